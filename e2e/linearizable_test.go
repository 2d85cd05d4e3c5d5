//go:build e2e

package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/orch-dev/orch/internal/agent/agenttest"
)

// registerInput and registerOutput are one GET or PUT of a ConfigMap's
// value, as the checker sees it.
type registerInput struct {
	key   string
	put   bool
	value string
}

type registerOutput struct{ value string }

// registerModel is one register per key (a ConfigMap's data), checked key
// by key (porcupine's P-compositionality).
var registerModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(registerInput).key
			byKey[k] = append(byKey[k], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range byKey {
			out = append(out, ops)
		}
		return out
	},
	Init: func() any { return "init" },
	Step: func(state, input, output any) (bool, any) {
		in := input.(registerInput)
		if in.put {
			return true, in.value
		}
		return output.(registerOutput).value == state.(string), state
	},
	DescribeOperation: func(input, output any) string {
		in := input.(registerInput)
		if in.put {
			return fmt.Sprintf("put(%s, %s)", in.key, in.value)
		}
		return fmt.Sprintf("get(%s) -> %s", in.key, output.(registerOutput).value)
	},
}

// TestLinearizableAcrossServers: reads and writes of ConfigMaps through
// two servers on one etcd, one of them killed (-9) halfway, form a
// linearizable history (porcupine, as etcd's robustness tests check
// theirs): no acknowledged write is lost, no read sees an older value
// than one acknowledged before it began, through either server. A write
// whose answer the kill cut off may or may not have happened; the checker
// is told so.
func TestLinearizableAcrossServers(t *testing.T) {
	c := newCluster(t)
	_ = c.serverCmd.Process.Kill()
	_ = c.serverCmd.Wait()
	run(t, "ip", "addr", "add", "198.18.0.2/24", "dev", c.bridge)
	etcdArgs := startEtcdProcess(t)
	const token = "e2e-linearizable-secret-0123456789"
	port := agenttest.FreePort(t)
	servers := []*haServer{
		startHAServer(t, c.bin, c.server, port, append([]string{"--token", token}, etcdArgs...)),
		startHAServer(t, c.bin, "198.18.0.2", port, append([]string{"--token", token}, etcdArgs...)),
	}
	checkLinearizable(t, servers, 1, 3*time.Second, 8*time.Second)
}

// checkLinearizable runs six workers reading and updating four ConfigMaps
// through every server for duration, kills servers[victim] (-9) at killAt,
// and checks the history and a watch resumed across the kill. It returns
// how long after the kill the first write sent after it was acknowledged.
func checkLinearizable(t *testing.T, servers []*haServer, victim int, killAt, duration time.Duration) time.Duration {
	t.Helper()
	clients := make([]kubernetes.Interface, len(servers))
	for i, s := range servers {
		clients[i] = s.client(t, 5*time.Second)
	}
	ctx := context.Background()
	keys := []string{"k0", "k1", "k2", "k3"}
	var lastRV string
	for _, k := range keys {
		cm, err := clients[0].CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: k}, Data: map[string]string{"v": "init"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		lastRV = cm.ResourceVersion
	}
	// A watcher, as a reflector: first through the server that will be
	// killed, then resumed from the last resourceVersion it saw through
	// the other.
	watched := watchAcross(t, clients, lastRV)

	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	const workers = 6
	var killed atomic.Int64 // since start, once killed
	resumed := time.Duration(math.MaxInt64)
	var (
		mu                      sync.Mutex
		history                 []porcupine.Operation
		acknowledged, uncertain int
		written                 = map[string]string{} // resourceVersion → key=value of each acknowledged write
	)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for seq := 0; time.Since(start) < duration; seq++ {
				key := keys[rng.IntN(len(keys))]
				cms := clients[rng.IntN(len(clients))].CoreV1().ConfigMaps("default")
				in := registerInput{key: key, put: rng.IntN(2) == 0, value: fmt.Sprintf("w%d-%d", w, seq)}
				call := now()
				var out registerOutput
				var err error
				if in.put {
					var cm *corev1.ConfigMap
					if cm, err = cms.Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: key}, Data: map[string]string{"v": in.value}}, metav1.UpdateOptions{}); err == nil {
						mu.Lock()
						written[cm.ResourceVersion] = key + "=" + in.value
						mu.Unlock()
					}
				} else {
					var cm *corev1.ConfigMap
					if cm, err = cms.Get(ctx, key, metav1.GetOptions{}); err == nil {
						out.value = cm.Data["v"]
					}
				}
				ret := now()
				if err == nil && in.put && killed.Load() != 0 && call > killed.Load() {
					mu.Lock()
					resumed = min(resumed, time.Duration(ret-killed.Load()))
					mu.Unlock()
				}
				switch {
				case err == nil:
				case errors.Is(err, syscall.ECONNREFUSED) || !in.put:
					// Never sent, or a read: nothing happened.
					continue
				default:
					// Cut off: it may have happened, at any time from its call on.
					ret = math.MaxInt64
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: w, Input: in, Call: call, Output: out, Return: ret})
				if ret == math.MaxInt64 {
					uncertain++
				} else if in.put {
					acknowledged++
				}
				mu.Unlock()
			}
		})
	}
	time.Sleep(killAt)
	_ = servers[victim].cmd.Process.Kill() // reaped by the test's cleanup
	killed.Store(now())
	wg.Wait()
	events, streams := watched(5 * time.Second)
	if streams < 2 {
		t.Fatalf("the watch was never resumed (%d stream): the kill did not reach it", streams)
	}
	checkWatch(t, events, written)

	result, info := porcupine.CheckOperationsVerbose(registerModel, history, time.Minute)
	t.Logf("%d operations (%d acknowledged writes, %d cut off by the kill) through %d servers, one killed at %s: %s; the first write sent after the kill was acknowledged %s after it",
		len(history), acknowledged, uncertain, len(servers), killAt, result, resumed)
	if result != porcupine.Ok {
		if result == porcupine.Illegal {
			path := t.TempDir() + "/history.html"
			if err := porcupine.VisualizePath(registerModel, info, path); err == nil {
				t.Logf("the history, drawn: %s", path)
			}
		}
		t.Fatalf("the history is %s, not linearizable", result)
	}
	// The checker would see a stale read: the same history with one more
	// read, after everything, of the value every key started with.
	stale := append(slices.Clone(history), porcupine.Operation{ClientId: workers, Input: registerInput{key: "k0"}, Call: now(), Output: registerOutput{value: "init"}, Return: now() + 1})
	if porcupine.CheckOperationsTimeout(registerModel, stale, time.Minute) != porcupine.Illegal {
		t.Fatal("the checker accepts a stale read: it proves nothing")
	}
	if acknowledged < 100 {
		t.Fatalf("only %d acknowledged writes: the check proves little", acknowledged)
	}
	return resumed
}

