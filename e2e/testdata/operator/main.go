// Command operator is a small operator built the way most are, with
// controller-runtime and kubebuilder's layout: it reconciles each Widget
// (example.com/v1) into a Deployment it owns, written with server-side
// apply, and reports the Deployment's ready replicas in the Widget's
// status; its webhook server defaults Widgets (mutating) and refuses
// invalid ones (validating), on the certificate mounted where
// controller-runtime looks for it, and is ready once that server serves.
// The e2e tests run it as a pod with its own ServiceAccount and RBAC. It
// is its own module: controller-runtime must not link into orch.
package main

import (
	"context"
	"fmt"
	"os"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

type reconciler struct{ client.Client }

func (r reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	widget := &Widget{}
	if err := r.Get(ctx, req.NamespacedName, widget); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	labels := map[string]string{"widget": widget.Name}
	dep := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: widget.Name, Namespace: widget.Namespace, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: widget.Spec.Replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: widget.Spec.Image, ImagePullPolicy: corev1.PullIfNotPresent,
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
	if ready := widget.Status.ReadyReplicas; ready == nil || *ready != live.Status.ReadyReplicas {
		widget.Status.ReadyReplicas = &live.Status.ReadyReplicas
		if err := r.Status().Update(ctx, widget); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, nil
}

// defaultImage is what a Widget that names no image runs.
const defaultImage = "busybox:test"

// maxReplicas is the most replicas a Widget may ask for.
const maxReplicas = 5

// defaulter fills in what a Widget leaves out: its image, and the tier
// label every Widget carries.
type defaulter struct{}

func (defaulter) Default(_ context.Context, w *Widget) error {
	if w.Spec.Image == "" {
		w.Spec.Image = defaultImage
	}
	if w.Labels["example.com/tier"] == "" {
		if w.Labels == nil {
			w.Labels = map[string]string{}
		}
		w.Labels["example.com/tier"] = "standard"
	}
	return nil
}

// validator refuses a Widget of too many replicas, and warns of one of
// none.
type validator struct{}

func (validator) check(w *Widget) (admission.Warnings, error) {
	if w.Spec.Replicas == nil {
		return nil, nil // the CRD's default, 1
	}
	if n := *w.Spec.Replicas; n > maxReplicas {
		return nil, apierrors.NewInvalid(groupVersion.WithKind("Widget").GroupKind(), w.Name, field.ErrorList{
			field.Invalid(field.NewPath("spec", "replicas"), n, fmt.Sprintf("a Widget runs at most %d replicas", maxReplicas))})
	} else if n == 0 {
		return admission.Warnings{"a Widget of 0 replicas runs nothing"}, nil
	}
	return nil, nil
}

func (v validator) ValidateCreate(_ context.Context, w *Widget) (admission.Warnings, error) {
	return v.check(w)
}

func (v validator) ValidateUpdate(_ context.Context, _, w *Widget) (admission.Warnings, error) {
	return v.check(w)
}

func (validator) ValidateDelete(context.Context, *Widget) (admission.Warnings, error) {
	return nil, nil
}

func main() {
	ctrl.SetLogger(zap.New())
	log := ctrl.Log.WithName("widget-operator")
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		log.Error(err, "scheme")
		os.Exit(1)
	}
	if err := addToScheme(scheme); err != nil {
		log.Error(err, "scheme")
		os.Exit(1)
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: ":8081",
		LeaderElection:         true,
		LeaderElectionID:       "widget-operator",
	})
	if err != nil {
		log.Error(err, "manager")
		os.Exit(1)
	}
	err = ctrl.NewControllerManagedBy(mgr).For(&Widget{}).Owns(&appsv1.Deployment{}).Complete(reconciler{mgr.GetClient()})
	if err != nil {
		log.Error(err, "controller")
		os.Exit(1)
	}
	if err := ctrl.NewWebhookManagedBy(mgr, &Widget{}).WithDefaulter(defaulter{}).WithValidator(validator{}).Complete(); err != nil {
		log.Error(err, "webhooks")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		log.Error(err, "readiness check")
		os.Exit(1)
	}
	log.Info("starting")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "run")
		os.Exit(1)
	}
}
