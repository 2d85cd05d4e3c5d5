package agent

import (
	"context"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/agent/serverlb"
	"github.com/orch-dev/orch/internal/kube"
)

// followAPIServersEvery is how often the node asks which API servers are
// live (the kubernetes Service's endpoints change when a server starts or
// stops, rarely).
const followAPIServersEvery = 30 * time.Second

// hostPort is a server URL's host:port, 443 when it names none.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	return net.JoinHostPort(u.Hostname(), "443")
}

// followAPIServers tells the balancer which servers the kubernetes
// Service lists, now and every followAPIServersEvery, until ctx ends.
// It reads as the service proxy does (kube-proxy's identity reads
// EndpointSlices).
func followAPIServers(ctx context.Context, client *kube.Client, lb *serverlb.Balancer, log *slog.Logger) {
	for {
		list, err := client.EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kubernetes"})
		if err == nil {
			var servers []string
			for _, slice := range list.Items {
				port := 0
				for _, p := range slice.Ports {
					if p.Port != nil && (p.Name == nil || *p.Name == "https") {
						port = int(*p.Port)
					}
				}
				if port == 0 {
					continue
				}
				for _, ep := range slice.Endpoints {
					if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
						continue
					}
					for _, a := range ep.Addresses {
						servers = append(servers, net.JoinHostPort(a, strconv.Itoa(port)))
					}
				}
			}
			if len(servers) > 0 {
				lb.SetServers(servers)
			}
		} else if ctx.Err() == nil {
			log.Debug("reading the API servers from the kubernetes Service", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(followAPIServersEvery):
		}
	}
}
