// Package registries reads a node's registries.yaml, in k3s's format, and
// gives containerd's resolver the endpoints it names: mirrors tried before
// a registry (a local cache on a site's network, a plain-HTTP registry),
// and each endpoint's TLS and credentials.
package registries

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/containerd/containerd/remotes/docker"
	"sigs.k8s.io/yaml"
)

// Config is registries.yaml:
//
//	mirrors:
//	  docker.io:
//	    endpoint: ["https://cache.plant.local:5000"]
//	  "*":
//	    endpoint: ["http://10.0.0.2:5000"]
//	configs:
//	  cache.plant.local:5000:
//	    auth: {username: robot, password: hunter2}
//	    tls: {ca_file: /etc/orch/plant-ca.pem}
type Config struct {
	// Mirrors are the endpoints tried, in order, before a registry
	// itself, by registry host ("*" for every registry without its own).
	Mirrors map[string]Mirror `json:"mirrors"`
	// Configs are the credentials and TLS of an endpoint, by host[:port].
	Configs map[string]EndpointConfig `json:"configs"`

	// Built by Load: the mirrors' endpoints parsed, by registry, and the
	// HTTP clients of the endpoints with TLS settings, by host.
	endpoints map[string][]endpoint
	clients   map[string]*http.Client
}

// Mirror lists a registry's mirrors as URLs: scheme, host and an optional
// path under which the registry API (/v2) is served.
type Mirror struct {
	Endpoints []string `json:"endpoint"`
}

// EndpointConfig is how to talk to one endpoint.
type EndpointConfig struct {
	Auth *Auth      `json:"auth"`
	TLS  *TLSConfig `json:"tls"`
}

// Auth is a user and password, or Docker's base64 "user:password" auth.
type Auth struct {
	Username string `json:"username"`
	Password string `json:"password"`
	Auth     string `json:"auth"`
}

// TLSConfig is an endpoint's CA, client certificate and whether its
// certificate is checked at all.
type TLSConfig struct {
	CAFile             string `json:"ca_file"`
	CertFile           string `json:"cert_file"`
	KeyFile            string `json:"key_file"`
	InsecureSkipVerify bool   `json:"insecure_skip_verify"`
}

// Load reads path. A missing file is an empty configuration: images come
// from the registries their names point to. Anything that would only fail
// at a pull (a bad URL, an unreadable CA) fails here, at the start.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return &Config{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("registries: %w", err)
	}
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("registries %s: %w", path, err)
	}
	if err := c.prepare(); err != nil {
		return nil, fmt.Errorf("registries %s: %w", path, err)
	}
	return &c, nil
}

func (c *Config) prepare() error {
	c.endpoints = map[string][]endpoint{}
	for registry, m := range c.Mirrors {
		eps := []endpoint{} // an entry without endpoints keeps "*" off this registry
		for _, raw := range m.Endpoints {
			e, err := parseEndpoint(raw)
			if err != nil {
				return fmt.Errorf("mirrors[%q]: %w", registry, err)
			}
			eps = append(eps, e)
		}
		c.endpoints[registry] = eps
	}
	c.clients = map[string]*http.Client{}
	for host, ec := range c.Configs {
		if ec.Auth != nil && ec.Auth.Auth != "" && ec.Auth.Username == "" {
			dec, err := base64.StdEncoding.DecodeString(ec.Auth.Auth)
			if err != nil {
				return fmt.Errorf("configs[%q].auth.auth: not base64: %w", host, err)
			}
			ec.Auth.Username, ec.Auth.Password, _ = strings.Cut(string(dec), ":")
		}
		if ec.TLS == nil {
			continue
		}
		cfg, err := ec.TLS.tlsConfig()
		if err != nil {
			return fmt.Errorf("configs[%q].tls: %w", host, err)
		}
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = cfg
		c.clients[host] = &http.Client{Transport: t}
	}
	return nil
}

func (t *TLSConfig) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{InsecureSkipVerify: t.InsecureSkipVerify} //nolint:gosec // the user asked for it, for this endpoint only
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, err
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file %s: no PEM certificate", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("cert_file and key_file go together")
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// endpoint is a mirror URL split as containerd's resolver wants it.
type endpoint struct{ scheme, host, path string }

func parseEndpoint(raw string) (endpoint, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return endpoint{}, fmt.Errorf("endpoint %q: %w", raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return endpoint{}, fmt.Errorf("endpoint %q: want http(s)://host[:port][/path]", raw)
	}
	// containerd's hosts.toml rule: the API is under the path, at /v2.
	path := strings.TrimSuffix(u.Path, "/")
	if !strings.HasSuffix(path, "/v2") {
		path += "/v2"
	}
	return endpoint{scheme: u.Scheme, host: u.Host, path: path}, nil
}

// Credentials are a pod's pull credentials for a registry host.
type Credentials func(host string) (user, pass string, ok bool)

// Hosts resolves a registry host to its endpoints: its mirrors (or the
// "*" mirrors) in order, for pulls only, then the registry itself (plain
// HTTP for localhost, as Docker does), which containerd falls back to.
// An endpoint's credentials are the pod's for it (or, on a mirror, the
// pod's for the registry it stands in for, as containerd's CRI passes
// them), else the configured ones.
func (c *Config) Hosts(pod Credentials) docker.RegistryHosts {
	return func(registry string) ([]docker.RegistryHost, error) {
		var hosts []docker.RegistryHost
		for _, e := range c.mirrors(registry) {
			hosts = append(hosts, c.host(e, registry, pod, docker.HostCapabilityPull|docker.HostCapabilityResolve))
		}
		upstream := endpoint{scheme: "https", host: registry, path: "/v2"}
		if registry == "docker.io" {
			upstream.host = "registry-1.docker.io"
		}
		if local, err := docker.MatchLocalhost(registry); err == nil && local {
			upstream.scheme = "http"
		}
		hosts = append(hosts, c.host(upstream, registry, pod, docker.HostCapabilityPull|docker.HostCapabilityResolve|docker.HostCapabilityPush))
		return hosts, nil
	}
}

// mirrors are registry's mirror endpoints, or those of "*".
func (c *Config) mirrors(registry string) []endpoint {
	if c == nil {
		return nil
	}
	if e, ok := c.endpoints[registry]; ok {
		return e
	}
	return c.endpoints["*"]
}

func (c *Config) host(e endpoint, registry string, pod Credentials, caps docker.HostCapabilities) docker.RegistryHost {
	client := http.DefaultClient
	if c != nil {
		if cl, ok := c.clients[e.host]; ok {
			client = cl
		}
	}
	creds := func(host string) (string, string, error) {
		// host is where the token or basic auth is asked for: the
		// endpoint, or an auth server it names.
		for _, h := range []string{host, e.host, registry} {
			if pod != nil {
				if u, p, ok := pod(h); ok {
					return u, p, nil
				}
			}
		}
		if c != nil {
			for _, h := range []string{host, e.host} {
				if ec, ok := c.Configs[h]; ok && ec.Auth != nil {
					return ec.Auth.Username, ec.Auth.Password, nil
				}
			}
		}
		return "", "", nil
	}
	return docker.RegistryHost{
		Client: client, Host: e.host, Scheme: e.scheme, Path: e.path, Capabilities: caps,
		Authorizer: docker.NewDockerAuthorizer(docker.WithAuthClient(client), docker.WithAuthCreds(creds)),
	}
}
