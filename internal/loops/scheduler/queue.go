package scheduler

import (
	"container/heap"

	"k8s.io/client-go/util/workqueue"
)

// activeQueue orders the pods waiting to be scheduled as kube-scheduler's
// PrioritySort does: the higher priority first, then the one queued
// first. A burst of low-priority pods then does not keep a critical one
// waiting behind them. It is the work queue's store; the queue calls it
// under its own lock.
type activeQueue struct {
	// priority is the pod's of key (0 when it has none or is gone).
	priority func(key string) int32
	items    queuedPods
	seq      uint64
}

var _ workqueue.Queue[string] = (*activeQueue)(nil)

type queuedPod struct {
	key      string
	priority int32
	seq      uint64
}

// Touch: a pod queued again keeps its place (its priority cannot change).
func (q *activeQueue) Touch(string) {}

func (q *activeQueue) Push(key string) {
	q.seq++
	heap.Push(&q.items, queuedPod{key: key, priority: q.priority(key), seq: q.seq})
}

func (q *activeQueue) Len() int { return len(q.items) }

func (q *activeQueue) Pop() string {
	return heap.Pop(&q.items).(queuedPod).key
}

type queuedPods []queuedPod

func (h queuedPods) Len() int { return len(h) }
func (h queuedPods) Less(i, j int) bool {
	if h[i].priority != h[j].priority {
		return h[i].priority > h[j].priority
	}
	return h[i].seq < h[j].seq
}
func (h queuedPods) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *queuedPods) Push(x any)   { *h = append(*h, x.(queuedPod)) }
func (h *queuedPods) Pop() any {
	old := *h
	last := old[len(old)-1]
	*h = old[:len(old)-1]
	return last
}
