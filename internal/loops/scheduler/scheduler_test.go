package scheduler_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/scheduler"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// fixture is a real API server, hollow nodes, and the scheduler running
// over the loops' in-process client.
type fixture struct {
	t      *testing.T
	ctx    context.Context
	client kubernetes.Interface
	nodes  *hollow.Cluster
}

func start(t *testing.T, nodes map[string]hollow.NodeOptions) *fixture {
	t.Helper()
	srv := apitest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	loops, err := kube.NewForConfig(srv.Loopback())
	if err != nil {
		t.Fatal(err)
	}
	factory := kube.NewInformers(loops, 0)
	s, err := scheduler.New(loops, factory, kube.NewEvents(ctx, loops, slog.Default()).Recorder(scheduler.Name), scheduler.Options{RetryEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, ctx: ctx, client: srv.Client, nodes: hollow.New(srv.Client, hollow.Options{LeaseEvery: -1})}
	for name, o := range nodes {
		f.addNode(name, o)
	}
	factory.Start(ctx)
	go s.Run(ctx)
	go f.nodes.Run(ctx)
	t.Cleanup(func() { cancel(); factory.Shutdown() })
	return f
}

func (f *fixture) addNode(name string, o hollow.NodeOptions) {
	f.t.Helper()
	if err := f.nodes.AddNode(f.ctx, name, o); err != nil {
		f.t.Fatal(err)
	}
}

// owner makes pods look like one ReplicaSet's.
var owner = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-1", UID: types.UID("4f8e5c8a-0000-4000-8000-000000000001"), Controller: ptr.To(true)}}

func pod(name, cpu string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": "web"}, OwnerReferences: owner},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	if cpu != "" {
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}
	}
	return p
}

func (f *fixture) create(pods ...*corev1.Pod) {
	f.t.Helper()
	for _, p := range pods {
		if _, err := f.client.CoreV1().Pods(p.Namespace).Create(f.ctx, p, metav1.CreateOptions{}); err != nil {
			f.t.Fatal(err)
		}
	}
}

// placement waits until want pods are bound and returns pods per node.
func (f *fixture) placement(want int) map[string]int {
	f.t.Helper()
	var perNode map[string]int
	err := wait.PollUntilContextTimeout(f.ctx, 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := f.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		perNode = map[string]int{}
		bound := 0
		for _, p := range list.Items {
			if p.Spec.NodeName != "" {
				perNode[p.Spec.NodeName]++
				bound++
			}
		}
		return bound >= want, nil
	})
	if err != nil {
		f.t.Fatalf("waiting for %d bound pods: %v (have %v)", want, err, perNode)
	}
	return perNode
}

// unschedulable waits for the pod's PodScheduled=False condition.
func (f *fixture) unschedulable(name string) string {
	f.t.Helper()
	var message string
	err := wait.PollUntilContextTimeout(f.ctx, 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := f.client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("pod %s was bound to %s", name, p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				message = c.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		f.t.Fatalf("waiting for %s to be unschedulable: %v", name, err)
	}
	return message
}

func threeNodes() map[string]hollow.NodeOptions {
	return map[string]hollow.NodeOptions{"n1": {}, "n2": {}, "n3": {}}
}

func TestSpreadsAControllersPods(t *testing.T) {
	f := start(t, threeNodes())
	for i := range 6 {
		f.create(pod(fmt.Sprintf("web-%d", i), "100m"))
	}
	got := f.placement(6)
	if got["n1"] != 2 || got["n2"] != 2 || got["n3"] != 2 {
		t.Fatalf("6 pods of one owner on 3 equal nodes: %v, want 2/2/2", got)
	}
	// The hollow kubelet runs them.
	err := wait.PollUntilContextTimeout(f.ctx, 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := f.client.CoreV1().Pods("default").Get(ctx, "web-0", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", err
	})
	if err != nil {
		t.Fatalf("bound pod never ran: %v", err)
	}
	// kubectl describe shows where it went.
	err = wait.PollUntilContextTimeout(f.ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := f.client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=web-0"})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == "Scheduled" && strings.HasPrefix(e.Message, "Successfully assigned default/web-0 to n") {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no Scheduled event: %v", err)
	}
}

func TestPodThatFitsNowhereStaysPending(t *testing.T) {
	f := start(t, threeNodes())
	f.create(pod("huge", "64"))
	msg := f.unschedulable("huge")
	if msg != "0/3 nodes are available: 3 Insufficient cpu." {
		t.Errorf("message %q", msg)
	}
	// kubectl describe shows the event.
	err := wait.PollUntilContextTimeout(f.ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := f.client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=huge"})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == "FailedScheduling" && e.Type == corev1.EventTypeWarning && e.Message == msg {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no FailedScheduling event: %v", err)
	}
	// Retried as soon as the cluster changes: a node big enough arrives.
	f.addNode("big", hollow.NodeOptions{CPU: "128"})
	if got := f.placement(1); got["big"] != 1 {
		t.Fatalf("after a big node joined: %v", got)
	}
}

