package main

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The Widget API, as kubebuilder lays one out (api/v1/widget_types.go
// and the deep copies controller-gen writes, here by hand).

// groupVersion is the Widget API's.
var groupVersion = schema.GroupVersion{Group: "example.com", Version: "v1"}

// WidgetSpec is what a Widget asks for.
type WidgetSpec struct {
	Replicas *int32 `json:"replicas,omitempty"`
	Image    string `json:"image,omitempty"`
}

// WidgetStatus is what the operator reports.
type WidgetStatus struct {
	ReadyReplicas *int32 `json:"readyReplicas,omitempty"`
}

// Widget runs its image as a Deployment of its replicas.
type Widget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              WidgetSpec   `json:"spec,omitempty"`
	Status            WidgetStatus `json:"status,omitempty"`
}

// WidgetList is a list of Widgets.
type WidgetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Widget `json:"items"`
}

func addToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(groupVersion, &Widget{}, &WidgetList{})
	metav1.AddToGroupVersion(s, groupVersion)
	return nil
}

func copyInt32(p *int32) *int32 {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// DeepCopy copies w.
func (w *Widget) DeepCopy() *Widget {
	if w == nil {
		return nil
	}
	out := &Widget{TypeMeta: w.TypeMeta, Spec: w.Spec, Status: w.Status}
	w.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec.Replicas = copyInt32(w.Spec.Replicas)
	out.Status.ReadyReplicas = copyInt32(w.Status.ReadyReplicas)
	return out
}

// DeepCopyObject copies w.
func (w *Widget) DeepCopyObject() runtime.Object { return w.DeepCopy() }

// DeepCopyObject copies l.
func (l *WidgetList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &WidgetList{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	for i := range l.Items {
		out.Items = append(out.Items, *l.Items[i].DeepCopy())
	}
	return out
}
