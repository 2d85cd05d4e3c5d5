package api

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/store"
	"github.com/orch-dev/orch/internal/store/etcdstore"
)

// Datastore names an external etcd, as k3s's --datastore-endpoint and
// --datastore-cafile/-certfile/-keyfile do.
type Datastore struct {
	// Endpoint is one or more etcd client URLs, comma-separated
	// (https://a:2379,https://b:2379).
	Endpoint string
	// CAFile verifies etcd's serving certificate (default: the system's
	// roots); CertFile and KeyFile are orch's client certificate.
	CAFile, CertFile, KeyFile string
}

// endpoints parses Endpoint: etcd URLs only (k3s also takes SQL databases
// through kine; orch speaks etcd alone).
func (d Datastore) endpoints() ([]string, bool, error) {
	var out []string
	secure := false
	for _, e := range strings.Split(d.Endpoint, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		u, err := url.Parse(e)
		if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") || (u.Path != "" && u.Path != "/") {
			return nil, false, fmt.Errorf("--datastore-endpoint %q: want etcd client URLs such as https://10.0.0.5:2379 (orch keeps its state in etcd only, not in SQL databases)", e)
		}
		if len(out) > 0 && (u.Scheme == "https") != secure {
			return nil, false, fmt.Errorf("--datastore-endpoint %q: mixes http and https", d.Endpoint)
		}
		secure = u.Scheme == "https"
		out = append(out, u.Scheme+"://"+u.Host)
	}
	if len(out) == 0 {
		return nil, false, errors.New("--datastore-endpoint: no endpoint")
	}
	return out, secure, nil
}

// tlsConfig is the client's TLS for https endpoints.
func (d Datastore) tlsConfig(secure bool) (*tls.Config, error) {
	if !secure {
		if d.CAFile != "" || d.CertFile != "" || d.KeyFile != "" {
			return nil, errors.New("--datastore-cafile, -certfile and -keyfile need https:// endpoints")
		}
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if d.CAFile != "" {
		pem, err := os.ReadFile(d.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--datastore-cafile: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--datastore-cafile %s: no PEM certificate in it", d.CAFile)
		}
	}
	if (d.CertFile == "") != (d.KeyFile == "") {
		return nil, errors.New("--datastore-certfile and --datastore-keyfile go together")
	}
	if d.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(d.CertFile, d.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("--datastore-certfile/-keyfile: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// openDatastore connects to the external etcd.
func openDatastore(ctx context.Context, d Datastore, compactInterval time.Duration, expiring map[string]time.Duration, log *slog.Logger) (store.Store, error) {
	endpoints, secure, err := d.endpoints()
	if err != nil {
		return nil, err
	}
	tlsCfg, err := d.tlsConfig(secure)
	if err != nil {
		return nil, err
	}
	s, err := etcdstore.Open(ctx, etcdstore.Options{Endpoints: endpoints, TLS: tlsCfg, CompactInterval: compactInterval, Expiring: expiring, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("open the datastore: %w", err)
	}
	log.Info("the cluster's state is in etcd", "endpoints", strings.Join(endpoints, ","))
	return s, nil
}
