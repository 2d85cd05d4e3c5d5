package etcdmember_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if they leave goroutines running.
// etcd members leave a peer connection behind now and then, both ends in
// the process: the server side stuck aborting its background read through
// etcd's connection wrapper, the client side idle in the peer transport.
// A process exiting closes them; they are etcd's.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/client/pkg/v3/transport.timeoutConn.Read"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).abortPendingRead"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
	)
}
