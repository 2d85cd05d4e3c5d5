package ingress

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/orch-dev/orch/internal/atomicfile"
	"github.com/orch-dev/orch/internal/gatewayapi"
	"k8s.io/apimachinery/pkg/types"
)

// saved is a table as the node keeps it on disk, so that an agent started
// again while the server is away serves what it served before: the routes
// and the endpoints they went to. No certificate or key is kept (Secrets
// stay off the disk, as the pods' do): HTTPS waits for the server.
type saved struct {
	Routes   []savedRoute   `json:"routes"`
	Backends []savedBackend `json:"backends"`
	// Default is the default backend's index in Backends, -1 for none.
	Default   int `json:"default"`
	Ingresses int `json:"ingresses"`
	// Listening: some IngressClass was orch's, so the node listened.
	Listening bool `json:"listening"`
	// Gateways is the Gateways' configuration, GatewayBackends the
	// Service ports it named, by serviceKey.
	Gateways        gatewayapi.Config       `json:"gateways"`
	GatewayBackends map[string]savedBackend `json:"gatewayBackends,omitempty"`
}

type savedRoute struct {
	// Host is the rule's: a name, *.domain, or "" for any.
	Host    string `json:"host,omitempty"`
	Path    string `json:"path"`
	Exact   bool   `json:"exact,omitempty"`
	Backend int    `json:"backend"`
	Ingress string `json:"ingress"`
	Order   int    `json:"order"`
}

type savedBackend struct {
	Service   string   `json:"service"`
	Endpoints []string `json:"endpoints,omitempty"`
	H2C       bool     `json:"h2c,omitempty"`
	Problem   string   `json:"problem,omitempty"`
}

// save is the table as kept on disk.
func (t *table) save() saved {
	s := saved{Default: -1, Ingresses: t.ingresses}
	index := map[*backend]int{}
	backendOf := func(b *backend) int {
		if i, ok := index[b]; ok {
			return i
		}
		index[b] = len(s.Backends)
		s.Backends = append(s.Backends, savedBackend{Service: b.service.String(), Endpoints: b.endpoints, H2C: b.h2c, Problem: b.problem})
		return index[b]
	}
	add := func(host string, rs routes) {
		for _, r := range rs {
			s.Routes = append(s.Routes, savedRoute{Host: host, Path: r.path, Exact: r.exact, Backend: backendOf(r.backend), Ingress: r.ingress, Order: r.order})
		}
	}
	for _, h := range sortedKeys(t.exact) {
		add(h, t.exact[h])
	}
	for _, d := range sortedKeys(t.wildcard) {
		add("*."+d, t.wildcard[d])
	}
	add("", t.anyHost)
	if t.defaultBackend != nil {
		s.Default = backendOf(t.defaultBackend)
	}
	s.Gateways = t.gateways
	for key, b := range t.gwBackends {
		if s.GatewayBackends == nil {
			s.GatewayBackends = map[string]savedBackend{}
		}
		s.GatewayBackends[key] = savedBackend{Service: b.service.String(), Endpoints: b.endpoints, H2C: b.h2c, Problem: b.problem}
	}
	return s
}

// load is the table kept on disk.
func (s saved) load() (*table, error) {
	t := &table{exact: map[string]routes{}, wildcard: map[string]routes{}, ingresses: s.Ingresses}
	backends := make([]*backend, len(s.Backends))
	for i, b := range s.Backends {
		ns, name, _ := strings.Cut(b.Service, "/")
		backends[i] = &backend{service: types.NamespacedName{Namespace: ns, Name: name}, endpoints: b.Endpoints, h2c: b.H2C, problem: b.Problem}
	}
	at := func(i int) (*backend, error) {
		if i < 0 || i >= len(backends) {
			return nil, fmt.Errorf("backend %d of %d", i, len(backends))
		}
		return backends[i], nil
	}
	for _, r := range s.Routes {
		be, err := at(r.Backend)
		if err != nil {
			return nil, err
		}
		rt := route{path: r.Path, exact: r.Exact, backend: be, ingress: r.Ingress, order: r.Order}
		switch {
		case r.Host == "":
			t.anyHost = append(t.anyHost, rt)
		case strings.HasPrefix(r.Host, "*."):
			t.wildcard[r.Host[2:]] = append(t.wildcard[r.Host[2:]], rt)
		default:
			t.exact[r.Host] = append(t.exact[r.Host], rt)
		}
	}
	for _, rs := range t.exact {
		rs.sort()
	}
	for _, rs := range t.wildcard {
		rs.sort()
	}
	t.anyHost.sort()
	if s.Default >= 0 {
		be, err := at(s.Default)
		if err != nil {
			return nil, err
		}
		t.defaultBackend = be
	}
	// The Gateways as they were, without their certificates (HTTPS waits
	// for the server).
	t.gateways, t.gwBackends = s.Gateways, map[string]*backend{}
	for key, b := range s.GatewayBackends {
		ns, name, _ := strings.Cut(b.Service, "/")
		t.gwBackends[key] = &backend{service: types.NamespacedName{Namespace: ns, Name: name}, endpoints: b.Endpoints, h2c: b.H2C, problem: b.Problem}
	}
	offline := cluster{certificate: func(string, string) (*tls.Certificate, error) {
		return nil, errors.New("the API server is away: no key is kept on the disk")
	}}
	t.sites, _ = buildGateways(s.Gateways, offline, func(namespace, name string, port int32) *backend {
		if be := t.gwBackends[serviceKey(namespace, name, port)]; be != nil {
			return be
		}
		return &backend{service: types.NamespacedName{Namespace: namespace, Name: name}, problem: "not known while the API server is away"}
	})
	t.gatewayPorts = gatewayPorts(s.Gateways)
	return t, nil
}

// keep writes the table to path when it differs from what was written
// last (an SD card is not rewritten for nothing); written is that.
func keep(path string, t *table, listening bool, written []byte) ([]byte, error) {
	s := t.save()
	s.Listening = listening
	data, err := json.Marshal(s)
	if err != nil {
		return written, err
	}
	if bytes.Equal(data, written) {
		return written, nil
	}
	if err := atomicfile.Write(path, data, 0o600); err != nil {
		return written, fmt.Errorf("keep the ingress routes: %w", err)
	}
	return data, nil
}

// restore reads the table kept at path, and whether the node listened.
func restore(path string) (*table, bool, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, false, nil, err
	}
	var s saved
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, false, nil, fmt.Errorf("%s: %w", path, err)
	}
	t, err := s.load()
	if err != nil {
		return nil, false, nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, s.Listening, data, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
