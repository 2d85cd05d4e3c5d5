package pods

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The kubelet's words for pods of a node shutting down.
const (
	shutdownReason          = "Terminated"
	shutdownMessage         = "Pod was terminated in response to imminent node shutdown."
	shutdownRejectedReason  = "NodeShutdown"
	shutdownRejectedMessage = "Pod was rejected as the node is shutting down."
)

// shutdownReportTimeout bounds a stopped pod's report during a shutdown:
// the machine does not wait on a server that is away.
const shutdownReportTimeout = 3 * time.Second

// SetShuttingDown makes the node reject pods new to it while the machine
// shuts down, as the kubelet's shutdown manager admits none; false takes
// pods again after a cancelled shutdown.
func (m *Manager) SetShuttingDown(on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.shuttingDown = on
}

func (m *Manager) isShuttingDown() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.shuttingDown
}

// Terminate stops the running pods in group for a node shutdown, all at
// once, each within grace or its own shorter termination grace period
// (preStop hooks, SIGTERM, SIGKILL), and reports them as the kubelet
// does: Failed, reason Terminated, a DisruptionTarget condition by
// TerminationByKubelet. It returns once they are stopped and reported, or
// once grace (and a report's time) is up.
func (m *Manager) Terminate(ctx context.Context, group func(*corev1.Pod) bool, grace time.Duration) {
	var chosen []*podState
	m.mu.Lock()
	for _, st := range m.running {
		if st.pod != nil && !st.evicted && group(st.pod) {
			chosen = append(chosen, st)
		}
	}
	m.mu.Unlock()
	var stopped []chan struct{}
	for _, st := range chosen {
		m.mu.Lock()
		own := graceOf(st.pod)
		m.mu.Unlock()
		done := make(chan struct{})
		stopped = append(stopped, done)
		m.log.Info("stopping a pod for the node's shutdown", "pod", st.key(), "grace", min(own, grace))
		m.stopForNode(st, &evictionNotice{reason: shutdownReason, message: shutdownMessage, nodePressure: true,
			grace: min(own, grace), keepOffline: true, stopped: done, once: &sync.Once{}})
	}
	deadline := time.NewTimer(grace + shutdownReportTimeout)
	defer deadline.Stop()
	for _, done := range stopped {
		select {
		case <-done:
		case <-deadline.C:
			m.log.Warn("the node's shutdown goes on before its pods stopped", "grace", grace)
			return
		case <-ctx.Done():
			return
		}
	}
}
