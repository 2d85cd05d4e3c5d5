// Package hostcheck is `orch check-config`: what orch needs of a machine's
// kernel and system, checked, each with how to fix it, as k3s's
// check-config does. It reads /proc, /sys, /boot and /lib/modules under a
// root (a test's fake one) and looks programs up on PATH.
package hostcheck

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Result is one check's outcome.
type Result struct {
	Name string
	// OK: what orch needs is there. Otherwise Fix says how to get it;
	// Optional checks do not stop orch.
	OK       bool
	Optional bool
	Detail   string
	Fix      string
}

// Host is the machine checked.
type Host struct {
	// Root is where /proc, /sys, /boot and /lib/modules are ("/").
	Root string
	// Release is the running kernel's (uname -r).
	Release string
	// LookPath finds a program (exec.LookPath).
	LookPath func(string) (string, error)
}

// Local is this machine.
func Local() Host {
	release, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return Host{Root: "/", Release: strings.TrimSpace(string(release)), LookPath: exec.LookPath}
}

func (h Host) path(p string) string { return filepath.Join(h.Root, p) }

func (h Host) read(p string) string {
	data, _ := os.ReadFile(h.path(p))
	return string(data)
}

func (h Host) exists(p string) bool {
	_, err := os.Stat(h.path(p))
	return err == nil
}

// kernelConfig is the running kernel's build configuration, from
// /proc/config.gz or /boot/config-<release>; nil when neither is there.
func (h Host) kernelConfig() map[string]string {
	var r io.Reader
	if f, err := os.Open(h.path("/proc/config.gz")); err == nil {
		defer func() { _ = f.Close() }()
		if gz, err := gzip.NewReader(f); err == nil {
			r = gz
		}
	}
	if r == nil {
		data, err := os.ReadFile(h.path("/boot/config-" + h.Release))
		if err != nil {
			return nil
		}
		r = bytes.NewReader(data)
	}
	cfg := map[string]string{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && strings.HasPrefix(k, "CONFIG_") {
			cfg[k] = v
		}
	}
	return cfg
}

// feature checks a kernel feature: built in or a module, by the kernel's
// configuration or, without one, by what the running kernel shows.
func (h Host) feature(cfg map[string]string, option, module, shows string) (bool, string) {
	if cfg != nil {
		switch cfg[option] {
		case "y":
			return true, "built in"
		case "m":
			return true, "module " + module
		}
		return false, option + " is not set"
	}
	if shows != "" && h.exists(shows) {
		return true, "present"
	}
	if module != "" && h.moduleAvailable(module) {
		return true, "module " + module
	}
	return false, "not found (and no kernel configuration to read)"
}

func (h Host) moduleAvailable(name string) bool {
	if strings.Contains(h.read("/proc/modules"), name+" ") {
		return true
	}
	found := false
	_ = filepath.WalkDir(h.path("/lib/modules/"+h.Release), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasPrefix(d.Name(), name+".ko") {
			found = true
			return filepath.SkipAll
		}
		return nil
	})
	return found
}

