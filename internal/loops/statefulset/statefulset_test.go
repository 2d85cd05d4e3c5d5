package statefulset

import (
	"context"
	"slices"
	"testing"

	"github.com/orch-dev/orch/internal/loops/controller"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func start(t *testing.T, objs ...runtime.Object) (*Controller, *controllertest.Fake) {
	t.Helper()
	f := controllertest.New(t, objs...)
	c, err := New(f.Client, f.Informers, f.Events, controller.Env{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.queue.ShutDown)
	f.Start()
	return c, f
}

func set(replicas int32, change ...func(*appsv1.StatefulSet)) *appsv1.StatefulSet {
	labels := map[string]string{"app": "db"}
	s := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "default", UID: "set-uid", Generation: 1},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To(replicas), ServiceName: "db", Selector: &metav1.LabelSelector{MatchLabels: labels},
			PodManagementPolicy: appsv1.OrderedReadyPodManagement, RevisionHistoryLimit: ptr.To[int32](10),
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.RollingUpdateStatefulSetStrategyType,
				RollingUpdate: &appsv1.RollingUpdateStatefulSetStrategy{Partition: ptr.To[int32](0)}},
			PersistentVolumeClaimRetentionPolicy: &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{
				WhenDeleted: appsv1.RetainPersistentVolumeClaimRetentionPolicyType, WhenScaled: appsv1.RetainPersistentVolumeClaimRetentionPolicyType},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "db", Image: "postgres:16"}}}},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"}, Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}},
		}}
	for _, f := range change {
		f(s)
	}
	return s
}

func (c *Controller) syncOnce(t *testing.T) {
	t.Helper()
	if err := c.sync(context.Background(), "default/db"); err != nil {
		t.Fatal(err)
	}
}

func names(writes []controllertest.Write) []string {
	var out []string
	for _, w := range writes {
		out = append(out, w.Name)
	}
	slices.Sort(out)
	return out
}

// readyPod is the set's pod of an ordinal at a revision, Running and Ready.
func readyPod(s *appsv1.StatefulSet, ordinal int, revision string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(s, ordinal), Namespace: "default", UID: types.UID("pod-" + podName(s, ordinal)),
		Labels:          map[string]string{"app": "db", appsv1.ControllerRevisionHashLabelKey: revision},
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(s, appsv1.SchemeGroupVersion.WithKind("StatefulSet"))}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	return p
}

// TestOrderedReadyMakesOneAtATime: a new set makes its first pod and that
// pod's claim, nothing more until it is ready; Parallel makes every pod.
func TestOrderedReadyMakesOneAtATime(t *testing.T) {
	c, f := start(t, set(3))
	c.syncOnce(t)
	writes := f.Writes()
	if got := names(controllertest.Only(writes, "create", "pods")); !slices.Equal(got, []string{"db-0"}) {
		t.Errorf("pods made %v, want db-0 alone", got)
	}
	if got := names(controllertest.Only(writes, "create", "persistentvolumeclaims")); !slices.Equal(got, []string{"data-db-0"}) {
		t.Errorf("claims made %v, want data-db-0", got)
	}
	pod := controllertest.Only(writes, "create", "pods")[0].Object.(*corev1.Pod)
	if pod.Spec.Hostname != "db-0" || pod.Spec.Subdomain != "db" || pod.Labels[podIndexLabel] != "0" || pod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != "data-db-0" {
		t.Errorf("pod made: %+v", pod)
	}
	c, f = start(t, set(3, func(s *appsv1.StatefulSet) { s.Spec.PodManagementPolicy = appsv1.ParallelPodManagement }))
	c.syncOnce(t)
	if got := names(controllertest.Only(f.Writes(), "create", "pods")); !slices.Equal(got, []string{"db-0", "db-1", "db-2"}) {
		t.Errorf("Parallel made %v", got)
	}
}

