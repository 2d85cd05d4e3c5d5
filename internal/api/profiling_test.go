package api_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/orch-dev/orch/internal/api"
)

// TestProfiling: cluster admins read the process's profiles at
// /debug/pprof/, as from kube-apiserver with --profiling (its default), in
// the format go tool pprof reads (gzipped protobuf) or as text; anyone
// else is refused, bad parameters are 400 and 404, and --profiling=false
// serves none.
func TestProfiling(t *testing.T) {
	ts := startServer(t, "")
	admin := ts.as(t, "admin", "system:masters")
	alice := ts.as(t, "alice", "developers")
	gzipped := func(body string) bool { return strings.HasPrefix(body, "\x1f\x8b") }
	for _, tc := range []struct {
		name  string
		who   identity
		path  string
		want  int
		check func(string) bool
	}{
		{"index", admin, "/debug/pprof/", 200, func(b string) bool { return strings.Contains(b, "\theap\n") && strings.Contains(b, "\tgoroutine\n") }},
		{"heap for go tool pprof", admin, "/debug/pprof/heap?gc=1", 200, gzipped},
		{"goroutines as text", admin, "/debug/pprof/goroutine?debug=1", 200, func(b string) bool { return strings.HasPrefix(b, "goroutine profile: total ") }},
		{"CPU", admin, "/debug/pprof/profile?seconds=1", 200, gzipped},
		{"CPU for too long", admin, "/debug/pprof/profile?seconds=3600", 400, func(b string) bool { return strings.Contains(b, "from 1 to 300") }},
		{"CPU for no time", admin, "/debug/pprof/profile?seconds=0", 400, nil},
		{"no such profile", admin, "/debug/pprof/nothing", 404, func(b string) bool { return strings.Contains(b, `no profile "nothing"`) }},
		{"a user without the right", alice, "/debug/pprof/heap", 403, func(b string) bool {
			return strings.Contains(b, `User \"alice\" cannot get path \"/debug/pprof/heap\"`)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.who.t = t
			code, body := tc.who.raw(tc.path)
			if code != tc.want || tc.check != nil && !tc.check(body) {
				t.Errorf("GET %s: %d %.200q, want %d", tc.path, code, body, tc.want)
			}
		})
	}

	off := startServerWith(t, "", 0, func(c *api.Config) { c.DisableProfiling = true })
	if code, body := off.as(t, "admin", "system:masters").raw("/debug/pprof/heap"); code != 404 {
		t.Errorf("with profiling off: %d %.200q, want 404", code, body)
	}
}

// raw GETs path and returns the status and the body as it came.
func (id identity) raw(path string) (int, string) {
	id.t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), "GET", id.ts.srv.URL()+path, nil)
	if err != nil {
		id.t.Fatal(err)
	}
	resp, err := id.client.Do(req)
	if err != nil {
		id.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		id.t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}
