package openapi

import (
	"crypto/sha512"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/orch-dev/orch/internal/api/resources"
)

// Handler serves /openapi/v3 (the index) and /openapi/v3/<group path>.
// Documents are built on first request and kept: a board that never runs
// kubectl never pays for them.
type Handler struct {
	served []*resources.Resource
	once   sync.Once
	index  []byte
	docs   map[string]document
	err    error
}

type document struct {
	body []byte
	hash string
}

// NewHandler serves the documents of the given resources.
func NewHandler(served []*resources.Resource) *Handler {
	return &Handler{served: served}
}

func (h *Handler) build() {
	h.docs = map[string]document{}
	type entry struct {
		URL string `json:"serverRelativeURL"`
	}
	index := map[string]map[string]entry{"paths": {}}
	for _, gv := range GroupVersions(h.served) {
		body, err := json.Marshal(Document(gv, h.served))
		if err != nil {
			h.err = fmt.Errorf("openapi document of %s: %w", gv, err)
			return
		}
		hash := fmt.Sprintf("%X", hashOf(body))
		path := PathOf(gv)
		h.docs[path] = document{body: body, hash: hash}
		index["paths"][path] = entry{URL: "/openapi/v3/" + path + "?hash=" + hash}
	}
	h.index, h.err = json.Marshal(index)
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.once.Do(h.build)
	if !servable(w, r, h.err) {
		return
	}
	path := strings.Trim(strings.TrimPrefix(r.URL.Path, "/openapi/v3"), "/")
	w.Header().Set("Content-Type", "application/json")
	if path == "" {
		w.Header().Set("Cache-Control", "no-cache, private")
		_, _ = w.Write(h.index)
		return
	}
	doc, ok := h.docs[path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	etag := `"` + doc.hash + `"`
	w.Header().Set("Etag", etag)
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
	_, _ = w.Write(doc.body)
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
