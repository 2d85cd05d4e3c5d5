package store

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
)

// Errors a Store returns, wrapped with context. Test them with errors.Is.
var (
	// ErrNotFound: the key does not exist.
	ErrNotFound = errors.New("key not found")
	// ErrExists: Create of a key that exists.
	ErrExists = errors.New("key already exists")
	// ErrConflict: the key's modification revision is not the expected one.
	ErrConflict = errors.New("modification revision does not match")
	// ErrCompacted: the requested revision's history has been compacted.
	ErrCompacted = errors.New("revision has been compacted")
	// ErrFutureRevision: a read at a revision the store has not reached.
	ErrFutureRevision = errors.New("revision is in the future")
	// ErrWatcherTooSlow: the watcher fell too far behind and was cut off.
	ErrWatcherTooSlow = errors.New("watcher fell behind and was cut off")
	// ErrInvalid: a malformed key, value, option or continue token.
	ErrInvalid = errors.New("invalid argument")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("store is closed")
)

// KeyValue is one version of a key. Value must not be modified by callers:
// it may be shared with other readers.
type KeyValue struct {
	Key            string
	Value          []byte
	CreateRevision int64
	ModRevision    int64
}

// EventType says what happened to a key.
type EventType int

// The event types. Progress carries no key: it says every event up to its
// Revision has been delivered (etcd's progress notification).
const (
	EventPut EventType = iota + 1
	EventDelete
	EventProgress
)

func (t EventType) String() string {
	switch t {
	case EventPut:
		return "PUT"
	case EventDelete:
		return "DELETE"
	case EventProgress:
		return "PROGRESS"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event is one change. For a put, KV is the new version and PrevKV the one
// it replaced (nil on create). For a delete, KV holds the key and the
// deletion's revision, and PrevKV the deleted version.
type Event struct {
	Type     EventType
	KV       KeyValue
	PrevKV   *KeyValue
	Revision int64
}

// IsCreate reports whether the event created its key.
func (e Event) IsCreate() bool { return e.Type == EventPut && e.PrevKV == nil }

// ListOptions pages a List.
type ListOptions struct {
	// Limit caps the number of keys returned; 0 means no limit.
	Limit int64
	// Revision reads at a past revision; 0 means the current one.
	Revision int64
	// Continue resumes a paged List; it overrides Revision.
	Continue string
}

// ListResult is one page.
type ListResult struct {
	KVs []KeyValue
	// Revision the page was read at; pass Continue to read on at it.
	Revision int64
	// Continue is empty on the last page.
	Continue string
	// Remaining is how many keys under the prefix follow this page at
	// Revision (etcd's count less the page), set when Continue is.
	Remaining int64
}

// Watcher is a running watch. Events is closed when the watch ends; Err
// then says why (nil when stopped by Stop or its context).
type Watcher interface {
	Events() <-chan Event
	Err() error
	// RequestProgress asks for an EventProgress in the stream, after every
	// event the watcher has been sent so far.
	RequestProgress()
	Stop()
}

// Store is the contract every backend meets. It maps onto etcd's KV and
// Watch so that an etcd backend drops in for HA.
type Store interface {
	Get(ctx context.Context, key string) (KeyValue, error)
	List(ctx context.Context, prefix string, opts ListOptions) (ListResult, error)
	// Create fails with ErrExists if the key exists.
	Create(ctx context.Context, key string, value []byte) (KeyValue, error)
	// Update fails with ErrConflict unless the key's ModRevision equals
	// expectedModRevision; 0 accepts any.
	Update(ctx context.Context, key string, value []byte, expectedModRevision int64) (KeyValue, error)
	// Delete returns the deleted version and the deletion's revision.
	Delete(ctx context.Context, key string, expectedModRevision int64) (prev KeyValue, rev int64, err error)
	// Revision is the newest revision every read sees.
	Revision(ctx context.Context) (int64, error)
	// Watch delivers the events under prefix with a revision greater than
	// afterRevision; 0 means from now.
	Watch(ctx context.Context, prefix string, afterRevision int64) (Watcher, error)
	// Compact forgets history at or below revision.
	Compact(ctx context.Context, revision int64) error
	// CompactedRevision is the newest revision forgotten by compaction.
	CompactedRevision() int64
	Close() error
}

// EncodeContinue makes the opaque token that resumes a List after key at rev.
func EncodeContinue(rev int64, nextKey string) string {
	buf := binary.AppendVarint(nil, rev)
	buf = append(buf, nextKey...)
	return base64.RawURLEncoding.EncodeToString(buf)
}

// DecodeContinue reverses EncodeContinue.
func DecodeContinue(token string) (rev int64, nextKey string, err error) {
	buf, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return 0, "", fmt.Errorf("continue token: %w: %w", ErrInvalid, err)
	}
	rev, n := binary.Varint(buf)
	if n <= 0 || rev <= 0 {
		return 0, "", fmt.Errorf("continue token: %w: bad revision", ErrInvalid)
	}
	return rev, string(buf[n:]), nil
}
