package rest

import (
	"bytes"
	"encoding/json"

	"github.com/orch-dev/orch/internal/api/memo"
	"k8s.io/apimachinery/pkg/runtime"
)

// encodingKey is one shared watch object in one format. The registry hands
// every watcher of a change the same decoded object, so a change seen by
// 500 watchers is encoded once per format instead of 500 times. Objects
// are never modified once shared, which is what makes their identity a
// safe key.
type encodingKey struct {
	obj      runtime.Object
	protobuf bool
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
