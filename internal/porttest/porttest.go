// Package porttest hands tests TCP ports to listen on later (an etcd
// member's client and peer ports are given, not asked of the kernel).
// A port the kernel picks for a listener closed at once is in its
// ephemeral range, where an outgoing connection of a parallel test may
// take it before it is listened on again; these come from below that
// range, where the kernel never picks, and none is handed out twice in
// one process.
package porttest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
)

// The kernel's ephemeral range starts at 32768 by default
// (net.ipv4.ip_local_port_range); these are below it.
const lowest, highest = 20000, 32767

var (
	mu     sync.Mutex
	handed = map[int]bool{}
)

// Free is a port of 127.0.0.1 nothing listens on, not handed out before.
func Free(t testing.TB) int {
	t.Helper()
	port, err := Pick()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// Pick is Free for code without a testing.TB (a TestMain).
func Pick() (int, error) {
	mu.Lock()
	defer mu.Unlock()
	for range 1000 {
		port := lowest + rand.IntN(highest-lowest+1)
		if handed[port] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		_ = l.Close()
		handed[port] = true
		return port, nil
	}
	return 0, errors.New("no free port below the ephemeral range")
}
