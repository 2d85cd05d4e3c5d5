package logs

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func newTestWriter(t *testing.T, maxSize int64) (*Writer, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "0.log")
	w, err := NewWriter(path, maxSize)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	clock := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	w.now = func() time.Time { clock = clock.Add(time.Second); return clock }
	return w, path
}

func read(t *testing.T, path string, opts Options) string {
	t.Helper()
	var b bytes.Buffer
	if err := Read(context.Background(), path, opts, &b, func() bool { return false }); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// Lines are stored in the CRI format, a line split across writes is one
// entry, and a long line becomes partial entries that read back whole.
func TestWriteCRIFormat(t *testing.T) {
	w, path := newTestWriter(t, 1<<20)
	out, errOut := w.Stdout(), w.Stderr()
	for _, s := range []string{"one\ntw", "o\n"} {
		if _, err := out.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := errOut.Write([]byte("oops\n")); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", MaxLineSize+10)
	if _, err := out.Write([]byte(long + "\n")); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	want := []string{"2026-11-22T10:00:01Z stdout F one", "2026-11-22T10:00:02Z stdout F two", "2026-11-22T10:00:03Z stderr F oops"}
	for i, w := range want {
		if lines[i] != w {
			t.Errorf("line %d = %q, want %q", i, lines[i], w)
		}
	}
	if len(lines) != 5 || !strings.Contains(lines[3], " stdout P ") || !strings.Contains(lines[4], " stdout F ") {
		t.Errorf("long line stored as %d entries", len(lines)-3)
	}
	if got := read(t, path, Options{Tail: -1}); got != "one\ntwo\noops\n"+long+"\n" {
		t.Errorf("read back %q", got[:min(len(got), 40)])
	}
}

// The last words of a container's output without their newline are
// logged as a line when its output ends (Flush), as containerd's CRI logs
// them: `echo -n DONE; false` leaves DONE for FallbackToLogsOnError.
func TestFlushLastPartialLine(t *testing.T) {
	w, path := newTestWriter(t, 1<<20)
	out := w.Stdout()
	if _, err := out.Write([]byte("first\nDO")); err != nil {
		t.Fatal(err)
	}
	if _, err := out.Write([]byte("NE")); err != nil {
		t.Fatal(err)
	}
	if got := read(t, path, Options{Tail: -1}); got != "first\n" {
		t.Fatalf("before the end: %q", got)
	}
	if err := out.(interface{ Flush() error }).Flush(); err != nil {
		t.Fatal(err)
	}
	if got := read(t, path, Options{Tail: -1}); got != "first\nDONE\n" {
		t.Errorf("after the end: %q", got)
	}
}

func TestReadOptions(t *testing.T) {
	w, path := newTestWriter(t, 1<<20)
	for _, l := range []string{"a", "b", "c", "d"} {
		_, _ = w.Stdout().Write([]byte(l + "\n"))
	}
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"all", Options{Tail: -1}, "a\nb\nc\nd\n"},
		{"tail 2", Options{Tail: 2}, "c\nd\n"},
		{"tail 0", Options{Tail: 0}, ""},
		{"tail more than there is", Options{Tail: 10}, "a\nb\nc\nd\n"},
		{"since", Options{Tail: -1, Since: time.Date(2026, 11, 22, 10, 0, 3, 0, time.UTC)}, "c\nd\n"},
		{"timestamps", Options{Tail: 1, Timestamps: true}, "2026-11-22T10:00:04Z d\n"},
		{"limit bytes", Options{Tail: -1, LimitBytes: 3}, "a\nb"},
	} {
		if got := read(t, path, tc.opts); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

// The file rotates at its size limit, keeping one older file; reading
// spans both.
func TestRotation(t *testing.T) {
	w, path := newTestWriter(t, 200)
	for i := range 10 {
		_, _ = w.Stdout().Write([]byte(strings.Repeat(string(rune('a'+i)), 20) + "\n"))
	}
	for _, p := range []string{path, path + ".1"} {
		if fi, err := os.Stat(p); err != nil || fi.Size() > 200 {
			t.Fatalf("%s: %v %v", p, fi, err)
		}
	}
	got := read(t, path, Options{Tail: -1})
	if !strings.HasSuffix(got, strings.Repeat("j", 20)+"\n") || strings.Contains(got, "aaaa") {
		t.Errorf("after rotation read %q", got)
	}
}

// Follow streams what is appended, through a rotation, and ends once the
// container has stopped and the file is drained.
func TestFollow(t *testing.T) {
	w, path := newTestWriter(t, 180)
	_, _ = w.Stdout().Write([]byte("before\n"))
	var running atomic.Bool
	running.Store(true)
	var mu sync.Mutex
	var b bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- Read(context.Background(), path, Options{Tail: -1, Follow: true}, writerFunc(func(p []byte) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return b.Write(p)
		}), running.Load)
	}()
	wait := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			mu.Lock()
			got := b.String()
			mu.Unlock()
			if strings.Contains(got, want) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("follow never showed %q", want)
	}
	wait("before\n")
	// Each batch rotates the file once at most (a file holds three
	// entries): what was written before a rotation is read before the
	// reader moves to the new file.
	for batch := range 3 {
		for i := range 2 {
			_, _ = w.Stdout().Write([]byte("line " + string(rune('0'+2*batch+i)) + " padding\n"))
		}
		wait("line " + string(rune('0'+2*batch+1)) + " padding\n")
	}
	running.Store(false)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("follow did not end after the container stopped")
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Count(b.String(), "\n") != 7 {
		t.Errorf("followed output:\n%s", b.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