// watchEvent is one change a watcher saw.
type watchEvent struct{ rv, change string }

// watchAcross watches the ConfigMaps from rv through each client in turn,
// resuming from the last resourceVersion seen whenever a stream ends (the
// first client's server is the one the test kills). stop waits for the
// events of a quiet period, ends the watch and returns what it saw.
func watchAcross(t *testing.T, clients []kubernetes.Interface, rv string) (stop func(quiet time.Duration) (events []watchEvent, streams int)) {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu     sync.Mutex
		events []watchEvent
		opened int
		last   = time.Now()
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; ctx.Err() == nil; i++ {
			w, err := clients[i%len(clients)].CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			mu.Lock()
			opened++
			mu.Unlock()
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					// The server said the history is gone: a gap. Anything
					// else (the stream cut by the kill, or by stop's cancel,
					// as client-go reports it) is resumed or ends the watch;
					// checkWatch finds any event that went missing.
					if err := apierrors.FromObject(ev.Object); ctx.Err() == nil && (apierrors.IsResourceExpired(err) || apierrors.IsGone(err)) {
						t.Errorf("watch resumed from %s: %v", rv, err)
					}
					break
				}
				cm, ok := ev.Object.(*corev1.ConfigMap)
				if !ok || ev.Type != watch.Modified {
					continue
				}
				rv = cm.ResourceVersion
				mu.Lock()
				events = append(events, watchEvent{rv: rv, change: cm.Name + "=" + cm.Data["v"]})
				last = time.Now()
				mu.Unlock()
			}
			w.Stop()
		}
	}()
	return func(quiet time.Duration) ([]watchEvent, int) {
		for {
			mu.Lock()
			idle := time.Since(last)
			mu.Unlock()
			if idle >= quiet {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return events, opened
	}
}

// checkWatch: the resumed stream is in resourceVersion order with no
// repeats, and holds every acknowledged write with its value (no gaps),
// across the failover (etcd's Ordered, Unique and Reliable watch checks).
func checkWatch(t *testing.T, events []watchEvent, written map[string]string) {
	t.Helper()
	seen := map[string]string{}
	var prev int64
	for _, ev := range events {
		n, err := strconv.ParseInt(ev.rv, 10, 64)
		if err != nil || n <= prev {
			t.Fatalf("watch event at resourceVersion %s after %d: out of order or repeated", ev.rv, prev)
		}
		prev = n
		seen[ev.rv] = ev.change
	}
	missing := 0
	for rv, change := range written {
		if got, ok := seen[rv]; !ok {
			missing++
		} else if got != change {
			t.Errorf("watch event at %s is %s, the write there was %s", rv, got, change)
		}
	}
	if missing > 0 {
		t.Fatalf("the watch missed %d of %d acknowledged writes across the failover", missing, len(written))
	}
	t.Logf("the watch saw %d events in order, every one of %d acknowledged writes among them, resumed across the kill", len(events), len(written))
}
