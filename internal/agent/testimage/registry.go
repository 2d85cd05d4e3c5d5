package testimage

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// Registry is an in-process, read-only OCI distribution registry for pull
// tests: it serves the images put in it by repository and tag, and with
// credentials set asks for them (HTTP basic auth, as registries with a
// password do).
type Registry struct {
	mu     sync.Mutex
	images map[string]Image // "repo:tag"
	user   string
	pass   string
	pulls  int
}

// NewRegistry is an empty registry.
func NewRegistry() *Registry { return &Registry{images: map[string]Image{}} }

// Put serves img as repo:tag.
func (r *Registry) Put(repo, tag string, img Image) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.images[repo+":"+tag] = img
}

// RequireAuth makes the registry answer only user and pass.
func (r *Registry) RequireAuth(user, pass string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.user, r.pass = user, pass
}

// ManifestRequests counts the manifests served (HEAD or GET).
func (r *Registry) ManifestRequests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pulls
}

// ServeHTTP answers /v2/ and the manifests and blobs of its images.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	user, pass := r.user, r.pass
	r.mu.Unlock()
	if user != "" {
		if u, p, ok := req.BasicAuth(); !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
	}
	path := strings.TrimPrefix(req.URL.Path, "/v2/")
	if path == "" {
		w.WriteHeader(http.StatusOK)
		return
	}
	if i := strings.LastIndex(path, "/manifests/"); i >= 0 {
		repo, ref := path[:i], path[i+len("/manifests/"):]
		r.mu.Lock()
		img, ok := r.images[repo+":"+ref]
		if !ok {
			for key, candidate := range r.images {
				if strings.HasPrefix(key, repo+":") && candidate.ManifestDigest() == ref {
					img, ok = candidate, true
				}
			}
		}
		if ok {
			r.pulls++
		}
		r.mu.Unlock()
		if !ok {
			http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}`, http.StatusNotFound)
			return
		}
		r.send(w, req, "application/vnd.oci.image.manifest.v1+json", img.ManifestDigest(), img.Manifest)
		return
	}
	if i := strings.LastIndex(path, "/blobs/"); i >= 0 {
		d := path[i+len("/blobs/"):]
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, img := range r.images {
			if data, ok := img.Blob(d); ok {
				r.send(w, req, "application/octet-stream", d, data)
				return
			}
		}
		http.Error(w, `{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}`, http.StatusNotFound)
		return
	}
	http.NotFound(w, req)
}

func (r *Registry) send(w http.ResponseWriter, req *http.Request, mediaType, d string, data []byte) {
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Docker-Content-Digest", d)
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	if req.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(data)
}
