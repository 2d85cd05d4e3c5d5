package pods

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	orchctr "github.com/orch-dev/orch/internal/agent/containerd"

	"github.com/containerd/containerd/cio"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// startProbes runs a started container's probes until it exits: the
// startup probe first, then liveness and readiness, with Kubernetes'
// timing fields and thresholds.
func (m *Manager) startProbes(ctx context.Context, pod *corev1.Pod, st *podState, cs *containerState, c *corev1.Container) {
	if c.StartupProbe == nil && c.LivenessProbe == nil && c.ReadinessProbe == nil {
		return
	}
	pctx, cancel := context.WithCancel(ctx)
	m.mu.Lock()
	if cs.stopProbes != nil {
		cs.stopProbes()
	}
	cs.stopProbes = cancel
	m.mu.Unlock()
	restart := func(which string) {
		m.log.Info("container failed its "+which+" probe: restarting it", "pod", st.key(), "container", c.Name)
		m.event(pod, c.Name, corev1.EventTypeNormal, "Killing", "Container %s failed %s probe, will be restarted", c.Name, which)
		grace := graceOf(pod)
		for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe} {
			if p != nil && p.TerminationGracePeriodSeconds != nil {
				grace = time.Duration(*p.TerminationGracePeriodSeconds) * time.Second
			}
		}
		cancel()
		m.kill(ctx, cs, grace)
	}
	m.mu.Lock()
	startupDone := cs.startupDone
	m.mu.Unlock()
	go func() {
		if c.StartupProbe != nil && !startupDone {
			started := make(chan bool, 1)
			m.probeLoop(pctx, pod, st, c, "Startup", c.StartupProbe, func(ok bool) bool {
				started <- ok
				return true
			})
			select {
			case ok := <-started:
				if !ok {
					restart("startup")
					return
				}
			default:
				return // stopped
			}
			m.mu.Lock()
			cs.startupDone = true
			m.mu.Unlock()
			m.queue.Add(st.key())
		}
		if c.ReadinessProbe != nil {
			go m.probeLoop(pctx, pod, st, c, "Readiness", c.ReadinessProbe, func(ok bool) bool {
				m.mu.Lock()
				changed := cs.ready != ok
				cs.ready = ok
				m.mu.Unlock()
				if changed {
					m.queue.Add(st.key())
				}
				return false
			})
		}
		if c.LivenessProbe != nil {
			m.probeLoop(pctx, pod, st, c, "Liveness", c.LivenessProbe, func(ok bool) bool {
				if !ok {
					restart("liveness")
				}
				return !ok
			})
		}
	}()
}

// probeLoop runs probe (of the kind: Startup, Liveness, Readiness) every
// period after its initial delay and calls result when the outcome passes
// a threshold (successThreshold successes, failureThreshold failures in a
// row) or changes; it ends when result says so or ctx ends. Each failure
// is an Unhealthy event, as the kubelet records it.
func (m *Manager) probeLoop(ctx context.Context, pod *corev1.Pod, st *podState, c *corev1.Container, kind string, p *corev1.Probe, result func(ok bool) (done bool)) {
	period := seconds(p.PeriodSeconds, 10)
	timeout := seconds(p.TimeoutSeconds, 1)
	successes, failures := max(p.SuccessThreshold, 1), max(p.FailureThreshold, 1)
	if p.InitialDelaySeconds > 0 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(p.InitialDelaySeconds) * time.Second):
		}
	}
	var okRun, failRun int32
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		err := m.probe(ctx, pod, st, c, p.ProbeHandler, timeout)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			okRun, failRun = okRun+1, 0
			if okRun == successes && result(true) {
				return
			}
		} else {
			okRun, failRun = 0, failRun+1
			m.log.Debug("probe failed", "pod", st.key(), "container", c.Name, "err", err)
			m.event(pod, c.Name, corev1.EventTypeWarning, "Unhealthy", "%s probe failed: %v", kind, err)
			if failRun == failures && result(false) {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func seconds(v, def int32) time.Duration {
	if v <= 0 {
		v = def
	}
	return time.Duration(v) * time.Second
}

// probe runs one check: exec in the container, an HTTP GET, a TCP
// connect or a gRPC health check against the pod.
func (m *Manager) probe(ctx context.Context, pod *corev1.Pod, st *podState, c *corev1.Container, h corev1.ProbeHandler, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ip := m.podIP(st)
	switch {
	case h.Exec != nil || h.HTTPGet != nil:
		return m.runAction(ctx, pod, st, c, h.Exec, h.HTTPGet)
	case h.TCPSocket != nil:
		host := h.TCPSocket.Host
		if host == "" {
			host = ip
		}
		port, err := resolvePort(h.TCPSocket.Port, c)
		if err != nil {
			return err
		}
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	case h.GRPC != nil:
		conn, err := grpc.NewClient(net.JoinHostPort(ip, strconv.Itoa(int(h.GRPC.Port))), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close() }()
		service := ""
		if h.GRPC.Service != nil {
			service = *h.GRPC.Service
		}
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			return err
		}
		if resp.Status != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("gRPC health: %s", resp.Status)
		}
		return nil
	}
	return errors.New("probe has no handler")
}

