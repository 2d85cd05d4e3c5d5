// Package shutdown is the node's graceful shutdown, as the kubelet's: the
// agent holds a systemd-logind delay lock on shutdown, and when the
// machine begins to shut down or reboot (logind's PrepareForShutdown) it
// stops the node's pods in priority order, regular pods first and
// critical ones last, each group within its share of the grace period,
// then lets the shutdown go on. A board's reboot then gives its databases
// their SIGTERM and preStop hooks instead of cutting them off mid-write.
//
// Machines without logind (no system bus, another init) have no graceful
// shutdown; the agent says so once and runs on.
package shutdown

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// systemCriticalPriority is the priority from which a pod is critical
// (system-cluster-critical and system-node-critical are at or above it):
// such pods stop last, within CriticalPodsGracePeriod.
const systemCriticalPriority = 2000000000

// DefaultLogindConfDir is where logind reads drop-ins from.
const DefaultLogindConfDir = "/etc/systemd/logind.conf.d"

// Config is the node's graceful shutdown.
type Config struct {
	// GracePeriod is how long the machine's shutdown waits for the pods
	// (the kubelet's shutdownGracePeriod); zero turns graceful shutdown
	// off.
	GracePeriod time.Duration
	// CriticalPodsGracePeriod is the part of GracePeriod kept for
	// critical pods (shutdownGracePeriodCriticalPods); the rest goes to
	// the others, which stop first.
	CriticalPodsGracePeriod time.Duration
	// Bus is the D-Bus address of the system bus; empty is the machine's.
	Bus string
	// LogindConfDir is where the drop-in raising logind's
	// InhibitDelayMaxSec goes; empty is DefaultLogindConfDir.
	LogindConfDir string
	Logger        *slog.Logger
}

// Pods are the node's pods, which the shutdown stops.
type Pods interface {
	// SetShuttingDown makes the node reject pods new to it (true) or
	// take them again after a cancelled shutdown (false).
	SetShuttingDown(on bool)
	// Terminate stops the running pods in group, each within grace (or
	// its own shorter termination grace period), marks them as the
	// kubelet marks pods stopped for a node shutdown, and returns once
	// they stopped or grace is up.
	Terminate(ctx context.Context, group func(*corev1.Pod) bool, grace time.Duration)
}

// Group is one step of the shutdown: the pods it takes, and how long
// they get.
type Group struct {
	Name  string
	Pods  func(*corev1.Pod) bool
	Grace time.Duration
}

// Groups are the shutdown's steps for a total grace period of total, the
// kubelet's two: regular pods get what critical ones do not keep, then
// critical pods get theirs. When total is less than the configured grace
// period (logind allows less), the regular pods' share shrinks first.
func (c Config) Groups(total time.Duration) []Group {
	critical := min(c.CriticalPodsGracePeriod, total)
	return []Group{
		{Name: "regular", Pods: func(p *corev1.Pod) bool { return !isCritical(p) }, Grace: total - critical},
		{Name: "critical", Pods: isCritical, Grace: critical},
	}
}

func isCritical(p *corev1.Pod) bool {
	return p.Spec.Priority != nil && *p.Spec.Priority >= systemCriticalPriority
}

// Manager runs the node's graceful shutdown.
type Manager struct {
	cfg  Config
	pods Pods
	log  *slog.Logger
	// shuttingDown is true from logind's PrepareForShutdown(true) until
	// a PrepareForShutdown(false): the node reports NotReady meanwhile.
	shuttingDown atomic.Bool
	// notify is told when the shutdown begins or is cancelled.
	notify func(shuttingDown bool)
}

