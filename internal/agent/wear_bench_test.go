package agent_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/proctest"
	"github.com/orch-dev/orch/internal/roottest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// deviceDisk is a file system of its own (ext4 on a loop device), whose
// writes the kernel counts apart from the machine's other disk traffic.
type deviceDisk struct {
	dir, device string
}

func newDeviceDisk(b *testing.B) *deviceDisk {
	b.Helper()
	for _, tool := range []string{"losetup", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("%s is needed", tool)
		}
	}
	image := filepath.Join(b.TempDir(), "disk.img")
	run := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			b.Skipf("%s %v: %v %s (no loop devices here?)", name, args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run("truncate", "-s", "4G", image)
	run("mkfs.ext4", "-q", "-F", image)
	device := run("losetup", "--find", "--show", image)
	d := &deviceDisk{dir: b.TempDir(), device: device}
	run("mount", device, d.dir)
	b.Cleanup(func() {
		agenttest.UnmountUnder(d.dir)
		_ = exec.Command("umount", "-l", d.dir).Run()
		_ = exec.Command("losetup", "-d", device).Run()
	})
	return d
}

// written is what the device has had written to it so far, in bytes,
// once everything pending is flushed.
func (d *deviceDisk) written(b *testing.B) int64 {
	b.Helper()
	syscall.Sync()
	data, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(d.device), "stat"))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(data))
	sectors, _ := strconv.ParseInt(f[6], 10, 64)
	return sectors * 512
}

// BenchmarkServerIdle: `orch server` with its own agent, as installed on
// a board: data dir on a disk of its own, runtime dir on tmpfs, 30 pods.
// It reports the bytes a pod start writes to the disk, and for ten
// minutes from the first minute after start the disk's writes per second
// (overall and in the worst minute) and the process's CPU, then its
// resident memory: the edge budgets (0.5 kB/s, 0.5 % of a core, 60 MB).
func BenchmarkServerIdle(b *testing.B) {
	roottest.Require(b, "running containers")
	bin := agenttest.BuildOrch(b)
	for range b.N {
		disk := newDeviceDisk(b)
		dir := disk.dir
		agenttest.WriteBusyboxImage(b, dir)
		runDir := b.TempDir()
		if err := syscall.Mount("tmpfs", runDir, "tmpfs", 0, "size=256m"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { agenttest.UnmountUnder(runDir); _ = syscall.Unmount(runDir, syscall.MNT_DETACH) })
		kubeconfig := filepath.Join(b.TempDir(), "kc.yaml")
		cmd := exec.Command(bin, "server", "--data-dir", dir, "--runtime-dir", runDir, "--write-kubeconfig", kubeconfig,
			"--https-listen-port", strconv.Itoa(agenttest.FreePort(b)), "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
			"--node-name", "board", "--node-ip", "127.0.0.1", "--kubelet-port", "0", "--disable-snapshots")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		started := time.Now()
		b.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
			agenttest.ReapNode(dir)
		})
		client := agenttest.WaitServer(b, kubeconfig)
		ctx := context.Background()
		running := func(want int) {
			agenttest.EventuallyWithin(b, fmt.Sprintf("%d pods Running", want), 3*time.Minute, func() bool {
				l, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
				n := 0
				for _, p := range l.Items {
					if p.Status.Phase == corev1.PodRunning {
						n++
					}
				}
				return err == nil && n == want
			})
		}
		create := func(from, to int) {
			for i := from; i < to; i++ {
				p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("idle-%02d", i)}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: agenttest.PtrTo[int64](0),
					Containers: []corev1.Container{{Name: "main", Image: "busybox:test", Command: []string{"sleep", "3600"}}}}}
				if _, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			running(to)
		}
		// The first pod unpacks the image; the next ten are what a pod
		// start writes.
		create(0, 1)
		time.Sleep(5 * time.Second)
		before := disk.written(b)
		create(1, 11)
		time.Sleep(5 * time.Second)
		b.ReportMetric(float64(disk.written(b)-before)/10/1024, "disk-KB/pod-start")
		create(11, 30)
		// From the first minute after start, a minute at a time, as the
		// budget is put: not only once settled (the second minute once
		// wrote 2.9 KB/s), and what is written in bursts minutes apart
		// shows in the worst minute. Ten minutes, to the eleventh: the
		// store's compaction runs every five, in memory; bbolt forgets the
		// start's history (the pods' creation and status writes, the
		// largest write an idle server makes: 660-820 KB) only at the
		// twelfth interval, an hour after start, so none of it is here.
		time.Sleep(time.Until(started.Add(time.Minute)))
		w0, cpu0, at0 := disk.written(b), proctest.CPUTicks(cmd.Process.Pid), time.Now()
		worst, last := 0.0, w0
		for range 10 {
			time.Sleep(time.Minute)
			w := disk.written(b)
			worst = max(worst, float64(w-last)/60/1024)
			last = w
		}
		w1, cpu1, at1 := last, proctest.CPUTicks(cmd.Process.Pid), time.Now()
		b.Logf("files written while idle: %v", modifiedSince(dir, at0))
		b.ReportMetric(float64(w1-w0)/at1.Sub(at0).Seconds()/1024, "idle-disk-KB/s")
		b.ReportMetric(worst, "worst-minute-disk-KB/s")
		b.ReportMetric(float64(cpu1-cpu0)/proctest.TicksPerSecond/at1.Sub(at0).Seconds()*100, "idle-cpu-%")
		b.ReportMetric(proctest.RSSMB(cmd.Process.Pid), "server+agent-rss-MB")
		b.ReportMetric(pssMB(cmd.Process.Pid), "server+agent-pss-MB")
		// What else the node's pods cost it: the containerd shims.
		var shims, shimsMB float64
		out, _ := exec.Command("pgrep", "-f", "containerd-shim-runc-v2 .*"+dir).Output()
		for _, f := range strings.Fields(string(out)) {
			pid, _ := strconv.Atoi(f)
			shims++
			shimsMB += pssMB(pid)
		}
		b.ReportMetric(shims, "shims")
		b.ReportMetric(shimsMB, "shims-pss-MB")
		deleteAll(b, client)
	}
}

func deleteAll(b *testing.B, client kubernetes.Interface) {
	b.Helper()
	if err := client.CoreV1().Pods("default").DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		b.Fatal(err)
	}
}

// modifiedSince lists the files under dir modified since t: what wrote
// to the disk while idle.
func modifiedSince(dir string, t time.Time) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if info, err := d.Info(); err == nil && info.ModTime().After(t) {
			rel, _ := filepath.Rel(dir, path)
			out = append(out, fmt.Sprintf("%s (%d KB)", rel, info.Size()>>10))
		}
		return nil
	})
	return out
}
