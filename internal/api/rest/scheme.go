package rest

import (
	"github.com/orch-dev/orch/internal/apis"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
)

// newScheme registers the served groups' k8s.io/api types and the meta
// types (Status, List options, Table, WatchEvent) every group shares.
func newScheme() *runtime.Scheme {
	s := apis.NewScheme()
	// Query parameters decode as meta.k8s.io/v1 options.
	metav1.AddToGroupVersion(s, metav1.SchemeGroupVersion)
	utilruntime.Must(metav1.AddMetaToScheme(s))
	return s
}

// wire is the scheme and serializers every handler shares; both are
// read-only once built.
var wire = newSerializers(newScheme())

// serializers decode request bodies (JSON and YAML, each in a lenient form
// and a strict one that reports unknown and duplicate fields for
// fieldValidation, and protobuf) and encode protobuf responses.
type serializers struct {
	scheme                             *runtime.Scheme
	json, yaml, strictJSON, strictYAML *json.Serializer
	protobuf                           *protobuf.Serializer
}

func newSerializers(s *runtime.Scheme) serializers {
	mk := func(yaml, strict bool) *json.Serializer {
		return json.NewSerializerWithOptions(json.DefaultMetaFactory, s, s, json.SerializerOptions{Yaml: yaml, Strict: strict})
	}
	return serializers{scheme: s, json: mk(false, false), yaml: mk(true, false), strictJSON: mk(false, true),
		strictYAML: mk(true, true), protobuf: protobuf.NewSerializer(s, s)}
}
