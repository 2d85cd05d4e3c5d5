package api_test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/release"
	"github.com/orch-dev/orch/internal/upgradeapi"
)

// TestReleases: orch upgrade stage keeps a verified binary that the API
// serves to nodes (whole or from an offset) and to no one else; orch
// upgrade apply makes a plan only for a staged version, one at a time.
func TestReleases(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx := context.Background()
	bin := filepath.Join(t.TempDir(), "orch")
	build := exec.Command("go", "build", "-ldflags", "-X main.version=v0.7.0", "-o", bin, "../release/testdata/fakeorch")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v: %s", err, out)
	}
	want, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.StageReleases(ctx, ts.dir, []string{"/bin/true"}); err == nil {
		t.Fatal("a binary that is not orch was staged")
	}
	out, err := api.StageReleases(ctx, ts.dir, []string{bin})
	if err != nil || len(out.Staged) != 1 || out.Staged[0].Version != "v0.7.0" {
		t.Fatalf("stage: %+v, %v", out, err)
	}
	path := upgradeapi.ReleasesPath + "v0.7.0/" + release.Platform()
	get := func(id identity, path string, header ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.srv.URL()+path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := id.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		return resp.StatusCode, readAll(resp)
	}
	node := ts.as(t, "system:node:n1", "system:nodes")
	if code, body := get(node, path); code != http.StatusOK || body != string(want) {
		t.Fatalf("a node's download: %d, %d bytes of %d", code, len(body), len(want))
	}
	if code, body := get(node, path, "Range", "bytes=1000-"); code != http.StatusPartialContent || body != string(want[1000:]) {
		t.Fatalf("a resumed download: %d, %d bytes", code, len(body))
	}
	for _, p := range []string{upgradeapi.ReleasesPath + "v0.8.0/" + release.Platform(), upgradeapi.ReleasesPath + "v0.7.0/linux/s390x",
		upgradeapi.ReleasesPath + "..%2F..%2Fserver/tls", upgradeapi.ReleasesPath + "v0.7.0/..%2F..%2F..%2Fserver%2Ftoken"} {
		if code, _ := get(node, p); code != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", p, code)
		}
	}
	// Not a node's and not an admin's: refused.
	for name, id := range map[string]identity{
		"a user":            ts.as(t, "alice", "developers"),
		"a service account": ts.as(t, "system:serviceaccount:default:app", "system:serviceaccounts"),
	} {
		if code, _ := get(id, path); code != http.StatusForbidden {
			t.Errorf("%s got the release: %d", name, code)
		}
	}

	if _, err := api.ApplyUpgrade(ctx, ts.dir, api.ApplyOptions{Version: "v0.8.0"}); err == nil || !strings.Contains(err.Error(), "not staged") {
		t.Fatalf("a plan for a version not staged: %v", err)
	}
	// The loops install the kind; here, no loops run.
	client, err := kube.NewForConfig(ts.config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CustomResourceDefinitions().Create(ctx, upgradeapi.CRD(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.WaitEstablished(ctx, upgradeapi.CRD().Name); err != nil {
		t.Fatal(err)
	}
	u, err := api.ApplyUpgrade(ctx, ts.dir, api.ApplyOptions{Version: "v0.7.0", Concurrency: 2, Selector: "role=edge"})
	if err != nil {
		t.Fatal(err)
	}
	if u.Spec.Concurrency != 2 || u.Spec.NodeSelector == nil || u.Spec.NodeSelector.MatchLabels["role"] != "edge" {
		t.Fatalf("plan %+v", u.Spec)
	}
	if _, err := api.ApplyUpgrade(ctx, ts.dir, api.ApplyOptions{Version: "v0.7.0"}); err == nil || !strings.Contains(err.Error(), "under way") {
		t.Fatalf("a second plan: %v", err)
	}
	if err := api.PauseUpgrade(ctx, ts.dir, "", true); err != nil {
		t.Fatal(err)
	}
	st, err := api.GetUpgradeStatus(ctx, ts.dir)
	if err != nil || len(st.Upgrades) != 1 || !st.Upgrades[0].Spec.Paused || len(st.Releases) != 1 {
		t.Fatalf("status %+v, %v", st, err)
	}
}
