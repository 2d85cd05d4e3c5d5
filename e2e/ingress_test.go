//go:build e2e

package e2e_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ingressApps are two web apps, each answering with its app name, its
// pod and what the proxy sent (Host, X-Forwarded-For), behind one
// Ingress by host and by path.
const ingressApps = `apiVersion: apps/v1
kind: Deployment
metadata: {name: app-a}
spec:
  replicas: 2
  selector: {matchLabels: {app: a}}
  template:
    metadata: {labels: {app: a}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: web
        image: busybox:test
        command: [sh, -c, 'mkdir -p /www/cgi-bin /www/a /www/b; printf "#!/bin/sh\necho Content-Type: text/plain\necho\necho \"a \$(hostname) host=\$HTTP_HOST xff=\$HTTP_X_FORWARDED_FOR proto=\$HTTP_X_FORWARDED_PROTO\"\n" > /www/cgi-bin/who; chmod +x /www/cgi-bin/who; echo a > /www/index.html; echo a > /www/a/index.html; exec httpd -f -p 8080 -h /www']
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: app-b}
spec:
  replicas: 1
  selector: {matchLabels: {app: b}}
  template:
    metadata: {labels: {app: b}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: web
        image: busybox:test
        command: [sh, -c, 'mkdir -p /www; echo b > /www/index.html; echo b > /www/b.txt; exec httpd -f -p 8080 -h /www']
---
apiVersion: v1
kind: Service
metadata: {name: a}
spec: {selector: {app: a}, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: b}
spec: {selector: {app: b}, ports: [{port: 8000, targetPort: 8080}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: site}
spec:
  tls: [{hosts: [a.example], secretName: a-tls}]
  rules:
  - host: a.example
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: a, port: {name: http}}}}]}
  - host: b.example
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: b, port: {number: 8000}}}}]}
  - host: both.example
    http:
      paths:
      - {path: /a, pathType: Prefix, backend: {service: {name: a, port: {number: 80}}}}
      - {path: /b.txt, pathType: Exact, backend: {service: {name: b, port: {number: 8000}}}}
`

