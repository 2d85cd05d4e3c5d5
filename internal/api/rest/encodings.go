package rest

import (
	"bytes"
	"encoding/json"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
)

// sharedEncodings remembers how recent watch objects encode. The registry
// hands every watcher of a change the same decoded object, so a change
// seen by 500 watchers is encoded once per format instead of 500 times;
// concurrent watchers wait for the first one's encoding. Objects in it are
// never modified, which is what makes their identity a safe key.
type sharedEncodings struct {
	mu      sync.Mutex
	entries map[encodingKey]*encoding
	ring    []encodingKey // oldest first out once full
	next    int
}

type encodingKey struct {
	obj      runtime.Object
	protobuf bool
}

type encoding struct {
	once sync.Once
	data []byte
	err  error
}

func newSharedEncodings(size int) *sharedEncodings {
	return &sharedEncodings{entries: make(map[encodingKey]*encoding, size), ring: make([]encodingKey, size)}
}

// encode returns obj's JSON or protobuf encoding, computing it at most once
// while obj stays among the most recent objects.
func (c *sharedEncodings) encode(obj runtime.Object, protobuf bool) ([]byte, error) {
	key := encodingKey{obj, protobuf}
	c.mu.Lock()
	e := c.entries[key]
	if e == nil {
		e = &encoding{}
		if old := c.ring[c.next]; old.obj != nil {
			delete(c.entries, old)
		}
		c.ring[c.next] = key
		c.next = (c.next + 1) % len(c.ring)
		c.entries[key] = e
	}
	c.mu.Unlock()
	e.once.Do(func() { e.data, e.err = encodeObject(obj, protobuf) })
	return e.data, e.err
}

func encodeObject(obj runtime.Object, protobuf bool) ([]byte, error) {
	if !protobuf {
		return json.Marshal(obj)
	}
	var buf bytes.Buffer
	if err := wire.protobuf.Encode(obj, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
