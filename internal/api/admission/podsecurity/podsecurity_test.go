package podsecurity

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/pod-security-admission/api"
	"k8s.io/utils/ptr"
)

// namespaces is a fixed set of namespaces and pods.
type namespaces struct {
	ns   map[string]*corev1.Namespace
	pods map[string][]*corev1.Pod
}

func (n namespaces) Namespace(_ context.Context, name string) (*corev1.Namespace, error) {
	if ns, ok := n.ns[name]; ok {
		return ns, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, name)
}

func (n namespaces) Pods(_ context.Context, namespace string) ([]*corev1.Pod, error) {
	return n.pods[namespace], nil
}

func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// compliant is a pod the restricted level allows.
func compliant(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "locked"}, Spec: corev1.PodSpec{
		SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
		Containers: []corev1.Container{{Name: "app", Image: "busybox", SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}},
	}}
}

func newAdmission(t *testing.T, cfg Config, pods ...*corev1.Pod) *Admission {
	t.Helper()
	n := namespaces{ns: map[string]*corev1.Namespace{
		"locked":   namespace("locked", map[string]string{api.EnforceLevelLabel: "restricted"}),
		"base":     namespace("base", map[string]string{api.EnforceLevelLabel: "baseline", api.WarnLevelLabel: "restricted"}),
		"open":     namespace("open", nil),
		"old":      namespace("old", map[string]string{api.EnforceLevelLabel: "restricted", api.EnforceVersionLabel: "v1.22"}),
		"kube-sys": namespace("kube-sys", map[string]string{api.EnforceLevelLabel: "restricted"}),
	}, pods: map[string][]*corev1.Pod{}}
	for _, p := range pods {
		n.pods[p.Namespace] = append(n.pods[p.Namespace], p)
	}
	a, err := New(cfg, n)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestAdmitPod: Kubernetes' levels as its namespace labels set them: a
// restricted namespace refuses a privileged pod, a hostPath volume, a
// hostNetwork pod, and admits a compliant one; baseline with
// warn=restricted admits with a warning; exemptions and unlabelled
// namespaces let anything through.
func TestAdmitPod(t *testing.T) {
	privileged := compliant("priv")
	privileged.Spec.Containers[0].SecurityContext.Privileged = ptr.To(true)
	hostPath := compliant("hostpath")
	hostPath.Spec.Volumes = []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
	hostNet := compliant("hostnet")
	hostNet.Spec.HostNetwork = true
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
	onRuntime := plain.DeepCopy()
	onRuntime.Spec.RuntimeClassName = ptr.To("kata")
	cfg := DefaultConfig()
	cfg.Usernames, cfg.RuntimeClasses, cfg.Namespaces = []string{"system:serviceaccount:kube-system:trusted"}, []string{"kata"}, []string{"kube-sys"}
	a := newAdmission(t, cfg)
	for _, tc := range []struct {
		name, namespace, user string
		pod                   *corev1.Pod
		refused, warned       string
	}{
		{name: "compliant in restricted", namespace: "locked", pod: compliant("ok")},
		{name: "privileged in restricted", namespace: "locked", pod: privileged,
			refused: `pods "priv" is forbidden: violates PodSecurity "restricted:latest": privileged (container "app" must not set securityContext.privileged=true)`},
		{name: "hostPath in restricted", namespace: "locked", pod: hostPath, refused: `restricted volume types (volume "root" uses restricted volume type "hostPath")`},
		{name: "hostNetwork in restricted", namespace: "locked", pod: hostNet, refused: `host namespaces (hostNetwork=true)`},
		{name: "plain in restricted", namespace: "locked", pod: plain, refused: `allowPrivilegeEscalation != false`},
		{name: "plain in baseline, warned of restricted", namespace: "base", pod: plain,
			warned: `would violate PodSecurity "restricted:latest": allowPrivilegeEscalation != false`},
		{name: "privileged in baseline", namespace: "base", pod: privileged, refused: `violates PodSecurity "baseline:latest": privileged`},
		{name: "privileged unlabelled", namespace: "open", pod: privileged},
		{name: "exempt namespace", namespace: "kube-sys", pod: privileged},
		{name: "exempt user", namespace: "locked", user: "system:serviceaccount:kube-system:trusted", pod: privileged},
		{name: "exempt runtime class", namespace: "locked", pod: onRuntime},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := tc.pod.DeepCopy()
			pod.Namespace = tc.namespace
			v := a.AdmitPod(context.Background(), Request{User: tc.user, Namespace: tc.namespace, Name: pod.Name, Resource: schema.GroupResource{Resource: "pods"}}, pod, nil)
			switch {
			case tc.refused == "" && v.Err != nil:
				t.Errorf("refused: %v", v.Err)
			case tc.refused != "" && (v.Err == nil || !apierrors.IsForbidden(v.Err) || !strings.Contains(v.Err.Error(), tc.refused)):
				t.Errorf("got %v, want refused with %q", v.Err, tc.refused)
			}
			if got := strings.Join(v.Warnings, "\n"); tc.warned != "" && !strings.Contains(got, tc.warned) || tc.warned == "" && got != "" {
				t.Errorf("warnings %q, want %q", got, tc.warned)
			}
		})
	}
}

