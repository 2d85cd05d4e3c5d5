package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent"
	"github.com/orch-dev/orch/internal/agent/testimage"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// BenchmarkPodStartup: 30 pods created at once onto one real node (image
// present), each from its creation to Running as a watcher sees it.
// Target: p99 under 1 s (Kubernetes' SLO is 5 s).
func BenchmarkPodStartup(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("running containers needs root")
	}
	for range b.N {
		c := loopstest.Start(b, nil, hollow.Options{LeaseEvery: -1})
		dir := b.TempDir()
		images := filepath.Join(dir, "agent", "images")
		if err := os.MkdirAll(images, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := testimage.WriteBusybox(filepath.Join(images, "busybox.tar"), "docker.io/library/busybox:test", "sh"); err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- agent.Run(ctx, agent.Config{Server: c.Server.URL(), Token: c.Server.Token(), DataDir: dir, NodeName: "bench",
				NodeIPs: []string{"127.0.0.1"}, LeaseEvery: time.Second, Version: "bench", Logger: quiet})
		}()
		waitNodeReady(c, "bench")
		w, err := c.Client.CoreV1().Pods("default").Watch(c.Ctx, metav1.ListOptions{})
		if err != nil {
			b.Fatal(err)
		}
		const pods = 30
		created := map[string]time.Time{}
		for i := range pods {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%02d", i)}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptrTo[int64](0),
				Containers: []corev1.Container{{Name: "main", Image: "busybox:test", Command: []string{"sleep", "3600"}}}}}
			created[p.Name] = time.Now()
			if _, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, p, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		var lat []time.Duration
		timeout := time.After(2 * time.Minute)
		for len(lat) < pods {
			select {
			case ev := <-w.ResultChan():
				p, ok := ev.Object.(*corev1.Pod)
				if ok && ev.Type == watch.Modified && p.Status.Phase == corev1.PodRunning {
					if at, ok := created[p.Name]; ok {
						lat = append(lat, time.Since(at))
						delete(created, p.Name)
					}
				}
			case <-timeout:
				b.Fatalf("%d of %d pods running", len(lat), pods)
			}
		}
		w.Stop()
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Milliseconds()), "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Milliseconds()), "p99-ms")
		if err := c.Client.CoreV1().Pods("default").DeleteCollection(c.Ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			b.Fatal(err)
		}
		c.Eventually("pods gone and cleaned up on the node", 2*time.Minute, func(ctx context.Context) (bool, error) {
			l, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
			left, _ := os.ReadDir(filepath.Join(dir, "agent", "netns"))
			return err == nil && len(l.Items) == 0 && len(left) == 0, nil
		})
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
}
