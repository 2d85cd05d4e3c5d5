package volume

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/orch-dev/orch/internal/localpath"
	"github.com/orch-dev/orch/internal/loops/controller"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

type removed struct {
	mu    sync.Mutex
	calls []string
}

func (r *removed) remove(_ context.Context, node, pv string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, node+":"+pv)
	return nil
}

func start(t *testing.T, objs ...runtime.Object) (*Controller, *controllertest.Fake, *removed) {
	t.Helper()
	f := controllertest.New(t, objs...)
	r := &removed{}
	c, err := New(f.Client, f.Informers, f.Events, Options{StoragePath: "/var/lib/orch/storage", RemoveDir: r.remove}, controller.Env{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.claims.ShutDown)
	t.Cleanup(c.volumes.ShutDown)
	f.Start()
	return c, f, r
}

func claim(change ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "default", UID: "claim-uid"},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr.To(""),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending}}
	for _, f := range change {
		f(pvc)
	}
	return pvc
}

func volume(name, size string, change ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv/" + name}}},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeAvailable}}
	for _, f := range change {
		f(pv)
	}
	return pv
}

var localPath = &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: localpath.ClassName}, Provisioner: localpath.Provisioner,
	ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete), VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}

func node(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
}

func getClaim(t *testing.T, f *controllertest.Fake) *corev1.PersistentVolumeClaim {
	t.Helper()
	return f.Get(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), "default", "data").(*corev1.PersistentVolumeClaim)
}

func getVolume(f *controllertest.Fake, name string) *corev1.PersistentVolume {
	pv, _ := f.Get(corev1.SchemeGroupVersion.WithResource("persistentvolumes"), "", name).(*corev1.PersistentVolume)
	return pv
}

func hasEvent(f *controllertest.Fake, prefix string) bool {
	return slices.ContainsFunc(f.Events.List(), func(e string) bool { return strings.HasPrefix(e, prefix) })
}

// TestBindsSmallestFit: a claim of 1Gi RWO binds the smallest available
// volume of its class that holds 1Gi and offers RWO; both halves of the
// binding are written and the claim's status says the volume's size.
func TestBindsSmallestFit(t *testing.T) {
	c, f, _ := start(t, claim(),
		volume("big", "5Gi"), volume("fits", "2Gi"), volume("small", "500Mi"),
		volume("shared-only", "1Gi", func(pv *corev1.PersistentVolume) {
			pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany}
		}),
		volume("other-class", "1Gi", func(pv *corev1.PersistentVolume) { pv.Spec.StorageClassName = "fast" }),
		volume("taken", "1Gi", func(pv *corev1.PersistentVolume) {
			pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "default", Name: "other", UID: "other-uid"}
		}))
	if err := c.syncClaim(context.Background(), "default/data"); err != nil {
		t.Fatal(err)
	}
	pvc := getClaim(t, f)
	if pvc.Spec.VolumeName != "fits" || pvc.Status.Phase != corev1.ClaimBound || pvc.Status.Capacity.Storage().String() != "2Gi" {
		t.Fatalf("claim after bind: volume %q, status %+v", pvc.Spec.VolumeName, pvc.Status)
	}
	pv := getVolume(f, "fits")
	if pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != "claim-uid" || pv.Status.Phase != corev1.VolumeBound {
		t.Fatalf("volume after bind: %+v %+v", pv.Spec.ClaimRef, pv.Status)
	}
}

// TestLocalPathWaitsForItsPod: a claim of the local-path class waits for
// the scheduler's choice of node; then a hostPath volume is made on that
// node (node affinity to it, the directory rancher's provisioner would
// use, the class's reclaim policy) and bound.
func TestLocalPathWaitsForItsPod(t *testing.T) {
	wffc := func(pvc *corev1.PersistentVolumeClaim) { pvc.Spec.StorageClassName = ptr.To(localpath.ClassName) }
	c, f, _ := start(t, claim(wffc), localPath, node("pi-1"), node("pi-2"))
	if err := c.syncClaim(context.Background(), "default/data"); err != nil {
		t.Fatal(err)
	}
	if w := controllertest.Only(f.Writes(), "create", "persistentvolumes"); len(w) != 0 || !hasEvent(f, "Normal WaitForFirstConsumer") {
		t.Fatalf("before the pod is scheduled: %v, events %v", w, f.Events.List())
	}
	c2, f2, _ := start(t, claim(wffc, func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Annotations = map[string]string{localpath.SelectedNodeAnnotation: "pi-2"}
	}), localPath, node("pi-1"), node("pi-2"))
	if err := c2.syncClaim(context.Background(), "default/data"); err != nil {
		t.Fatal(err)
	}
	pv := getVolume(f2, "pvc-claim-uid")
	if pv == nil {
		t.Fatalf("no volume made: %v", f2.Events.List())
	}
	if got := pv.Spec.HostPath; got == nil || got.Path != "/var/lib/orch/storage/pvc-claim-uid_default_data" || *got.Type != corev1.HostPathDirectoryOrCreate {
		t.Errorf("volume source %+v", got)
	}
	terms := pv.Spec.NodeAffinity.Required.NodeSelectorTerms
	if len(terms) != 1 || terms[0].MatchExpressions[0].Values[0] != "pi-2" || pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("volume affinity %+v, reclaim %s", terms, pv.Spec.PersistentVolumeReclaimPolicy)
	}
	if pvc := getClaim(t, f2); pvc.Spec.VolumeName != pv.Name || pvc.Status.Phase != corev1.ClaimBound {
		t.Errorf("claim %q %s", pvc.Spec.VolumeName, pvc.Status.Phase)
	}
}