// Check runs every check.
func Check(h Host) []Result {
	cfg := h.kernelConfig()
	var out []Result
	add := func(r Result) { out = append(out, r) }

	// Namespaces and cgroups: what every container needs.
	for _, ns := range []struct{ option, name string }{
		{"CONFIG_NET_NS", "net"}, {"CONFIG_PID_NS", "pid"}, {"CONFIG_IPC_NS", "ipc"}, {"CONFIG_UTS_NS", "uts"},
	} {
		ok, detail := h.feature(cfg, ns.option, "", "/proc/self/ns/"+ns.name)
		add(Result{Name: ns.name + " namespaces", OK: ok, Detail: detail, Fix: "a kernel built with " + ns.option})
	}
	add(h.cgroups())

	ok, detail := h.feature(cfg, "CONFIG_OVERLAY_FS", "overlay", "")
	if strings.Contains(h.read("/proc/filesystems"), "\toverlay\n") {
		ok, detail = true, "in /proc/filesystems"
	}
	add(Result{Name: "overlay filesystem", OK: ok, Detail: detail, Fix: "modprobe overlay (and add it to /etc/modules-load.d), or a kernel with CONFIG_OVERLAY_FS"})

	for _, f := range []struct{ name, option, module, shows, fix string }{
		{"veth", "CONFIG_VETH", "veth", "", "modprobe veth, or a kernel with CONFIG_VETH"},
		{"bridge", "CONFIG_BRIDGE", "bridge", "/sys/module/bridge", "modprobe bridge, or a kernel with CONFIG_BRIDGE"},
		{"bridge netfilter", "CONFIG_BRIDGE_NETFILTER", "br_netfilter", "/proc/sys/net/bridge", "modprobe br_netfilter (and add it to /etc/modules-load.d)"},
		{"netfilter NAT", "CONFIG_NF_NAT", "nf_nat", "", "modprobe nf_nat, or a kernel with CONFIG_NF_NAT"},
		{"netfilter conntrack match", "CONFIG_NETFILTER_XT_MATCH_CONNTRACK", "xt_conntrack", "", "modprobe xt_conntrack"},
		{"masquerade target", "CONFIG_IP_NF_TARGET_MASQUERADE", "ipt_MASQUERADE", "", "modprobe ipt_MASQUERADE"},
		{"vxlan", "CONFIG_VXLAN", "vxlan", "", "modprobe vxlan, or run orch with --pod-network host-gw"},
		// NetworkPolicies: without these a policy is not enforced (the
		// node says so with an event); optional for a node run with
		// --disable-network-policy.
		{"ip sets", "CONFIG_IP_SET_HASH_IP", "ip_set_hash_ip", "/sys/module/ip_set_hash_ip", "modprobe ip_set_hash_ip ip_set_hash_net xt_set (NetworkPolicies need them)"},
		{"ip set match", "CONFIG_NETFILTER_XT_SET", "xt_set", "/sys/module/xt_set", "modprobe xt_set (NetworkPolicies need it)"},
		// The service proxy's nftables mode; the iptables mode without it.
		{"nf_tables", "CONFIG_NF_TABLES", "nf_tables", "/sys/module/nf_tables", "modprobe nf_tables (the service proxy's nftables mode; it uses iptables without)"},
	} {
		ok, detail := h.feature(cfg, f.option, f.module, f.shows)
		add(Result{Name: f.name, OK: ok, Detail: detail, Fix: f.fix, Optional: f.name == "vxlan" || f.name == "nf_tables" || strings.HasPrefix(f.name, "ip set")})
	}

	for _, p := range []struct{ name, fix string }{
		{"iptables", "apt-get install iptables"},
		{"nft", "apt-get install nftables (the service proxy's nftables mode; it uses iptables without)"},
		{"containerd", "apt-get install containerd (or give orch --container-runtime-endpoint)"},
		{"runc", "apt-get install runc"},
	} {
		path, err := h.LookPath(p.name)
		r := Result{Name: p.name, OK: err == nil, Detail: path, Fix: p.fix, Optional: p.name == "containerd" || p.name == "nft"}
		if (p.name == "iptables" || p.name == "nft") && err == nil {
			if v, err := exec.Command(path, "--version").Output(); err == nil {
				r.Detail = strings.TrimSpace(string(v))
			}
		}
		add(r)
	}
	cni := Result{Name: "CNI plugins", Fix: "apt-get install containernetworking-plugins"}
	for _, dir := range []string{"/usr/lib/cni", "/opt/cni/bin"} {
		missing := ""
		for _, plugin := range []string{"bridge", "host-local", "loopback", "portmap"} {
			if !h.exists(filepath.Join(dir, plugin)) {
				missing += " " + plugin
			}
		}
		if missing == "" {
			cni.OK, cni.Detail = true, dir
			break
		}
		cni.Detail = "missing in " + dir + ":" + missing
	}
	add(cni)
	return out
}

// cgroups checks the controllers pods are limited with. On a Raspberry Pi
// the memory controller is off unless the kernel's command line turns it
// on.
func (h Host) cgroups() Result {
	r := Result{Name: "cgroup controllers"}
	var enabled []string
	if controllers := h.read("/sys/fs/cgroup/cgroup.controllers"); controllers != "" {
		enabled = strings.Fields(controllers)
		r.Detail = "cgroup v2: "
	} else {
		sc := bufio.NewScanner(strings.NewReader(h.read("/proc/cgroups")))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 4 && f[3] == "1" {
				enabled = append(enabled, f[0])
			}
		}
		r.Detail = "cgroup v1: "
	}
	var missing []string
	for _, c := range []string{"cpu", "memory", "pids"} {
		found := false
		for _, e := range enabled {
			found = found || e == c
		}
		if !found {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		r.OK = true
		r.Detail += "cpu, memory and pids"
		return r
	}
	r.Detail += "missing " + strings.Join(missing, ", ")
	r.Fix = "a kernel with those cgroup controllers"
	for _, m := range missing {
		if m == "memory" {
			cmdline := "/boot/firmware/cmdline.txt"
			if !h.exists(cmdline) {
				cmdline = "/boot/cmdline.txt"
			}
			r.Fix = fmt.Sprintf("add cgroup_memory=1 cgroup_enable=memory to the kernel command line (%s on a Raspberry Pi) and reboot", cmdline)
		}
	}
	return r
}

// Print writes the results, one a line, and reports whether everything
// orch needs is there.
func Print(w io.Writer, results []Result) bool {
	ok := true
	for _, r := range results {
		mark := "ok"
		switch {
		case !r.OK && r.Optional:
			mark = "optional, missing"
		case !r.OK:
			mark = "MISSING"
			ok = false
		}
		line := fmt.Sprintf("%-28s %s", r.Name+":", mark)
		if r.Detail != "" {
			line += " (" + r.Detail + ")"
		}
		if !r.OK {
			line += "\n    fix: " + r.Fix
		}
		_, _ = fmt.Fprintln(w, line)
	}
	return ok
}
