package release

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/orch-dev/orch/internal/atomicfile"
)

// Trial is an upgrade a machine has installed but not yet kept: the
// process that installed it writes it before it swaps the binary, and
// the new binary removes it once its node is Ready. Until then the guard
// (and the new binary itself, at each start) may roll it back.
type Trial struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Exe is the binary the trial replaced; its previous version is at
	// PreviousPath(Exe).
	Exe string `json:"exe"`
	// Args and Env start the process again when no service manager does.
	Args []string `json:"args"`
	Env  []string `json:"env"`
	// Deadline is when the new binary must have its node Ready.
	Deadline time.Time `json:"deadline"`
	// Starts counts the new binary's starts: one that keeps dying under
	// a service manager is rolled back at its MaxStarts-th.
	Starts int `json:"starts"`
	// Supervised: a service manager (systemd) restarts the process.
	Supervised bool `json:"supervised,omitempty"`
	GuardPID   int  `json:"guardPID,omitempty"`
}

// MaxStarts is how often a new binary may start before its trial fails.
const MaxStarts = 3

// Failure is an upgrade a machine rolled back: its node says so, and the
// machine does not try that version again until told another.
type Failure struct {
	Version string    `json:"version"`
	Reason  string    `json:"reason"`
	Time    time.Time `json:"time"`
}

func upgradeDir(dataDir string) string { return filepath.Join(dataDir, "upgrade") }
func trialPath(dataDir string) string  { return filepath.Join(upgradeDir(dataDir), "trial.json") }
func failurePath(dataDir string) string {
	return filepath.Join(upgradeDir(dataDir), "failure.json")
}

// SaveTrial writes t (whole or not at all).
func SaveTrial(dataDir string, t Trial) error {
	data, err := json.Marshal(t)
	if err != nil {
		return err
	}
	return atomicfile.Write(trialPath(dataDir), data, 0o600)
}

// LoadTrial is the machine's trial, if one runs.
func LoadTrial(dataDir string) (Trial, bool, error) {
	var t Trial
	ok, err := readJSON(trialPath(dataDir), &t)
	return t, ok, err
}

// CommitTrial keeps the new binary: the trial ends.
func CommitTrial(dataDir string) error {
	if err := os.Remove(trialPath(dataDir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// RollBack puts the previous binary back, records why, and ends the
// trial.
func RollBack(dataDir string, t Trial, reason string) error {
	if err := Restore(t.Exe); err != nil {
		return err
	}
	data, err := json.Marshal(Failure{Version: t.To, Reason: reason, Time: time.Now().UTC()})
	if err != nil {
		return err
	}
	if err := atomicfile.Write(failurePath(dataDir), data, 0o600); err != nil {
		return err
	}
	return CommitTrial(dataDir)
}

// MarkFailureReported says the machine's node has reported its last
// rolled back upgrade: LastFailure no longer gives it.
func MarkFailureReported(dataDir string) error {
	err := os.Rename(failurePath(dataDir), failurePath(dataDir)+".reported")
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// LastFailure is the machine's last rolled back upgrade its node has not
// reported.
func LastFailure(dataDir string) (Failure, bool) {
	var f Failure
	ok, err := readJSON(failurePath(dataDir), &f)
	return f, ok && err == nil
}

func readJSON(path string, v any) (bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	return true, nil
}
