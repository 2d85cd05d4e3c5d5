package netproxy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func podNode(name, podCIDR, ip string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: podCIDR},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: ip}}}}
}

// TestHostGateway: two nodes on one segment (network namespaces joined by
// a veth pair), each with a bridge and a pod behind it. Once each node's
// routes are synced from the API, a pod reaches the other node's pod by
// its address and is seen with its own (no NAT between pods); a node
// deleted from the API loses its route on the other.
func TestHostGateway(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	id := fmt.Sprint(os.Getpid() % 100000)
	type side struct{ node, pod, podCIDR, bridgeIP, podIP, nodeIP string }
	sides := []side{
		{"hga-" + id, "hgpa-" + id, "10.42.0.0/24", "10.42.0.1", "10.42.0.5", "198.51.100.1"},
		{"hgb-" + id, "hgpb-" + id, "10.42.1.0/24", "10.42.1.1", "10.42.1.5", "198.51.100.2"},
	}
	for _, s := range sides {
		netns(t, s.node)
		netns(t, s.pod)
	}
	ip(t, "-n", sides[0].node, "link", "add", "hgl0", "type", "veth", "peer", "name", "hgl1", "netns", sides[1].node)
	for i, s := range sides {
		ip(t, "-n", s.node, "link", "set", "lo", "up")
		ip(t, "-n", s.node, "addr", "add", s.nodeIP+"/24", "dev", fmt.Sprintf("hgl%d", i))
		ip(t, "-n", s.node, "link", "set", fmt.Sprintf("hgl%d", i), "up")
		ip(t, "-n", s.node, "link", "add", "hgbr0", "type", "bridge")
		ip(t, "-n", s.node, "addr", "add", s.bridgeIP+"/24", "dev", "hgbr0")
		ip(t, "-n", s.node, "link", "set", "hgbr0", "up")
		ip(t, "-n", s.node, "link", "add", "hgh0", "type", "veth", "peer", "name", "hgp0", "netns", s.pod)
		ip(t, "-n", s.node, "link", "set", "hgh0", "master", "hgbr0", "up")
		ip(t, "-n", s.pod, "link", "set", "lo", "up")
		ip(t, "-n", s.pod, "addr", "add", s.podIP+"/24", "dev", "hgp0")
		ip(t, "-n", s.pod, "link", "set", "hgp0", "up")
		ip(t, "-n", s.pod, "route", "add", "default", "via", s.bridgeIP)
		if err := in("/run/netns/"+s.node, func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) }); err != nil {
			t.Fatal(err)
		}
		var l net.Listener
		if err := in("/run/netns/"+s.pod, func() (err error) { l, err = net.Listen("tcp", s.podIP+":8080"); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				_, _ = fmt.Fprintf(c, "%s\n", c.RemoteAddr())
				_ = c.Close()
			}
		}()
	}

	api := controllertest.New(t, []runtime.Object{podNode(sides[0].node, sides[0].podCIDR, sides[0].nodeIP),
		podNode(sides[1].node, sides[1].podCIDR, sides[1].nodeIP),
		podNode("never-reachable", "10.42.9.0/24", "203.0.113.9")}...)
	var routes []*Routes
	for _, s := range sides {
		r, err := NewRoutes(RoutesConfig{Informers: api.Informers, NodeName: s.node, ClusterCIDR: "10.42.0.0/16"})
		if err != nil {
			t.Fatal(err)
		}
		routes = append(routes, r)
	}
	api.Start()
	sync := func(i int) error {
		return in("/run/netns/"+sides[i].node, func() error {
			ipt, err := iptables.IPv4()
			if err != nil {
				return err
			}
			routes[i].cfg.IPTables = ipt
			return routes[i].Sync()
		})
	}
	for i := range sides {
		// The node no one can reach fails alone: the others' routes are made.
		if err := sync(i); err == nil || !strings.Contains(err.Error(), "203.0.113.9") {
			t.Errorf("node %d's sync: %v, want the unreachable node's route to fail", i, err)
		}
	}
	ask := func() (string, error) {
		var answer string
		err := in("/run/netns/"+sides[0].pod, func() error {
			c, err := net.DialTimeout("tcp", sides[1].podIP+":8080", 2*time.Second)
			if err != nil {
				return err
			}
			defer func() { _ = c.Close() }()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			answer, err = bufio.NewReader(c).ReadString('\n')
			return err
		})
		return strings.TrimSpace(answer), err
	}
	got, err := ask()
	if err != nil {
		t.Fatal(err)
	}
	if host, _, _ := net.SplitHostPort(got); host != sides[0].podIP {
		t.Errorf("the other node's pod saw %s, want the pod's own address %s", host, sides[0].podIP)
	}

	if err := api.Client.Nodes().Delete(context.Background(), sides[1].node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the informer sees the node gone", func() bool {
		_, err := routes[0].nodes.Get(sides[1].node)
		return err != nil
	})
	_ = sync(0)
	if out, err := exec.Command("ip", "-n", sides[0].node, "route", "show", sides[1].podCIDR).CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Errorf("the deleted node's route is still there: %s %v", out, err)
	}
	if _, err := ask(); err == nil {
		t.Error("a deleted node's pods are still reachable")
	}
}
