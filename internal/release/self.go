package release

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Self is a running orch's side of its own upgrade: it installs a release
// over its binary, on trial, and has the process start again on it.
type Self struct {
	dataDir, exe, version string
	log                   *slog.Logger
	// stop ends the process's parts; Exec then replaces it.
	stop func()

	mu        sync.Mutex
	swapped   *Trial // begun by this process: Exec starts the guard
	onTrial   bool   // this process runs a trial's binary
	committed bool
}

// NewSelf is the upgrade side of a process running version from its
// binary, keeping its state in dataDir; stop ends the process's parts so
// that Exec can replace it.
func NewSelf(dataDir, version string, log *slog.Logger, stop func()) (*Self, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("which binary runs: %w", err)
	}
	if exe, err = filepath.EvalSymlinks(exe); err != nil {
		return nil, fmt.Errorf("which binary runs: %w", err)
	}
	return &Self{dataDir: dataDir, exe: exe, version: version, log: log, stop: stop}, nil
}

// Version is the version this process runs.
func (s *Self) Version() string { return s.version }

// Start looks at the machine's trial as the process starts. A trial of
// this binary counts a start; past MaxStarts, or past its deadline, it is
// rolled back and Start says to restart at once (on the previous binary).
// A trial of another version is one whose swap never happened (a crash
// between writing it and swapping): it is dropped.
func (s *Self) Start() (restart bool, err error) {
	t, ok, err := LoadTrial(s.dataDir)
	if err != nil || !ok {
		return false, err
	}
	if t.To != s.version {
		s.log.Warn("dropping an upgrade trial this binary is not part of", "to", t.To, "running", s.version)
		return false, CommitTrial(s.dataDir)
	}
	if t.GuardPID > 0 {
		// The guard was this process's child before it replaced itself:
		// collect it when it ends.
		go func() { _, _ = syscall.Wait4(t.GuardPID, nil, 0, nil) }()
	}
	t.Starts++
	reason := ""
	switch {
	case t.Starts > MaxStarts:
		reason = fmt.Sprintf("the new binary started %d times without its node becoming Ready", t.Starts-1)
	case time.Now().After(t.Deadline):
		reason = "the node was not Ready on the new binary by the deadline"
	}
	if reason != "" {
		s.log.Error("rolling back an upgrade", "from", t.From, "to", t.To, "reason", reason)
		if err := RollBack(s.dataDir, t, reason); err != nil {
			return false, err
		}
		return true, nil
	}
	if err := SaveTrial(s.dataDir, t); err != nil {
		return false, err
	}
	s.mu.Lock()
	s.onTrial = true
	s.mu.Unlock()
	s.log.Info("running an upgrade on trial until the node is Ready", "from", t.From, "to", t.To, "deadline", t.Deadline, "start", t.Starts)
	return false, nil
}

// DownloadPath is where a release of version is downloaded: beside the
// binary it replaces, so that installing it is a rename.
func (s *Self) DownloadPath(version string) string {
	return filepath.Join(filepath.Dir(s.exe), "."+filepath.Base(s.exe)+"-"+version+".download")
}

// Swap installs the verified binary at file (DownloadPath(to)) on trial,
// to be Ready within timeout, and stops the process's parts; Exec then
// starts it.
func (s *Self) Swap(file, to string, timeout time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.swapped != nil {
		return fmt.Errorf("already swapped to %s", s.swapped.To)
	}
	_, supervised := os.LookupEnv("INVOCATION_ID") // systemd sets it for its services
	t := Trial{From: s.version, To: to, Exe: s.exe, Args: os.Args, Env: os.Environ(),
		Deadline: time.Now().Add(timeout), Supervised: supervised}
	// The trial is written before the swap: a crash after the swap finds
	// it, one before finds a trial of a version not installed (dropped).
	if err := SaveTrial(s.dataDir, t); err != nil {
		return err
	}
	if err := Install(s.exe, file); err != nil {
		_ = CommitTrial(s.dataDir)
		return err
	}
	s.swapped = &t
	s.log.Info("installed a new binary: restarting on it", "from", s.version, "to", to, "binary", s.exe)
	s.stop()
	return nil
}

// Restarting says a swap asked the process to start again.
func (s *Self) Restarting() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.swapped != nil
}

// OnTrial says this process runs an upgrade not yet kept.
func (s *Self) OnTrial() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.onTrial && !s.committed
}

// Ready says the node runs Ready on this binary: a trial is kept. It
// says whether this call kept it.
func (s *Self) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.onTrial || s.committed {
		return false
	}
	if err := CommitTrial(s.dataDir); err != nil {
		s.log.Error("keeping the upgrade", "err", err)
		return false
	}
	s.committed = true
	s.log.Info("upgrade kept: the node is Ready on this binary", "version", s.version)
	return true
}

// LastFailure is the machine's last rolled back upgrade not yet
// reported.
func (s *Self) LastFailure() (Failure, bool) { return LastFailure(s.dataDir) }

// MarkReported says the node reported LastFailure.
func (s *Self) MarkReported() error { return MarkFailureReported(s.dataDir) }

// Exec replaces the process with its binary as it now is (the same PID,
// the same arguments), once the process's parts have stopped: after a
// swap it first starts the guard, from the previous binary.
func (s *Self) Exec() error {
	s.mu.Lock()
	t := s.swapped
	s.mu.Unlock()
	if t != nil {
		pid, err := startGuard(s.dataDir, PreviousPath(s.exe), os.Getpid())
		if err != nil {
			// Without a guard the new binary still rolls back a failed
			// start itself (Start), if it runs at all.
			s.log.Error("starting the upgrade's guard", "err", err)
		} else {
			t.GuardPID = pid
			if err := SaveTrial(s.dataDir, *t); err != nil {
				s.log.Error("recording the upgrade's guard", "err", err)
			}
		}
	}
	return syscall.Exec(s.exe, os.Args, os.Environ())
}

// startGuard runs `orch upgrade guard` from the binary at bin, watching
// pid, in a session of its own so that nothing stopping pid stops it.
func startGuard(dataDir, bin string, pid int) (int, error) {
	logFile, err := os.OpenFile(filepath.Join(upgradeDir(dataDir), "guard.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer func() { _ = logFile.Close() }()
	cmd := exec.Command(bin, "upgrade", "guard", "--data-dir", dataDir, "--pid", strconv.Itoa(pid))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	guard := cmd.Process.Pid
	_ = cmd.Process.Release()
	return guard, nil
}
