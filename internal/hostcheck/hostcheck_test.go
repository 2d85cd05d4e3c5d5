package hostcheck

import (
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeRoot lays out files under a temporary root.
func fakeRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		data := []byte(content)
		if strings.HasSuffix(p, ".gz") {
			var b bytes.Buffer
			gz := gzip.NewWriter(&b)
			_, _ = gz.Write(data)
			_ = gz.Close()
			data = b.Bytes()
		}
		if err := os.WriteFile(full, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const fullConfig = "CONFIG_NET_NS=y\nCONFIG_PID_NS=y\nCONFIG_IPC_NS=y\nCONFIG_UTS_NS=y\nCONFIG_OVERLAY_FS=m\nCONFIG_VETH=m\n" +
	"CONFIG_BRIDGE=m\nCONFIG_BRIDGE_NETFILTER=m\nCONFIG_NF_NAT=m\nCONFIG_NETFILTER_XT_MATCH_CONNTRACK=m\nCONFIG_IP_NF_TARGET_MASQUERADE=m\nCONFIG_VXLAN=m\nCONFIG_NF_TABLES=m\n"

func all(string) (string, error) { return "/usr/bin/x", nil }

func TestCheck(t *testing.T) {
	plugins := map[string]string{"/usr/lib/cni/bridge": "", "/usr/lib/cni/host-local": "", "/usr/lib/cni/loopback": "", "/usr/lib/cni/portmap": ""}
	with := func(extra map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range plugins {
			out[k] = v
		}
		for k, v := range extra {
			out[k] = v
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		files    map[string]string
		lookPath func(string) (string, error)
		ok       bool
		want     []string
	}{
		{"a ready machine", with(map[string]string{"/proc/config.gz": fullConfig, "/sys/fs/cgroup/cgroup.controllers": "cpuset cpu io memory pids\n"}), all, true,
			[]string{"overlay filesystem:          ok (module overlay)", "cgroup controllers:          ok (cgroup v2: cpu, memory and pids)"}},
		{"a Raspberry Pi without the memory controller",
			with(map[string]string{"/boot/config-6.6.0": fullConfig, "/proc/cgroups": "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpu\t2\t1\t1\nmemory\t0\t1\t0\npids\t3\t1\t1\n", "/boot/firmware/cmdline.txt": "console=tty1"}),
			all, false, []string{"cgroup controllers:          MISSING (cgroup v1: missing memory)", "fix: add cgroup_memory=1 cgroup_enable=memory to the kernel command line (/boot/firmware/cmdline.txt on a Raspberry Pi) and reboot"}},
		{"no vxlan is optional", with(map[string]string{"/proc/config.gz": strings.Replace(fullConfig, "CONFIG_VXLAN=m\n", "", 1), "/sys/fs/cgroup/cgroup.controllers": "cpu memory pids"}), all, true,
			[]string{"vxlan:                       optional, missing (CONFIG_VXLAN is not set)", "--pod-network host-gw"}},
		{"no nft is optional", with(map[string]string{"/proc/config.gz": fullConfig, "/sys/fs/cgroup/cgroup.controllers": "cpu memory pids"}),
			func(name string) (string, error) {
				if name == "nft" {
					return "", errors.New("not found")
				}
				return "/usr/bin/" + name, nil
			}, true, []string{"nft:                         optional, missing", "apt-get install nftables"}},
		{"no runc, no plugins", map[string]string{"/proc/config.gz": fullConfig, "/sys/fs/cgroup/cgroup.controllers": "cpu memory pids"},
			func(name string) (string, error) {
				if name == "runc" {
					return "", errors.New("not found")
				}
				return "/usr/bin/" + name, nil
			}, false, []string{"runc:                        MISSING", "apt-get install runc", "CNI plugins:                 MISSING", "apt-get install containernetworking-plugins"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := Host{Root: fakeRoot(t, tc.files), Release: "6.6.0", LookPath: tc.lookPath}
			var out bytes.Buffer
			if ok := Print(&out, Check(h)); ok != tc.ok {
				t.Errorf("ok %v, want %v:\n%s", ok, tc.ok, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("want %q in:\n%s", w, out.String())
				}
			}
		})
	}
}
