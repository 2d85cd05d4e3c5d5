package openapi

import (
	"crypto/sha512"
	"encoding/json"
	"fmt"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"net/http"
	"strings"
	"sync"

	"github.com/orch-dev/orch/internal/api/resources"
)

// Source gives the resources to document and the generation of the
// catalog they come from: documents are rebuilt when it changes.
type Source interface {
	Resources() (generation uint64, served []*resources.Resource)
}

// Static is a Source that never changes.
type Static []*resources.Resource

// Resources implements Source.
func (s Static) Resources() (uint64, []*resources.Resource) { return 1, s }

// perGeneration keeps what was built from one generation of a Source.
// Documents are built on first request and kept: a board that never runs
// kubectl never pays for them.
type perGeneration[T any] struct {
	mu         sync.Mutex
	built      bool
	generation uint64
	val        T
}

func (p *perGeneration[T]) get(src Source, build func([]*resources.Resource) T) T {
	gen, served := src.Resources()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.built || p.generation != gen {
		p.val, p.generation, p.built = build(served), gen, true
	}
	return p.val
}

// Handler serves /openapi/v3 (the index) and /openapi/v3/<group path>.
type Handler struct {
	src  Source
	docs perGeneration[*v3Docs]
	// aggregated, when set, gives the group/versions other servers serve
	// behind this one: the index lists their documents, which are
	// fetched from those servers (see aggregator.OpenAPIHandler).
	aggregated func() []schema.GroupVersion
}

// WithAggregated lists the aggregated group/versions' documents in the
// index too.
func (h *Handler) WithAggregated(gvs func() []schema.GroupVersion) *Handler {
	h.aggregated = gvs
	return h
}

type v3Docs struct {
	index []byte
	docs  map[string]document
	err   error
}

type document struct {
	body compressed
	hash string
}

// NewHandler serves the documents of the source's resources.
func NewHandler(src Source) *Handler {
	return &Handler{src: src}
}

func buildV3(served []*resources.Resource) *v3Docs {
	d := &v3Docs{docs: map[string]document{}}
	type entry struct {
		URL string `json:"serverRelativeURL"`
	}
	index := map[string]map[string]entry{"paths": {}}
	for _, gv := range GroupVersions(served) {
		body, err := json.Marshal(Document(gv, served))
		if err != nil {
			d.err = fmt.Errorf("openapi document of %s: %w", gv, err)
			return d
		}
		hash := fmt.Sprintf("%X", hashOf(body))
		kept, err := compress(body)
		if err != nil {
			d.err = err
			return d
		}
		path := PathOf(gv)
		d.docs[path] = document{body: kept, hash: hash}
		index["paths"][path] = entry{URL: "/openapi/v3/" + path + "?hash=" + hash}
	}
	d.index, d.err = json.Marshal(index)
	return d
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	built := h.docs.get(h.src, buildV3)
	if !servable(w, r, built.err) {
		return
	}
	path := strings.Trim(strings.TrimPrefix(r.URL.Path, "/openapi/v3"), "/")
	w.Header().Set("Content-Type", "application/json")
	if path == "" {
		w.Header().Set("Cache-Control", "no-cache, private")
		_, _ = w.Write(h.index(built))
		return
	}
	doc, ok := built.docs[path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	etag := `"` + doc.hash + `"`
	w.Header().Set("Etag", etag)
	w.Header().Set("Vary", "Accept-Encoding")
	if r.URL.Query().Get("hash") == doc.hash {
		// The URL names this exact content, so clients may keep it.
		w.Header().Set("Cache-Control", "public, immutable")
		w.Header().Set("Expires", "Fri, 01 Jan 2038 00:00:00 GMT")
	} else {
		w.Header().Set("Cache-Control", "no-cache, private")
	}
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	doc.body.write(w, r)
}

// index is the documents' index, with the aggregated group/versions'.
func (h *Handler) index(built *v3Docs) []byte {
	if h.aggregated == nil {
		return built.index
	}
	gvs := h.aggregated()
	if len(gvs) == 0 {
		return built.index
	}
	var index map[string]map[string]map[string]string
	if err := json.Unmarshal(built.index, &index); err != nil {
		return built.index
	}
	for _, gv := range gvs {
		path := PathOf(gv)
		index["paths"][path] = map[string]string{"serverRelativeURL": "/openapi/v3/" + path}
	}
	body, err := json.Marshal(index)
	if err != nil {
		return built.index
	}
	return body
}

// hashOf is a document's content hash, as Kubernetes puts in its URLs.
func hashOf(body []byte) []byte {
	sum := sha512.Sum512(body)
	return sum[:]
}

// servable answers a request that cannot be served (the documents failed
// to build, or a method other than GET or HEAD) and says whether the
// request may go on.
func servable(w http.ResponseWriter, r *http.Request, buildErr error) bool {
	if buildErr != nil {
		http.Error(w, buildErr.Error(), http.StatusInternalServerError)
		return false
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return false
	}
	return true
}