// TestClaimOfAMissingClass stays Pending and says why.
func TestClaimOfAMissingClass(t *testing.T) {
	c, f, _ := start(t, claim(func(pvc *corev1.PersistentVolumeClaim) { pvc.Spec.StorageClassName = ptr.To("gold") }))
	if err := c.syncClaim(context.Background(), "default/data"); err != nil {
		t.Fatal(err)
	}
	if !hasEvent(f, `Warning ProvisioningFailed storageclass.storage.k8s.io "gold" not found`) || getClaim(t, f).Status.Phase != corev1.ClaimPending {
		t.Errorf("events %v", f.Events.List())
	}
}

// TestReclaim: a volume whose claim is gone is Released; Retain keeps
// it, Delete of a local-path volume has its node remove the data and
// then deletes it, Delete of a volume no plugin can delete fails.
func TestReclaim(t *testing.T) {
	bound := func(pv *corev1.PersistentVolume) {
		pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "default", Name: "gone", UID: "gone-uid"}
		pv.Status.Phase = corev1.VolumeBound
	}
	local := func(pv *corev1.PersistentVolume) {
		pv.Annotations = map[string]string{localpath.ProvisionedByAnnotation: localpath.Provisioner}
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimDelete
		pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"pi-1"}}}}}}}
	}
	static := func(pv *corev1.PersistentVolume) {
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimDelete
	}
	c, f, r := start(t, volume("kept", "1Gi", bound), volume("local", "1Gi", bound, local), volume("static", "1Gi", bound, static), node("pi-1"))
	for _, name := range []string{"kept", "local", "static"} {
		if err := c.syncVolume(context.Background(), name); err != nil {
			t.Fatal(err)
		}
	}
	if pv := getVolume(f, "kept"); pv.Status.Phase != corev1.VolumeReleased {
		t.Errorf("retained volume %s", pv.Status.Phase)
	}
	if getVolume(f, "local") != nil || !slices.Equal(r.calls, []string{"pi-1:local"}) {
		t.Errorf("local volume left, removals asked %v", r.calls)
	}
	if pv := getVolume(f, "static"); pv.Status.Phase != corev1.VolumeFailed || !hasEvent(f, "Warning VolumeFailedDelete") {
		t.Errorf("static volume %s, events %v", pv.Status.Phase, f.Events.List())
	}
}

// TestClaimProtection: a claim being deleted keeps pvc-protection while a
// pod that may run uses it, and loses it once none does.
func TestClaimProtection(t *testing.T) {
	deleting := func(pvc *corev1.PersistentVolumeClaim) {
		now := metav1.Now()
		pvc.DeletionTimestamp, pvc.Finalizers = &now, []string{pvcProtection}
	}
	user := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "default"}, Spec: corev1.PodSpec{Volumes: []corev1.Volume{{Name: "d",
		VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	c, f, _ := start(t, claim(deleting), user)
	if err := c.syncClaim(context.Background(), "default/data"); err != nil {
		t.Fatal(err)
	}
	if w := controllertest.Only(f.Writes(), "update", "persistentvolumeclaims"); len(w) != 0 {
		t.Fatalf("protection lifted under a running pod: %v", w)
	}
	done := user.DeepCopy()
	done.Status.Phase = corev1.PodSucceeded
	c, f, _ = start(t, claim(deleting), done)
	if err := c.syncClaim(context.Background(), "default/data"); err != nil {
		t.Fatal(err)
	}
	if pvc := getClaim(t, f); slices.Contains(pvc.Finalizers, pvcProtection) {
		t.Errorf("finalizers %v after the pod finished", pvc.Finalizers)
	}
}
