package api_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestEphemeralContainers: pods/ephemeralcontainers as Kubernetes serves
// it, the way `kubectl debug` and client-go's UpdateEphemeralContainers
// use it: only spec.ephemeralContainers is taken from a write (defaulted,
// counted in the pod's generation); one may be added, never changed or
// removed; none on create, in a template or in a static pod; the fields
// a pod relies on are refused with their paths; a node and an `edit`
// user may not add one.
func TestEphemeralContainers(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	pods := ts.client.CoreV1().Pods("default")
	debug := func(name string) corev1.EphemeralContainer {
		return corev1.EphemeralContainer{TargetContainerName: "app", EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: name, Image: "busybox", Command: []string{"sh"}, Stdin: true, TTY: true}}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "app", Image: "busybox:1.36"}},
		Volumes:    []corev1.Volume{{Name: "data"}}}}
	early := pod.DeepCopy()
	early.Spec.EphemeralContainers = []corev1.EphemeralContainer{debug("early")}
	if _, err := pods.Create(ctx, early, metav1.CreateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.ephemeralContainers: Forbidden: cannot be set on create") {
		t.Errorf("a pod created with an ephemeral container: %v", err)
	}
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// client-go's UpdateEphemeralContainers, with changes beside it that
	// the subresource does not take.
	sent := created.DeepCopy()
	sent.Spec.EphemeralContainers = []corev1.EphemeralContainer{debug("debugger")}
	sent.Spec.Containers[0].Image = "busybox:1.37"
	sent.Labels = map[string]string{"sneaked": "in"}
	sent.Status.Phase = corev1.PodRunning
	got, err := pods.UpdateEphemeralContainers(ctx, "web", sent, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ec := got.Spec.EphemeralContainers
	if len(ec) != 1 || ec[0].Name != "debugger" || ec[0].TargetContainerName != "app" || ec[0].ImagePullPolicy != corev1.PullAlways ||
		ec[0].TerminationMessagePath != corev1.TerminationMessagePathDefault || ec[0].TerminationMessagePolicy != corev1.TerminationMessageReadFile {
		t.Errorf("ephemeral containers as stored (defaulted): %+v", ec)
	}
	if got.Spec.Containers[0].Image != "busybox:1.36" || got.Labels["sneaked"] != "" || got.Status.Phase != corev1.PodPending {
		t.Errorf("the write changed more than the ephemeral containers: image %s, labels %v, phase %s", got.Spec.Containers[0].Image, got.Labels, got.Status.Phase)
	}
	if got.Generation != created.Generation+1 {
		t.Errorf("generation %d after adding an ephemeral container to a pod at %d", got.Generation, created.Generation)
	}
	// GET of the subresource is the pod.
	if res := ts.client.CoreV1().RESTClient().Get().Namespace("default").Resource("pods").Name("web").SubResource("ephemeralcontainers").Do(ctx); res.Error() != nil {
		t.Errorf("get pods/ephemeralcontainers: %v", res.Error())
	} else if obj, err := res.Get(); err != nil || len(obj.(*corev1.Pod).Spec.EphemeralContainers) != 1 {
		t.Errorf("get pods/ephemeralcontainers: %v, %v", obj, err)
	}

	// A strategic merge patch, as kubectl debug sends it, adds a second.
	patch := `{"spec":{"ephemeralContainers":[{"name":"second","image":"busybox","targetContainerName":"app","volumeMounts":[{"name":"data","mountPath":"/data"}]}]}}`
	got, err = pods.Patch(ctx, "web", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "ephemeralcontainers")
	if err != nil || len(got.Spec.EphemeralContainers) != 2 {
		t.Fatalf("strategic merge patch of pods/ephemeralcontainers: %+v, %v", got.Spec.EphemeralContainers, err)
	}

	// Kubernetes' refusals, each with its field path.
	refused := []struct {
		name   string
		change func(p *corev1.Pod)
		want   string
	}{
		{"removed", func(p *corev1.Pod) {
			p.Spec.EphemeralContainers = slices.DeleteFunc(p.Spec.EphemeralContainers, func(c corev1.EphemeralContainer) bool { return c.Name == "debugger" })
		}, `spec.ephemeralContainers: Forbidden: existing ephemeral containers "debugger" may not be removed`},
		{"changed", func(p *corev1.Pod) {
			for i := range p.Spec.EphemeralContainers {
				if p.Spec.EphemeralContainers[i].Name == "debugger" {
					p.Spec.EphemeralContainers[i].Image = "alpine"
				}
			}
		},
			`spec.ephemeralContainers: Forbidden: existing ephemeral containers "debugger" may not be changed`},
		{"ports", func(p *corev1.Pod) {
			c := debug("ports")
			c.Ports = []corev1.ContainerPort{{ContainerPort: 80, Protocol: corev1.ProtocolTCP}}
			p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, c)
		}, "spec.ephemeralContainers[2].ports: Forbidden: cannot be set for an Ephemeral Container"},
		{"resources and probes", func(p *corev1.Pod) {
			c := debug("heavy")
			c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}
			c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}
			c.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}
			p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, c)
		}, "spec.ephemeralContainers[2].resources: Forbidden: cannot be set for an Ephemeral Container"},
		{"a target that is not there", func(p *corev1.Pod) {
			c := debug("lost")
			c.TargetContainerName = "db"
			p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, c)
		}, `spec.ephemeralContainers[2].targetContainerName: Not found: "db"`},
		{"a container's name", func(p *corev1.Pod) { p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, debug("app")) },
			`spec.ephemeralContainers[2].name: Duplicate value: "app"`},
		{"a subPath", func(p *corev1.Pod) {
			c := debug("sub")
			c.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/d", SubPath: "x"}}
			p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, c)
		}, "spec.ephemeralContainers[2].volumeMounts[0].subPath: Forbidden: cannot be set for an Ephemeral Container"},
	}
	for _, tc := range refused {
		current, err := pods.Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tc.change(current)
		if _, err := pods.UpdateEphemeralContainers(ctx, "web", current, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v\nwant %s", tc.name, err, tc.want)
		}
	}
	current, err := pods.Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(current.Spec.EphemeralContainers) != 2 {
		t.Errorf("after the refused writes: %+v", current.Spec.EphemeralContainers)
	}
	// Through the pod itself, as through no other way, they do not change.
	current.Spec.EphemeralContainers = append(current.Spec.EphemeralContainers, debug("third"))
	if _, err := pods.Update(ctx, current, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "pod updates may not change fields") {
		t.Errorf("ephemeral containers added by an update of the pod: %v", err)
	}

	// Not in a template.
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "d"}, Spec: appsv1.DeploymentSpec{
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"a": "b"}}, Spec: *early.Spec.DeepCopy()}}}
	if _, err := ts.client.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); !apierrors.IsInvalid(err) ||
		!strings.Contains(err.Error(), "spec.template.spec.ephemeralContainers: Forbidden: ephemeral containers not allowed in pod template") {
		t.Errorf("a template with an ephemeral container: %v", err)
	}

	// Not in a static pod's mirror.
	mirror := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "static-n1", Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "x"}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
	if mirror, err = pods.Create(ctx, mirror, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mirror.Spec.EphemeralContainers = []corev1.EphemeralContainer{debug("debugger")}
	if _, err := pods.UpdateEphemeralContainers(ctx, mirror.Name, mirror, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) ||
		!strings.Contains(err.Error(), "static pods do not support ephemeral containers") {
		t.Errorf("an ephemeral container in a mirror pod: %v", err)
	}

	// Who may: a node may not (even for a pod bound to it), nor a user
	// with the pod rules of Kubernetes' edit role, which do not list the
	// subresource.
	bound := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bound"}, Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
	if _, err := pods.Create(ctx, bound, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	body := `{"spec":{"ephemeralContainers":[{"name":"x","image":"busybox"}]}}`
	n1 := ts.as(t, "system:node:n1", "system:nodes")
	if code, msg := n1.do("PATCH", "/api/v1/namespaces/default/pods/bound/ephemeralcontainers", "application/strategic-merge-patch+json", body); code != 403 {
		t.Errorf("a node adding an ephemeral container: %d %s", code, msg)
	}
	// The pod rules of Kubernetes' edit role (the API server alone runs
	// no aggregation of roles).
	if _, err := ts.client.RbacV1().Roles("default").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "pod-editor"},
		Rules: []rbacv1.PolicyRule{{Verbs: []string{"create", "delete", "deletecollection", "patch", "update"}, APIGroups: []string{""},
			Resources: []string{"pods", "pods/attach", "pods/proxy", "pods/exec", "pods/portforward"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.client.RbacV1().RoleBindings("default").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "jane-edit"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pod-editor"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "jane"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	jane := ts.as(t, "jane")
	deadline := time.Now().Add(10 * time.Second)
	for code, msg := 0, ""; code != 200; {
		if code, msg = jane.do("PATCH", "/api/v1/namespaces/default/pods/bound", "application/merge-patch+json", `{"metadata":{"labels":{"ok":"yes"}}}`); code != 200 && time.Now().After(deadline) {
			t.Fatalf("the edit user patching the pod itself: %d %s", code, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, msg := jane.do("PATCH", "/api/v1/namespaces/default/pods/bound/ephemeralcontainers", "application/strategic-merge-patch+json", body); code != 403 ||
		!strings.Contains(msg, `cannot patch resource "pods/ephemeralcontainers"`) {
		t.Errorf("an edit user adding an ephemeral container: %d %s", code, msg)
	}

	// Discovery lists it, as kubectl debug looks for it.
	list, err := ts.client.Discovery().ServerResourcesForGroupVersion("v1")
	if err != nil {
		t.Fatal(err)
	}
	found := ""
	for _, r := range list.APIResources {
		if r.Name == "pods/ephemeralcontainers" {
			found = fmt.Sprint(r.Kind, r.Verbs)
		}
	}
	if found != "Pod[get patch update]" {
		t.Errorf("discovery of pods/ephemeralcontainers: %q", found)
	}
}
