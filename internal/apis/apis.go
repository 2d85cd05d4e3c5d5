// Package apis names the API groups and versions orch serves, with the
// k8s.io/api functions that register their types: the one list the API
// server's scheme and the clients' scheme are both built from.
package apis

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	storagev1 "k8s.io/api/storage/v1"
	svmv1 "k8s.io/api/storagemigration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
)

// GroupVersion is one served group/version and how to register its types.
type GroupVersion struct {
	schema.GroupVersion
	AddToScheme func(*runtime.Scheme) error
}

// Served lists the group/versions in the order discovery gives them.
var Served = []GroupVersion{
	{corev1.SchemeGroupVersion, corev1.AddToScheme},
	{appsv1.SchemeGroupVersion, appsv1.AddToScheme},
	{batchv1.SchemeGroupVersion, batchv1.AddToScheme},
	{certificatesv1.SchemeGroupVersion, certificatesv1.AddToScheme},
	{coordinationv1.SchemeGroupVersion, coordinationv1.AddToScheme},
	{discoveryv1.SchemeGroupVersion, discoveryv1.AddToScheme},
	{eventsv1.SchemeGroupVersion, eventsv1.AddToScheme},
	{networkingv1.SchemeGroupVersion, networkingv1.AddToScheme},
	{flowcontrolv1.SchemeGroupVersion, flowcontrolv1.AddToScheme},
	{nodev1.SchemeGroupVersion, nodev1.AddToScheme},
	{policyv1.SchemeGroupVersion, policyv1.AddToScheme},
	{rbacv1.SchemeGroupVersion, rbacv1.AddToScheme},
	{resourcev1.SchemeGroupVersion, resourcev1.AddToScheme},
	{schedulingv1.SchemeGroupVersion, schedulingv1.AddToScheme},
	{storagev1.SchemeGroupVersion, storagev1.AddToScheme},
	{svmv1.SchemeGroupVersion, svmv1.AddToScheme},
	{apiextensionsv1.SchemeGroupVersion, apiextensionsv1.AddToScheme},
	{apiregistrationv1.SchemeGroupVersion, apiregistrationv1.AddToScheme},
	{admissionregistrationv1.SchemeGroupVersion, admissionregistrationv1.AddToScheme},
	{authenticationv1.SchemeGroupVersion, authenticationv1.AddToScheme},
	{authorizationv1.SchemeGroupVersion, authorizationv1.AddToScheme},
	{autoscalingv2.SchemeGroupVersion, autoscalingv2.AddToScheme},
	{autoscalingv1.SchemeGroupVersion, autoscalingv1.AddToScheme},
	{metricsv1beta1.SchemeGroupVersion, metricsv1beta1.AddToScheme},
}

// NewScheme registers every served group's types, and the meta types
// (Status, ListOptions, WatchEvent) under the core version.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, gv := range Served {
		utilruntime.Must(gv.AddToScheme(s))
	}
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	return s
}