// TestPodWithResourceClaimWaits: a pod asking for devices through a
// resource claim is not placed (orch allocates none), and says why, as
// Kubernetes' scheduler keeps such a pod pending until its claim can be
// allocated; a pod beside it without one is placed.
func TestPodWithResourceClaimWaits(t *testing.T) {
	f := start(t, threeNodes())
	gpu := pod("gpu", "1")
	gpu.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu")}}
	f.create(gpu)
	f.create(pod("plain", "1"))
	if msg := f.unschedulable("gpu"); msg != "0/3 nodes are available: orch allocates no devices for resource claims (dynamic resource allocation)." {
		t.Errorf("message %q", msg)
	}
	if got := f.placement(1); len(got) != 1 {
		t.Errorf("the plain pod: %v", got)
	}
}

func TestTaintsAndTolerations(t *testing.T) {
	gpu := []corev1.Taint{{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}}
	f := start(t, map[string]hollow.NodeOptions{"n1": {Taints: gpu}, "n2": {Taints: gpu}, "plain": {Labels: map[string]string{"disk": "ssd"}}})
	for i := range 4 {
		f.create(pod(fmt.Sprintf("p-%d", i), ""))
	}
	if got := f.placement(4); got["plain"] != 4 {
		t.Fatalf("pods without toleration went to tainted nodes: %v", got)
	}
	tolerant := pod("tolerant", "")
	tolerant.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "gpu", Effect: corev1.TaintEffectNoSchedule}}
	tolerant.Spec.NodeSelector = map[string]string{corev1.LabelHostname: "n2"}
	f.create(tolerant)
	if got := f.placement(5); got["n2"] != 1 {
		t.Fatalf("tolerating pod selecting n2: %v", got)
	}
	picky := pod("picky", "")
	picky.Spec.NodeSelector = map[string]string{"disk": "nvme"}
	f.create(picky)
	want := "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 node(s) had untolerated taint {dedicated: gpu}."
	if msg := f.unschedulable("picky"); msg != want {
		t.Errorf("message %q, want %q", msg, want)
	}
}

func TestBurstNeverOvercommits(t *testing.T) {
	f := start(t, map[string]hollow.NodeOptions{"n1": {CPU: "1"}, "n2": {CPU: "1"}, "n3": {CPU: "1"}})
	// Every change to the pods is seen, in order, until the scheduler has
	// tried each pod: a bind beyond a node's CPU cannot slip by unseen.
	w, err := f.client.CoreV1().Pods("default").Watch(f.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i := range 10 {
		f.create(pod(fmt.Sprintf("half-%d", i), "500m"))
	}
	bound, unschedulable, perNode := map[string]string{}, map[string]bool{}, map[string]int{}
	for len(bound)+len(unschedulable) < 10 {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch ended")
			}
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				t.Fatalf("watch event %s: %v", ev.Type, ev.Object)
			}
			if p.Spec.NodeName != "" && bound[p.Name] == "" {
				bound[p.Name] = p.Spec.NodeName
				if perNode[p.Spec.NodeName]++; perNode[p.Spec.NodeName] > 2 {
					t.Fatalf("a third half-CPU pod bound to 1-CPU node %s: %v", p.Spec.NodeName, bound)
				}
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonUnschedulable && p.Spec.NodeName == "" {
					unschedulable[p.Name] = true
				}
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("pods bound %v, unschedulable %v", bound, unschedulable)
		}
	}
	if perNode["n1"] != 2 || perNode["n2"] != 2 || perNode["n3"] != 2 {
		t.Fatalf("10 half-CPU pods on three 1-CPU nodes: %v", perNode)
	}
	list, _ := f.client.CoreV1().Pods("default").List(f.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName="})
	if len(list.Items) != 4 {
		t.Fatalf("%d pods left pending, want 4", len(list.Items))
	}
	if msg := f.unschedulable(list.Items[0].Name); msg != "0/3 nodes are available: 3 Insufficient cpu." {
		t.Errorf("message %q", msg)
	}
}

