//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestInstallAndUninstall runs scripts/install.sh in a throw-away root (its
// directories in a temporary one, the machine a network namespace), checks
// the unit with systemd-analyze, starts orch as the unit says, runs a pod,
// then the uninstall script: no process, mount, iptables rule, route,
// link or file of orch's is left.
func TestInstallAndUninstall(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze is needed (Debian's systemd package)")
	}
	bin := agenttest.BuildOrch(t)
	root := t.TempDir()
	data := agenttest.NodeDataDir(t) // holds the busybox test image
	dirs := map[string]string{"INSTALL_ORCH_BIN_DIR": filepath.Join(root, "bin"), "INSTALL_ORCH_SYSTEMD_DIR": filepath.Join(root, "systemd"),
		"INSTALL_ORCH_CONFIG_DIR": filepath.Join(root, "etc"), "INSTALL_ORCH_DATA_DIR": data, "INSTALL_ORCH_RUNTIME_DIR": filepath.Join(root, "run")}

	// The machine: a network namespace with one address.
	id := fmt.Sprintf("%d", os.Getpid()%10000)
	ns, host := "inst-"+id, "inst"+id
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	run(t, "ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", host).Run() })
	run(t, "ip", "addr", "add", "198.18.9.1/24", "dev", host)
	run(t, "ip", "link", "set", host, "up")
	run(t, "ip", "-n", ns, "addr", "add", "198.18.9.2/24", "dev", "eth0")
	run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
	run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	run(t, "ip", "-n", ns, "route", "add", "default", "via", "198.18.9.1")
	inNS := func(name string, args ...string) *exec.Cmd {
		return exec.Command("nsenter", append([]string{"--net=/run/netns/" + ns, name}, args...)...)
	}
	state := func() map[string]string {
		out := map[string]string{}
		for what, cmd := range map[string]*exec.Cmd{
			"iptables": inNS("iptables-save"), "routes": inNS("ip", "route", "show", "table", "all"), "links": inNS("ip", "-o", "link", "show"),
		} {
			b, _ := cmd.Output()
			lines := strings.Split(string(b), "\n")
			var keep []string
			builtin := map[string]bool{":INPUT": true, ":FORWARD": true, ":OUTPUT": true, ":PREROUTING": true, ":POSTROUTING": true}
			for _, l := range lines {
				// Rules and chains of one's own; the kernel's tables and
				// built-in chains appear once anything used iptables.
				if what == "iptables" && !strings.HasPrefix(l, "-A") && !strings.HasPrefix(l, ":") {
					continue
				}
				if what == "iptables" && strings.HasPrefix(l, ":") {
					if l = strings.Fields(l)[0]; builtin[l] {
						continue
					}
				}
				// The kernel gives eth0 its IPv6 link-local address when it will.
				if what == "routes" && strings.Contains(l, "fe80::") {
					continue
				}
				if what == "links" {
					l = regexp.MustCompile(`^\d+: (\S+?)[:@].*`).ReplaceAllString(l, "$1")
				}
				keep = append(keep, l)
			}
			out[what] = strings.Join(keep, "\n")
		}
		return out
	}
	before := state()

	port, kubeletPort := agenttest.FreePort(t), agenttest.FreePort(t)
	install := exec.Command("sh", "../scripts/install.sh", "--node-name", "installed", "--node-ip", "198.18.9.2", "--bind-address", "198.18.9.2",
		"--advertise-address", "198.18.9.2", "--https-listen-port", strconv.Itoa(port), "--kubelet-port", strconv.Itoa(kubeletPort))
	install.Env = append(os.Environ(), "ORCH_BINARY="+bin, "INSTALL_ORCH_SKIP_DEPS=true", "INSTALL_ORCH_SKIP_START=true")
	for k, v := range dirs {
		install.Env = append(install.Env, k+"="+v)
	}
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	unit := filepath.Join(dirs["INSTALL_ORCH_SYSTEMD_DIR"], "orch.service")
	if out, err := exec.Command("systemd-analyze", "verify", unit).CombinedOutput(); err != nil {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	for _, f := range []string{"orch", "orch-killall.sh", "orch-uninstall.sh"} {
		if _, err := os.Stat(filepath.Join(dirs["INSTALL_ORCH_BIN_DIR"], f)); err != nil {
			t.Errorf("installed %s: %v", f, err)
		}
	}
	unitText, _ := os.ReadFile(unit)
	for _, want := range []string{"KillMode=process", "Delegate=yes", "Restart=always"} {
		if !strings.Contains(string(unitText), want) {
			t.Errorf("the unit lacks %s", want)
		}
	}

	// Started as systemd would start it.
	m := regexp.MustCompile(`(?m)^ExecStart=(.*)$`).FindStringSubmatch(string(unitText))
	var argv []string
	for _, a := range strings.Fields(m[1]) {
		argv = append(argv, strings.Trim(a, `"`))
	}
	orch := inNS(argv[0], argv[1:]...)
	logPath := filepath.Join(t.TempDir(), "orch.log")
	logFile, _ := os.Create(logPath)
	orch.Stdout, orch.Stderr = logFile, logFile
	if err := orch.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = orch.Process.Kill()
		_ = orch.Wait()
		if t.Failed() {
			out, _ := exec.Command("tail", "-n", "30", logPath).Output()
			t.Logf("orch's log ends:\n%s", out)
		}
	})
	client := agenttest.WaitServer(t, filepath.Join(dirs["INSTALL_ORCH_CONFIG_DIR"], "orch.yaml"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "busy"}, Spec: corev1.PodSpec{
		Containers:                    []corev1.Container{agenttest.Busybox("main", "sleep 3600")},
		TerminationGracePeriodSeconds: agenttest.PtrTo[int64](0)}}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	agenttest.Eventually(t, "the pod running", func() bool {
		p, err := client.CoreV1().Pods("default").Get(ctx, "busy", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
	// What need not outlive a reboot is in the runtime dir, not on disk.
	if pins, _ := os.ReadDir(filepath.Join(dirs["INSTALL_ORCH_RUNTIME_DIR"], "netns")); len(pins) != 1 {
		t.Errorf("network namespace pins in the runtime dir: %d, want 1", len(pins))
	}
	if _, err := os.Stat(filepath.Join(dirs["INSTALL_ORCH_RUNTIME_DIR"], "containerd", "io.containerd.runtime.v2.task")); err != nil {
		t.Errorf("containerd's state is not in the runtime dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(data, "agent", "run")); !os.IsNotExist(err) {
		t.Errorf("runtime state in the data dir: %v", err)
	}

	out, err := inNS(filepath.Join(dirs["INSTALL_ORCH_BIN_DIR"], "orch-uninstall.sh")).CombinedOutput()
	if err != nil {
		t.Fatalf("orch-uninstall.sh: %v\n%s", err, out)
	}
	_ = orch.Wait()
	ps, _ := exec.Command("ps", "-e", "-o", "pid=,args=").Output()
	for _, l := range strings.Split(string(ps), "\n") {
		if strings.Contains(l, data) || strings.Contains(l, "sleep 3600") {
			t.Errorf("a process outlived the uninstall: %s", l)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), data) || strings.Contains(string(mounts), dirs["INSTALL_ORCH_RUNTIME_DIR"]) {
		t.Errorf("mounts under the data or runtime dir outlived the uninstall")
	}
	if out, err := inNS("nft", "list", "ruleset").CombinedOutput(); err != nil || strings.Contains(string(out), "kube-proxy") {
		t.Errorf("the service proxy's nftables table outlived the uninstall (%v):\n%s", err, out)
	}
	after := state()
	for what := range before {
		if before[what] != after[what] {
			t.Errorf("%s before the install:\n%s\nafter the uninstall:\n%s", what, before[what], after[what])
		}
	}
	for _, p := range []string{data, dirs["INSTALL_ORCH_CONFIG_DIR"], dirs["INSTALL_ORCH_RUNTIME_DIR"], unit, unit + ".env",
		filepath.Join(dirs["INSTALL_ORCH_BIN_DIR"], "orch"), filepath.Join(dirs["INSTALL_ORCH_BIN_DIR"], "orch-uninstall.sh")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s outlived the uninstall: %v", p, err)
		}
	}
}
