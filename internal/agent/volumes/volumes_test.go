package volumes

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The atomic writer: files behind ..data, unchanged content not
// rewritten, removed keys gone, paths out of the volume refused.
func TestWriteProjection(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vol")
	files := map[string]projectedFile{"a": {data: []byte("1"), mode: 0o644}, "sub/b": {data: []byte("2"), mode: 0o600}}
	if err := writeProjection(dir, files, false, nil); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string { data, _ := os.ReadFile(filepath.Join(dir, p)); return string(data) }
	if read("a") != "1" || read("sub/b") != "2" {
		t.Fatalf("got a=%q sub/b=%q", read("a"), read("sub/b"))
	}
	if fi, _ := os.Stat(filepath.Join(dir, "sub/b")); fi.Mode().Perm() != 0o600 {
		t.Errorf("sub/b mode %v", fi.Mode())
	}
	first, _ := os.Readlink(filepath.Join(dir, "..data"))
	if err := writeProjection(dir, files, false, nil); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.Readlink(filepath.Join(dir, "..data")); again != first {
		t.Errorf("unchanged content rewritten: %s then %s", first, again)
	}
	time.Sleep(time.Millisecond)
	if err := writeProjection(dir, map[string]projectedFile{"a": {data: []byte("new"), mode: 0o644}}, false, nil); err != nil {
		t.Fatal(err)
	}
	if read("a") != "new" {
		t.Errorf("a = %q after the update", read("a"))
	}
	if _, err := os.Lstat(filepath.Join(dir, "sub")); !os.IsNotExist(err) {
		t.Errorf("sub still there after its key went: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 3 || !slices.Contains(names, "..data") || !slices.Contains(names, "a") {
		t.Errorf("volume holds %v, want a, ..data and one data directory", names)
	}
	for _, bad := range []string{"../escape", "/abs", "..data"} {
		if err := writeProjection(dir, map[string]projectedFile{bad: {data: []byte("x")}}, false, nil); err == nil {
			t.Errorf("path %q accepted", bad)
		}
	}
}

func TestSubPath(t *testing.T) {
	vol := t.TempDir()
	if err := os.Symlink("/etc", filepath.Join(vol, "out")); err != nil {
		t.Fatal(err)
	}
	if p, err := subPath(vol, "new/dir"); err != nil || !strings.HasSuffix(p, "new/dir") {
		t.Errorf("subPath new/dir: %q %v", p, err)
	}
	for _, bad := range []string{"../x", "/etc", "out", "a/../../x"} {
		if _, err := subPath(vol, bad); err == nil {
			t.Errorf("subPath %q accepted", bad)
		}
	}
}

func TestCheckHostPath(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		typ  corev1.HostPathType
		ok   bool
	}{
		{dir, corev1.HostPathDirectory, true},
		{file, corev1.HostPathDirectory, false},
		{file, corev1.HostPathFile, true},
		{filepath.Join(dir, "missing"), corev1.HostPathFile, false},
		{filepath.Join(dir, "made/here"), corev1.HostPathDirectoryOrCreate, true},
		{filepath.Join(dir, "made/file"), corev1.HostPathFileOrCreate, true},
		{file, corev1.HostPathSocket, false},
		{filepath.Join(dir, "anything"), corev1.HostPathUnset, true},
	} {
		err := checkHostPath(&corev1.HostPathVolumeSource{Path: tc.path, Type: &tc.typ})
		if (err == nil) != tc.ok {
			t.Errorf("%s as %q: %v", tc.path, tc.typ, err)
		}
	}
}
