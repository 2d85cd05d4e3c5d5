package roottest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// NetNS makes a named network namespace for the test, removed at its
// end, and returns its path.
func NetNS(tb testing.TB, name string) string {
	tb.Helper()
	IP(tb, "netns", "add", name)
	tb.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return "/run/netns/" + name
}

// IP runs ip(8), failing the test if it fails.
func IP(tb testing.TB, args ...string) {
	tb.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		tb.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// In runs fn on a thread in the network namespace at path; the thread
// dies with it, so no other goroutine ever runs there.
func In(path string, fn func() error) error {
	errs := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		f, err := os.Open(path)
		if err != nil {
			errs <- err
			return
		}
		defer func() { _ = f.Close() }()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errs <- fmt.Errorf("setns %s: %w", path, err)
			return
		}
		errs <- fn()
	}()
	return <-errs
}

// Serve listens on TCP addr in the network namespace at path until the
// test ends, answering each connection with answer and closing it.
func Serve(tb testing.TB, path, addr string, answer func(net.Conn)) {
	tb.Helper()
	var l net.Listener
	if err := In(path, func() (err error) { l, err = net.Listen("tcp", addr); return err }); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				answer(c)
			}()
		}
	}()
}

// UseIPTables puts iptables' backend (nft or legacy) first in PATH for
// the test, as the alternatives system does for a host; it skips the test
// when that backend is not installed.
func UseIPTables(t *testing.T, backend string) {
	dir := t.TempDir()
	for _, cmd := range []string{"iptables", "iptables-save", "iptables-restore"} {
		bin, err := exec.LookPath(strings.Replace(cmd, "iptables", "iptables-"+backend, 1))
		if err != nil {
			t.Skipf("iptables' %s back end is not installed: %v", backend, err)
		}
		if err := os.Symlink(bin, filepath.Join(dir, cmd)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
}
