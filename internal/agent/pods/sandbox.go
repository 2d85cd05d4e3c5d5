package pods

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
)

// The files the kubelet writes for every pod and mounts into each of its
// containers.
const (
	hostsFile    = "etc-hosts"
	resolvFile   = "resolv.conf"
	hostnameFile = "hostname"
)

// podHostname is the pod's hostname: spec.hostname or its name (the
// node's for hostNetwork pods), as Kubernetes sets it.
func podHostname(pod *corev1.Pod, nodeHostname string) string {
	switch {
	case pod.Spec.HostNetwork:
		return nodeHostname
	case pod.Spec.Hostname != "":
		return pod.Spec.Hostname
	}
	name := pod.Name
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-.")
	}
	return name
}

// runDir holds the pod's files that need not outlive a reboot (a pod
// rebooted is started anew): its hosts, resolv.conf and hostname files,
// its streams' FIFOs, its namespace pins. On tmpfs, they cost the SD card
// nothing.
func (m *Manager) runDir(uid string) string {
	return filepath.Join(m.cfg.RuntimeDir, "pods", uid)
}

// writeEtcFiles writes the pod's hosts, resolv.conf and hostname files.
func (m *Manager) writeEtcFiles(pod *corev1.Pod, ip string) error {
	dir := m.runDir(string(pod.UID))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	hostname := podHostname(pod, m.cfg.NodeHostname)
	hosts, err := m.hosts(pod, ip, hostname)
	if err != nil {
		return err
	}
	resolv, err := m.resolvConf(pod)
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{hostsFile: hosts, resolvFile: resolv, hostnameFile: []byte(hostname + "\n")} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// hosts is the pod's /etc/hosts as the kubelet writes it: localhost, the
// pod's own name at its IP (with its subdomain's FQDN), then hostAliases.
// hostNetwork pods get the node's file plus their aliases.
func (m *Manager) hosts(pod *corev1.Pod, ip, hostname string) ([]byte, error) {
	var b bytes.Buffer
	if pod.Spec.HostNetwork {
		host, err := os.ReadFile("/etc/hosts")
		if err != nil && !os.IsNotExist(err) {
			return nil, err
		}
		b.Write(host)
	} else {
		b.WriteString("# Kubernetes-managed hosts file.\n" +
			"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
			"fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n")
		if pod.Spec.Subdomain != "" {
			fqdn := fmt.Sprintf("%s.%s.%s.svc.%s", hostname, pod.Spec.Subdomain, pod.Namespace, m.cfg.ClusterDomain)
			fmt.Fprintf(&b, "%s\t%s\t%s\n", ip, fqdn, hostname)
		} else {
			fmt.Fprintf(&b, "%s\t%s\n", ip, hostname)
		}
	}
	if len(pod.Spec.HostAliases) > 0 {
		b.WriteString("\n# Entries added by HostAliases.\n")
		for _, a := range pod.Spec.HostAliases {
			fmt.Fprintf(&b, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
		}
	}
	return b.Bytes(), nil
}

// resolvConf is the pod's resolv.conf for its dnsPolicy: ClusterFirst
// (the default) points at the cluster DNS with the namespace's search
// path and ndots:5; Default is the node's; None is only dnsConfig.
// hostNetwork pods use the node's unless ClusterFirstWithHostNet.
func (m *Manager) resolvConf(pod *corev1.Pod) ([]byte, error) {
	host, err := parseResolvConf(m.cfg.ResolvConf)
	if err != nil {
		return nil, err
	}
	policy := pod.Spec.DNSPolicy
	if policy == "" {
		policy = corev1.DNSClusterFirst
	}
	if policy == corev1.DNSClusterFirst && pod.Spec.HostNetwork {
		policy = corev1.DNSDefault
	}
	var conf resolv
	switch policy {
	case corev1.DNSClusterFirst, corev1.DNSClusterFirstWithHostNet:
		if m.cfg.ClusterDNS == "" {
			conf = host // no cluster DNS configured: the kubelet falls back to the node's
			break
		}
		d := m.cfg.ClusterDomain
		conf.nameservers = []string{m.cfg.ClusterDNS}
		conf.searches = append([]string{pod.Namespace + ".svc." + d, "svc." + d, d}, host.searches...)
		conf.options = []string{"ndots:5"}
	case corev1.DNSDefault:
		conf = host
	case corev1.DNSNone:
	}
	if dc := pod.Spec.DNSConfig; dc != nil {
		conf.nameservers = append(conf.nameservers, dc.Nameservers...)
		conf.searches = append(conf.searches, dc.Searches...)
		for _, o := range dc.Options {
			opt := o.Name
			if o.Value != nil {
				opt += ":" + *o.Value
			}
			conf.options = slices.DeleteFunc(conf.options, func(s string) bool { return strings.SplitN(s, ":", 2)[0] == o.Name })
			conf.options = append(conf.options, opt)
		}
	}
	return conf.bytes(), nil
}

type resolv struct {
	nameservers, searches, options []string
}

func parseResolvConf(path string) (resolv, error) {
	var r resolv
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return r, nil
	}
	if err != nil {
		return r, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") || strings.HasPrefix(f[0], ";") {
			continue
		}
		switch f[0] {
		case "nameserver":
			r.nameservers = append(r.nameservers, f[1])
		case "search", "domain":
			r.searches = append(r.searches, f[1:]...)
		case "options":
			r.options = append(r.options, f[1:]...)
		}
	}
	return r, nil
}