// runHandler runs a lifecycle hook (postStart, preStop).
func (m *Manager) runHandler(ctx context.Context, pod *corev1.Pod, st *podState, c *corev1.Container, h *corev1.LifecycleHandler, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	switch {
	case h.Exec != nil || h.HTTPGet != nil:
		return m.runAction(ctx, pod, st, c, h.Exec, h.HTTPGet)
	case h.Sleep != nil:
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(h.Sleep.Seconds) * time.Second):
		}
		return nil
	}
	return errors.New("lifecycle hook has no handler")
}

// runAction runs the exec or HTTP GET that probes and hooks share.
func (m *Manager) runAction(ctx context.Context, pod *corev1.Pod, st *podState, c *corev1.Container, exec *corev1.ExecAction, get *corev1.HTTPGetAction) error {
	if exec != nil {
		return m.execIn(ctx, containerID(pod, c.Name), exec.Command)
	}
	return httpGet(ctx, m.podIP(st), c, get)
}

func (m *Manager) podIP(st *podState) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return st.ip
}

// execIn runs command in the container (as its process runs: same user,
// env and working directory) and fails unless it exits 0 before ctx ends.
func (m *Manager) execIn(ctx context.Context, id string, command []string) error {
	cctx := m.ctx(ctx)
	task, pspec, err := m.processSpec(cctx, id, command, false)
	if err != nil {
		return err
	}
	code, err := m.execProcess(ctx, task, pspec, cio.NullIO, nil, nil)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("command %q timed out", strings.Join(command, " "))
	case err != nil:
		return err
	case code != 0:
		return fmt.Errorf("command %q exited with %d", strings.Join(command, " "), code)
	}
	return nil
}

// processSpec is a process for the running container id as its own
// process runs (user, env, working directory), running command.
func (m *Manager) processSpec(cctx context.Context, id string, command []string, tty bool) (orchctr.Task, *specs.Process, error) {
	spec, err := m.ctr.Spec(cctx, id)
	if err != nil {
		return nil, nil, err
	}
	task, err := m.ctr.Task(cctx, id, nil)
	if err != nil {
		return nil, nil, err
	}
	pspec := *spec.Process
	pspec.Args, pspec.Terminal = command, tty
	return task, &pspec, nil
}

// execID names an exec'd process.
func execID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "exec-" + hex.EncodeToString(b[:])
}

// httpGet is an HTTP(S) GET against the pod (or the host named) that
// succeeds on a 2xx or 3xx answer, as the kubelet's probes do.
func httpGet(ctx context.Context, ip string, c *corev1.Container, g *corev1.HTTPGetAction) error {
	host := g.Host
	if host == "" {
		host = ip
	}
	port, err := resolvePort(g.Port, c)
	if err != nil {
		return err
	}
	scheme := strings.ToLower(string(g.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	path := g.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	u := &url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(port))}
	full, err := url.Parse(u.String() + path)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, full.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "kube-probe/orch")
	req.Header.Set("Accept", "*/*")
	for _, h := range g.HTTPHeaders {
		if strings.EqualFold(h.Name, "Host") {
			req.Host = h.Value
			continue
		}
		req.Header.Add(h.Name, h.Value)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}} //nolint:gosec // the kubelet does not verify probe targets either
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
	}
	return nil
}

// resolvePort is a probe's port: a number, or the name of one of the
// container's ports.
func resolvePort(p intstr.IntOrString, c *corev1.Container) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("container %s has no port named %q", c.Name, p.StrVal)
}
