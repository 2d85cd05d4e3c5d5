// Package containerd gives the agent its container runtime: it starts the
// node's own containerd (config, root, state and socket under
// DATA/agent/containerd, the CRI plugin off since the agent speaks to it
// directly), restarts it if it dies, and imports the image tarballs users
// drop into DATA/agent/images, the air-gapped way to get images. Containers
// outlive containerd restarts: their shims keep them running.
//
// Runtime is all the pod manager asks of containerd; Client is it over a
// containerd client, Fake an in-memory one for tests without root, and
// TestRuntimeContract runs the same steps on both.
package containerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd"
)

// Namespace is the containerd namespace orch's containers and images live in.
const Namespace = "orch"

// config is containerd's configuration: everything under dir, no CRI.
const config = `version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q
`

// requiredServices are the gRPC services of containerd the agent uses.
// A containerd that started without one (its plugin failed to load: a
// node booted on a full disk) answers its health check yet cannot run a
// pod, until it is started again.
var requiredServices = []string{"containers", "content", "diff", "events", "images", "leases", "namespaces", "snapshots", "tasks"}

// HealthEvery is how often a serving containerd's services are checked
// (read when a Supervisor starts).
var HealthEvery = 30 * time.Second

// Supervisor runs containerd and keeps it running.
type Supervisor struct {
	dir    string
	log    *slog.Logger
	binary string
	// unhealthy is told why containerd is being restarted while it ran.
	unhealthy   func(reason string)
	healthEvery time.Duration

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	done   chan struct{}
}

// Done is closed once supervision ended and containerd stopped.
func (s *Supervisor) Done() <-chan struct{} { return s.done }

// Socket is the address of the supervised containerd.
func (s *Supervisor) Socket() string { return filepath.Join(s.dir, "containerd.sock") }

// Start runs containerd from PATH under dir, its state (what does not
// outlive a reboot: the containers' bundles, runc's state, the shims'
// sockets) in stateDir, and returns once it serves; it is restarted with
// back-off whenever it exits, or serves without a service the agent uses
// (unhealthy is told why), until ctx ends, and then stopped.
func Start(ctx context.Context, dir, stateDir string, log *slog.Logger, unhealthy func(reason string)) (*Supervisor, error) {
	binary, err := exec.LookPath("containerd")
	if err != nil {
		return nil, fmt.Errorf("containerd is not installed (apt install containerd runc): %w", err)
	}
	for _, d := range []string{filepath.Join(dir, "root"), stateDir, filepath.Join(dir, "opt")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("containerd dir: %w", err)
		}
	}
	if unhealthy == nil {
		unhealthy = func(string) {}
	}
	s := &Supervisor{dir: dir, log: log.With("component", "containerd"), binary: binary, unhealthy: unhealthy, healthEvery: HealthEvery, done: make(chan struct{})}
	cfg := fmt.Sprintf(config, filepath.Join(dir, "root"), stateDir, s.Socket(), filepath.Join(dir, "opt"))
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o600); err != nil {
		return nil, fmt.Errorf("containerd config: %w", err)
	}
	// A containerd of a previous run that did not stop it (orch killed
	// with -9, or its unit stopped with KillMode=process) still holds the
	// root's lock: stop it first. Its containers run on in their shims and
	// are adopted.
	if err := stopLeftovers(ctx, filepath.Join(dir, "config.toml"), s.log); err != nil {
		return nil, err
	}
	if err := s.start(); err != nil {
		return nil, err
	}
	if err := s.waitServing(ctx, 30*time.Second); err != nil {
		s.stop()
		return nil, err
	}
	go s.supervise(ctx)
	return s, nil
}

