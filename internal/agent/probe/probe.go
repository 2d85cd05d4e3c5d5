// Package probe checks containers as the kubelet's prober does: one check
// (exec in the container, an HTTP GET, a TCP connect or a gRPC health
// check against the pod) and the loop that runs a probe with its timing
// fields and thresholds. What a probe's outcome does to its container
// (restart it, mark it ready) is the pod manager's.
package probe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/clock"
)

// Target is what a check runs against.
type Target struct {
	// IP is the pod's address.
	IP string
	// Container is the container probed, whose ports name probe ports.
	Container *corev1.Container
	// Exec runs command in the container and fails unless it exits 0.
	Exec func(ctx context.Context, command []string) error
}

// Check runs one check of h against t, failing after timeout.
func Check(ctx context.Context, h corev1.ProbeHandler, t Target, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case h.Exec != nil || h.HTTPGet != nil:
		return Action(ctx, h.Exec, h.HTTPGet, t)
	case h.TCPSocket != nil:
		host := h.TCPSocket.Host
		if host == "" {
			host = t.IP
		}
		port, err := resolvePort(h.TCPSocket.Port, t.Container)
		if err != nil {
			return err
		}
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	case h.GRPC != nil:
		return grpcHealth(ctx, t.IP, h.GRPC)
	}
	return errors.New("probe has no handler")
}

// Action runs the exec or HTTP GET that probes and lifecycle hooks share.
func Action(ctx context.Context, exec *corev1.ExecAction, get *corev1.HTTPGetAction, t Target) error {
	if exec != nil {
		if t.Exec == nil {
			return errors.New("exec is not possible in this container")
		}
		return t.Exec(ctx, exec.Command)
	}
	if get == nil {
		return errors.New("the action has no handler")
	}
	return httpGet(ctx, t.IP, t.Container, get)
}

func grpcHealth(ctx context.Context, ip string, g *corev1.GRPCAction) error {
	conn, err := grpc.NewClient(net.JoinHostPort(ip, strconv.Itoa(int(g.Port))), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	service := ""
	if g.Service != nil {
		service = *g.Service
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
	if c != nil {
		for _, cp := range c.Ports {
			if cp.Name == p.StrVal {
				return int(cp.ContainerPort), nil
			}
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	name := ""
	if c != nil {
		name = c.Name
	}
	return 0, fmt.Errorf("container %s has no port named %q", name, p.StrVal)
}

// Loop runs check every periodSeconds after initialDelaySeconds, each
// within timeoutSeconds (Kubernetes' defaults for the ones unset), and
// calls result when the outcome reaches a threshold: successThreshold
// successes or failureThreshold failures in a row. It ends when result
// says it is done or ctx ends; failed hears every failure (the kubelet
// records each as an Unhealthy event).
func Loop(ctx context.Context, clk clock.WithTicker, p *corev1.Probe, check func(ctx context.Context, timeout time.Duration) error,
	failed func(error), result func(ok bool) (done bool)) {
	period := seconds(p.PeriodSeconds, 10)
	timeout := seconds(p.TimeoutSeconds, 1)
	successes, failures := max(p.SuccessThreshold, 1), max(p.FailureThreshold, 1)
	if p.InitialDelaySeconds > 0 {
		select {
		case <-ctx.Done():
			return
		case <-clk.After(time.Duration(p.InitialDelaySeconds) * time.Second):
		}
	}
	var okRun, failRun int32
	tick := clk.NewTicker(period)
	defer tick.Stop()
	for {
		err := check(ctx, timeout)
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
			failed(err)
			if failRun == failures && result(false) {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
	}
}

func seconds(v, def int32) time.Duration {
	if v <= 0 {
		v = def
	}
	return time.Duration(v) * time.Second
}