// TestAdmitPodUpdates: updates are checked only when they could change
// what the checks see, as Kubernetes does (a label change of a pod
// admitted before a namespace was locked down still goes through).
func TestAdmitPodUpdates(t *testing.T) {
	a := newAdmission(t, DefaultConfig())
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "legacy", Namespace: "locked"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
	relabelled := old.DeepCopy()
	relabelled.Labels = map[string]string{"tier": "web"}
	r := Request{Namespace: "locked", Name: "legacy", Resource: schema.GroupResource{Resource: "pods"}}
	if v := a.AdmitPod(context.Background(), r, relabelled, old); v.Err != nil {
		t.Errorf("a label change: %v", v.Err)
	}
	newImage := old.DeepCopy()
	newImage.Spec.Containers[0].Image = "busybox:2"
	if v := a.AdmitPod(context.Background(), r, newImage, old); v.Err == nil {
		t.Error("an image change was not checked")
	}
	r.Subresource = "status"
	if v := a.AdmitPod(context.Background(), r, newImage, old); v.Err != nil {
		t.Errorf("a status write: %v", v.Err)
	}
}

// TestAdmitController: a Deployment whose pods a namespace would refuse
// is admitted with a warning (Kubernetes never enforces on templates).
func TestAdmitController(t *testing.T) {
	a := newAdmission(t, DefaultConfig())
	pod := compliant("x")
	pod.Spec.HostPID = true
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "locked"},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: pod.Spec}}}
	v := a.AdmitController(context.Background(), Request{Namespace: "locked", Name: "web"}, d)
	if v.Err != nil || len(v.Warnings) != 1 || !strings.Contains(v.Warnings[0], `would violate PodSecurity "restricted:latest": host namespaces (hostPID=true)`) {
		t.Errorf("verdict %+v", v)
	}
	if v := a.AdmitController(context.Background(), Request{Namespace: "open", Name: "web"}, d); v.Err != nil || len(v.Warnings) > 0 {
		t.Errorf("in a privileged namespace: %+v", v)
	}
}

// TestAdmitNamespace: labels naming no level are refused with the label
// and the levels; making enforce stricter warns of the pods already there
// that it would refuse (one line per reason, how many pods).
func TestAdmitNamespace(t *testing.T) {
	bad := []*corev1.Pod{compliant("a"), compliant("b"), compliant("c")}
	for _, p := range bad {
		p.Namespace = "open"
		p.Spec.HostNetwork = true
	}
	a := newAdmission(t, DefaultConfig(), bad...)
	r := Request{Name: "open"}
	v := a.AdmitNamespace(context.Background(), r, namespace("open", map[string]string{api.EnforceLevelLabel: "strict"}), nil)
	if !apierrors.IsInvalid(v.Err) || !strings.Contains(v.Err.Error(), `metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: "strict": must be one of privileged, baseline, restricted`) {
		t.Errorf("an unknown level: %v", v.Err)
	}
	v = a.AdmitNamespace(context.Background(), r, namespace("open", map[string]string{api.EnforceLevelLabel: "baseline"}), namespace("open", nil))
	want := []string{
		`existing pods in namespace "open" violate the new PodSecurity enforce level "baseline:latest"`,
		`a (and 2 other pods): host namespaces`,
	}
	if v.Err != nil || len(v.Warnings) != 2 || v.Warnings[0] != want[0] || !strings.HasPrefix(v.Warnings[1], want[1]) {
		t.Errorf("verdict %+v, want warnings %q", v, want)
	}
	// Relaxing, or leaving enforce as it was, checks nothing.
	if v := a.AdmitNamespace(context.Background(), r, namespace("open", map[string]string{api.EnforceLevelLabel: "baseline", "x": "y"}),
		namespace("open", map[string]string{api.EnforceLevelLabel: "baseline"})); len(v.Warnings) > 0 || v.Err != nil {
		t.Errorf("an unrelated change: %+v", v)
	}
}

// TestLoadConfig: the file k3s and kube-apiserver take, both ways, and a
// bad one refused with what is wrong.
func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	admissionConfig := write("admission.yaml", `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults:
      enforce: baseline
      enforce-version: latest
      warn: restricted
    exemptions:
      namespaces: [kube-system]
      runtimeClasses: [kata]
      usernames: [admin]
`)
	cfg, err := LoadConfig(admissionConfig)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Defaults.Enforce.Level != api.LevelBaseline || cfg.Defaults.Warn.Level != api.LevelRestricted || cfg.Defaults.Audit.Level != api.LevelPrivileged ||
		len(cfg.Namespaces) != 1 || cfg.RuntimeClasses[0] != "kata" || cfg.Usernames[0] != "admin" {
		t.Errorf("config %+v", cfg)
	}
	bare := write("psa.yaml", "apiVersion: pod-security.admission.config.k8s.io/v1\nkind: PodSecurityConfiguration\ndefaults:\n  enforce: restricted\n")
	if cfg, err := LoadConfig(bare); err != nil || cfg.Defaults.Enforce.Level != api.LevelRestricted {
		t.Errorf("a bare PodSecurityConfiguration: %+v, %v", cfg, err)
	}
	wrong := write("wrong.yaml", "apiVersion: pod-security.admission.config.k8s.io/v1\nkind: PodSecurityConfiguration\ndefaults:\n  enforce: strict\n")
	if _, err := LoadConfig(wrong); err == nil || !strings.Contains(err.Error(), "strict") {
		t.Errorf("an unknown level: %v", err)
	}
	if cfg, err := LoadConfig(""); err != nil || !cfg.Defaults.FullyPrivileged() {
		t.Errorf("no file: %+v, %v", cfg, err)
	}
}
