package api_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/orch-dev/orch/internal/api"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func insecureClient() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
}

func TestDefaultObjects(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	for _, ns := range []string{"default", "kube-system", "kube-public", "kube-node-lease"} {
		got, err := ts.client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("namespace %s: %v", ns, err)
		}
		if got.Status.Phase != corev1.NamespaceActive || got.Labels[corev1.LabelMetadataName] != ns {
			t.Errorf("namespace %s: phase %q labels %v", ns, got.Status.Phase, got.Labels)
		}
	}
	svc, err := ts.client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != "10.43.0.1" || svc.Spec.Ports[0].Port != 443 {
		t.Errorf("kubernetes service: clusterIP %s ports %v", svc.Spec.ClusterIP, svc.Spec.Ports)
	}
	ep, err := ts.client.CoreV1().Endpoints("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil || ep.Subsets[0].Addresses[0].IP != "192.0.2.10" {
		t.Fatalf("kubernetes endpoints: %v %v", ep, err)
	}
	// The default ServiceCIDR describes --service-cidr, Ready, as
	// kube-apiserver keeps it (the conformance suite reads it).
	cidr, err := ts.client.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil || len(cidr.Spec.CIDRs) != 1 || cidr.Spec.CIDRs[0] != "10.43.0.0/16" ||
		len(cidr.Status.Conditions) != 1 || cidr.Status.Conditions[0].Type != "Ready" || cidr.Status.Conditions[0].Status != metav1.ConditionTrue {
		t.Fatalf("default ServiceCIDR: %+v %v", cidr, err)
	}
	// API Priority and Fairness' mandatory objects.
	for _, name := range []string{"exempt", "catch-all"} {
		if _, err := ts.client.FlowcontrolV1().FlowSchemas().Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("FlowSchema %s: %v", name, err)
		}
		if _, err := ts.client.FlowcontrolV1().PriorityLevelConfigurations().Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("PriorityLevelConfiguration %s: %v", name, err)
		}
	}
}

// TestLoopbackAdvertised: a server advertised at a loopback address gives
// the kubernetes Service no endpoints, as Kubernetes' endpoint validation
// refuses such addresses (each node's proxy would send pods to their own
// node's loopback), and a slice naming one is refused.
func TestLoopbackAdvertised(t *testing.T) {
	ts := startServerWith(t, "", 0, func(c *api.Config) { c.AdvertiseAddress = "127.0.0.1" })
	ctx := context.Background()
	if _, err := ts.client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.client.DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the kubernetes EndpointSlice: %v, want none", err)
	}
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "local"}, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"127.0.0.1"}}}}
	_, err := ts.client.DiscoveryV1().EndpointSlices("default").Create(ctx, s, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "endpoints[0].addresses[0]") {
		t.Errorf("a loopback endpoint: %v, want Invalid at endpoints[0].addresses[0]", err)
	}
}

// TestKubeDNSService: the server makes kube-system/kube-dns at
// --cluster-dns, as distributions do, with internalTrafficPolicy Local
// (each node answers its own pods); an address outside the service
// network leaves none, and the server still starts.
func TestKubeDNSService(t *testing.T) {
	ts := startServerWith(t, "", 0, func(c *api.Config) { c.ClusterDNS = "10.43.0.10" })
	svc, err := ts.client.CoreV1().Services("kube-system").Get(context.Background(), "kube-dns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != "10.43.0.10" || len(svc.Spec.Ports) != 2 || svc.Spec.Ports[0].Port != 53 || svc.Spec.Ports[0].TargetPort.IntValue() != api.KubeDNSTargetPort ||
		ptr.Deref(svc.Spec.InternalTrafficPolicy, "") != corev1.ServiceInternalTrafficPolicyLocal || svc.Labels["k8s-app"] != "kube-dns" || len(svc.Spec.Selector) != 0 {
		t.Errorf("kube-dns: %+v", svc)
	}
	outside := startServerWith(t, "", 0, func(c *api.Config) { c.ClusterDNS = "192.168.0.10" })
	if _, err := outside.client.CoreV1().Services("kube-system").Get(context.Background(), "kube-dns", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("kube-dns outside the service network: %v, want none", err)
	}
}

func configMap(name string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data}
}

