package release

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestCheckSkew(t *testing.T) {
	for _, tc := range []struct {
		from, to string
		force    bool
		err      string // a part of the error, "" for none
	}{
		{"v0.3.0", "v0.3.1", false, ""},
		{"v0.3.0", "v0.4.0", false, ""},
		{"v0.3.2", "v0.4.7", false, ""},
		{"v0.9.3", "v1.0.0", false, ""},
		{"v0.3.0", "v0.3.0", false, ""},
		{"v0.3.1", "v0.3.0", false, "downgrade"},
		{"v0.4.0", "v0.3.9", false, "downgrade"},
		{"v0.3.0", "v0.5.0", false, "upgrade to v0.4 first"},
		{"v0.9.0", "v1.1.0", false, "upgrade to v1.0 first"},
		{"v1.2.0", "v3.0.0", false, "skips a major"},
		{DevVersion, "v0.3.0", false, "development build"},
		{"abc1234", "v0.3.0", false, "development build"},
		{"v0.3.0", "latest", false, "no semantic version"},
		{"v0.4.0", "v0.3.0", true, ""},
		{"v0.3.0", "v0.5.0", true, ""},
		{DevVersion, "v0.3.0", true, ""},
		{"v0.3.0", "latest", true, "no semantic version"},
	} {
		err := CheckSkew(tc.from, tc.to, tc.force)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s -> %s (force %v): %v", tc.from, tc.to, tc.force, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s -> %s (force %v): got %v, want an error saying %q", tc.from, tc.to, tc.force, err, tc.err)
		}
	}
}

func TestLdflagValue(t *testing.T) {
	flags := "-s -w -X main.version=v0.4.1 -X 'main.commit=abc123' -X=main.other=x"
	for name, want := range map[string]string{"main.version": "v0.4.1", "main.commit": "abc123", "main.other": "x", "main.none": ""} {
		if got := ldflagValue(flags, name); got != want {
			t.Errorf("%s: got %q, want %q", name, got, want)
		}
	}
}

// buildFake builds testdata/fakeorch stamped with version, for goarch,
// with more go build flags (-trimpath).
func buildFake(t *testing.T, dir, name, version, goarch string, flags ...string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	args := append([]string{"build", "-ldflags", "-X main.version=" + version, "-o", out}, flags...)
	cmd := exec.Command("go", append(args, "./testdata/fakeorch")...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build fakeorch: %v: %s", err, b)
	}
	return out
}

