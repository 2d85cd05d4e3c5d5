package rest

import (
	"encoding/json"
	"testing"
)

// TestDropPath: the fields pruning reports (dotted, [i] for list items)
// leave the object, and nothing else does; a path through what is not
// there changes nothing.
func TestDropPath(t *testing.T) {
	for _, tc := range []struct{ path, want string }{
		{"spec.color", `{"metadata":{"name":"b","x":1},"spec":{"ports":[{"n":1,"y":2}],"size":1}}`},
		{"metadata.x", `{"metadata":{"name":"b"},"spec":{"color":"red","ports":[{"n":1,"y":2}],"size":1}}`},
		{"spec.ports[0].y", `{"metadata":{"name":"b","x":1},"spec":{"color":"red","ports":[{"n":1}],"size":1}}`},
		{"spec.ports[3].y", `{"metadata":{"name":"b","x":1},"spec":{"color":"red","ports":[{"n":1,"y":2}],"size":1}}`},
		{"spec.size.deeper", `{"metadata":{"name":"b","x":1},"spec":{"color":"red","ports":[{"n":1,"y":2}],"size":1}}`},
	} {
		var obj map[string]any
		_ = json.Unmarshal([]byte(`{"metadata":{"name":"b","x":1},"spec":{"size":1,"color":"red","ports":[{"n":1,"y":2}]}}`), &obj)
		dropPath(obj, tc.path)
		if got, _ := json.Marshal(obj); string(got) != tc.want {
			t.Errorf("%s: %s, want %s", tc.path, got, tc.want)
		}
	}
}
