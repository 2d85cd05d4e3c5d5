package serverlb_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/agent/serverlb"
	"github.com/orch-dev/orch/internal/api/etcdmember"
	"github.com/orch-dev/orch/internal/proctest"
)

// serverProcess is `orch server` (no agent) run as a board runs it.
type serverProcess struct {
	cmd   *exec.Cmd
	dir   string
	addr  string // host:port of its API
	ip    string
	admin *rest.Config
}

// The servers of these benchmarks listen on addresses of their own on the
// loopback (127.0.0.0/8 is all local), away from the etcd ports of other
// tests on 127.0.0.1.
var benchServerIPs = []string{"127.0.0.11", "127.0.0.12", "127.0.0.13"}

func startServerProcess(b *testing.B, bin, ip string, port int, args ...string) *serverProcess {
	b.Helper()
	dir := b.TempDir()
	s := &serverProcess{dir: dir, ip: ip, addr: net.JoinHostPort(ip, strconv.Itoa(port))}
	kubeconfig := filepath.Join(dir, "admin.yaml")
	s.cmd = exec.Command(bin, append([]string{"server", "--data-dir", dir, "--disable-agent", "--disable-snapshots",
		"--bind-address", ip, "--advertise-address", ip, "--https-listen-port", strconv.Itoa(port), "--write-kubeconfig", kubeconfig}, args...)...)
	logFile, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		b.Fatal(err)
	}
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	if err := s.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		_ = logFile.Close()
	})
	agenttest.WaitServer(b, kubeconfig)
	if s.admin, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		b.Fatal(err)
	}
	return s
}