func TestCreateGetUpdateDelete(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	cms := ts.client.CoreV1().ConfigMaps("default")
	created, err := cms.Create(ctx, configMap("c1", map[string]string{"a": "1"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if created.UID == "" || created.ResourceVersion == "" || created.CreationTimestamp.IsZero() {
		t.Fatalf("create did not fill metadata: %+v", created.ObjectMeta)
	}
	if _, err := cms.Create(ctx, configMap("c1", nil), metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("second create: want AlreadyExists (409), got %v", err)
	}
	got, err := cms.Get(ctx, "c1", metav1.GetOptions{})
	if err != nil || got.Data["a"] != "1" || got.ResourceVersion != created.ResourceVersion {
		t.Fatalf("get: %v %v", got, err)
	}
	got.Data["a"] = "2"
	updated, err := cms.Update(ctx, got, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if updated.ResourceVersion == got.ResourceVersion {
		t.Errorf("update kept resourceVersion %s", updated.ResourceVersion)
	}
	// Kubernetes: an update from a stale resourceVersion is a 409 Conflict.
	got.Data["a"] = "3"
	if _, err := cms.Update(ctx, got, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("stale update: want Conflict, got %v", err)
	}
	// An update that changes nothing keeps the resourceVersion.
	same, err := cms.Update(ctx, updated, metav1.UpdateOptions{})
	if err != nil || same.ResourceVersion != updated.ResourceVersion {
		t.Fatalf("no-op update: rv %s -> %s, %v", updated.ResourceVersion, same.ResourceVersion, err)
	}
	if err := cms.Delete(ctx, "c1", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: ptr.To(types.UID("wrong"))}}); !apierrors.IsConflict(err) {
		t.Fatalf("delete with wrong uid precondition: want Conflict, got %v", err)
	}
	if err := cms.Delete(ctx, "c1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Get(ctx, "c1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get after delete: want NotFound, got %v", err)
	}
}

func TestGenerateNameAndGeneration(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	cm, err := ts.client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "gen-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cm.Name, "gen-") || len(cm.Name) != len("gen-")+5 {
		t.Errorf("generated name %q", cm.Name)
	}
	deps := ts.client.AppsV1().Deployments("default")
	d, err := deps.Create(ctx, deployment("web", 2), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Generation != 1 {
		t.Errorf("generation on create = %d, want 1", d.Generation)
	}
	// Kubernetes' defaults are applied on admission.
	if d.Spec.Strategy.RollingUpdate.MaxSurge.String() != "25%" || *d.Spec.RevisionHistoryLimit != 10 ||
		*d.Spec.ProgressDeadlineSeconds != 600 || d.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyAlways ||
		d.Spec.Template.Spec.Containers[0].ImagePullPolicy != corev1.PullAlways {
		t.Errorf("defaults not applied: %+v", d.Spec)
	}
	p, err := ts.client.CoreV1().Pods("default").Create(ctx, pod("defaults"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s := p.Spec; s.ServiceAccountName != "default" || s.DeprecatedServiceAccount != "default" || s.DNSPolicy != corev1.DNSClusterFirst ||
		*s.TerminationGracePeriodSeconds != 30 || s.SchedulerName != "default-scheduler" || s.Containers[0].ImagePullPolicy != corev1.PullIfNotPresent ||
		len(s.Tolerations) != 2 || s.Containers[0].TerminationMessagePolicy != corev1.TerminationMessageReadFile {
		t.Errorf("pod defaults not applied: %+v", s)
	}
	d.Labels = map[string]string{"x": "y"}
	d, err = deps.Update(ctx, d, metav1.UpdateOptions{})
	if err != nil || d.Generation != 1 {
		t.Fatalf("metadata-only update: generation %d, %v", d.Generation, err)
	}
	d.Spec.Replicas = ptr.To[int32](3)
	d, err = deps.Update(ctx, d, metav1.UpdateOptions{})
	if err != nil || d.Generation != 2 {
		t.Fatalf("spec update: generation %d, %v", d.Generation, err)
	}
	// Status written through the main resource is ignored, and the other way round.
	d.Status.Replicas = 7
	d, err = deps.Update(ctx, d, metav1.UpdateOptions{})
	if err != nil || d.Status.Replicas != 0 {
		t.Fatalf("status through main resource: %d, %v", d.Status.Replicas, err)
	}
	d.Status.Replicas = 7
	d.Spec.Replicas = ptr.To[int32](9)
	d, err = deps.UpdateStatus(ctx, d, metav1.UpdateOptions{})
	if err != nil || d.Status.Replicas != 7 || *d.Spec.Replicas != 3 {
		t.Fatalf("status update: status %d spec %d, %v", d.Status.Replicas, *d.Spec.Replicas, err)
	}
	scale, err := deps.GetScale(ctx, "web", metav1.GetOptions{})
	if err != nil || scale.Spec.Replicas != 3 || scale.Status.Selector != "app=web" {
		t.Fatalf("scale: %+v %v", scale, err)
	}
	scale.Spec.Replicas = 5
	if _, err := deps.UpdateScale(ctx, "web", scale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d, _ = deps.Get(ctx, "web", metav1.GetOptions{})
	if *d.Spec.Replicas != 5 {
		t.Errorf("replicas after scale = %d", *d.Spec.Replicas)
	}
}

func deployment(name string, replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
			},
		},
	}
}

func pod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "p"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox:1.36"}}},
	}
}

