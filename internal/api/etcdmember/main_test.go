package etcdmember_test

import (
	"testing"

	"go.uber.org/goleak"
)

// etcd's peer connections between members (HTTP, through cmux) outlive a
// member's Close for as long as the other side keeps them; they are
// etcd's, not this package's.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
	)
}