func TestHostPortsAndAntiAffinity(t *testing.T) {
	f := start(t, threeNodes())
	for i := range 4 {
		p := pod(fmt.Sprintf("solo-%d", i), "")
		p.Labels = map[string]string{"app": "solo"}
		p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "solo"}}, TopologyKey: corev1.LabelHostname,
			}},
		}}
		f.create(p)
	}
	got := f.placement(3)
	if got["n1"] != 1 || got["n2"] != 1 || got["n3"] != 1 {
		t.Fatalf("anti-affine pods: %v", got)
	}
	list, _ := f.client.CoreV1().Pods("default").List(f.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName="})
	if len(list.Items) != 1 {
		t.Fatalf("%d pending, want 1", len(list.Items))
	}
	if msg := f.unschedulable(list.Items[0].Name); !strings.Contains(msg, "3 node(s) didn't match pod anti-affinity rules") {
		t.Errorf("message %q", msg)
	}
	for i := range 4 {
		p := pod(fmt.Sprintf("port-%d", i), "")
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80, HostPort: 8080, Protocol: corev1.ProtocolTCP}}
		f.create(p)
	}
	f.placement(6)
	pending, _ := f.client.CoreV1().Pods("default").List(f.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName="})
	var left []string
	for _, p := range pending.Items {
		if strings.HasPrefix(p.Name, "port-") {
			left = append(left, p.Name)
		}
	}
	if len(left) != 1 {
		t.Fatalf("pods wanting host port 8080 left pending: %v, want one", left)
	}
	if msg := f.unschedulable(left[0]); !strings.Contains(msg, "3 node(s) didn't have free ports for the requested pod ports") {
		t.Errorf("message %q", msg)
	}
}

func withClaim(p *corev1.Pod, claim string) *corev1.Pod {
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: claim, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}})
	return p
}

func (f *fixture) claim(name string, class *string) {
	f.t.Helper()
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: class,
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if _, err := f.client.CoreV1().PersistentVolumeClaims("default").Create(f.ctx, pvc, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// TestVolumesDecideTheNode: kube-scheduler's VolumeBinding: a pod whose
// claim is bound goes where the volume's node affinity says; a pod of a
// claim that names no pod's node and is not bound waits with
// Kubernetes' message; a pod of a local-path claim (WaitForFirstConsumer)
// is placed first and its claim told where (the volume loop, not running
// here, would make the volume there), and bound once the claim is.
func TestVolumesDecideTheNode(t *testing.T) {
	f := start(t, threeNodes())
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "disk-on-n2"}, Spec: corev1.PersistentVolumeSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
		StorageClassName: "manual", ClaimRef: &corev1.ObjectReference{Namespace: "default", Name: "bound"},
		PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/mnt/disk"}},
		NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"n2"}}}}}}}}}
	if _, err := f.client.CoreV1().PersistentVolumes().Create(f.ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.claim("bound", ptr.To("manual"))
	// The volume loop does not run here: the test binds the claim itself.
	pvc, err := f.client.CoreV1().PersistentVolumeClaims("default").Get(f.ctx, "bound", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvc.Spec.VolumeName = "disk-on-n2"
	if _, err := f.client.CoreV1().PersistentVolumeClaims("default").Update(f.ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.claim("immediate", ptr.To("manual"))
	f.claim("local", nil) // the default class: local-path
	f.create(withClaim(pod("db", ""), "bound"))
	if got := f.placement(1); got["n2"] != 1 {
		t.Fatalf("the pod of a volume on n2 went to %v", got)
	}
	f.create(withClaim(pod("waits", ""), "immediate"))
	if msg := f.unschedulable("waits"); msg != "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims." {
		t.Errorf("message %q", msg)
	}
	f.create(withClaim(pod("cache", ""), "local"))
	// The claim learns the pod's node; the pod is bound only once the
	// claim is (the volume loop, not running here, would bind it: the test
	// does, as that loop would, on the node chosen).
	var node string
	err = wait.PollUntilContextTimeout(f.ctx, 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		claim, err := f.client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "local", metav1.GetOptions{})
		node = claim.Annotations["volume.kubernetes.io/selected-node"]
		return err == nil && node != "", nil
	})
	if err != nil {
		t.Fatalf("the claim never learned its pod's node: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	if p, err := f.client.CoreV1().Pods("default").Get(f.ctx, "cache", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Fatalf("the pod was bound before its claim: %v %v", p.Spec.NodeName, err)
	}
	local := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "made-on-" + node}, Spec: corev1.PersistentVolumeSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
		StorageClassName: "local-path", PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/x"}}}}
	if _, err := f.client.CoreV1().PersistentVolumes().Create(f.ctx, local, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim, err := f.client.CoreV1().PersistentVolumeClaims("default").Get(f.ctx, "local", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim.Spec.VolumeName = local.Name
	if claim, err = f.client.CoreV1().PersistentVolumeClaims("default").Update(f.ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim.Status.Phase = corev1.ClaimBound
	if _, err := f.client.CoreV1().PersistentVolumeClaims("default").UpdateStatus(f.ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.placement(2)
	cache, err := f.client.CoreV1().Pods("default").Get(f.ctx, "cache", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cache.Spec.NodeName != node {
		t.Errorf("the pod went to %q, its claim's node is %s", cache.Spec.NodeName, node)
	}
}