func (r resolv) bytes() []byte {
	var b bytes.Buffer
	for _, ns := range r.nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", ns)
	}
	if len(r.searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(r.searches, " "))
	}
	if len(r.options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(r.options, " "))
	}
	return b.Bytes()
}

// etcMounts bind the pod's hosts, resolv.conf and hostname files into a
// container, and its termination-message file.
func (m *Manager) etcMounts(pod *corev1.Pod, c *corev1.Container) []specs.Mount {
	dir := m.runDir(string(pod.UID))
	out := []specs.Mount{
		{Destination: "/etc/hosts", Type: "bind", Source: filepath.Join(dir, hostsFile), Options: []string{"rbind", "rprivate"}},
		{Destination: "/etc/resolv.conf", Type: "bind", Source: filepath.Join(dir, resolvFile), Options: []string{"rbind", "rprivate"}},
		{Destination: "/etc/hostname", Type: "bind", Source: filepath.Join(dir, hostnameFile), Options: []string{"rbind", "rprivate"}},
	}
	path := c.TerminationMessagePath
	if path == "" {
		path = corev1.TerminationMessagePathDefault
	}
	return append(out, specs.Mount{Destination: path, Type: "bind", Source: m.terminationLog(pod, c.Name), Options: []string{"rbind", "rprivate"}})
}

// terminationLog is where a container's termination message lands.
func (m *Manager) terminationLog(pod *corev1.Pod, container string) string {
	return filepath.Join(m.cfg.DataDir, "pods", string(pod.UID), "termination", container)
}

// logPath is where a container's output goes: one file per run, named by
// its restart count, as the kubelet keeps them (kubectl logs --previous
// reads the one before).
func (m *Manager) logPath(uid, container string, restart int32) string {
	return filepath.Join(m.cfg.DataDir, "pods", uid, "logs", container, fmt.Sprintf("%d.log", restart))
}

// restartsOnDisk is the number of the container's latest run, from its log
// files (run n writes n.log): the kubelet keeps a container's restart
// count in the runtime for the same reason, to survive its own restart.
func (m *Manager) restartsOnDisk(uid, container string) int32 {
	entries, _ := os.ReadDir(filepath.Dir(m.logPath(uid, container, 0)))
	var latest int32
	for _, e := range entries {
		if n, err := strconv.ParseInt(strings.TrimSuffix(e.Name(), ".log"), 10, 32); err == nil && strings.HasSuffix(e.Name(), ".log") {
			latest = max(latest, int32(n))
		}
	}
	return latest
}
