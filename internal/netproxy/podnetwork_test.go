package netproxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	"github.com/orch-dev/orch/internal/roottest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

func podNode(name, podCIDR, ip string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: podCIDR},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: ip}}}}
}

// bulk is how much a pod sends another after the address it sees: more
// than a few packets, so that a tunnel's MTU is put to the test.
const bulk = 1 << 20

// TestPodNetworkBackends: two nodes on one segment (network namespaces
// joined by a veth pair), each with a bridge and a pod behind it, for
// each backend. Once each node's pod network is synced from the API, a
// pod reaches the other node's pod by its address, is seen with its own
// (no NAT between pods) and gets a megabyte back through it (the pods'
// MTU fits the tunnel); a node deleted from the API loses its way in on
// the other.
func TestPodNetworkBackends(t *testing.T) {
	roottest.Require(t, "network namespaces")
	for _, backend := range []string{HostGW, VXLAN} {
		t.Run(backend, func(t *testing.T) { testPodNetwork(t, backend) })
	}
}

func testPodNetwork(t *testing.T, backend string) {
	id := strconv.Itoa(os.Getpid() % 100000)
	type side struct{ node, pod, podCIDR, bridgeIP, podIP, nodeIP string }
	sides := []side{
		{"pna-" + id, "pnpa-" + id, "10.42.0.0/24", "10.42.0.1", "10.42.0.5", "198.51.100.1"},
		{"pnb-" + id, "pnpb-" + id, "10.42.1.0/24", "10.42.1.1", "10.42.1.5", "198.51.100.2"},
	}
	for _, s := range sides {
		roottest.NetNS(t, s.node)
		roottest.NetNS(t, s.pod)
	}
	roottest.IP(t, "-n", sides[0].node, "link", "add", "pnl0", "type", "veth", "peer", "name", "pnl1", "netns", sides[1].node)
	for i, s := range sides {
		roottest.IP(t, "-n", s.node, "link", "set", "lo", "up")
		roottest.IP(t, "-n", s.node, "addr", "add", s.nodeIP+"/24", "dev", fmt.Sprintf("pnl%d", i))
		roottest.IP(t, "-n", s.node, "link", "set", fmt.Sprintf("pnl%d", i), "up")
	}
	for _, s := range sides {
		mtu := 1500
		if backend == VXLAN {
			// What the agent gives its pods (podnet's CNI bridge).
			if err := roottest.In("/run/netns/"+s.node, func() (err error) { mtu, err = VXLANMTU(s.nodeIP); return err }); err != nil {
				t.Fatal(err)
			}
			if mtu != 1500-VXLANOverhead {
				t.Errorf("VXLANMTU = %d, want %d", mtu, 1500-VXLANOverhead)
			}
		}
		roottest.IP(t, "-n", s.node, "link", "add", "pnbr0", "type", "bridge")
		roottest.IP(t, "-n", s.node, "addr", "add", s.bridgeIP+"/24", "dev", "pnbr0")
		roottest.IP(t, "-n", s.node, "link", "set", "pnbr0", "up")
		roottest.IP(t, "-n", s.node, "link", "add", "pnh0", "mtu", strconv.Itoa(mtu), "type", "veth", "peer", "name", "pnp0", "mtu", strconv.Itoa(mtu), "netns", s.pod)
		roottest.IP(t, "-n", s.node, "link", "set", "pnh0", "master", "pnbr0", "up")
		roottest.IP(t, "-n", s.pod, "link", "set", "lo", "up")
		roottest.IP(t, "-n", s.pod, "addr", "add", s.podIP+"/24", "dev", "pnp0")
		roottest.IP(t, "-n", s.pod, "link", "set", "pnp0", "up")
		roottest.IP(t, "-n", s.pod, "route", "add", "default", "via", s.bridgeIP)
		if err := roottest.In("/run/netns/"+s.node, func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) }); err != nil {
			t.Fatal(err)
		}
		roottest.Serve(t, "/run/netns/"+s.pod, s.podIP+":8080", func(c net.Conn) {
			_, _ = fmt.Fprintf(c, "%s\n", c.RemoteAddr())
			_, _ = c.Write(make([]byte, bulk))
		})
	}

	// A node never reachable (host-gw: its route fails alone) and, for
	// VXLAN, one whose published tunnel end is garbage (skipped).
	broken := podNode("garbage", "10.42.8.0/24", "198.51.100.8")
	broken.Annotations = map[string]string{annotationBackendType: VXLAN, annotationBackendData: `{"VNI":1,"VtepMAC":"not a MAC"}`, annotationPublicIP: "198.51.100.8"}
	api := controllertest.New(t, []runtime.Object{podNode(sides[0].node, sides[0].podCIDR, sides[0].nodeIP),
		podNode(sides[1].node, sides[1].podCIDR, sides[1].nodeIP), podNode("never-reachable", "10.42.9.0/24", "203.0.113.9"), broken}...)
	var nets []*PodNetwork
	for _, s := range sides {
		annotate := func(ctx context.Context, annotations map[string]string) error {
			patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
			if err != nil {
				return err
			}
			_, err = api.Client.Nodes().Patch(ctx, s.node, types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		}
		r, err := NewPodNetwork(PodNetworkConfig{Informers: api.Informers, Backend: backend, NodeName: s.node, ClusterCIDR: "10.42.0.0/16", Annotate: annotate})
		if err != nil {
			t.Fatal(err)
		}
		nets = append(nets, r)
	}
	api.Start()
	sync := func(i int) error {
		return roottest.In("/run/netns/"+sides[i].node, func() error {
			ipt, err := iptables.IPv4()
			if err != nil {
				return err
			}
			nets[i].cfg.IPTables = ipt
			return nets[i].Sync(context.Background())
		})
	}
	for i := range sides {
		err := sync(i)
		switch {
		case backend == HostGW && (err == nil || !strings.Contains(err.Error(), "203.0.113.9")):
			t.Errorf("node %d's sync: %v, want the unreachable node's route to fail", i, err)
		case backend == VXLAN && err != nil:
			t.Errorf("node %d's sync: %v", i, err)
		}
	}
	if backend == VXLAN {
		// Each node published its tunnel end; the informers bring the
		// other's, and the next sync uses it.
		eventually(t, "both nodes' tunnel ends published", func() bool {
			for i, s := range sides {
				n, err := nets[i].nodes.Get(s.node)
				if err != nil || n.Annotations[annotationPublicIP] != s.nodeIP || !strings.Contains(n.Annotations[annotationBackendData], `"VtepMAC"`) {
					return false
				}
			}
			return true
		})
		for i := range sides {
			if err := sync(i); err != nil {
				t.Fatal(err)
			}
		}
		out, err := exec.Command("ip", "-n", sides[0].node, "-d", "link", "show", vxlanDevice).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "vxlan id 1 ") || !strings.Contains(string(out), "dstport 8472") || !strings.Contains(string(out), "mtu 1450") {
			t.Errorf("%s: %v\n%s", vxlanDevice, err, out)
		}
	}
	ask := func() (string, int, error) {
		var answer string
		var n int64
		err := roottest.In("/run/netns/"+sides[0].pod, func() error {
			c, err := net.DialTimeout("tcp", sides[1].podIP+":8080", 2*time.Second)
			if err != nil {
				return err
			}
			defer func() { _ = c.Close() }()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			r := bufio.NewReader(c)
			if answer, err = r.ReadString('\n'); err != nil {
				return err
			}
			n, err = io.Copy(io.Discard, r)
			return err
		})
		return strings.TrimSpace(answer), int(n), err
	}
	got, n, err := ask()
	if err != nil {
		t.Fatal(err)
	}
	if host, _, _ := net.SplitHostPort(got); host != sides[0].podIP {
		t.Errorf("the other node's pod saw %s, want the pod's own address %s", host, sides[0].podIP)
	}
	if n != bulk {
		t.Errorf("got %d bytes of the other node's pod's %d", n, bulk)
	}

	if err := api.Client.Nodes().Delete(context.Background(), sides[1].node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the informer sees the node gone", func() bool {
		_, err := nets[0].nodes.Get(sides[1].node)
		return err != nil
	})
	_ = sync(0)
	if out, err := exec.Command("ip", "-n", sides[0].node, "route", "show", sides[1].podCIDR).CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Errorf("the deleted node's route is still there: %s %v", out, err)
	}
	if backend == VXLAN {
		for _, show := range [][]string{{"neigh", "show", "dev", vxlanDevice}, {"fdb", "show", "dev", vxlanDevice}} {
			cmd := "ip"
			if show[0] == "fdb" {
				cmd = "bridge"
			}
			out, err := exec.Command(cmd, append([]string{"-n", sides[0].node}, show...)...).CombinedOutput()
			if err != nil || strings.Contains(string(out), "permanent") {
				t.Errorf("the deleted node's entries are still there (%s %s): %v\n%s", cmd, strings.Join(show, " "), err, out)
			}
		}
	}
	if _, _, err := ask(); err == nil {
		t.Error("a deleted node's pods are still reachable")
	}
}
