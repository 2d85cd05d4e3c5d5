package rest

import (
	"net/http/httptest"
	"testing"
)

// TestParseRequest: paths read as Kubernetes' RequestInfoFactory reads
// them; what follows a subresource (a node proxy's path) is apart from it,
// so that authorization sees nodes/proxy.
func TestParseRequest(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		want         RequestInfo
	}{
		{"GET", "/api/v1/namespaces/default/pods/web-0/log", RequestInfo{IsResource: true, Verb: "get", Version: "v1", Namespace: "default", Resource: "pods", Name: "web-0", Subresource: "log"}},
		{"GET", "/api/v1/nodes/pi-1/proxy/stats/summary", RequestInfo{IsResource: true, Verb: "get", Version: "v1", Resource: "nodes", Name: "pi-1", Subresource: "proxy", SubPath: "/stats/summary"}},
		{"PUT", "/apis/apps/v1/namespaces/db/statefulsets/kv/scale", RequestInfo{IsResource: true, Verb: "update", Group: "apps", Version: "v1", Namespace: "db", Resource: "statefulsets", Name: "kv", Subresource: "scale"}},
		{"GET", "/api/v1/watch/namespaces/default/pods", RequestInfo{IsResource: true, Verb: "watch", Version: "v1", Namespace: "default", Resource: "pods"}},
	} {
		got := ParseRequest(httptest.NewRequest(tc.method, tc.path, nil))
		tc.want.Path = tc.path
		if got != tc.want {
			t.Errorf("%s %s:\n got %+v\nwant %+v", tc.method, tc.path, got, tc.want)
		}
	}
}

// TestSelectedName: the name authorization takes from a list or watch's
// field selector, as Kubernetes' RequestInfoFactory takes it: only an
// exact metadata.name that could be a path segment.
func TestSelectedName(t *testing.T) {
	for _, tc := range []struct{ selector, want string }{
		{"metadata.name=extension-apiserver-authentication", "extension-apiserver-authentication"},
		{"metadata.name==web,metadata.namespace=default", "web"},
		{"metadata.name!=web", ""},
		{"spec.nodeName=pi-1", ""},
		{"metadata.name=a/b", ""},
		{"metadata.name=..", ""},
		{"metadata.name", ""},
		{"", ""},
	} {
		if got := SelectedName(tc.selector); got != tc.want {
			t.Errorf("SelectedName(%q) = %q, want %q", tc.selector, got, tc.want)
		}
	}
}
