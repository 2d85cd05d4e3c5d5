package api_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/joinproto"
)

// TestTokenRotate: orch token rotate replaces the join secret of the
// running server (joins with the old one are refused at once, with the
// new one taken) and of a stopped one's data dir, which it starts with.
func TestTokenRotate(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, dir)
	join := func(secret string) int {
		t.Helper()
		req, _ := http.NewRequest("POST", ts.srv.URL()+joinproto.Path, strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := insecureClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	secret := func(token string) string {
		tok, err := joinproto.ParseToken(token)
		if err != nil {
			t.Fatal(err)
		}
		return tok.Secret
	}
	old := secret(ts.srv.Token())
	if code := join(old); code == http.StatusUnauthorized {
		t.Fatalf("the first token refused: %d", code)
	}
	rotated, err := api.RotateToken(context.Background(), dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if code := join(old); code != http.StatusUnauthorized {
		t.Errorf("the old token after rotating: %d, want 401", code)
	}
	if code := join(secret(rotated)); code == http.StatusUnauthorized {
		t.Errorf("the new token refused")
	}
	if ts.srv.Token() != rotated || !strings.HasPrefix(rotated, "K10") {
		t.Errorf("the server's token %q, rotated to %q", ts.srv.Token(), rotated)
	}
	if _, err := api.RotateToken(context.Background(), dir, "short"); err == nil || !strings.Contains(err.Error(), "too easy to guess") {
		t.Errorf("a short secret: %v", err)
	}

	ts.stop()
	offline, err := api.RotateToken(context.Background(), dir, "a-chosen-secret-of-some-length")
	if err != nil {
		t.Fatal(err)
	}
	onDisk, _ := os.ReadFile(filepath.Join(dir, "server", "token"))
	if strings.TrimSpace(string(onDisk)) != offline || !strings.HasSuffix(offline, "::server:a-chosen-secret-of-some-length") {
		t.Errorf("offline rotation wrote %q, said %q", onDisk, offline)
	}
	again := restartOn(t, dir, ts.srv.URL()[len("https://"):])
	if again.srv.Token() != offline {
		t.Errorf("restarted with %q, want the rotated %q", again.srv.Token(), offline)
	}
}
