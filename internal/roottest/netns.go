package roottest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
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
