package etcdmember

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Two restores in one second (a retry, or a test) each keep the data they
// replace: the second must not fail on, or overwrite, the first's.
func TestKeepAsideTwiceInOneSecond(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etcd")
	now := time.Unix(1_796_099_376, 0)
	var kept []string
	for i, content := range []string{"first", "second", "third"} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "data"), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		old, err := keepAside(dir, now)
		if err != nil {
			t.Fatalf("keep aside %d: %v", i, err)
		}
		kept = append(kept, old)
	}
	for i, content := range []string{"first", "second", "third"} {
		got, err := os.ReadFile(filepath.Join(kept[i], "data"))
		if err != nil || string(got) != content {
			t.Errorf("%s: %q %v, want %q", kept[i], got, err, content)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s is still there: %v", dir, err)
	}
}
