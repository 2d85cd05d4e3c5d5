package scheduler_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/scheduler"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// BenchmarkScheduling: 10,000 pending pods onto 1,000 and 5,000 hollow
// nodes, from the moment the scheduler starts to the last binding seen by
// a watcher. Targets: 1,000 pods/s at 1,000 nodes, 680 at 5,000.
func BenchmarkScheduling(b *testing.B) {
	for _, nodes := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("nodes=%d/pods=10000", nodes), func(b *testing.B) {
			for range b.N {
				b.ReportMetric(schedule(b, nodes, 10000), "pods/s")
			}
		})
	}
}

func schedule(b *testing.B, nodes, pods int) float64 {
	srv := apitest.Start(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cluster := hollow.New(srv.Client, hollow.Options{LeaseEvery: -1})
	parallel(b, nodes, func(i int) error { return cluster.AddNode(ctx, fmt.Sprintf("node-%05d", i), hollow.NodeOptions{}) })
	parallel(b, pods, func(i int) error {
		_, err := srv.Client.CoreV1().Pods("default").Create(ctx, pod(fmt.Sprintf("p-%05d", i), "10m"), metav1.CreateOptions{})
		return err
	})

	// Count bindings as a watcher sees them.
	bound := make(chan struct{}, pods)
	watcher := informers.NewSharedInformerFactory(srv.Client, 0)
	seen := sync.Map{}
	if _, err := watcher.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			p := obj.(*corev1.Pod)
			if p.Spec.NodeName != "" {
				if _, dup := seen.LoadOrStore(p.Name, true); !dup {
					bound <- struct{}{}
				}
			}
		},
	}); err != nil {
		b.Fatal(err)
	}
	watcher.Start(ctx.Done())
	watcher.WaitForCacheSync(ctx.Done())

	loops, err := kube.NewForConfig(srv.Loopback())
	if err != nil {
		b.Fatal(err)
	}
	factory := kube.NewInformers(loops, 0)
	s, err := scheduler.New(loops, factory, kube.NewEvents(ctx, loops, slog.Default()).Recorder(scheduler.Name), scheduler.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	factory.Start(ctx)
	ran := make(chan struct{})
	go func() { s.Run(ctx); close(ran) }()
	timeout := time.After(5 * time.Minute)
	for i := range pods {
		select {
		case <-bound:
		case <-timeout:
			b.Fatalf("only %d of %d pods bound", i, pods)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	<-ran // the scheduler's queue is shut down when Run returns
	factory.Shutdown()
	watcher.Shutdown()
	return float64(pods) / elapsed.Seconds()
}

func parallel(b *testing.B, n int, fn func(i int) error) {
	var wg sync.WaitGroup
	work := make(chan int)
	for range 32 {
		wg.Go(func() {
			for i := range work {
				if err := fn(i); err != nil {
					b.Error(err)
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
}