func TestValidationErrors(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	noSelector := deployment("bad", 1)
	noSelector.Spec.Selector = nil
	mismatch := deployment("bad2", 1)
	mismatch.Spec.Selector.MatchLabels = map[string]string{"app": "other"}
	noContainers := pod("nocontainers")
	noContainers.Spec.Containers = nil
	badName := configMap("Bad_Name", nil)
	for _, tc := range []struct {
		name   string
		create func() error
		field  string
	}{
		{"deployment without selector", func() error {
			_, err := ts.client.AppsV1().Deployments("default").Create(ctx, noSelector, metav1.CreateOptions{})
			return err
		}, "spec.selector"},
		{"selector not matching template", func() error {
			_, err := ts.client.AppsV1().Deployments("default").Create(ctx, mismatch, metav1.CreateOptions{})
			return err
		}, "spec.template.metadata.labels"},
		{"pod without containers", func() error {
			_, err := ts.client.CoreV1().Pods("default").Create(ctx, noContainers, metav1.CreateOptions{})
			return err
		}, "spec.containers"},
		{"invalid name", func() error {
			_, err := ts.client.CoreV1().ConfigMaps("default").Create(ctx, badName, metav1.CreateOptions{})
			return err
		}, "metadata.name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.create()
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want 422 Invalid, got %v", err)
			}
			st := err.(apierrors.APIStatus).Status()
			found := false
			for _, c := range st.Details.Causes {
				found = found || c.Field == tc.field
			}
			if !found {
				t.Errorf("causes %+v do not name %s", st.Details.Causes, tc.field)
			}
		})
	}
	t.Run("namespace must exist", func(t *testing.T) {
		_, err := ts.client.CoreV1().ConfigMaps("nope").Create(ctx, configMap("c", nil), metav1.CreateOptions{})
		if !apierrors.IsNotFound(err) || !strings.Contains(err.Error(), `namespaces "nope" not found`) {
			t.Fatalf("want NotFound for the namespace, got %v", err)
		}
	})
	t.Run("pod spec is immutable", func(t *testing.T) {
		p, err := ts.client.CoreV1().Pods("default").Create(ctx, pod("imm"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Spec.Containers[0].Image = "busybox:1.37"
		if p, err = ts.client.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("image change is allowed: %v", err)
		}
		p.Spec.Containers[0].Name = "renamed"
		if _, err := ts.client.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
			t.Fatalf("container rename: want Invalid, got %v", err)
		}
	})
	t.Run("deployment selector is immutable", func(t *testing.T) {
		d, err := ts.client.AppsV1().Deployments("default").Create(ctx, deployment("immsel", 1), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		d.Spec.Selector.MatchLabels["extra"] = "x"
		d.Spec.Template.Labels["extra"] = "x"
		_, err = ts.client.AppsV1().Deployments("default").Update(ctx, d, metav1.UpdateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.selector") {
			t.Fatalf("want Invalid on spec.selector, got %v", err)
		}
	})
}

