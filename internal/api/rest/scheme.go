package rest

import (
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
)

// newScheme registers the served groups' k8s.io/api types and the meta
// types (Status, List options, Table, WatchEvent) every group shares.
func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme, coordinationv1.AddToScheme,
		discoveryv1.AddToScheme, eventsv1.AddToScheme, autoscalingv1.AddToScheme,
	} {
		utilruntime.Must(add(s))
	}
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
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
