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
