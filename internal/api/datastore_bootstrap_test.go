package api

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orch-dev/orch/internal/store/boltstore"
)

// Two servers making the cluster at once: the one that loses removes an
// identity this start made, so that its next start joins, but keeps one
// it had before (it ran alone: its nodes trust that CA).
func TestPushBootstrapRace(t *testing.T) {
	for _, fresh := range []bool{true, false} {
		t.Run(map[bool]string{true: "fresh", false: "ran alone"}[fresh], func(t *testing.T) {
			st, err := boltstore.Open(t.TempDir(), boltstore.Options{CompactInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = st.Close() }()
			s := &Server{store: st, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			if _, err := st.Create(context.Background(), bootstrapKey, []byte("{}")); err != nil {
				t.Fatal(err) // the other server's
			}
			dir := t.TempDir()
			ca := filepath.Join(dir, "tls", "ca.crt")
			if err := os.MkdirAll(filepath.Dir(ca), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(ca, []byte("this server's CA"), 0o600); err != nil {
				t.Fatal(err)
			}
			err = s.pushBootstrap(context.Background(), dir, "secret", fresh)
			if err == nil || !strings.Contains(err.Error(), "another server made the cluster") {
				t.Fatalf("push: %v, want the race said", err)
			}
			_, statErr := os.Stat(ca)
			if kept := statErr == nil; kept == fresh {
				t.Fatalf("fresh %v: CA kept %v", fresh, kept)
			}
		})
	}
}
