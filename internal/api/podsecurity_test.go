package api_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/orch-dev/orch/internal/api"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// warnings collects the Warning headers a client is sent.
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

func (w *warnings) take() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := strings.Join(w.list, "\n")
	w.list = nil
	return out
}

func restrictedPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
		SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
		Containers: []corev1.Container{{Name: "app", Image: "busybox", SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}},
	}}
}

// TestPodSecurityAdmission: Pod Security Admission through the API, as
// kube-apiserver has it on: a restricted namespace refuses a privileged
// pod with Kubernetes' message and admits a compliant one; warn sends
// Warning headers (what kubectl prints); a Deployment's template is warned
// about, not refused; labels naming no level are refused; locking a
// namespace down warns of the pods it would refuse. The cluster's
// defaults come from --pod-security-admission-config-file.
func TestPodSecurityAdmission(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "psa.yaml")
	if err := os.WriteFile(config, []byte(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults:
      warn: baseline
    exemptions:
      namespaces: [kube-system]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	ts := startServerWith(t, "", 0, func(cfg *api.Config) { cfg.PodSecurityConfigFile = config })
	ctx := context.Background()
	seen := &warnings{}
	cfg := rest.CopyConfig(ts.config)
	cfg.WarningHandler = seen
	client := kubernetes.NewForConfigOrDie(cfg)

	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "locked", Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "open"}},
	} {
		if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{"locked", "open", "kube-system"} {
		// No loops run here to make it.
		if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	if _, err := client.CoreV1().Pods("locked").Create(ctx, restrictedPod("ok"), metav1.CreateOptions{}); err != nil {
		t.Errorf("a compliant pod: %v", err)
	}
	privileged := restrictedPod("priv")
	privileged.Spec.Containers[0].SecurityContext.Privileged = ptr.To(true)
	_, err := client.CoreV1().Pods("locked").Create(ctx, privileged, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || err.Error() != `pods "priv" is forbidden: violates PodSecurity "restricted:latest": privileged (container "app" must not set securityContext.privileged=true)` {
		t.Errorf("a privileged pod in a restricted namespace: %v", err)
	}
	hostRoot := restrictedPod("hostroot")
	hostRoot.Spec.HostNetwork = true
	hostRoot.Spec.Volumes = []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
	if _, err := client.CoreV1().Pods("locked").Create(ctx, hostRoot, metav1.CreateOptions{}); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), "host namespaces (hostNetwork=true)") || !strings.Contains(err.Error(), `volume "root" uses restricted volume type "hostPath"`) {
		t.Errorf("the node's root filesystem and network in a restricted namespace: %v", err)
	}
	// The cluster's default (warn=baseline) for a namespace without labels.
	seen.take()
	if _, err := client.CoreV1().Pods("open").Create(ctx, privileged, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := seen.take(); !strings.Contains(got, `would violate PodSecurity "baseline:latest": privileged (container "app" must not set securityContext.privileged=true)`) {
		t.Errorf("the default warn level: warnings %q", got)
	}
	// Templates: warned, never refused.
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: appsv1.DeploymentSpec{
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}}, Spec: privileged.Spec}}}
	if _, err := client.AppsV1().Deployments("open").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := seen.take(); !strings.Contains(got, `would violate PodSecurity "baseline:latest"`) {
		t.Errorf("a privileged Deployment: warnings %q", got)
	}
	// Locking "open" down: told which pods it would refuse.
	ns, err := client.CoreV1().Namespaces().Get(ctx, "open", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels["pod-security.kubernetes.io/enforce"] = "baseline"
	if _, err := client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := seen.take(); !strings.Contains(got, `existing pods in namespace "open" violate the new PodSecurity enforce level "baseline:latest"`) ||
		!strings.Contains(got, "priv: privileged") {
		t.Errorf("locking a namespace down: warnings %q", got)
	}
	ns.Labels["pod-security.kubernetes.io/enforce"] = "strict"
	ns.ResourceVersion = ""
	if _, err := client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) ||
		!strings.Contains(err.Error(), `metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: "strict": must be one of privileged, baseline, restricted`) {
		t.Errorf("an unknown level: %v", err)
	}
	// kube-system is exempt: its labels are ignored, and said so.
	sys, err := client.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sys.Labels == nil {
		sys.Labels = map[string]string{}
	}
	sys.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	if _, err := client.CoreV1().Namespaces().Update(ctx, sys, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := seen.take(); !strings.Contains(got, `namespace "kube-system" is exempt from Pod Security, and the policy (enforce=restricted:latest) will be ignored`) {
		t.Errorf("labelling an exempt namespace: warnings %q", got)
	}
	if _, err := client.CoreV1().Pods("kube-system").Create(ctx, privileged, metav1.CreateOptions{}); err != nil {
		t.Errorf("a privileged pod in an exempt namespace: %v", err)
	}
}
