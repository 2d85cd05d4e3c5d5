package rest

import (
	"bytes"
	"encoding/json"

	"github.com/orch-dev/orch/internal/api/memo"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// encodingKey is one shared watch object's event in one format. The
// registry hands every watcher of a change the same decoded object, so a
// change seen by 500 watchers is framed once per format and event type
// instead of 500 times. Objects are never modified once shared, which is
// what makes their identity a safe key.
type encodingKey struct {
	obj      runtime.Object
	protobuf bool
	typ      watch.EventType
}

func newSharedEncodings(size int) *memo.Ring[encodingKey, []byte] {
	return memo.New[encodingKey, []byte](size)
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
