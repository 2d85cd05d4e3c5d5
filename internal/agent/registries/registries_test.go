package registries

import (
	"context"
	"encoding/pem"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/remotes/docker"
	"github.com/orch-dev/orch/internal/agent/testimage"
)

func write(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoad(t *testing.T) {
	if c, err := Load(filepath.Join(t.TempDir(), "absent.yaml")); err != nil || len(c.Mirrors) != 0 {
		t.Errorf("a missing file: %+v, %v; want an empty configuration", c, err)
	}
	for _, tc := range []struct{ name, yaml, wantErr string }{
		{"bad endpoint", "mirrors:\n  docker.io:\n    endpoint: [\"cache.local:5000\"]\n", `mirrors["docker.io"]: endpoint "cache.local:5000": want http(s)://`},
		{"unknown field", "mirror:\n  docker.io: {}\n", `unknown field "mirror"`},
		{"unreadable CA", "configs:\n  cache.local:\n    tls: {ca_file: /nonexistent/ca.pem}\n", `configs["cache.local"].tls: open /nonexistent/ca.pem`},
		{"not a CA", "configs:\n  cache.local:\n    tls: {ca_file: " + write(t, "ca.pem", "junk") + "}\n", "no PEM certificate"},
		{"half a client certificate", "configs:\n  cache.local:\n    tls: {cert_file: /c.pem}\n", "cert_file and key_file go together"},
		{"bad auth", "configs:\n  cache.local:\n    auth: {auth: \"%%%\"}\n", `configs["cache.local"].auth.auth: not base64`},
	} {
		_, err := Load(write(t, "registries.yaml", tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.wantErr)
		}
	}
	c, err := Load(write(t, "registries.yaml", "configs:\n  cache.local:\n    auth: {auth: cm9ib3Q6aHVudGVyMg==}\n"))
	if err != nil || c.Configs["cache.local"].Auth.Username != "robot" || c.Configs["cache.local"].Auth.Password != "hunter2" {
		t.Errorf("Docker's base64 auth: %+v, %v", c, err)
	}
}

// The endpoints a registry resolves to: its mirrors in order (pull and
// resolve only), then itself, as containerd's hosts.toml gives them.
func TestHosts(t *testing.T) {
	c, err := Load(write(t, "registries.yaml", `
mirrors:
  docker.io:
    endpoint: ["https://cache.local:5000", "http://10.0.0.2:5000/proxy/"]
  "*":
    endpoint: ["http://10.0.0.3"]
`))
	if err != nil {
		t.Fatal(err)
	}
	pull := docker.HostCapabilityPull | docker.HostCapabilityResolve
	for _, tc := range []struct {
		registry string
		want     []string // scheme://host/path caps
	}{
		{"docker.io", []string{"https://cache.local:5000/v2 3", "http://10.0.0.2:5000/proxy/v2 3", "https://registry-1.docker.io/v2 7"}},
		{"ghcr.io", []string{"http://10.0.0.3/v2 3", "https://ghcr.io/v2 7"}},
		{"localhost:5000", []string{"http://10.0.0.3/v2 3", "http://localhost:5000/v2 7"}},
	} {
		hosts, err := c.Hosts(nil)(tc.registry)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, h := range hosts {
			got = append(got, h.Scheme+"://"+h.Host+h.Path+" "+map[bool]string{true: "3", false: "7"}[h.Capabilities == pull])
		}
		if strings.Join(got, ", ") != strings.Join(tc.want, ", ") {
			t.Errorf("%s: %v, want %v", tc.registry, got, tc.want)
		}
	}
	var none *Config // no registries.yaml given at all
	if hosts, err := none.Hosts(nil)("quay.io"); err != nil || len(hosts) != 1 || hosts[0].Host != "quay.io" || hosts[0].Scheme != "https" {
		t.Errorf("without a configuration: %+v, %v", hosts, err)
	}
}

// Real pulls' first step (resolving a tag to its manifest) through
// containerd's resolver: a Docker Hub name served by a TLS mirror that
// wants a password, a name whose only mirror is down served by the
// registry itself, and the pod's credentials winning over the file's.
func TestResolveThroughMirrors(t *testing.T) {
	img, err := testimage.BuildBusybox("sh")
	if err != nil {
		t.Skipf("no busybox to build a test image from: %v", err)
	}
	cache := testimage.NewRegistry()
	cache.Put("library/tool", "1.0", img)
	cache.RequireAuth("robot", "hunter2")
	cacheSrv := httptest.NewTLSServer(cache)
	defer cacheSrv.Close()
	ca := write(t, "ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cacheSrv.Certificate().Raw})))
	origin := testimage.NewRegistry()
	origin.Put("team/app", "2", img)
	originSrv := httptest.NewServer(origin)
	defer originSrv.Close()
	cacheHost, originHost := strings.TrimPrefix(cacheSrv.URL, "https://"), strings.TrimPrefix(originSrv.URL, "http://")

	c, err := Load(write(t, "registries.yaml", `
mirrors:
  docker.io:
    endpoint: ["`+cacheSrv.URL+`"]
  `+originHost+`:
    endpoint: ["http://127.0.0.1:1"]
configs:
  `+cacheHost+`:
    auth: {username: robot, password: hunter2}
    tls: {ca_file: `+ca+`}
`))
	if err != nil {
		t.Fatal(err)
	}
	resolve := func(ref string, pod Credentials) error {
		_, desc, err := docker.NewResolver(docker.ResolverOptions{Hosts: c.Hosts(pod)}).Resolve(context.Background(), ref)
		if err == nil && desc.Digest.String() != img.ManifestDigest() {
			t.Errorf("%s resolved to %s, want %s", ref, desc.Digest, img.ManifestDigest())
		}
		return err
	}
	if err := resolve("docker.io/library/tool:1.0", nil); err != nil {
		t.Errorf("a Docker Hub image from its TLS mirror, with the configured password: %v", err)
	}
	if err := resolve(originHost+"/team/app:2", nil); err != nil {
		t.Errorf("the registry itself once its mirror is down: %v", err)
	}
	wrong := func(host string) (string, string, bool) { return "robot", "wrong", host == "docker.io" }
	if err := resolve("docker.io/library/tool:1.0", wrong); err == nil {
		t.Error("the pod's credentials for docker.io were not the ones sent to its mirror")
	}
}