// New manages pods' graceful shutdown; notify (may be nil) is told when
// the node begins to shut down, and when that is cancelled.
func New(cfg Config, pods Pods, notify func(shuttingDown bool)) *Manager {
	if cfg.LogindConfDir == "" {
		cfg.LogindConfDir = DefaultLogindConfDir
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if notify == nil {
		notify = func(bool) {}
	}
	return &Manager{cfg: cfg, pods: pods, log: cfg.Logger.With("component", "shutdown"), notify: notify}
}

// ShuttingDown reports whether the machine is shutting down.
func (m *Manager) ShuttingDown() bool { return m.shuttingDown.Load() }

// reconnectEvery is how often a lost or missing system bus is tried again.
const reconnectEvery = 30 * time.Second

// Run holds the delay lock and carries out shutdowns until ctx ends. It
// connects again when logind or the bus restarts.
func (m *Manager) Run(ctx context.Context) {
	if m.cfg.GracePeriod <= 0 {
		return
	}
	warned := false
	for {
		err := m.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if !warned {
			m.log.Warn("graceful node shutdown unavailable (trying again every 30s)", "err", err)
			warned = true
		} else {
			m.log.Debug("graceful node shutdown unavailable", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(reconnectEvery):
		}
	}
}

// session is one connection to logind: the delay lock taken, shutdowns
// carried out, until the connection is lost or ctx ends.
func (m *Manager) session(ctx context.Context) error {
	l, err := connectLogind(ctx, m.cfg.Bus)
	if err != nil {
		return err
	}
	defer func() { _ = l.Close() }()
	delay, err := l.inhibitDelayMax()
	if err != nil {
		return err
	}
	if delay < m.cfg.GracePeriod {
		if delay, err = l.raiseDelay(ctx, m.cfg.LogindConfDir, m.cfg.GracePeriod); err != nil {
			return err
		}
		if delay < m.cfg.GracePeriod {
			m.log.Warn("logind allows less than the shutdown grace period: the pods get what it allows",
				"InhibitDelayMaxSec", delay, "shutdownGracePeriod", m.cfg.GracePeriod)
		}
	}
	total := min(delay, m.cfg.GracePeriod)
	signals, err := l.watchShutdown()
	if err != nil {
		return err
	}
	lock, err := l.inhibit(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if lock != nil {
			_ = lock.Close()
		}
	}()
	m.log.Info("graceful node shutdown ready", "gracePeriod", total, "criticalPodsGracePeriod", min(m.cfg.CriticalPodsGracePeriod, total))
	if m.shuttingDown.Load() {
		// Reconnected after the shutdown began: it is over or cancelled.
		m.shuttingDown.Store(false)
		m.pods.SetShuttingDown(false)
		m.notify(false)
	}
	for {
		var shutting, ok bool
		select {
		case <-ctx.Done():
			return nil
		case shutting, ok = <-signals:
			if !ok {
				return fmt.Errorf("the system bus connection ended")
			}
		}
		if shutting == m.shuttingDown.Load() {
			continue
		}
		if shutting {
			m.shutDown(ctx, total)
			if lock != nil {
				_ = lock.Close()
				lock = nil
			}
			m.log.Info("node's pods stopped: the machine's shutdown goes on")
			continue
		}
		m.log.Info("the machine's shutdown was cancelled: the node takes pods again")
		if lock == nil {
			if lock, err = l.inhibit(ctx); err != nil {
				return err
			}
		}
		m.shuttingDown.Store(false)
		m.pods.SetShuttingDown(false)
		m.notify(false)
	}
}

// shutDown stops the node's pods group by group.
func (m *Manager) shutDown(ctx context.Context, total time.Duration) {
	m.shuttingDown.Store(true)
	m.pods.SetShuttingDown(true)
	m.notify(true)
	m.log.Info("the machine is shutting down: stopping the node's pods", "gracePeriod", total)
	for _, g := range m.cfg.Groups(total) {
		if g.Grace <= 0 {
			continue
		}
		start := time.Now()
		m.pods.Terminate(ctx, g.Pods, g.Grace)
		m.log.Info("pods stopped for the shutdown", "group", g.Name, "took", time.Since(start).Round(time.Millisecond))
	}
}
