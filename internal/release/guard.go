package release

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Guard watches the process pid running a trial's binary, with the
// previous binary's code: when the process dies before its node is Ready,
// or the deadline passes, it stops it, puts the previous binary back and
// starts it (a service manager starts it when one supervises the
// process). It returns when the trial ends, kept or rolled back.
func Guard(ctx context.Context, dataDir string, pid int, every time.Duration, log *slog.Logger) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		trial, ok, err := LoadTrial(dataDir)
		if err != nil {
			return err
		}
		if !ok {
			log.Info("the upgrade's trial ended")
			return nil
		}
		alive := processAlive(pid)
		reason := ""
		switch {
		case !alive:
			reason = "the new binary exited before its node was Ready"
		case time.Now().After(trial.Deadline):
			reason = "the node was not Ready on the new binary by the deadline"
		default:
			continue
		}
		log.Error("rolling back an upgrade", "from", trial.From, "to", trial.To, "reason", reason)
		if alive {
			stopProcess(pid, 30*time.Second)
		}
		if err := RollBack(dataDir, trial, reason); err != nil {
			return fmt.Errorf("roll back to %s: %w", trial.From, err)
		}
		if trial.Supervised {
			return nil
		}
		return startDetached(dataDir, trial)
	}
}

// processAlive says pid runs (a zombie does not).
func processAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) STATE ...: comm may hold spaces and parentheses.
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

func stopProcess(pid int, grace time.Duration) {
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) && processAlive(pid) {
		time.Sleep(200 * time.Millisecond)
	}
	if processAlive(pid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// startDetached starts the trial's process again, on the binary now at
// its path, in a session of its own, its output appended to
// DATA/upgrade/orch.log.
func startDetached(dataDir string, t Trial) error {
	if len(t.Args) == 0 {
		return errors.New("the trial records no command line to start again")
	}
	out, err := os.OpenFile(filepath.Join(upgradeDir(dataDir), "orch.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer func() { _ = out.Close() }()
	cmd := exec.Command(t.Exe, t.Args[1:]...)
	cmd.Env = t.Env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s again: %w", t.Exe, err)
	}
	return cmd.Process.Release()
}
