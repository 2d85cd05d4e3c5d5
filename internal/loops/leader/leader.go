// Package leader runs the control loops on one server at a time when
// several share a datastore: the holder of a coordination.k8s.io Lease, as
// kube-controller-manager's --leader-elect does (`kubectl -n kube-system
// get lease orch-controllers` shows the holder). client-go's
// leaderelection links every API group's clientset; this is its algorithm
// on orch's client.
//
// The Lease is liveness, not a lock: a holder cut off from the API stops
// its loops once it cannot renew for RenewDeadline, a little before the
// others may take over after LeaseDuration, and every write the loops make
// is still a compare-and-swap on the object they read.
package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/kube"
)

// Defaults: kube-controller-manager's lease duration and renew deadline;
// a renewal every 5 s instead of its 2 s, since each is a write to the
// datastore's disk on a board.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 5 * time.Second
)

// Config is one candidate's.
type Config struct {
	Client *kube.Client
	// Namespace and Name of the Lease.
	Namespace, Name string
	// Identity is this candidate's, unique among them.
	Identity                                  string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Logger                                    *slog.Logger
}

func (c *Config) setDefaults() {
	if c.LeaseDuration <= 0 {
		c.LeaseDuration = DefaultLeaseDuration
	}
	if c.RenewDeadline <= 0 {
		c.RenewDeadline = DefaultRenewDeadline
	}
	if c.RetryPeriod <= 0 {
		c.RetryPeriod = DefaultRetryPeriod
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// elector holds what this candidate last saw of the Lease. Expiry is
// judged by this process's clock from when it saw the record change, not
// by the holder's renewTime, so clocks need not agree.
type elector struct {
	cfg        Config
	observedRV string // the Lease's resourceVersion when last seen changed
	observedAt time.Time
}

// Run campaigns until ctx ends; while this candidate holds the Lease, lead
// runs with a context that ends when the Lease is lost. After a loss it
// campaigns again. On the way out it gives the Lease up so another
// candidate need not wait for it to expire.
func Run(ctx context.Context, cfg Config, lead func(context.Context) error) error {
	cfg.setDefaults()
	if cfg.RenewDeadline >= cfg.LeaseDuration || cfg.RetryPeriod >= cfg.RenewDeadline {
		return fmt.Errorf("leader election: want retry period < renew deadline < lease duration, have %s, %s, %s", cfg.RetryPeriod, cfg.RenewDeadline, cfg.LeaseDuration)
	}
	e := &elector{cfg: cfg}
	for {
		if !e.acquire(ctx) {
			return nil
		}
		cfg.Logger.Info("this server leads the control loops", "lease", cfg.Namespace+"/"+cfg.Name, "identity", cfg.Identity)
		leadCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- lead(leadCtx) }()
		lost, finished, err := e.renew(leadCtx, done)
		cancel()
		if !finished {
			err = <-done
		}
		if ctx.Err() != nil {
			e.release()
			return nil
		}
		if !lost {
			// The loops stopped on their own: that is the server's error.
			e.release()
			if err == nil {
				err = errors.New("the control loops stopped")
			}
			return err
		}
		cfg.Logger.Warn("this server lost the lead of the control loops; they stopped and it campaigns again", "lease", cfg.Namespace+"/"+cfg.Name)
	}
}

// acquire tries every RetryPeriod until it holds the Lease or ctx ends.
func (e *elector) acquire(ctx context.Context) bool {
	t := time.NewTicker(e.cfg.RetryPeriod)
	defer t.Stop()
	for {
		if e.tryAcquireOrRenew(ctx) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// renew keeps the Lease every RetryPeriod until ctx ends, lead returns
// (finished, with its error) or no renewal succeeded for RenewDeadline
// (lost).
func (e *elector) renew(ctx context.Context, done <-chan error) (lost, finished bool, leadErr error) {
	t := time.NewTicker(e.cfg.RetryPeriod)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return false, false, nil
		case err := <-done:
			return false, true, err
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, e.cfg.RenewDeadline-time.Since(last))
		ok := e.tryAcquireOrRenew(rctx)
		cancel()
		if ok {
			last = time.Now()
		} else if time.Since(last) >= e.cfg.RenewDeadline {
			return true, false, nil
		}
	}
}

func (e *elector) leases() kube.Resource[*coordinationv1.Lease, *coordinationv1.LeaseList] {
	return e.cfg.Client.Leases(e.cfg.Namespace)
}

// tryAcquireOrRenew is client-go's: take the Lease when it is free, ours or
// expired, by an update conditional on the version read.
func (e *elector) tryAcquireOrRenew(ctx context.Context) bool {
	now := metav1.NewMicroTime(time.Now())
	seconds := int32(e.cfg.LeaseDuration / time.Second)
	lease, err := e.leases().Get(ctx, e.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		created, err := e.leases().Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: e.cfg.Namespace, Name: e.cfg.Name},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: &e.cfg.Identity, LeaseDurationSeconds: &seconds,
				AcquireTime: &now, RenewTime: &now, LeaseTransitions: new(int32),
			},
		}, metav1.CreateOptions{})
		if err != nil {
			e.cfg.Logger.Debug("leader election: create lease", "err", err)
			return false
		}
		e.observe(created)
		return true
	}
	if err != nil {
		e.cfg.Logger.Debug("leader election: read lease", "err", err)
		return false
	}
	if e.observedRV != lease.ResourceVersion {
		e.observe(lease)
	}
	holder := ""
	if lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	duration := e.cfg.LeaseDuration
	if lease.Spec.LeaseDurationSeconds != nil {
		duration = time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second
	}
	if holder != "" && holder != e.cfg.Identity && time.Since(e.observedAt) < duration {
		return false // another candidate holds it
	}
	next := lease.DeepCopy()
	if holder != e.cfg.Identity {
		next.Spec.AcquireTime = &now
		transitions := int32(0)
		if lease.Spec.LeaseTransitions != nil {
			transitions = *lease.Spec.LeaseTransitions
		}
		if holder != "" {
			transitions++
		}
		next.Spec.LeaseTransitions = &transitions
	}
	next.Spec.HolderIdentity, next.Spec.LeaseDurationSeconds, next.Spec.RenewTime = &e.cfg.Identity, &seconds, &now
	updated, err := e.leases().Update(ctx, next, metav1.UpdateOptions{})
	if err != nil {
		e.cfg.Logger.Debug("leader election: update lease", "err", err)
		return false
	}
	e.observe(updated)
	return true
}

func (e *elector) observe(l *coordinationv1.Lease) {
	e.observedRV, e.observedAt = l.ResourceVersion, time.Now()
}

// release gives the Lease up if this candidate still holds it, as
// client-go's ReleaseOnCancel: no holder and a one-second duration.
func (e *elector) release() {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RetryPeriod)
	defer cancel()
	lease, err := e.leases().Get(ctx, e.cfg.Name, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != e.cfg.Identity {
		return
	}
	one := int32(1)
	now := metav1.NewMicroTime(time.Now())
	lease.Spec.HolderIdentity, lease.Spec.LeaseDurationSeconds, lease.Spec.RenewTime, lease.Spec.AcquireTime = nil, &one, &now, &now
	if _, err := e.leases().Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		e.cfg.Logger.Warn("leader election: could not give the lease up; the others take it when it expires", "err", err)
	}
}
