package netproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/roottest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestDatapath: the rules carry real traffic. A node (a network
// namespace) and two pods (namespaces behind veths, each answering with
// its name) behind a Service: connections to the ClusterIP and to the
// node port reach both pods; a Service with no endpoints refuses at once;
// with ClientIP affinity a client keeps its pod.
//
// It runs in the nftables mode and in the iptables mode on both of
// iptables' back ends, nf_tables (Debian's and Raspberry Pi OS's default)
// and legacy (older systems').
func TestDatapath(t *testing.T) {
	roottest.Require(t, "network namespaces and iptables")
	for _, backend := range []string{"nft", "legacy"} {
		t.Run("iptables-"+backend, func(t *testing.T) {
			roottest.UseIPTables(t, backend)
			testDatapath(t, backend[:1]+strconv.Itoa(os.Getpid()%10000), ModeIPTables)
		})
	}
	t.Run("nftables", func(t *testing.T) {
		if _, err := exec.LookPath("nft"); err != nil {
			t.Skip("nft is not installed")
		}
		testDatapath(t, "t"+strconv.Itoa(os.Getpid()%10000), ModeNFTables)
	})
}

func testDatapath(t *testing.T, id, mode string) {
	node := roottest.NetNS(t, "npn-"+id)
	roottest.IP(t, "-n", "npn-"+id, "link", "set", "lo", "up")
	pods := []struct{ name, ip string }{{"pod-a", "10.42.0.5"}, {"pod-b", "10.42.0.6"}}
	roottest.IP(t, "-n", "npn-"+id, "link", "add", "npbr0", "type", "bridge")
	roottest.IP(t, "-n", "npn-"+id, "addr", "add", "10.42.0.1/24", "dev", "npbr0")
	roottest.IP(t, "-n", "npn-"+id, "link", "set", "npbr0", "up")
	roottest.IP(t, "-n", "npn-"+id, "route", "add", "10.43.0.0/16", "dev", "npbr0")
	for i, p := range pods {
		ns := fmt.Sprintf("npp%d-%s", i, id)
		path := roottest.NetNS(t, ns)
		host, peer := fmt.Sprintf("nph%d", i), fmt.Sprintf("npe%d", i)
		roottest.IP(t, "-n", "npn-"+id, "link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns)
		roottest.IP(t, "-n", "npn-"+id, "link", "set", host, "master", "npbr0", "up")
		roottest.IP(t, "-n", ns, "link", "set", "lo", "up")
		roottest.IP(t, "-n", ns, "addr", "add", p.ip+"/24", "dev", peer)
		roottest.IP(t, "-n", ns, "link", "set", peer, "up")
		roottest.IP(t, "-n", ns, "route", "add", "default", "via", "10.42.0.1")
		roottest.Serve(t, path, p.ip+":8080", func(c net.Conn) { _, _ = fmt.Fprintf(c, "%s %s\n", p.name, c.RemoteAddr()) })
		var u net.PacketConn
		if err := roottest.In(path, func() (err error) { u, err = net.ListenPacket("udp", p.ip+":5353"); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = u.Close() })
		go func(name string) {
			buf := make([]byte, 512)
			for {
				_, from, err := u.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = u.WriteTo([]byte(name), from)
			}
		}(p.name)
	}

	// A client outside the cluster, one hop from the node.
	outside := roottest.NetNS(t, "npo-"+id)
	roottest.IP(t, "-n", "npn-"+id, "link", "add", "npo0", "type", "veth", "peer", "name", "npo1", "netns", "npo-"+id)
	roottest.IP(t, "-n", "npn-"+id, "addr", "add", "198.51.100.1/24", "dev", "npo0")
	roottest.IP(t, "-n", "npn-"+id, "link", "set", "npo0", "up")
	roottest.IP(t, "-n", "npo-"+id, "addr", "add", "198.51.100.2/24", "dev", "npo1")
	roottest.IP(t, "-n", "npo-"+id, "link", "set", "npo1", "up")
	roottest.IP(t, "-n", "npo-"+id, "route", "add", "default", "via", "198.51.100.1")
	if err := roottest.In(node, func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) }); err != nil {
		t.Fatal(err)
	}

	web := service("web", "10.43.0.10", corev1.ServiceTypeNodePort, corev1.ServicePort{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP})
	sticky := service("sticky", "10.43.0.11", corev1.ServiceTypeClusterIP, corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	sticky.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	empty := service("empty", "10.43.0.12", corev1.ServiceTypeClusterIP, corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	local := service("local", "10.43.0.13", corev1.ServiceTypeNodePort, corev1.ServicePort{Name: "http", Port: 80, NodePort: 30081, Protocol: corev1.ProtocolTCP})
	local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	localSlice := slice("local", "local-1", 8080, "http", "10.42.0.5", "10.42.0.6")
	localSlice.Endpoints[0].NodeName, localSlice.Endpoints[1].NodeName = ptr.To("n1"), ptr.To("elsewhere")
	dns := service("dns", "10.43.0.14", corev1.ServiceTypeClusterIP, corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP})
	dnsSlice := slice("dns", "dns-1", 5353, "dns", "10.42.0.5")
	dnsSlice.Ports[0].Protocol = ptr.To(corev1.ProtocolUDP)
	// SCTP: the kernel takes its rules (no traffic: SCTP sockets need a
	// module test machines may lack).
	sctp := service("sctp", "10.43.0.15", corev1.ServiceTypeNodePort, corev1.ServicePort{Name: "s", Port: 9, NodePort: 30082, Protocol: corev1.ProtocolSCTP})
	sctpSlice := slice("sctp", "sctp-1", 9999, "s", "10.42.0.5")
	sctpSlice.Ports[0].Protocol = ptr.To(corev1.ProtocolSCTP)
	n := newFakeNode(t, web, sticky, empty, local, dns, sctp, sctpSlice,
		slice("web", "web-1", 8080, "http", "10.42.0.5", "10.42.0.6"),
		slice("sticky", "sticky-1", 8080, "http", "10.42.0.5", "10.42.0.6"), localSlice, dnsSlice)
	n.p.cfg.NodeName = "n1"

	// ask is which pod answered addr, and the client address it saw.
	askFrom := func(addr string) (string, string, error) {
		c, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err != nil {
			return "", "", err
		}
		defer func() { _ = c.Close() }()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		name, from, _ := strings.Cut(strings.TrimSpace(line), " ")
		host, _, _ := net.SplitHostPort(from)
		return name, host, err
	}
	ask := func(addr string) (string, error) {
		c, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err != nil {
			return "", err
		}
		defer func() { _ = c.Close() }()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		name, _, _ := strings.Cut(line, " ")
		return name, err
	}
	err := roottest.In(node, func() error {
		addrs := []string{"10.43.0.10:80", "10.42.0.1:30080"}
		if mode == ModeNFTables {
			nft, err := NewNFTables()
			if err != nil {
				return err
			}
			n.p.cfg.Mode, n.p.nft = ModeNFTables, &nftWriter{nft: nft}
			if err := n.p.Sync(); err != nil {
				return err
			}
			if out, err := exec.Command("nft", "list", "table", "ip", nftTable).CombinedOutput(); err != nil || !strings.Contains(string(out), "sctp . 30082 : goto external-") {
				return fmt.Errorf("the SCTP node port's element is not in the kernel: %w\n%s", err, out)
			}
			// An agent restarted finds the table in place: its first sync
			// makes it anew, without what a hand (or an older orch) left.
			if out, err := exec.Command("nft", "add", "chain", "ip", nftTable, "left-behind").CombinedOutput(); err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			n.p.nft, n.p.written = &nftWriter{nft: nft}, nil
			if err := n.p.Sync(); err != nil {
				return fmt.Errorf("the first sync over a table in place: %w", err)
			}
			if out, err := exec.Command("nft", "list", "table", "ip", nftTable).CombinedOutput(); err != nil || strings.Contains(string(out), "left-behind") || !strings.Contains(string(out), "sctp . 30082 : goto external-") {
				return fmt.Errorf("after the first sync over a table in place: %w\n%s", err, out)
			}
		} else {
			ipt, err := iptables.IPv4()
			if err != nil {
				return err
			}
			n.p.cfg.IPTables = ipt
			if err := n.p.Sync(); err != nil {
				return err
			}
			if out, err := exec.Command("iptables-save", "-t", "nat").CombinedOutput(); err != nil || !strings.Contains(string(out), "-m sctp --dport 30082 -j KUBE-EXT-") {
				return fmt.Errorf("the SCTP node port's rule is not in the kernel: %w\n%s", err, out)
			}
			// What the agent does in this mode: node ports on 127.0.0.1
			// too (kube-proxy's nftables mode has none).
			if err := EnableLocalhostNodePorts(); err != nil {
				return err
			}
			addrs = append(addrs, "127.0.0.1:30080")
		}
		for _, addr := range addrs {
			seen := map[string]int{}
			for range 40 {
				name, err := ask(addr)
				if err != nil {
					return fmt.Errorf("%s: %w", addr, err)
				}
				seen[name]++
			}
			if seen["pod-a"] == 0 || seen["pod-b"] == 0 {
				return fmt.Errorf("%s spread %v over the pods, want both", addr, seen)
			}
		}
		first, err := ask("10.43.0.11:80")
		if err != nil {
			return err
		}
		for range 20 {
			if name, err := ask("10.43.0.11:80"); err != nil || name != first {
				return fmt.Errorf("with ClientIP affinity a client went to %s (%w) after %s", name, err, first)
			}
		}
		// A new affinity timeout is taken by a sync after the change (the
		// nftables mode makes its sets again, which rules may not name
		// while it does).
		sticky.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](30)}}
		if _, err := n.api.Client.Services("default").Update(context.Background(), sticky, metav1.UpdateOptions{}); err != nil {
			return err
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if s, err := n.p.services.Services("default").Get("sticky"); err == nil && s.Spec.SessionAffinityConfig != nil {
				break
			} else if time.Now().After(deadline) {
				return errors.New("the informer never saw the new timeout")
			}
		}
		if err := n.p.sync(false); err != nil {
			return fmt.Errorf("the sync after a new affinity timeout: %w", err)
		}
		if name, err := ask("10.43.0.11:80"); err != nil {
			return fmt.Errorf("after a new affinity timeout: %s, %w", name, err)
		}
		// Refused, not left to time out. (A connection the node itself
		// opens may take the SYN's first retransmission, a second, to
		// hear it: the kernel holds the socket while the REJECT answers.
		// Pods hear it at once.)
		start := time.Now()
		_, err = net.DialTimeout("tcp", "10.43.0.12:80", 3*time.Second)
		if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > 2500*time.Millisecond {
			return fmt.Errorf("a Service with no endpoints: %w after %v, want connection refused at once", err, time.Since(start))
		}

		// UDP from one client port: the first answer is pod-a's; once the
		// endpoint moves to pod-b, the next datagram goes there, though
		// pod-a still runs (its conntrack entry is forgotten).
		c, err := net.ListenPacket("udp", "10.42.0.1:40053")
		if err != nil {
			return err
		}
		defer func() { _ = c.Close() }()
		query := func() (string, error) {
			if _, err := c.WriteTo([]byte("q"), &net.UDPAddr{IP: net.ParseIP("10.43.0.14"), Port: 53}); err != nil {
				return "", err
			}
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 64)
			k, _, err := c.ReadFrom(buf)
			return string(buf[:k]), err
		}
		if got, err := query(); err != nil || got != "pod-a" {
			return fmt.Errorf("UDP before the move: %q, %w", got, err)
		}
		moved := slice("dns", "dns-1", 5353, "dns", "10.42.0.6")
		moved.Ports[0].Protocol = ptr.To(corev1.ProtocolUDP)
		if _, err := n.api.Client.EndpointSlices("default").Update(context.Background(), moved, metav1.UpdateOptions{}); err != nil {
			return err
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if s, err := n.p.slices.EndpointSlices("default").Get("dns-1"); err == nil && s.Endpoints[0].Addresses[0] == "10.42.0.6" {
				break
			} else if time.Now().After(deadline) {
				return errors.New("the informer never saw the endpoint move")
			}
		}
		if err := n.p.Sync(); err != nil {
			return err
		}
		if got, err := query(); err != nil || got != "pod-b" {
			return fmt.Errorf("UDP after the endpoint moved: %q, %w, want pod-b", got, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if mode == ModeIPTables {
		testLocalnetClosed(t, id, node, outside, ask)
	}

	// From outside: externalTrafficPolicy Cluster masquerades the client
	// as the node; Local keeps its address and answers from this node's
	// endpoint only.
	err = roottest.In(outside, func() error {
		if _, from, err := askFrom("198.51.100.1:30080"); err != nil || from != "10.42.0.1" {
			return fmt.Errorf("a node port under Cluster saw the client as %s (%w), want the node, 10.42.0.1", from, err)
		}
		for range 10 {
			name, from, err := askFrom("198.51.100.1:30081")
			if err != nil || name != "pod-a" || from != "198.51.100.2" {
				return fmt.Errorf("a node port under Local: answered by %s seeing %s (%w), want pod-a seeing 198.51.100.2", name, from, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// testLocalnetClosed: a neighbour may not reach what listens on the
// node's 127.0.0.1, which route_localnet (the iptables mode's node ports
// on 127.0.0.1) would otherwise let it (CVE-2020-8558): it routes
// 127.0.0.0/8 to the node and asks.
func testLocalnetClosed(t *testing.T, id, node, outside string, ask func(string) (string, error)) {
	var private net.Listener
	if err := roottest.In(node, func() (err error) { private, err = net.Listen("tcp", "127.0.0.1:9999"); return err }); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = private.Close() }()
	go func() {
		for {
			c, err := private.Accept()
			if err != nil {
				return
			}
			_, _ = fmt.Fprintf(c, "secret %s\n", c.RemoteAddr())
			_ = c.Close()
		}
	}()
	// (Its own loopback is down: 127.0.0.0/8 is not local there.)
	roottest.IP(t, "-n", "npo-"+id, "route", "add", "127.0.0.0/8", "via", "198.51.100.1")
	err := roottest.In(outside, func() error {
		if err := EnableLocalhostNodePorts(); err != nil {
			return err
		}
		if name, err := ask("127.0.0.1:9999"); err == nil {
			return fmt.Errorf("a neighbour reached the node's 127.0.0.1:9999 (%q)", name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