// rawRequest sends a request as the admin and returns code and body.
func (ts *testServer) rawRequest(t *testing.T, method, path, contentType, body string) (int, string, http.Header) {
	t.Helper()
	c, err := restHTTPClient(ts)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(method, ts.config.Host+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var sb strings.Builder
	_, _ = fmt.Fprint(&sb, readAll(resp))
	return resp.StatusCode, sb.String(), resp.Header
}

// TestDeletePropagation: the propagation policy becomes the garbage
// collector's finalizer, as in Kubernetes; Jobs and ReplicationControllers
// orphan by default.
func TestDeletePropagation(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	cms := ts.client.CoreV1().ConfigMaps("default")
	for _, tt := range []struct {
		name      string
		opts      metav1.DeleteOptions
		finalizer string // "" when the object is gone at once
	}{
		{"background", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}, ""},
		{"foreground", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}, metav1.FinalizerDeleteDependents},
		{"orphan", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationOrphan)}, metav1.FinalizerOrphanDependents},
		{"orphan-dependents", metav1.DeleteOptions{OrphanDependents: ptr.To(true)}, metav1.FinalizerOrphanDependents}, //nolint:staticcheck // old clients still send it
	} {
		if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: tt.name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := cms.Delete(ctx, tt.name, tt.opts); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		cm, err := cms.Get(ctx, tt.name, metav1.GetOptions{})
		if tt.finalizer == "" {
			if !apierrors.IsNotFound(err) {
				t.Errorf("%s: still there: %v", tt.name, err)
			}
			continue
		}
		if err != nil || cm.DeletionTimestamp == nil || len(cm.Finalizers) != 1 || cm.Finalizers[0] != tt.finalizer {
			t.Errorf("%s: %+v %v", tt.name, cm.ObjectMeta, err)
		}
	}
	both := metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationOrphan), OrphanDependents: ptr.To(true)} //nolint:staticcheck // old clients still send it
	if err := cms.Delete(ctx, "foreground", both); !apierrors.IsInvalid(err) {
		t.Errorf("both policies: %v", err)
	}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "j"}, Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}}
	if _, err := ts.client.BatchV1().Jobs("default").Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := ts.client.BatchV1().Jobs("default").Delete(ctx, "j", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if j, err := ts.client.BatchV1().Jobs("default").Get(ctx, "j", metav1.GetOptions{}); err != nil || len(j.Finalizers) != 1 || j.Finalizers[0] != metav1.FinalizerOrphanDependents {
		t.Errorf("a job deleted without a policy orphans its pods: %+v %v", j.Finalizers, err)
	}
	// So do v1 ReplicationControllers (Kubernetes' conformance suite: "should
	// orphan pods created by rc if deleteOptions.OrphanDependents is nil").
	rcs := ts.client.CoreV1().ReplicationControllers("default")
	rc := &corev1.ReplicationController{ObjectMeta: metav1.ObjectMeta{Name: "rc"}, Spec: corev1.ReplicationControllerSpec{
		Replicas: ptr.To[int32](0), Selector: map[string]string{"app": "rc"}, Template: &corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "rc"}}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}}
	if _, err := rcs.Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := rcs.Delete(ctx, "rc", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := rcs.Get(ctx, "rc", metav1.GetOptions{}); err != nil || len(got.Finalizers) != 1 || got.Finalizers[0] != metav1.FinalizerOrphanDependents {
		t.Errorf("a replication controller deleted without a policy orphans its pods: %+v %v", got.Finalizers, err)
	}
}
