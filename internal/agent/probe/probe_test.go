package probe

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	clocktesting "k8s.io/utils/clock/testing"
)

// script is a check whose outcomes the test gives, one per call, and
// which says on calls when it was called.
type script struct {
	mu       sync.Mutex
	outcomes []bool
	calls    chan time.Duration
}

func (s *script) check(_ context.Context, timeout time.Duration) error {
	s.mu.Lock()
	ok := len(s.outcomes) > 0 && s.outcomes[0]
	if len(s.outcomes) > 0 {
		s.outcomes = s.outcomes[1:]
	}
	s.mu.Unlock()
	s.calls <- timeout
	if ok {
		return nil
	}
	return errors.New("no")
}

// TestLoop: Kubernetes' probe timing on a stepped clock: nothing before
// the initial delay, one check each period with the probe's timeout, the
// result only once a threshold is reached in a row, every failure heard.
func TestLoop(t *testing.T) {
	start := time.Now()
	clk := clocktesting.NewFakeClock(start)
	s := &script{outcomes: []bool{false, true, false, false, false}, calls: make(chan time.Duration, 10)}
	p := &corev1.Probe{InitialDelaySeconds: 5, PeriodSeconds: 2, TimeoutSeconds: 3, FailureThreshold: 3}
	var mu sync.Mutex
	var failures int
	results := make(chan bool, 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		Loop(ctx, clk, p, s.check, func(error) { mu.Lock(); failures++; mu.Unlock() }, func(ok bool) bool {
			results <- ok
			return !ok
		})
	}()
	waitTimers := func() {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !clk.HasWaiters() {
			if time.Now().After(deadline) {
				t.Fatal("the loop set no timer")
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitTimers()
	clk.Step(4 * time.Second)
	select {
	case <-s.calls:
		t.Fatal("checked before the initial delay")
	case <-time.After(50 * time.Millisecond):
	}
	clk.Step(time.Second)
	want := []bool{false, true, false, false, false}
	for i := range want {
		select {
		case timeout := <-s.calls:
			if timeout != 3*time.Second {
				t.Errorf("check %d with timeout %v, want 3s", i, timeout)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("check %d did not come", i)
		}
		if i == 1 {
			// successThreshold 1: one success is a result.
			if ok := <-results; !ok {
				t.Fatal("a success reported as a failure")
			}
		}
		if i < len(want)-1 {
			waitTimers()
			clk.Step(2 * time.Second)
		}
	}
	select {
	case ok := <-results:
		if ok {
			t.Fatal("three failures reported as a success")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("three failures in a row were no result")
	}
	<-done // result said done
	mu.Lock()
	defer mu.Unlock()
	if failures != 4 {
		t.Errorf("%d failures heard, want 4", failures)
	}
}

// TestCheck: each handler against a real listener, named ports, and the
// kubelet's rule that 2xx and 3xx are healthy.
func TestCheck(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			if r.Header.Get("User-Agent") != "kube-probe/orch" || r.Host != "app.local" {
				w.WriteHeader(http.StatusBadRequest)
			}
		case "/moved":
			w.WriteHeader(http.StatusFound)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	host, portText, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portText)
	c := &corev1.Container{Name: "app", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: int32(port)}}}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := closed.Addr().(*net.TCPAddr).Port
	_ = closed.Close()
	target := Target{IP: host, Container: c, Exec: func(_ context.Context, command []string) error {
		if command[0] == "true" {
			return nil
		}
		return errors.New("exit 1")
	}}
	get := func(path string, port intstr.IntOrString) corev1.ProbeHandler {
		return corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: port, HTTPHeaders: []corev1.HTTPHeader{{Name: "Host", Value: "app.local"}}}}
	}
	for _, tc := range []struct {
		name    string
		handler corev1.ProbeHandler
		ok      bool
	}{
		{"http by port name", get("/healthz", intstr.FromString("http")), true},
		{"http by number", get("healthz", intstr.FromInt32(int32(port))), true},
		{"http redirect", get("/moved", intstr.FromString("http")), true},
		{"http 503", get("/down", intstr.FromString("http")), false},
		{"http no such port name", get("/healthz", intstr.FromString("metrics")), false},
		{"tcp open", corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("http")}}, true},
		{"tcp closed", corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(int32(closedPort))}}, false},
		{"exec 0", corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}, true},
		{"exec 1", corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"false"}}}, false},
		{"none", corev1.ProbeHandler{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(context.Background(), tc.handler, target, 2*time.Second)
			if (err == nil) != tc.ok {
				t.Errorf("check: %v, want ok %v", err, tc.ok)
			}
		})
	}
}