// threeServerProcesses runs three servers with their own etcd
// (--cluster-init, then --server with the server token) and returns them
// once all three vote.
func threeServerProcesses(b *testing.B, bin string) []*serverProcess {
	b.Helper()
	port := agenttest.FreePort(b)
	first := startServerProcess(b, bin, benchServerIPs[0], port, "--cluster-init", "--token", "bench-agents-0123456789")
	raw, err := os.ReadFile(filepath.Join(first.dir, "server", "server-token"))
	if err != nil {
		b.Fatal(err)
	}
	join := []string{"--server", "https://" + first.addr, "--token", strings.TrimSpace(string(raw))}
	servers := []*serverProcess{first}
	for _, ip := range benchServerIPs[1:] {
		servers = append(servers, startServerProcess(b, bin, ip, port, join...))
	}
	c := etcdClientOf(b, first)
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		voters, learners, err := etcdmember.CountMembers(ctx, c)
		cancel()
		if voters == 3 && learners == 0 {
			return servers
		}
		if time.Now().After(deadline) {
			b.Fatalf("three voting members not within a minute: %d and %d learners (%v)", voters, learners, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// etcdClientOf reaches every member with the server's etcd client
// certificate.
func etcdClientOf(b *testing.B, s *serverProcess) *clientv3.Client {
	b.Helper()
	certs, err := etcdmember.LoadCertificates(filepath.Join(s.dir, "server", "tls", "etcd"), false)
	if err != nil {
		b.Fatal(err)
	}
	var endpoints []string
	for _, ip := range benchServerIPs {
		endpoints = append(endpoints, "https://"+net.JoinHostPort(ip, strconv.Itoa(etcdmember.DefaultClientPort)))
	}
	c, err := certs.Client(endpoints)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// BenchmarkServersIdle: orch server processes (no agent) left alone, as on
// boards: one on its own store (bbolt), and three running their own etcd,
// same run. Per server, once settled (a minute after the last is ready),
// over two minutes: resident memory, CPU, and the bytes it had written to
// storage per second (an SD card's wear; /proc/PID/io). Every etcd member
// writes its WAL for every write of the cluster, idle or not: the Leases
// the servers renew.
func BenchmarkServersIdle(b *testing.B) {
	bin := agenttest.BuildOrch(b)
	for _, datastore := range []string{"bbolt", "embedded3"} {
		b.Run("datastore="+datastore, func(b *testing.B) {
			for range b.N {
				var servers []*serverProcess
				if datastore == "bbolt" {
					servers = []*serverProcess{startServerProcess(b, bin, benchServerIPs[0], agenttest.FreePort(b))}
				} else {
					servers = threeServerProcesses(b, bin)
				}
				time.Sleep(time.Minute)
				const window = 2 * time.Minute
				cpu0, w0 := make([]int64, len(servers)), make([]int64, len(servers))
				for i, s := range servers {
					cpu0[i], w0[i] = proctest.CPUTicks(s.cmd.Process.Pid), proctest.WrittenBytes(s.cmd.Process.Pid)
				}
				at0 := time.Now()
				time.Sleep(window)
				var cpu, written, rss float64
				for i, s := range servers {
					pid := s.cmd.Process.Pid
					cpu += float64(proctest.CPUTicks(pid) - cpu0[i])
					written += float64(proctest.WrittenBytes(pid) - w0[i])
					rss += proctest.RSSMB(pid)
				}
				secs, n := time.Since(at0).Seconds(), float64(len(servers))
				b.ReportMetric(rss/n, "rss-MB/server")
				b.ReportMetric(cpu/n/proctest.TicksPerSecond/secs*100, "cpu-%/server")
				b.ReportMetric(written/n/secs/1024, "disk-KB/s/server")
			}
		})
	}
}

// BenchmarkServersFailover: three servers with their own etcd; the server
// whose member leads is killed (-9) while clients write through the two
// others and a node's load balancer (the agent's serverlb, sending the
// node to the killed server until then) reads through it. Reported: the
// seconds from the kill to the next write acknowledged (target under 10 s,
// two election timeouts of the board settings), and to the node's first
// read through another server.
func BenchmarkServersFailover(b *testing.B) {
	bin := agenttest.BuildOrch(b)
	for range b.N {
		servers := threeServerProcesses(b, bin)
		members := etcdClientOf(b, servers[0])
		victim := -1
		for i, ip := range benchServerIPs {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			st, err := members.Status(ctx, "https://"+net.JoinHostPort(ip, strconv.Itoa(etcdmember.DefaultClientPort)))
			cancel()
			if err == nil && st.Leader == st.Header.MemberId {
				victim = i
			}
		}
		if victim < 0 {
			b.Fatal("no member leads")
		}

		// The node's load balancer, sent to the victim as the server it
		// joined, knowing the others as it learns them.
		admin := servers[victim].admin
		lb, err := serverlb.New(servers[victim].addr, filepath.Join(b.TempDir(), "servers.json"), admin.CAData, slog.New(slog.DiscardHandler))
		if err != nil {
			b.Fatal(err)
		}
		var addrs []string
		for _, s := range servers {
			addrs = append(addrs, s.addr)
		}
		lb.SetServers(addrs)
		ctx, cancel := context.WithCancel(context.Background())
		lbDone := make(chan error, 1)
		go func() { lbDone <- lb.Run(ctx) }()
		nodeCfg := rest.CopyConfig(admin)
		nodeCfg.Host = "https://" + lb.Address()
		node := clientFor(b, nodeCfg)
		if _, err := node.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "node"}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}

		var wg sync.WaitGroup
		var mu sync.Mutex
		var killed time.Time
		var writeResumed, nodeResumed time.Duration
		// record keeps the time to a success asked for after the kill.
		record := func(into *time.Duration, asked time.Time) bool {
			mu.Lock()
			defer mu.Unlock()
			if killed.IsZero() || asked.Before(killed) {
				return false
			}
			*into = time.Since(killed)
			return true
		}
		for i, s := range servers {
			if i == victim {
				continue
			}
			client := clientFor(b, s.admin)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; ctx.Err() == nil; n++ {
					asked := time.Now()
					_, err := client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("w%d-%d", i, n)}}, metav1.CreateOptions{})
					if err == nil && record(&writeResumed, asked) {
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				asked := time.Now()
				_, err := node.CoreV1().ConfigMaps("default").Get(ctx, "node", metav1.GetOptions{})
				if err == nil && record(&nodeResumed, asked) {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
		time.Sleep(2 * time.Second)
		mu.Lock()
		killed = time.Now()
		if err := servers[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
			b.Fatal(err)
		}
		mu.Unlock()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			b.Fatal("no write or node read within two minutes of the kill")
		}
		cancel()
		if err := <-lbDone; err != nil && !errors.Is(err, context.Canceled) {
			b.Fatal(err)
		}
		b.ReportMetric(writeResumed.Seconds(), "write-resumed-s")
		b.ReportMetric(nodeResumed.Seconds(), "node-resumed-s")
	}
}

// clientFor is a client that gives up on a request after 2 s, as a
// retrying one measures the first success.
func clientFor(b *testing.B, cfg *rest.Config) kubernetes.Interface {
	b.Helper()
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst, cfg.Timeout = -1, 0, 2*time.Second
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return c
}
