package main

import (
	"bytes"
	"context"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent"
	"github.com/urfave/cli/v2"
	"go.uber.org/goleak"
)

func TestVersionCommand(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"orch", "version"}, &out); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); !strings.HasPrefix(got, "orch version "+version+" (commit ") || !strings.Contains(got, runtime.Version()) {
		t.Fatalf("version printed %q, want the version, the commit and the Go version", got)
	}
}

func TestUnknownCommandFails(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), []string{"orch", "no-such-command"}, &out)
	if err == nil || !strings.Contains(err.Error(), "no-such-command") {
		t.Fatalf("unknown command: error %v, want one naming it", err)
	}
}

func TestAgentFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"orch", "agent"}, "needs --server"},
		{[]string{"orch", "agent", "--server", "http://x:6443", "--token", "t"}, "want https://"},
		{[]string{"orch", "agent", "--server", "https://x:6443", "--token", "t", "--node-taint", "gpu=yes"}, "want key=value:Effect"},
		{[]string{"orch", "agent", "--server", "https://x:6443", "--token", "t", "--node-taint", "gpu=yes:Sometimes"}, "effect must be"},
		{[]string{"orch", "agent", "--server", "https://x:6443", "--token", "t", "--node-label", "novalue"}, "want key=value"},
		// As the kubelet's --node-labels: NodeRestriction would refuse it.
		{[]string{"orch", "agent", "--server", "https://x:6443", "--token", "t", "--node-label", "node-role.kubernetes.io/worker=true"}, "may not set its own"},
	} {
		err := run(context.Background(), tt.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: %v, want %q", tt.args[2:], err, tt.want)
		}
	}
}

func TestTaintsParse(t *testing.T) {
	got, err := parseTaints([]string{"dedicated=gpu:NoSchedule", "edge:PreferNoSchedule"})
	if err != nil || len(got) != 2 || got[0].Key != "dedicated" || got[0].Value != "gpu" || got[0].Effect != "NoSchedule" || got[1].Value != "" {
		t.Fatalf("%+v %v", got, err)
	}
}

// TestServerTakesTheAgentsNodeFlags: as k3s's server does, orch server
// takes the agent's node flags for its own node, so a multi-homed server
// says which address is its own.
func TestServerTakesTheAgentsNodeFlags(t *testing.T) {
	args := []string{"--node-name", "edge-1", "--node-ip", "192.0.2.10", "--node-external-ip", "203.0.113.5", "--kubelet-port", "10251",
		"--node-label", "zone=a", "--container-runtime-endpoint", "/run/x.sock", "--cluster-cidr", "10.52.0.0/16"}
	for _, cmd := range []*cli.Command{serverCommand(), agentCommand()} {
		var got agent.Config
		cmd.Action = func(c *cli.Context) (err error) { got, err = nodeConfig(c); return err }
		app := &cli.App{Commands: []*cli.Command{cmd}, ExitErrHandler: func(*cli.Context, error) {}}
		if err := app.RunContext(context.Background(), append([]string{"orch", cmd.Name}, args...)); err != nil {
			t.Fatalf("orch %s: %v", cmd.Name, err)
		}
		if got.NodeName != "edge-1" || !slices.Equal(got.NodeIPs, []string{"192.0.2.10"}) || !slices.Equal(got.NodeExternalIPs, []string{"203.0.113.5"}) ||
			got.KubeletPort != 10251 || got.Labels["zone"] != "a" || got.ContainerRuntimeEndpoint != "/run/x.sock" || got.ClusterCIDR != "10.52.0.0/16" {
			t.Errorf("orch %s: node config %+v", cmd.Name, got)
		}
		cmd.Action = func(c *cli.Context) (err error) { _, err = nodeConfig(c); return err }
		if err := app.RunContext(context.Background(), []string{"orch", cmd.Name, "--node-ip", "not-an-ip"}); err == nil || !strings.Contains(err.Error(), "not an IP") {
			t.Errorf("orch %s --node-ip not-an-ip: %v", cmd.Name, err)
		}
		// The pod network and the service proxy: VXLAN (design.md) and the
		// proxy by default; an unknown backend is refused, naming those there are.
		for _, tc := range []struct {
			args    []string
			network string
			noProxy bool
			err     string
		}{
			{nil, "vxlan", false, ""},
			{[]string{"--pod-network", "none", "--disable-kube-proxy"}, "none", true, ""},
			{[]string{"--pod-network", "host-gw"}, "host-gw", false, ""},
			{[]string{"--pod-network", "calico"}, "", false, "want vxlan, host-gw or none"},
		} {
			cmd.Action = func(c *cli.Context) (err error) { got, err = nodeConfig(c); return err }
			err := app.RunContext(context.Background(), append([]string{"orch", cmd.Name}, tc.args...))
			switch {
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("orch %s %v: %v, want %q", cmd.Name, tc.args, err, tc.err)
			case tc.err == "" && (err != nil || got.PodNetwork != tc.network || got.DisableServiceProxy != tc.noProxy):
				t.Errorf("orch %s %v: %v, pod network %q, proxy disabled %v", cmd.Name, tc.args, err, got.PodNetwork, got.DisableServiceProxy)
			}
		}
		// Graceful node shutdown: on by default (30s, 10s of it for
		// critical pods); the critical pods' share is part of the whole.
		for _, tc := range []struct {
			args            []string
			grace, critical time.Duration
			err             string
		}{
			{nil, 30 * time.Second, 10 * time.Second, ""},
			{[]string{"--shutdown-grace-period", "0", "--shutdown-grace-period-critical-pods", "0"}, 0, 0, ""},
			{[]string{"--shutdown-grace-period", "2m", "--shutdown-grace-period-critical-pods", "30s"}, 2 * time.Minute, 30 * time.Second, ""},
			{[]string{"--shutdown-grace-period", "5s"}, 0, 0, "more than --shutdown-grace-period"},
			{[]string{"--shutdown-grace-period", "-5s"}, 0, 0, "may not be negative"},
		} {
			cmd.Action = func(c *cli.Context) (err error) { got, err = nodeConfig(c); return err }
			err := app.RunContext(context.Background(), append([]string{"orch", cmd.Name}, tc.args...))
			switch {
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("orch %s %v: %v, want %q", cmd.Name, tc.args, err, tc.err)
			case tc.err == "" && (err != nil || got.Shutdown.GracePeriod != tc.grace || got.Shutdown.CriticalPodsGracePeriod != tc.critical):
				t.Errorf("orch %s %v: %v, shutdown %+v", cmd.Name, tc.args, err, got.Shutdown)
			}
		}
	}
}

// TestMain fails the package's tests if they leave goroutines running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDisable: --disable takes k3s's form (repeated or comma-separated)
// and names only what orch packages.
func TestDisable(t *testing.T) {
	if got, err := components([]string{"servicelb"}); err != nil || !got["servicelb"] {
		t.Errorf("servicelb: %v %v", got, err)
	}
	if got, err := components([]string{" servicelb,"}); err != nil || !got["servicelb"] {
		t.Errorf("comma-separated: %v %v", got, err)
	}
	if got, err := components([]string{"servicelb,local-storage"}); err != nil || !got["servicelb"] || !got["local-storage"] {
		t.Errorf("two: %v %v", got, err)
	}
	if _, err := components([]string{"traefik"}); err == nil || !strings.Contains(err.Error(), "only servicelb, local-storage and ingress") {
		t.Errorf("traefik: %v", err)
	}
}