func TestStoreAddVerifies(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	if runtime.GOOS != "linux" {
		t.Skip("linux")
	}
	ctx := context.Background()
	src := t.TempDir()
	store := Store{Dir: filepath.Join(t.TempDir(), "releases")}
	native := buildFake(t, src, "orch-native", "v0.5.0", runtime.GOARCH)
	r, err := store.Add(ctx, native, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if r.Version != "v0.5.0" || r.Platform != Platform() || len(r.SHA256) != 64 || r.Size == 0 {
		t.Fatalf("added %+v", r)
	}
	got, path, err := store.Get("v0.5.0", Platform())
	if err != nil || got != r {
		t.Fatalf("get: %+v, %v", got, err)
	}
	if sum, _, _ := fileSHA256(path); sum != r.SHA256 {
		t.Fatalf("the kept copy's sum is %s, not %s", sum, r.SHA256)
	}
	if _, _, err := store.Get("v0.6.0", Platform()); err == nil {
		t.Fatal("a version never staged was found")
	}
	if _, _, err := store.Get("../../etc", Platform()); err == nil {
		t.Fatal("a version naming a path outside the store was served")
	}

	// Another architecture's binary is taken from its build information.
	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	arm := buildFake(t, src, "orch-"+other, "v0.5.0", other) // orch-arm64 is checked for arm64
	if r, err := store.Add(ctx, arm, nil, ""); err != nil || r.Platform != "linux/"+other {
		t.Fatalf("another architecture's binary: %+v, %v", r, err)
	}

	// Refused: a sum that does not match, a file no sum names, a name
	// for another architecture, a corrupt binary, a binary not orch's.
	sums := map[string]string{"orch-native": strings.Repeat("0", 64)}
	if _, err := store.Add(ctx, native, sums, ""); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("a wrong sum: %v", err)
	}
	if _, err := store.Add(ctx, native, map[string]string{}, ""); err == nil || !strings.Contains(err.Error(), "names no") {
		t.Errorf("no sum: %v", err)
	}
	misnamed := filepath.Join(src, "orch-armv6")
	if err := copyPlain(native, misnamed); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Add(ctx, misnamed, nil, ""); err == nil || !strings.Contains(err.Error(), "not linux/arm/v6") {
		t.Errorf("a binary named for another architecture: %v", err)
	}
	corrupt := filepath.Join(src, "corrupt")
	data, _ := os.ReadFile(native)
	if err := os.WriteFile(corrupt, data[:len(data)/2], 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Add(ctx, corrupt, nil, ""); err == nil {
		t.Error("half a binary was staged")
	}
	if _, err := store.Add(ctx, "/bin/sh", nil, ""); err == nil {
		t.Error("a binary that is not orch was staged")
	}
	// A -trimpath build keeps no -ldflags: another architecture's says
	// no version unless this machine can run it; the release's sums and
	// its binary for this machine say it then.
	trimmed := buildFake(t, t.TempDir(), "orch-"+other, "v0.6.0", other, "-trimpath")
	if b, err := Verify(ctx, trimmed, ""); err != nil || b.Version != "" && b.Version != "v0.6.0" {
		t.Fatalf("a -trimpath build of another architecture: %+v, %v", b, err)
	} else if b.Version == "" {
		if _, err := store.Add(ctx, trimmed, nil, ""); err == nil || !strings.Contains(err.Error(), "cannot tell which version") {
			t.Errorf("a binary of no known version: %v", err)
		}
	}
	sum, _, _ := fileSHA256(trimmed)
	if r, err := store.Add(ctx, trimmed, map[string]string{"orch-" + other: sum}, "v0.6.0"); err != nil || r.Version != "v0.6.0" {
		t.Fatalf("a -trimpath build of another architecture, with its release: %+v, %v", r, err)
	}
	list, err := store.List()
	if err != nil || len(list) != 3 {
		t.Fatalf("list: %+v, %v", list, err)
	}
}

func TestInstallAndRestore(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "orch")
	write := func(path, s string) {
		if err := os.WriteFile(path, []byte(s), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	read := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	write(exe, "old")
	write(filepath.Join(dir, ".next"), "new")
	if err := Install(exe, filepath.Join(dir, ".next")); err != nil {
		t.Fatal(err)
	}
	if read(exe) != "new" || read(PreviousPath(exe)) != "old" {
		t.Fatalf("after install: %q, previous %q", read(exe), read(PreviousPath(exe)))
	}
	if err := Restore(exe); err != nil {
		t.Fatal(err)
	}
	if read(exe) != "old" || read(PreviousPath(exe)) != "old" {
		t.Fatalf("after restore: %q, previous %q", read(exe), read(PreviousPath(exe)))
	}
	if err := Install(exe, filepath.Join(t.TempDir(), "elsewhere")); err == nil {
		t.Fatal("a binary from another directory was installed (not atomically)")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("left behind: %v", entries)
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestStartRollsBackATrialThatKeepsFailing(t *testing.T) {
	data, dir := t.TempDir(), t.TempDir()
	exe := filepath.Join(dir, "orch")
	if err := os.WriteFile(exe, []byte("new"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(PreviousPath(exe), []byte("old"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := SaveTrial(data, Trial{From: "v0.1.0", To: "v0.2.0", Exe: exe, Deadline: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	self := &Self{dataDir: data, exe: exe, version: "v0.2.0", log: quiet()}
	for i := 1; i <= MaxStarts; i++ {
		if restart, err := self.Start(); err != nil || restart {
			t.Fatalf("start %d: restart %v, %v", i, restart, err)
		}
	}
	restart, err := self.Start()
	if err != nil || !restart {
		t.Fatalf("start %d: restart %v, %v; want a roll back", MaxStarts+1, restart, err)
	}
	if b, _ := os.ReadFile(exe); string(b) != "old" {
		t.Fatalf("the binary is %q after a roll back", b)
	}
	f, ok := LastFailure(data)
	if !ok || f.Version != "v0.2.0" || !strings.Contains(f.Reason, "started 3 times") {
		t.Fatalf("failure %+v (%v)", f, ok)
	}
	if _, ok, _ := LoadTrial(data); ok {
		t.Fatal("the trial outlived its roll back")
	}
}

func TestStartDropsATrialOfAnotherVersion(t *testing.T) {
	data := t.TempDir()
	if err := SaveTrial(data, Trial{From: "v0.1.0", To: "v0.2.0", Exe: "/nonexistent"}); err != nil {
		t.Fatal(err)
	}
	self := &Self{dataDir: data, version: "v0.1.0", log: quiet()}
	if restart, err := self.Start(); err != nil || restart {
		t.Fatalf("restart %v, %v", restart, err)
	}
	if _, ok, _ := LoadTrial(data); ok {
		t.Fatal("a trial whose swap never happened was kept")
	}
}

func TestReadyCommitsOnlyATrial(t *testing.T) {
	data := t.TempDir()
	self := &Self{dataDir: data, version: "v0.2.0", log: quiet()}
	if err := SaveTrial(data, Trial{From: "v0.1.0", To: "v0.2.0", Deadline: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := self.Start(); err != nil {
		t.Fatal(err)
	}
	self.Ready()
	if _, ok, _ := LoadTrial(data); ok {
		t.Fatal("Ready kept the trial")
	}
}

// TestGuardRollsBackADeadProcess: the guard of a trial whose process died
// puts the previous binary back and starts it with the trial's command
// line.
func TestGuardRollsBackADeadProcess(t *testing.T) {
	data, dir := t.TempDir(), t.TempDir()
	exe := filepath.Join(dir, "orch")
	started := filepath.Join(dir, "started")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(PreviousPath(exe), []byte("#!/bin/sh\necho \"$@\" > "+started+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	trial := Trial{From: "v0.1.0", To: "v0.2.0", Exe: exe, Args: []string{exe, "agent", "--data-dir", data}, Env: os.Environ(), Deadline: time.Now().Add(time.Hour)}
	if err := SaveTrial(data, trial); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Guard(ctx, data, dead.Process.Pid, 20*time.Millisecond, quiet()); err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(started); err == nil && strings.TrimSpace(string(b)) == "agent --data-dir "+data {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the previous binary was not started again")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if f, ok := LastFailure(data); !ok || !strings.Contains(f.Reason, "exited before") {
		t.Fatalf("failure %+v", f)
	}
}

// TestGuardStopsAProcessPastItsDeadline and leaves a supervised one's
// start to its service manager.
func TestGuardStopsAProcessPastItsDeadline(t *testing.T) {
	data, dir := t.TempDir(), t.TempDir()
	exe := filepath.Join(dir, "orch")
	for _, p := range []string{exe, PreviousPath(exe)} {
		if err := os.WriteFile(p, []byte(filepath.Base(p)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	running := exec.Command("sleep", "60")
	if err := running.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = running.Wait(); close(waited) }()
	if err := SaveTrial(data, Trial{From: "v0.1.0", To: "v0.2.0", Exe: exe, Deadline: time.Now().Add(100 * time.Millisecond), Supervised: true}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Guard(ctx, data, running.Process.Pid, 20*time.Millisecond, quiet()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-waited:
	case <-ctx.Done():
		t.Fatal("the process past its deadline still runs")
	}
	if b, _ := os.ReadFile(exe); string(b) != "orch.previous" {
		t.Fatalf("the binary is %q", b)
	}
	if f, ok := LastFailure(data); !ok || !strings.Contains(f.Reason, "deadline") {
		t.Fatalf("failure %+v", f)
	}
}

// TestInstallHelper is TestInstallSurvivesSIGKILL's process that swaps
// binaries until it is killed; it does nothing in a normal run.
func TestInstallHelper(t *testing.T) {
	dir := os.Getenv("ORCH_INSTALL_HELPER_DIR")
	if dir == "" {
		t.Skip("the helper of TestInstallSurvivesSIGKILL")
	}
	exe := filepath.Join(dir, "orch")
	for i := 0; ; i++ {
		next := filepath.Join(dir, ".orch.download")
		if err := copyPlain(filepath.Join(dir, []string{"a", "b"}[i%2]), next); err != nil {
			t.Fatal(err)
		}
		if err := Install(exe, next); err != nil {
			t.Fatal(err)
		}
	}
}

// TestInstallSurvivesSIGKILL: a process killed at any moment of its
// swaps leaves the binary and the previous one whole, each one of the two
// versions, never missing.
func TestInstallSurvivesSIGKILL(t *testing.T) {
	dir := t.TempDir()
	versions := map[string]string{}
	for _, v := range []string{"a", "b"} {
		data := []byte(strings.Repeat(v, 4<<20)) // 4 MB: swaps that take a while
		if err := os.WriteFile(filepath.Join(dir, v), data, 0o755); err != nil {
			t.Fatal(err)
		}
		sum, _, _ := fileSHA256(filepath.Join(dir, v))
		versions[sum] = v
	}
	if err := copyPlain(filepath.Join(dir, "a"), filepath.Join(dir, "orch")); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "orch")
	for i := range 12 {
		helper := exec.Command(os.Args[0], "-test.run=^TestInstallHelper$")
		helper.Env = append(os.Environ(), "ORCH_INSTALL_HELPER_DIR="+dir)
		if err := helper.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(20+i*13) * time.Millisecond)
		_ = helper.Process.Kill()
		_ = helper.Wait()
		for _, p := range []string{exe, PreviousPath(exe)} {
			sum, size, err := fileSHA256(p)
			if p == PreviousPath(exe) && errors.Is(err, fs.ErrNotExist) {
				continue // killed before its first swap
			}
			if err != nil || versions[sum] == "" {
				t.Fatalf("kill %d: %s is %d bytes, not one of the two whole versions (%v)", i, p, size, err)
			}
		}
	}
	if _, err := os.Stat(PreviousPath(exe)); err != nil {
		t.Fatalf("the helper never swapped: %v", err)
	}
}

func TestOlder(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"v0.9.0", "v0.9.1", true}, {"v0.9.1", "v0.9.1", false}, {"v0.10.0", "v0.9.1", false},
		{DevVersion, "v0.1.0", true}, {"abc1234", "v0.1.0", true}, {"v0.9.0", "not-a-version", false},
	} {
		if got := Older(tc.a, tc.b); got != tc.want {
			t.Errorf("Older(%q, %q) = %v", tc.a, tc.b, got)
		}
	}
}