// TestScaleDownAndClaimRetention: scaling down deletes the highest pod
// first; whenScaled: Delete then deletes the removed ordinals' claims;
// whenDeleted: Delete has the set own the claims it makes.
func TestScaleDownAndClaimRetention(t *testing.T) {
	deleteBoth := func(s *appsv1.StatefulSet) {
		s.Spec.PersistentVolumeClaimRetentionPolicy.WhenScaled = appsv1.DeletePersistentVolumeClaimRetentionPolicyType
		s.Spec.PersistentVolumeClaimRetentionPolicy.WhenDeleted = appsv1.DeletePersistentVolumeClaimRetentionPolicyType
	}
	s := set(1, deleteBoth)
	rev, err := newRevision(s, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	claim := func(ordinal int) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: claimName(s, &s.Spec.VolumeClaimTemplates[0], ordinal), Namespace: "default"}}
	}
	c, f := start(t, s, rev, readyPod(s, 0, rev.Name), readyPod(s, 1, rev.Name), readyPod(s, 2, rev.Name), claim(0), claim(1), claim(2))
	c.syncOnce(t)
	if got := names(controllertest.Only(f.Writes(), "delete", "pods")); !slices.Equal(got, []string{"db-2"}) {
		t.Fatalf("scale-down deleted %v, want db-2 first", got)
	}
	c2, f2 := start(t, s, rev, readyPod(s, 0, rev.Name), claim(0), claim(1), claim(2))
	c2.syncOnce(t)
	if got := names(controllertest.Only(f2.Writes(), "delete", "persistentvolumeclaims")); !slices.Equal(got, []string{"data-db-1", "data-db-2"}) {
		t.Errorf("claims deleted after scale-down %v", got)
	}
	c3, f3 := start(t, set(1, deleteBoth))
	c3.syncOnce(t)
	made := controllertest.Only(f3.Writes(), "create", "persistentvolumeclaims")
	if len(made) != 1 || len(made[0].Object.(*corev1.PersistentVolumeClaim).OwnerReferences) != 1 ||
		made[0].Object.(*corev1.PersistentVolumeClaim).OwnerReferences[0].UID != "set-uid" {
		t.Errorf("claim of a set whose claims go with it: %+v", made)
	}
}

// TestPartitionedRollout: with partition 1, a new template replaces the
// highest pod only, and pods below the partition stay at the old
// revision.
func TestPartitionedRollout(t *testing.T) {
	old := set(3)
	oldRev, err := newRevision(old, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	updated := set(3, func(s *appsv1.StatefulSet) {
		s.Spec.Template.Spec.Containers[0].Image = "postgres:17"
		s.Spec.UpdateStrategy.RollingUpdate.Partition = ptr.To[int32](1)
		s.Status.CurrentRevision = oldRev.Name
	})
	c, f := start(t, updated, oldRev, readyPod(updated, 0, oldRev.Name), readyPod(updated, 1, oldRev.Name), readyPod(updated, 2, oldRev.Name))
	c.syncOnce(t)
	writes := f.Writes()
	if got := names(controllertest.Only(writes, "create", "controllerrevisions.apps")); len(got) != 1 {
		t.Fatalf("revisions made %v, want the new template's", got)
	}
	if got := names(controllertest.Only(writes, "delete", "pods")); !slices.Equal(got, []string{"db-2"}) {
		t.Errorf("rolled %v, want db-2 (the highest) alone", got)
	}
	st := f.Get(appsv1.SchemeGroupVersion.WithResource("statefulsets"), "default", "db").(*appsv1.StatefulSet).Status
	if st.CurrentRevision != oldRev.Name || st.UpdateRevision == oldRev.Name || st.CurrentReplicas != 3 {
		t.Errorf("status %+v", st)
	}
}

// TestScaleDownHaltsOnUnhealthyPods: with OrderedReady, a scale-down deletes
// nothing while a pod below the one to go is unhealthy; only the lowest
// unhealthy pod itself may go, as Kubernetes halts it (Parallel does not).
func TestScaleDownHaltsOnUnhealthyPods(t *testing.T) {
	s := set(0)
	rev, err := newRevision(s, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	unready := func(p *corev1.Pod) *corev1.Pod {
		p.Status.Conditions[0].Status = corev1.ConditionFalse
		return p
	}
	c, f := start(t, s, rev, unready(readyPod(s, 0, rev.Name)), unready(readyPod(s, 1, rev.Name)), unready(readyPod(s, 2, rev.Name)))
	c.syncOnce(t)
	if got := names(controllertest.Only(f.Writes(), "delete", "pods")); len(got) != 0 {
		t.Fatalf("deleted %v below an unhealthy pod", got)
	}
	c, f = start(t, s, rev, unready(readyPod(s, 0, rev.Name)))
	c.syncOnce(t)
	if got := names(controllertest.Only(f.Writes(), "delete", "pods")); !slices.Equal(got, []string{"db-0"}) {
		t.Fatalf("the lowest unhealthy pod: deleted %v", got)
	}
	c, f = start(t, s, rev, readyPod(s, 0, rev.Name), readyPod(s, 1, rev.Name), readyPod(s, 2, rev.Name))
	c.syncOnce(t)
	if got := names(controllertest.Only(f.Writes(), "delete", "pods")); !slices.Equal(got, []string{"db-2"}) {
		t.Fatalf("healthy pods: deleted %v, want db-2", got)
	}
}