func (s *Supervisor) start() error {
	_ = os.Remove(s.Socket()) // a stale socket from a crash
	logFile, err := os.OpenFile(filepath.Join(s.dir, "containerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("containerd log: %w", err)
	}
	cmd := exec.Command(s.binary, "--config", filepath.Join(s.dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("start containerd: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logFile.Close()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	s.log.Info("containerd started", "pid", cmd.Process.Pid, "socket", s.Socket())
	return nil
}

// waitServing waits until containerd answers on its socket.
func (s *Supervisor) waitServing(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if c, err := containerd.New(s.Socket(), containerd.WithTimeout(time.Second)); err == nil {
			ok, err := c.IsServing(ctx)
			_ = c.Close()
			if ok && err == nil {
				return nil
			}
		}
		s.mu.Lock()
		exited := s.exited
		s.mu.Unlock()
		select {
		case <-exited:
			return fmt.Errorf("containerd exited at start; see %s", filepath.Join(s.dir, "containerd.log"))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("containerd did not start serving in time")
		}
	}
}

// supervise restarts containerd when it exits or lacks a service, and
// stops it when ctx ends.
func (s *Supervisor) supervise(ctx context.Context) {
	defer close(s.done)
	backoff := time.Second
	check := time.NewTimer(0) // at once: the start itself may have gone wrong
	defer check.Stop()
	for {
		s.mu.Lock()
		exited := s.exited
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			s.stop()
			return
		case <-check.C:
			check.Reset(s.healthEvery)
			missing, err := s.missingServices(ctx)
			if err != nil || len(missing) == 0 {
				// Not answering is for its exit or the next check to tell.
				continue
			}
			reason := fmt.Sprintf("containerd serves without %s; restarting it", strings.Join(missing, ", "))
			s.log.Error(reason)
			s.unhealthy(reason)
			s.stop()
			continue
		case <-exited:
		}
		s.log.Warn("containerd exited; restarting", "in", backoff)
		select {
		case <-ctx.Done():
			s.stop()
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
		if err := s.start(); err != nil {
			s.log.Error("restarting containerd", "err", err)
			continue
		}
		if err := s.waitServing(ctx, 30*time.Second); err == nil {
			backoff = time.Second
		}
	}
}

// missingServices lists the required services containerd does not serve
// (a plugin that failed to load, or was never registered).
func (s *Supervisor) missingServices(ctx context.Context) ([]string, error) {
	c, err := containerd.New(s.Socket(), containerd.WithTimeout(2*time.Second))
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := c.IntrospectionService().Plugins(ctx, nil)
	if err != nil {
		return nil, err
	}
	serving := map[string]bool{}
	for _, p := range resp.Plugins {
		if p.Type == "io.containerd.grpc.v1" && p.InitErr == nil {
			serving[p.ID] = true
		}
	}
	var missing []string
	for _, id := range requiredServices {
		if !serving[id] {
			missing = append(missing, id)
		}
	}
	return missing, nil
}

// stop ends containerd gracefully; the containers keep running.
func (s *Supervisor) stop() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Pid is the running containerd's process id (0 when not running).
func (s *Supervisor) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	select {
	case <-s.exited:
		return 0
	default:
		return s.cmd.Process.Pid
	}
}

// leftovers are the processes running containerd with this config: only
// ours are stopped, never another containerd on the machine.
func leftovers(config string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if len(args) == 3 && filepath.Base(args[0]) == "containerd" && args[1] == "--config" && args[2] == config {
			pids = append(pids, pid)
		}
	}
	return pids
}

// stopLeftovers stops the containerd a previous run left: SIGTERM, then
// SIGKILL after ten seconds.
func stopLeftovers(ctx context.Context, config string, log *slog.Logger) error {
	pids := leftovers(config)
	for _, pid := range pids {
		log.Warn("stopping the containerd a previous run left running", "pid", pid)
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// alive reports whether pid runs (a zombie of a parent that is gone is
// reaped by init and so does not linger).
func alive(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// The state follows the command's closing parenthesis: Z is a zombie.
	s := string(stat)
	i := strings.LastIndex(s, ")")
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
