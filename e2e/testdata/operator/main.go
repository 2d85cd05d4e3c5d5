// Command operator is a small operator built the way most are, with
// controller-runtime: it reconciles each Widget (example.com/v1) into a
// Deployment it owns, written with server-side apply, and reports the
// Deployment's ready replicas in the Widget's status. The e2e tests run it
// as a pod with its own ServiceAccount and RBAC. It is its own module:
// controller-runtime must not link into orch.
package main

import (
	"context"
	"os"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

var widgetKind = schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"}

func newWidget() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(widgetKind)
	return u
}

type reconciler struct{ client.Client }

func (r reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	widget := newWidget()
	if err := r.Get(ctx, req.NamespacedName, widget); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	replicas, _, _ := unstructured.NestedInt64(widget.Object, "spec", "replicas")
	image, _, _ := unstructured.NestedString(widget.Object, "spec", "image")
	labels := map[string]string{"widget": widget.GetName()}
	n := int32(replicas)
	dep := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: widget.GetName(), Namespace: widget.GetNamespace(), Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &n,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
					Command: []string{"sleep", "3600"}}}, TerminationGracePeriodSeconds: new(int64)},
			},
		},
	}
	if err := controllerutil.SetControllerReference(widget, dep, r.Scheme()); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.Patch(ctx, dep, client.Apply, client.FieldOwner("widget-operator"), client.ForceOwnership); err != nil { //nolint:staticcheck // the apply patch every operator of this generation uses
		return ctrl.Result{}, err
	}
	live := &appsv1.Deployment{}
	if err := r.Get(ctx, client.ObjectKeyFromObject(dep), live); err != nil {
		return ctrl.Result{}, err
	}
	ready, _, _ := unstructured.NestedInt64(widget.Object, "status", "readyReplicas")
	if ready != int64(live.Status.ReadyReplicas) || !hasStatus(widget) {
		_ = unstructured.SetNestedField(widget.Object, int64(live.Status.ReadyReplicas), "status", "readyReplicas")
		if err := r.Status().Update(ctx, widget); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, nil
}

func hasStatus(u *unstructured.Unstructured) bool {
	_, ok := u.Object["status"]
	return ok
}

func main() {
	ctrl.SetLogger(zap.New())
	log := ctrl.Log.WithName("widget-operator")
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		LeaderElection:         true,
		LeaderElectionID:       "widget-operator",
	})
	if err != nil {
		log.Error(err, "manager")
		os.Exit(1)
	}
	err = ctrl.NewControllerManagedBy(mgr).For(newWidget()).Owns(&appsv1.Deployment{}).Complete(reconciler{mgr.GetClient()})
	if err != nil {
		log.Error(err, "controller")
		os.Exit(1)
	}
	log.Info("starting")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "run")
		os.Exit(1)
	}
}
