package scheduler

import (
	"testing"

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
