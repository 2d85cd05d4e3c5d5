package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/release"
	"github.com/orch-dev/orch/internal/upgradeapi"
)

// releaseServer serves body as the API server serves a release.
func releaseServer(t *testing.T, body []byte) (*httptest.Server, string) {
	sum := sha256.Sum256(body)
	hexSum := hex.EncodeToString(sum[:])
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != upgradeapi.ReleasesPath+"v0.2.0/"+release.Platform() {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("ETag", `"`+hexSum+`"`)
		w.Header().Set("X-Orch-Sha256", hexSum)
		http.ServeContent(w, r, "orch", time.Time{}, bytes.NewReader(body))
	}))
	t.Cleanup(srv.Close)
	return srv, hexSum
}

func TestUpgradeDownloadResumes(t *testing.T) {
	body := bytes.Repeat([]byte("orch release "), 20000) // 260 KB
	srv, sum := releaseServer(t, body)
	u := &upgrader{http: srv.Client(), server: srv.URL}
	file := filepath.Join(t.TempDir(), ".orch-v0.2.0.download")
	ctx := context.Background()

	// What a killed agent left: the first 100 KB.
	if err := os.WriteFile(file, body[:100000], 0o700); err != nil {
		t.Fatal(err)
	}
	from, n, err := u.download(ctx, "v0.2.0", file, sum, 0)
	if err != nil || from != 100000 || n != int64(len(body))-100000 {
		t.Fatalf("resumed at %d, %d bytes, %v", from, n, err)
	}
	if got, _ := os.ReadFile(file); !bytes.Equal(got, body) {
		t.Fatal("the resumed download is not the release")
	}
	// Whole already: nothing more is asked.
	if from, n, err := u.download(ctx, "v0.2.0", file, sum, 0); err != nil || n != 0 || from != int64(len(body)) {
		t.Fatalf("a whole download fetched again: %d from %d, %v", n, from, err)
	}

	// A corrupt part is dropped and the release fetched whole again.
	if err := os.WriteFile(file, bytes.Repeat([]byte("x"), 100000), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, _, err := u.download(ctx, "v0.2.0", file, sum, 0); err == nil || !strings.Contains(err.Error(), "downloading it whole") {
		t.Fatalf("a corrupt part: %v", err)
	}
	if from, _, err := u.download(ctx, "v0.2.0", file, sum, 0); err != nil || from != 0 {
		t.Fatalf("after a corrupt part: from %d, %v", from, err)
	}

	// A sum the server does not have, a version it does not hold: not
	// the release, reported rather than tried again.
	var bad badRelease
	if _, _, err := u.download(ctx, "v0.2.0", filepath.Join(t.TempDir(), "f"), strings.Repeat("0", 64), 0); !errors.As(err, &bad) {
		t.Fatalf("a release with another sum: %v", err)
	}
	if _, _, err := u.download(ctx, "v0.3.0", filepath.Join(t.TempDir(), "f"), sum, 0); !errors.As(err, &bad) {
		t.Fatalf("a release not staged: %v", err)
	}
}

// TestUpgradeDownloadRate: a capped download takes at least the time its
// cap allows (a lower bound, which a loaded machine cannot break).
func TestUpgradeDownloadRate(t *testing.T) {
	body := bytes.Repeat([]byte{7}, 300<<10)
	srv, sum := releaseServer(t, body)
	u := &upgrader{http: srv.Client(), server: srv.URL}
	start := time.Now()
	if _, _, err := u.download(context.Background(), "v0.2.0", filepath.Join(t.TempDir(), "f"), sum, 100<<10); err != nil {
		t.Fatal(err)
	}
	// 300 KB at 100 KB/s, the first 100 KB a burst: two seconds.
	if took := time.Since(start); took < 1900*time.Millisecond {
		t.Fatalf("300 KB capped at 100 KB/s came in %s", took)
	}
}
