// Package loopstest runs the whole control plane for the loops' tests: a
// real API server, every loop over the loopback client, and hollow nodes.
package loopstest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/loops"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// Cluster is a running control plane with hollow nodes.
type Cluster struct {
	Ctx    context.Context
	Server *apitest.Server
	// Client is the admin's clientset, over HTTPS.
	Client kubernetes.Interface
	Nodes  *hollow.Cluster
	t      testing.TB
}

// Start runs the control plane and registers the named hollow nodes.
func Start(t testing.TB, nodes map[string]hollow.NodeOptions, opts hollow.Options) *Cluster {
	t.Helper()
	return StartWith(t, nodes, opts, loops.Options{})
}

// StartWith is Start with the loops' options (their logger is replaced).
func StartWith(t testing.TB, nodes map[string]hollow.NodeOptions, opts hollow.Options, loopOpts loops.Options) *Cluster {
	t.Helper()
	return StartWithServer(t, nil, nodes, opts, loopOpts)
}

// StartWithServer is StartWith on a server whose configuration configure
// may change.
func StartWithServer(t testing.TB, configure func(*api.Config), nodes map[string]hollow.NodeOptions, opts hollow.Options, loopOpts loops.Options) *Cluster {
	t.Helper()
	srv := apitest.StartWith(t, configure)
	// The cluster's whole life, every Eventually within it: long tests
	// (TestOffline reboots a node offline: about two minutes alone) must
	// not run out of it under a loaded CI machine.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if opts.Logger == nil {
		opts.Logger = log
	}
	c := &Cluster{Ctx: ctx, Server: srv, Client: srv.Client, Nodes: hollow.New(srv.Client, opts), t: t}
	started := make(chan struct{})
	done := make(chan error, 1)
	loopOpts.Logger = log
	loopOpts.RootCA, loopOpts.IssueLegacyToken, loopOpts.SignCertificate, loopOpts.Metrics = srv.CACert, srv.IssueLegacyToken, srv.SignCertificate, srv.Metrics()
	if loopOpts.LocalStoragePath == "" {
		loopOpts.LocalStoragePath = filepath.Join(t.TempDir(), "storage")
	}
	if loopOpts.RemoveLocalVolume == nil {
		loopOpts.RemoveLocalVolume = srv.RemoveLocalVolume
	}
	go func() { done <- loops.Run(ctx, srv.Loopback(), loopOpts, func() { close(started) }) }()
	go c.Nodes.Run(ctx)
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("loops: %v", err)
		}
	})
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("loops did not start: %v", err)
	}
	for name, o := range nodes {
		c.AddNode(name, o)
	}
	return c
}

// For is c failing t, a subtest, instead of the test that started it:
// a helper that calls FailNow on its parent from a subtest's goroutine
// would end the wrong test.
func (c *Cluster) For(t testing.TB) *Cluster {
	cc := *c
	cc.t = t
	return &cc
}

// AddNode registers another hollow node.
func (c *Cluster) AddNode(name string, o hollow.NodeOptions) {
	c.t.Helper()
	if err := c.Nodes.AddNode(c.Ctx, name, o); err != nil {
		c.t.Fatal(err)
	}
}

// Eventually polls cond until it holds, failing the test after timeout.
func (c *Cluster) Eventually(what string, timeout time.Duration, cond func(ctx context.Context) (bool, error)) {
	c.t.Helper()
	if err := wait.PollUntilContextTimeout(c.Ctx, 20*time.Millisecond, timeout, true, cond); err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
}

// Record keeps every state of the objects a watch sees, from the LIST it
// starts from to the moment Stop is called: a check that something never
// happened reads each of them, where polling would sample and could miss
// it.
type Record[T any] struct {
	states []map[string]T
	stop   context.CancelFunc
	done   chan error
}

// RecordPods records the pods matching selector in namespace.
func (c *Cluster) RecordPods(namespace, selector string) *Record[*corev1.Pod] {
	c.t.Helper()
	pods := c.Client.CoreV1().Pods(namespace)
	return record(c, func(ctx context.Context) ([]*corev1.Pod, string, error) {
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return nil, "", err
		}
		out := make([]*corev1.Pod, len(l.Items))
		for i := range l.Items {
			out[i] = &l.Items[i]
		}
		return out, l.ResourceVersion, nil
	}, func(ctx context.Context, rv string) (watch.Interface, error) {
		return pods.Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: rv})
	})
}

// RecordReplicaSets records the ReplicaSets matching selector in namespace.
func (c *Cluster) RecordReplicaSets(namespace, selector string) *Record[*appsv1.ReplicaSet] {
	c.t.Helper()
	sets := c.Client.AppsV1().ReplicaSets(namespace)
	return record(c, func(ctx context.Context) ([]*appsv1.ReplicaSet, string, error) {
		l, err := sets.List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return nil, "", err
		}
		out := make([]*appsv1.ReplicaSet, len(l.Items))
		for i := range l.Items {
			out[i] = &l.Items[i]
		}
		return out, l.ResourceVersion, nil
	}, func(ctx context.Context, rv string) (watch.Interface, error) {
		return sets.Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: rv})
	})
}

func record[T metav1.Object](c *Cluster, list func(context.Context) ([]T, string, error), watchFrom func(context.Context, string) (watch.Interface, error)) *Record[T] {
	items, rv, err := list(c.Ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	state := map[string]T{}
	for _, it := range items {
		state[it.GetName()] = it
	}
	ctx, stop := context.WithCancel(c.Ctx)
	w, err := watchFrom(ctx, rv)
	if err != nil {
		stop()
		c.t.Fatal(err)
	}
	r := &Record[T]{states: []map[string]T{maps.Clone(state)}, stop: stop, done: make(chan error, 1)}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Error:
				if ctx.Err() != nil { // client-go reports its own cancellation so
					r.done <- nil
					return
				}
				r.done <- fmt.Errorf("watch: %v", ev.Object)
				return
			case watch.Added, watch.Modified, watch.Deleted:
				obj, ok := ev.Object.(T)
				if !ok {
					continue
				}
				if ev.Type == watch.Deleted {
					delete(state, obj.GetName())
				} else {
					state[obj.GetName()] = obj
				}
				r.states = append(r.states, maps.Clone(state))
			}
		}
		if ctx.Err() == nil {
			r.done <- errors.New("the watch ended before Stop")
			return
		}
		r.done <- nil
	}()
	return r
}

// Stop ends the recording and returns every state seen, in order; it
// fails the test if the watch ended early, which would leave a gap.
func (r *Record[T]) Stop(t testing.TB) []map[string]T {
	t.Helper()
	r.stop()
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}
	return r.states
}
