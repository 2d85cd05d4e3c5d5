package scheduler

import (
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// TestActiveQueueOrder: pods leave the queue highest priority first, and
// in the order they came among equals (kube-scheduler's PrioritySort); a
// pod queued again while waiting keeps its place.
func TestActiveQueueOrder(t *testing.T) {
	priorities := map[string]int32{"default/critical": 2000000000, "default/high": 1000, "default/batch": -10}
	q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{Queue: &activeQueue{priority: func(k string) int32 { return priorities[k] }}})
	defer q.ShutDown()
	for _, k := range []string{"default/web-1", "default/batch", "default/high", "default/web-2", "default/critical", "default/web-1", "default/web-3"} {
		q.Add(k)
	}
	var got []string
	for q.Len() > 0 {
		k, _ := q.Get()
		got = append(got, k)
		q.Done(k)
	}
	want := []string{"default/critical", "default/high", "default/web-1", "default/web-2", "default/web-3", "default/batch"}
	if len(got) != len(want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("order %v, want %v", got, want)
		}
	}
}

// addOrder records the order keys are queued in.
type addOrder struct {
	workqueue.TypedRateLimitingInterface[string]
	added []string
}

func (q *addOrder) Add(k string) { q.added = append(q.added, k) }

// TestWakeQueuesUrgentFirst: waking the pods that fit nowhere queues the
// most urgent first. A worker blocked on the queue takes the first key
// added before the rest are in (seen under load: a low-priority pod took
// the room freed for an urgent one, which then preempted it), so the order
// of the adds is the order the first pod is chosen in.
func TestWakeQueuesUrgentFirst(t *testing.T) {
	pods := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc})
	waiting := map[string]bool{}
	for name, priority := range map[string]int32{"low-0": 0, "low-1": 0, "low-2": 0, "mid": 100, "urgent": 1000, "negative": -5} {
		_ = pods.Add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: corev1.PodSpec{Priority: &priority}})
		waiting["default/"+name] = true
	}
	for range 20 { // map order differs from run to run
		q := &addOrder{}
		s := &Scheduler{pods: corelisters.NewPodLister(pods), waiting: maps.Clone(waiting), queue: q}
		s.wake()
		if len(q.added) != len(waiting) || q.added[0] != "default/urgent" || q.added[1] != "default/mid" || q.added[len(q.added)-1] != "default/negative" {
			t.Fatalf("queued %v: want urgent, mid, the low ones, negative", q.added)
		}
	}
}
