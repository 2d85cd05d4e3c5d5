package nodegraph

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"

	"github.com/orch-dev/orch/internal/gatewayapi"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// GatewaySecrets is which Secrets the Gateways orch serves name for TLS,
// kept from the routing configuration the server's Gateway loop writes
// for the nodes (only its certificate references are held): every node
// serves every such Gateway, so every node may read those Secrets.
type GatewaySecrets struct {
	mu sync.RWMutex
	// secrets are namespace/name, sorted.
	secrets []string
}

// NewGatewaySecrets names none until the configuration is seen.
func NewGatewaySecrets() *GatewaySecrets { return &GatewaySecrets{} }

// Replace implements the API server's follower, for the ConfigMaps of
// the configuration's name in its namespace.
func (s *GatewaySecrets) Replace(objs []runtime.Object) {
	var fresh []string
	for _, o := range objs {
		fresh = append(fresh, certificatesOf(o)...)
	}
	s.set(fresh)
}

// Set implements the API server's follower.
func (s *GatewaySecrets) Set(obj runtime.Object) { s.set(certificatesOf(obj)) }

// Delete implements the API server's follower.
func (s *GatewaySecrets) Delete(runtime.Object) { s.set(nil) }

func (s *GatewaySecrets) set(secrets []string) {
	slices.Sort(secrets)
	s.mu.Lock()
	s.secrets = slices.Compact(secrets)
	s.mu.Unlock()
}

func certificatesOf(obj runtime.Object) []string {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok || cm.Namespace != gatewayapi.ConfigNamespace || cm.Name != gatewayapi.ConfigName {
		return nil
	}
	var cfg gatewayapi.Config
	if err := json.Unmarshal([]byte(cm.Data[gatewayapi.ConfigKey]), &cfg); err != nil {
		return nil
	}
	var out []string
	for _, g := range cfg.Gateways {
		for _, l := range g.Listeners {
			out = append(out, l.Certificates...)
		}
	}
	return out
}

// Serves reports whether a Gateway orch serves names the Secret for TLS.
func (s *GatewaySecrets) Serves(namespace, name string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, found := slices.BinarySearchFunc(s.secrets, namespace+"/"+name, strings.Compare)
	return found
}
