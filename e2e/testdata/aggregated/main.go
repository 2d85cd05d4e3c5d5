// Command aggregated is a small aggregated API server, as an extension
// server behind a Kubernetes API server is written: it serves the group
// demo.orch.test/v1 (namespaced Widgets, get and list) over TLS with the
// certificate mounted at /tls, and trusts a request only from the API
// server's front proxy — a client certificate its request-header CA signed,
// for one of the allowed names, both read from
// kube-system/extension-apiserver-authentication with the pod's own
// token — taking the user from X-Remote-User and X-Remote-Group. Each
// widget says who asked for it. Standard library only.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
)

const (
	group   = "demo.orch.test"
	version = "v1"
	saDir   = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// frontProxy is what the API server publishes about its front proxy.
type frontProxy struct {
	roots   *x509.CertPool
	allowed []string
}

func loadFrontProxy() (*frontProxy, error) {
	token, err := os.ReadFile(saDir + "/token")
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(saDir + "/ca.crt")
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	req, _ := http.NewRequest(http.MethodGet, "https://kubernetes.default.svc/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication", nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading extension-apiserver-authentication: status %d", resp.StatusCode)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&cm); err != nil {
		return nil, err
	}
	fp := &frontProxy{roots: x509.NewCertPool()}
	if !fp.roots.AppendCertsFromPEM([]byte(cm.Data["requestheader-client-ca-file"])) {
		return nil, fmt.Errorf("no requestheader-client-ca-file")
	}
	if err := json.Unmarshal([]byte(cm.Data["requestheader-allowed-names"]), &fp.allowed); err != nil {
		return nil, fmt.Errorf("requestheader-allowed-names: %w", err)
	}
	return fp, nil
}

// user is the front proxy's user, or "" when the request is not from it.
func (fp *frontProxy) user(r *http.Request) (string, []string) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return "", nil
	}
	inter := x509.NewCertPool()
	for _, c := range r.TLS.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	leaf := r.TLS.PeerCertificates[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: fp.roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return "", nil
	}
	if len(fp.allowed) > 0 && !slices.Contains(fp.allowed, leaf.Subject.CommonName) {
		return "", nil
	}
	return r.Header.Get("X-Remote-User"), r.Header.Values("X-Remote-Group")
}

func widget(namespace, name, caller string, groups []string) map[string]any {
	return map[string]any{"apiVersion": group + "/" + version, "kind": "Widget",
		"metadata": map[string]any{"name": name, "namespace": namespace, "creationTimestamp": "2026-01-01T00:00:00Z"},
		"spec":     map[string]any{"caller": caller, "callerGroups": groups}}
}

func main() {
	var fp *frontProxy
	for {
		var err error
		if fp, err = loadFrontProxy(); err == nil {
			break
		}
		log.Printf("front proxy: %v (retrying)", err)
		time.Sleep(2 * time.Second)
	}
	mux := http.NewServeMux()
	write := func(w http.ResponseWriter, code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		caller, groups := fp.user(r)
		if caller == "" {
			write(w, http.StatusUnauthorized, map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Unauthorized", "code": 401, "message": "not the front proxy"})
			return
		}
		log.Printf("%s %s by %s %v", r.Method, r.URL.Path, caller, groups)
		parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		switch {
		case r.URL.Path == "/apis/"+group+"/"+version:
			write(w, http.StatusOK, map[string]any{"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group + "/" + version,
				"resources": []map[string]any{{"name": "widgets", "singularName": "widget", "namespaced": true, "kind": "Widget", "verbs": []string{"get", "list"}, "shortNames": []string{"wd"}}}})
		case len(parts) == 6 && parts[3] == "namespaces" && parts[5] == "widgets":
			write(w, http.StatusOK, map[string]any{"apiVersion": group + "/" + version, "kind": "WidgetList", "metadata": map[string]any{},
				"items": []any{widget(parts[4], "first", caller, groups), widget(parts[4], "second", caller, groups)}})
		case len(parts) == 4 && parts[3] == "widgets":
			write(w, http.StatusOK, map[string]any{"apiVersion": group + "/" + version, "kind": "WidgetList", "metadata": map[string]any{},
				"items": []any{widget("default", "first", caller, groups)}})
		case len(parts) == 7 && parts[3] == "namespaces" && parts[5] == "widgets" && (parts[6] == "first" || parts[6] == "second"):
			write(w, http.StatusOK, widget(parts[4], parts[6], caller, groups))
		default:
			write(w, http.StatusNotFound, map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"})
		}
	})
	srv := &http.Server{Addr: ":8443", Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, ClientAuth: tls.RequestClientCert}}
	log.Printf("serving %s/%s on :8443", group, version)
	log.Fatal(srv.ListenAndServeTLS("/tls/tls.crt", "/tls/tls.key"))
}
