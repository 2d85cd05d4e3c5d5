package boltstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/store"
)

const crashChildEnv = "ORCH_STORE_CRASH_CHILD"

// TestCrashChild is the writer the crash test kills; it does nothing unless
// started by TestKill9LosesNoAcknowledgedWrite.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashChildEnv)
	if dir == "" {
		t.Skip("run by TestKill9LosesNoAcknowledgedWrite")
	}
	s, err := Open(dir, Options{VolatilePrefixes: []string{"/vol/"}, CompactInterval: 30 * time.Millisecond})
	if err != nil {
		fmt.Println("open failed:", err)
		os.Exit(3)
	}
	var mu sync.Mutex
	ack := func(key string, rev int64, value string) {
		mu.Lock()
		fmt.Printf("ack %s %d %s\n", key, rev, value)
		mu.Unlock()
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				prefix := "/dur/"
				if w == 0 {
					prefix = "/vol/"
				}
				key := fmt.Sprintf("%sw%d/%d", prefix, w, i%16)
				value := fmt.Sprintf("%d-%d-%d", os.Getpid(), w, i)
				cur, err := s.Get(ctx, key)
				var kv store.KeyValue
				switch {
				case errors.Is(err, store.ErrNotFound):
					kv, err = s.Create(ctx, key, []byte(value))
				case err == nil:
					kv, err = s.Update(ctx, key, []byte(value), cur.ModRevision)
				}
				if err != nil {
					fmt.Println("write failed:", err)
					os.Exit(4)
				}
				ack(key, kv.ModRevision, value)
			}
		})
	}
	wg.Wait()
}

type ackedWrite struct {
	rev   int64
	value string
}

// TestKill9LosesNoAcknowledgedWrite kills a writing process with SIGKILL at
// random moments, many times over one data dir, and checks after each kill
// that the file opens cleanly, every acknowledged durable write is there,
// and revisions never go backwards.
func TestKill9LosesNoAcknowledgedWrite(t *testing.T) {
	rounds := 25
	if testing.Short() {
		rounds = 8
	}
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
	acked := map[string]ackedWrite{}
	var highest int64
	for round := range rounds {
		kill := time.Duration(20+r.IntN(200)) * time.Millisecond
		n, maxRev := runAndKill(t, dir, kill, acked)
		highest = max(highest, maxRev)

		s, err := Open(dir, Options{VolatilePrefixes: []string{"/vol/"}, CompactInterval: -1})
		if err != nil {
			t.Fatalf("round %d: reopen after kill -9: %v", round, err)
		}
		rev, _ := s.Revision(context.Background())
		if rev < highest {
			t.Fatalf("round %d: revision %d is below acknowledged revision %d", round, rev, highest)
		}
		for key, want := range acked {
			if strings.HasPrefix(key, "/vol/") {
				continue
			}
			got, err := s.Get(context.Background(), key)
			if err != nil || got.ModRevision < want.rev || (got.ModRevision == want.rev && string(got.Value) != want.value) {
				t.Fatalf("round %d: acknowledged %s=%s@%d, found %q@%d (%v)", round, key, want.value, want.rev, got.Value, got.ModRevision, err)
			}
		}
		_ = s.Close()
		checkFile(t, dir)
		t.Logf("round %d: killed after %v, %d writes acknowledged, revision %d", round, kill, n, rev)
	}
}

// runAndKill runs the child for d, kills it, and records its acks.
func runAndKill(t *testing.T, dir string, d time.Duration, acked map[string]ackedWrite) (n int, maxRev int64) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.v")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(d, func() { _ = cmd.Process.Signal(syscall.SIGKILL) })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if strings.HasPrefix(sc.Text(), "open failed") || strings.HasPrefix(sc.Text(), "write failed") {
			t.Fatalf("child: %s", sc.Text())
		}
		if len(f) != 4 || f[0] != "ack" {
			continue
		}
		rev, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			t.Fatalf("child printed %q", sc.Text())
		}
		if prev, ok := acked[f[1]]; ok && rev <= prev.rev {
			t.Fatalf("%s acknowledged at %d after %d: revisions went backwards", f[1], rev, prev.rev)
		}
		acked[f[1]] = ackedWrite{rev, f[3]}
		maxRev = max(maxRev, rev)
		n++
	}
	_ = cmd.Wait()
	return n, maxRev
}