// TestIngress: two apps behind one Ingress, made with stock kubectl,
// reached from outside the cluster on either node's port 80 by host and
// by path, and on port 443 with the certificate of a kubernetes.io/tls
// Secret; the Ingress gets the nodes' addresses as its status. A
// Deployment scaled down under a stream of requests answers every one
// (the endpoints going away are passed over); a header larger than the
// proxy takes is refused with 431; a deleted Ingress serves no more; an
// agent started again while the server is away serves the routes it
// kept.
func TestIngress(t *testing.T) {
	c := newCluster(t)
	nodes := map[string]string{"node-a": "198.18.0.81", "node-b": "198.18.0.82"}
	agents := map[string]*node{}
	for name, ip := range nodes {
		agents[name] = c.addNode(name, ip)
	}
	ctx := context.Background()
	certFile, keyFile, pool := writeServingCert(t, "a.example")
	c.mustKubectl("", "create", "secret", "tls", "a-tls", "--cert", certFile, "--key", keyFile)
	c.mustKubectl(ingressApps, "apply", "-f", "-")
	c.mustKubectl("", "wait", "--for=condition=Available", "deployment", "--all", "--timeout=180s")
	agenttest.Eventually(t, "the Ingress's status naming both nodes", func() bool {
		in, err := c.client.NetworkingV1().Ingresses("default").Get(ctx, "site", metav1.GetOptions{})
		return err == nil && len(in.Status.LoadBalancer.Ingress) == 2
	})
	if out := c.mustKubectl("", "get", "ingress", "site"); !strings.Contains(out, "orch") || !strings.Contains(out, "198.18.0.81,198.18.0.82") || !strings.Contains(out, "80, 443") {
		t.Errorf("kubectl get ingress:\n%s", out)
	}

	client := &http.Client{Timeout: 5 * time.Second}
	ask := func(ip, host, path string) (int, string, error) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+ip+path, nil)
		req.Host = host
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b)), err
	}
	for _, ip := range nodes {
		for _, tc := range []struct{ host, path, want string }{
			{"a.example", "/", "a"}, {"b.example", "/", "b"}, {"both.example", "/a/", "a"}, {"both.example", "/b.txt", "b"},
		} {
			agenttest.Eventually(t, fmt.Sprintf("%s%s on %s", tc.host, tc.path, ip), func() bool {
				code, body, err := ask(ip, tc.host, tc.path)
				return err == nil && code == 200 && body == tc.want
			})
		}
		if code, _, err := ask(ip, "both.example", "/b.txt/more"); err != nil || code != 404 {
			t.Errorf("an Exact path's longer one on %s: %d %v, want 404", ip, code, err)
		}
		if code, _, err := ask(ip, "nobody.example", "/"); err != nil || code != 404 {
			t.Errorf("a host no rule names on %s: %d %v, want 404", ip, code, err)
		}
		code, body, err := ask(ip, "a.example", "/cgi-bin/who")
		if err != nil || code != 200 || !strings.Contains(body, "host=a.example xff=198.18.0.1 proto=http") {
			t.Errorf("what the app is told on %s: %d %q %v", ip, code, body, err)
		}
		tlsClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "a.example"},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, ip+":443")
			}}}
		resp, err := tlsClient.Get("https://a.example/cgi-bin/who")
		if err != nil {
			t.Fatalf("HTTPS on %s: %v", ip, err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if !strings.Contains(string(b), "proto=https") || resp.ProtoMajor != 2 {
			t.Errorf("HTTPS on %s: HTTP/%d %q", ip, resp.ProtoMajor, b)
		}
	}

	// Scaled down under load: every request answered.
	var ok, failed atomic.Int32
	var lastErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, ip := range nodes {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				code, body, err := ask(ip, "a.example", "/")
				if err != nil || code != 200 || body != "a" {
					failed.Add(1)
					lastErr.Store(fmt.Sprintf("%d %q %v", code, body, err))
				} else {
					ok.Add(1)
				}
			}
		})
	}
	time.Sleep(time.Second)
	c.mustKubectl("", "scale", "deployment", "app-a", "--replicas=1")
	agenttest.Eventually(t, "app-a down to one pod", func() bool {
		list, err := c.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=a"})
		return err == nil && len(list.Items) == 1
	})
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	if failed.Load() > 0 {
		t.Errorf("scaling down under load: %d of %d requests failed, the last: %v", failed.Load(), failed.Load()+ok.Load(), lastErr.Load())
	}
	t.Logf("scaling down under load: %d requests answered", ok.Load())

	// Hostile input: a header past the proxy's limit.
	conn, err := net.Dial("tcp", nodes["node-a"]+":80")
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	// The proxy may answer and close before it has read all of it.
	_, _ = fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: a.example\r\nX-Big: %s\r\n\r\n", strings.Repeat("x", 200<<10))
	status, _ := io.ReadAll(io.LimitReader(conn, 64))
	_ = conn.Close()
	if !strings.Contains(string(status), "431") {
		t.Errorf("a 200 KiB header: %q, want 431", status)
	}

	c.mustKubectl("", "delete", "ingress", "site")
	agenttest.Eventually(t, "the deleted Ingress's hosts gone", func() bool {
		code, _, err := ask(nodes["node-b"], "a.example", "/")
		return err == nil && code == 404
	})

	// The server away and the agent started again: the routes the node
	// kept are served (plain HTTP; HTTPS waits for the server, as no key
	// is kept on the disk).
	c.mustKubectl(ingressApps, "apply", "-f", "-")
	agenttest.Eventually(t, "the Ingress served again", func() bool {
		code, body, err := ask(nodes["node-a"], "b.example", "/")
		return err == nil && code == 200 && body == "b"
	})
	_ = c.serverCmd.Process.Kill()
	_ = c.serverCmd.Wait()
	agents["node-a"].stop()
	agents["node-a"].start()
	agenttest.Eventually(t, "the kept routes served with the server away", func() bool {
		code, body, err := ask(nodes["node-a"], "b.example", "/")
		return err == nil && code == 200 && body == "b"
	})
}

// writeServingCert writes a self-signed certificate for name and its key
// as PEM files, and returns a pool trusting it.
func writeServingCert(t *testing.T, name string) (certFile, keyFile string, pool *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}
