package rest

import (
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/apimachinery/pkg/fields"
)

// RequestInfo is what a REST request asks for, as authorization sees it.
type RequestInfo struct {
	// IsResource is false for discovery and other non-resource paths.
	IsResource  bool
	Verb        string // get list watch create update patch delete deletecollection
	Group       string
	Version     string
	Namespace   string
	Resource    string
	Name        string
	Subresource string
	// SubPath is what follows the subresource (nodes/NAME/proxy/stats/summary
	// has /stats/summary), which only a proxy serves.
	SubPath string
	Path    string
}

// ParseRequest reads a request's path and method the way Kubernetes'
// RequestInfoFactory does, legacy /watch/ paths included.
func ParseRequest(r *http.Request) RequestInfo {
	info := RequestInfo{Path: r.URL.Path, Verb: strings.ToLower(r.Method)}
	segs := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(segs) >= 2 && segs[0] == "api":
		info.Version, segs = segs[1], segs[2:]
	case len(segs) >= 3 && segs[0] == "apis":
		info.Group, info.Version, segs = segs[1], segs[2], segs[3:]
	default:
		return info
	}
	watchPath := false
	if len(segs) > 0 && segs[0] == "watch" {
		watchPath, segs = true, segs[1:]
	}
	if len(segs) == 0 {
		return info
	}
	info.IsResource = true
	if segs[0] == "namespaces" && len(segs) >= 3 && segs[2] != "status" && segs[2] != "finalize" {
		info.Namespace, segs = segs[1], segs[2:]
	} else if segs[0] == "namespaces" && len(segs) >= 2 {
		info.Namespace = segs[1]
	}
	info.Resource = segs[0]
	if len(segs) > 1 {
		info.Name = segs[1]
	}
	if len(segs) > 2 {
		info.Subresource = segs[2]
	}
	if len(segs) > 3 {
		info.SubPath = "/" + strings.Join(segs[3:], "/")
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		info.Verb = "get"
		if info.Name == "" {
			info.Verb = "list"
		}
		if w := r.URL.Query().Get("watch"); watchPath || w == "true" || w == "1" {
			info.Verb = "watch"
		}
	case http.MethodPost:
		info.Verb = "create"
	case http.MethodPut:
		info.Verb = "update"
	case http.MethodPatch:
		info.Verb = "patch"
	case http.MethodDelete:
		info.Verb = "delete"
		if info.Name == "" {
			info.Verb = "deletecollection"
		}
	}
	return info
}

// SelectedName is the name a list or watch's field selector asks for
// exactly (metadata.name=NAME), if it is a valid path segment, as
// Kubernetes' RequestInfoFactory takes it for the request's name; ""
// otherwise, or when the selector does not parse.
func SelectedName(fieldSelector string) string {
	if fieldSelector == "" {
		return ""
	}
	sel, err := fields.ParseSelector(fieldSelector)
	if err != nil {
		return ""
	}
	name, ok := sel.RequiresExactMatch("metadata.name")
	if !ok || len(content.IsPathSegmentName(name)) > 0 {
		return ""
	}
	return name
}
