// Package loopstest runs the whole control plane for the loops' tests: a
// real API server, every loop over the loopback client, and hollow nodes.
package loopstest

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/loops"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// Cluster is a running control plane with hollow nodes.
type Cluster struct {
	Ctx    context.Context
	Server *apitest.Server
	// Client is the admin's clientset, over HTTPS.
	Client kubernetes.Interface
	Nodes  *hollow.Cluster
	t      testing.TB
}

// Start runs the control plane and registers the named hollow nodes.
func Start(t testing.TB, nodes map[string]hollow.NodeOptions, opts hollow.Options) *Cluster {
	t.Helper()
	return StartWith(t, nodes, opts, loops.Options{})
}

// StartWith is Start with the loops' options (their logger is replaced).
func StartWith(t testing.TB, nodes map[string]hollow.NodeOptions, opts hollow.Options, loopOpts loops.Options) *Cluster {
	t.Helper()
	srv := apitest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if opts.Logger == nil {
		opts.Logger = log
	}
	c := &Cluster{Ctx: ctx, Server: srv, Client: srv.Client, Nodes: hollow.New(srv.Client, opts), t: t}
	started := make(chan struct{})
	done := make(chan error, 1)
	loopOpts.Logger = log
	go func() { done <- loops.Run(ctx, srv.Loopback(), loopOpts, func() { close(started) }) }()
	go c.Nodes.Run(ctx)
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("loops: %v", err)
		}
	})
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("loops did not start: %v", err)
	}
	for name, o := range nodes {
		c.AddNode(name, o)
	}
	return c
}

// For is c failing t, a subtest, instead of the test that started it:
// a helper that calls FailNow on its parent from a subtest's goroutine
// would end the wrong test.
func (c *Cluster) For(t testing.TB) *Cluster {
	cc := *c
	cc.t = t
	return &cc
}

// AddNode registers another hollow node.
func (c *Cluster) AddNode(name string, o hollow.NodeOptions) {
	c.t.Helper()
	if err := c.Nodes.AddNode(c.Ctx, name, o); err != nil {
		c.t.Fatal(err)
	}
}

// Eventually polls cond until it holds, failing the test after timeout.
func (c *Cluster) Eventually(what string, timeout time.Duration, cond func(ctx context.Context) (bool, error)) {
	c.t.Helper()
	if err := wait.PollUntilContextTimeout(c.Ctx, 20*time.Millisecond, timeout, true, cond); err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
}
