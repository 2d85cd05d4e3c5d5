package leader_test

import (
	"context"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/leader"
)

// candidate runs one contender and reports when it leads and stops.
type candidate struct {
	name    string
	cancel  context.CancelFunc
	done    chan struct{} // closed when Run returned
	mu      sync.Mutex
	leading bool
	leads   int
}

func (c *candidate) isLeading() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leading
}

func start(t *testing.T, client *kube.Client, name string) *candidate {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &candidate{name: name, cancel: cancel, done: make(chan struct{})}
	cfg := leader.Config{Client: client, Namespace: "kube-system", Name: "orch-controllers", Identity: name,
		LeaseDuration: 1500 * time.Millisecond, RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond}
	go func() {
		defer close(c.done)
		_ = leader.Run(ctx, cfg, func(ctx context.Context) error {
			c.mu.Lock()
			c.leading, c.leads = true, c.leads+1
			c.mu.Unlock()
			<-ctx.Done()
			c.mu.Lock()
			c.leading = false
			c.mu.Unlock()
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-c.done
	})
	return c
}

func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// One candidate leads at a time; a leader that stops gives the Lease up
// and another takes it at once, not a lease duration later; a leader whose
// Lease another holder took stops its loops within the renew deadline and
// campaigns again.
func TestOneLeaderAtATime(t *testing.T) {
	srv := apitest.Start(t)
	// As the loops are: their own identity, which may take the Lease.
	client, err := kube.NewForConfig(srv.Loopback())
	if err != nil {
		t.Fatal(err)
	}
	a := start(t, client, "a")
	waitFor(t, "a leads", 5*time.Second, a.isLeading)
	b := start(t, client, "b")
	time.Sleep(2 * time.Second) // more than a lease duration
	if b.isLeading() || !a.isLeading() {
		t.Fatalf("a leading %v, b leading %v: want only a", a.isLeading(), b.isLeading())
	}
	lease, err := client.Leases("kube-system").Get(context.Background(), "orch-controllers", metav1.GetOptions{})
	if err != nil || *lease.Spec.HolderIdentity != "a" {
		t.Fatalf("lease %+v, %v: want held by a", lease, err)
	}

	stopped := time.Now()
	a.cancel()
	<-a.done
	waitFor(t, "b leads after a stops", time.Second, b.isLeading)
	t.Logf("b led %s after a stopped", time.Since(stopped))

	// Someone else takes the Lease (a partitioned b's view): b stops.
	lease, err = client.Leases("kube-system").Get(context.Background(), "orch-controllers", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other := "other"
	now := metav1.NewMicroTime(time.Now())
	lease.Spec.HolderIdentity, lease.Spec.RenewTime = &other, &now
	if _, err := client.Leases("kube-system").Update(context.Background(), lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b stops leading", 3*time.Second, func() bool { return !b.isLeading() })
	// "other" never renews: b takes the Lease back once it expires.
	waitFor(t, "b leads again", 5*time.Second, b.isLeading)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.leads != 2 {
		t.Fatalf("b led %d times, want 2", b.leads)
	}
}
