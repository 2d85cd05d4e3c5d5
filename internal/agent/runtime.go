package agent

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/containerd/containerd"
	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
)

// runtimeState is how the node's container runtime came up.
type runtimeState struct {
	client  *containerd.Client
	version string // containerd://1.6.20, empty without one
	err     error
	// stopped is closed once the agent's own containerd has stopped.
	stopped <-chan struct{}
	// images imports DATA/agent/images: once before the node runs pods,
	// then as tarballs appear.
	images *orchctr.Importer
}

func (r runtimeState) notReady() string {
	if r.err != nil {
		return "orch agent: container runtime: " + r.err.Error()
	}
	return notReadyMessage
}

// startRuntime connects to containerd (the agent's own unless an endpoint
// is given). A
// runtime that does not come up leaves the node NotReady, saying why; the
// agent stays joined.
func startRuntime(ctx context.Context, cfg Config, log *slog.Logger, unhealthy func(reason string)) runtimeState {
	socket := cfg.ContainerRuntimeEndpoint
	var stopped <-chan struct{}
	if socket == "" {
		sup, err := orchctr.Start(ctx, filepath.Join(cfg.DataDir, "agent", "containerd"), filepath.Join(cfg.runtimeDir(), "containerd"), log, unhealthy)
		if err != nil {
			log.Error("container runtime not started", "err", err)
			return runtimeState{err: err}
		}
		socket, stopped = sup.Socket(), sup.Done()
	}
	client, err := containerd.New(socket, containerd.WithTimeout(10*time.Second))
	if err != nil {
		log.Error("container runtime unreachable", "socket", socket, "err", err)
		return runtimeState{err: err, stopped: stopped}
	}
	context.AfterFunc(ctx, func() { _ = client.Close() })
	v, err := client.Version(ctx)
	if err != nil {
		return runtimeState{err: err, stopped: stopped}
	}
	return runtimeState{client: client, version: "containerd://" + v.Version, stopped: stopped,
		images: orchctr.NewImporter(client, filepath.Join(cfg.DataDir, "agent", "images"), log)}
}
