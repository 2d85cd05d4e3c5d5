package porttest

import (
	"fmt"
	"net"
	"testing"
)

func TestFreeIsBelowTheEphemeralRangeAndListenable(t *testing.T) {
	seen := map[int]bool{}
	for range 50 {
		port := Free(t)
		if port < lowest || port > highest || seen[port] {
			t.Fatalf("port %d: outside [%d, %d] or handed twice", port, lowest, highest)
		}
		seen[port] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatalf("port %d: %v", port, err)
		}
		_ = l.Close()
	}
}
