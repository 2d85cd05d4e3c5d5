package registry

import (
	"github.com/orch-dev/orch/internal/api/memo"
	"k8s.io/apimachinery/pkg/runtime"
)

// decodeKey names one stored version of one object: a key at the revision
// the decoded object reports (a deletion reports the deleting revision).
type decodeKey struct {
	key string
	rev int64
}

// recentDecodes lets the watchers of a resource decode each change once:
// every store watcher receives the same bytes for a change, and without
// it each of 500 watchers would decode them again. The objects are shared,
// so nothing downstream of a watch may modify them.
func newRecentDecodes(size int) *memo.Ring[decodeKey, runtime.Object] {
	return memo.New[decodeKey, runtime.Object](size)
}

// decodeShared is decodeAt for watch events: concurrent watchers of one
// change wait for a single decode and all get its object.
func (s *Storage) decodeShared(key string, value []byte, rev int64) (runtime.Object, error) {
	return s.recent.Get(decodeKey{key, rev}, func() (runtime.Object, error) { return s.decodeAt(value, rev) })
}
