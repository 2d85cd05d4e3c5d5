package pods

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/logs"
)

// TestContainerIO: what the container writes goes to its log and to the
// sessions attached at the time; attach input reaches its stdin, which
// stays open between sessions unless it is to be closed after one.
func TestContainerIO(t *testing.T) {
	dir := t.TempDir()
	lw, err := logs.NewWriter(filepath.Join(dir, "0.log"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lw.Close() }()
	created, err := newContainerIO(filepath.Join(dir, "fifo"), lw, streams{stdin: true})("c1")
	if err != nil {
		t.Fatal(err)
	}
	o := created.(*containerIO)
	defer func() { o.detach(); _ = o.Close() }()
	// The shim's ends of the FIFOs.
	stdout, err := os.OpenFile(o.Config().Stdout, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stdout.Close() }()
	stdin, err := os.OpenFile(o.Config().Stdin, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stdin.Close() }()

	var session strings.Builder
	detach := o.attach(&session, nil) // written under o.mu, read after detach
	if _, err := stdout.WriteString("while attached\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the log", func() bool { return strings.Contains(readLog(t, dir), "while attached") })
	detach()
	if _, err := stdout.WriteString("after detaching\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the log", func() bool { return strings.Contains(readLog(t, dir), "after detaching") })
	if got := session.String(); got != "while attached\n" {
		t.Errorf("the session got %q", got)
	}

	for _, once := range []bool{false, true} {
		if err := o.input(context.Background(), strings.NewReader("typed\n"), once); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 6)
		if _, err := stdin.Read(buf); err != nil || string(buf) != "typed\n" {
			t.Errorf("the container's stdin read %q, %v", buf, err)
		}
	}
	if err := o.input(context.Background(), strings.NewReader("more\n"), false); !errors.Is(err, errNoStdin) {
		t.Errorf("input after a stdinOnce session: %v, want %v", err, errNoStdin)
	}
	if n, err := stdin.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("the container's stdin after a stdinOnce session: %d bytes, %v; want end of file", n, err)
	}
}

func readLog(t *testing.T, dir string) string {
	data, err := os.ReadFile(filepath.Join(dir, "0.log"))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
