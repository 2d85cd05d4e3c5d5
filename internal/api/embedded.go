package api

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/orch-dev/orch/internal/api/etcdmember"
	"github.com/orch-dev/orch/internal/atomicfile"
	"github.com/orch-dev/orch/internal/joinproto"
	"github.com/orch-dev/orch/internal/store"
	"github.com/orch-dev/orch/internal/store/etcdstore"
)

// Servers that hold the cluster's state themselves each run an etcd
// member (k3s's embedded etcd): the first makes the cluster
// (--cluster-init), every other joins it through a server of it (--server)
// with the server token, which an agent's join token is not: the bootstrap
// data it yields (every CA key) makes a machine a server.

// Embedded makes this server a member of the servers' own etcd.
type Embedded struct {
	// Join is a server of the cluster (--server https://HOST:6443);
	// empty, this server makes the cluster. A server that is a member
	// already restarts as one, whatever Join says.
	Join string
	// ServerToken is what a joining server presents: DATA/server/server-token
	// of a server of the cluster.
	ServerToken string
	// ClientPort and PeerPort are etcd's (default 2379 and 2380).
	ClientPort, PeerPort int
	// EtcdLogLevel is etcd's own log level (default warn).
	EtcdLogLevel string
}

// serverTokenFile, under DATA/server, is the token servers join with.
const serverTokenFile = "server-token"

// serverBootstrapPath serves joining servers the cluster's bootstrap data.
const serverBootstrapPath = "/orch/v1/server-bootstrap"

// serverBootstrap is what a joining server receives.
type serverBootstrap struct {
	// Sealed is the bootstrap data as the cluster keeps it, sealed with the
	// server token's secret.
	Sealed []byte `json:"sealed"`
	// ClientURLs are the voting members' etcd client URLs.
	ClientURLs []string `json:"clientURLs"`
}

// sharedStore says whether other servers share this one's store.
func (s *Server) sharedStore() bool { return s.cfg.Datastore.Endpoint != "" || s.cfg.Embedded != nil }

// startMember starts this server's etcd member, making or joining the
// cluster, and opens the store on it. It returns the secret that seals
// the bootstrap data.
func (s *Server) startMember(ctx context.Context, serverDir string) (string, error) {
	e := s.cfg.Embedded
	host, _ := os.Hostname()
	mcfg := etcdmember.Config{
		Dir: filepath.Join(serverDir, "db", "etcd"), TLSDir: filepath.Join(serverDir, "tls", "etcd"),
		NodeName: host, IP: net.IP(s.advertise.AsSlice()), ClientPort: e.ClientPort, PeerPort: e.PeerPort,
		LogLevel: e.EtcdLogLevel, Logger: s.log,
	}
	tokenPath := filepath.Join(serverDir, serverTokenFile)
	var secret string
	var endpoints []string
	if err := rejoinIfRemoved(serverDir, e.Join); err != nil {
		return "", err
	}
	switch {
	case etcdmember.Initialized(mcfg.Dir):
		if e.Join != "" {
			s.log.Info("this server is a member of the cluster already: --server is not used", "etcd", mcfg.Dir)
		}
		b, err := os.ReadFile(tokenPath)
		if err != nil {
			return "", fmt.Errorf("the server token of this member: %w", err)
		}
		tok, err := joinproto.ParseToken(strings.TrimSpace(string(b)))
		if err != nil {
			return "", fmt.Errorf("%s: %w", tokenPath, err)
		}
		secret = tok.Secret
		certs, err := etcdmember.LoadCertificates(mcfg.TLSDir, false)
		if err != nil {
			return "", err
		}
		if s.member, err = etcdmember.StartNew(ctx, mcfg, certs); err != nil {
			return "", err
		}
	case e.Join != "":
		tok, err := joinproto.ParseToken(e.ServerToken)
		if err != nil {
			return "", fmt.Errorf("--token: %w", err)
		}
		if tok.CAHash == "" {
			return "", errors.New("--token: a server joins with the whole server token (K10...::server:..., DATA/server/server-token of a server of the cluster): its CA hash proves the server it is sent to")
		}
		boot, err := fetchServerBootstrap(ctx, e.Join, tok)
		if err != nil {
			return "", err
		}
		data, err := unsealBootstrap(boot.Sealed, tok.Secret)
		if err != nil {
			return "", err
		}
		if err := s.applyBootstrap(serverDir, data); err != nil {
			return "", err
		}
		secret = tok.Secret
		certs, err := etcdmember.LoadCertificates(mcfg.TLSDir, false)
		if err != nil {
			return "", err
		}
		if s.member, err = etcdmember.Join(ctx, mcfg, certs, boot.ClientURLs); err != nil {
			return "", err
		}
		endpoints = boot.ClientURLs
	default:
		if _, err := os.Stat(filepath.Join(serverDir, "db", "etcd")); err == nil {
			return "", fmt.Errorf("%s holds an etcd member that never started: remove it to make the cluster again", mcfg.Dir)
		}
		random := make([]byte, 16)
		if _, err := rand.Read(random); err != nil {
			return "", err
		}
		secret = hex.EncodeToString(random)
		// The bare secret now; the whole token, with the CA's hash, once
		// the CA is loaded (writeServerToken).
		if err := atomicfile.Write(tokenPath, []byte(secret+"\n"), 0o600); err != nil {
			return "", fmt.Errorf("write the server token: %w", err)
		}
		certs, err := etcdmember.LoadCertificates(mcfg.TLSDir, true)
		if err != nil {
			return "", err
		}
		if s.member, err = etcdmember.StartNew(ctx, mcfg, certs); err != nil {
			return "", err
		}
	}
	// A voting member's server reads and writes through it alone, as
	// kube-apiserver beside its etcd: it never waits on a dead remote one,
	// and a member cut off from the quorum answers nothing rather than
	// something stale. A learner serves no client request: until it is
	// promoted, the voters do.
	learner := s.member.IsLearner()
	switch {
	case !learner:
		endpoints = []string{s.member.ClientURL()}
	case len(endpoints) == 0:
		endpoints = s.member.VoterClientURLs()
	}
	tlsCfg, err := s.member.ClientTLS()
	if err != nil {
		return "", err
	}
	// The member may be one of a cluster that has no quorum yet (every
	// server restarting): wait for it, as the members need each other up.
	var st *etcdstore.Store
	for {
		st, err = etcdstore.Open(ctx, etcdstore.Options{Endpoints: endpoints, TLS: tlsCfg, CompactInterval: s.cfg.CompactInterval,
			Expiring: s.expiringKeys(), DialTimeout: 10 * time.Second, Logger: s.log})
		if err == nil {
			s.store = st
			break
		}
		s.log.Warn("waiting for the cluster's etcd to answer (a quorum of its servers must run)", "endpoints", strings.Join(endpoints, ","), "err", err)
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	if learner {
		go s.useOwnMemberOncePromoted(st)
	}
	s.serverSecret = secret
	return secret, nil
}

// useOwnMemberOncePromoted sends the store to this server's own member
// once it votes.
func (s *Server) useOwnMemberOncePromoted(st *etcdstore.Store) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.member.Done():
			return
		case <-t.C:
		}
		if !s.member.IsLearner() {
			st.SetEndpoints(s.member.ClientURL())
			s.log.Info("this server's etcd member votes: the API server uses it from now on", "member", s.member.Name())
			return
		}
	}
}

// IsEtcdMember says whether the server with this data dir is a member of
// the servers' own etcd (it restarts as one).
func IsEtcdMember(dataDir string) bool {
	return etcdmember.Initialized(filepath.Join(dataDir, "server", "db", "etcd"))
}

// IsEtcdSnapshot says whether a snapshot is of the servers' own etcd (it
// restores as a member), not of a single server's store.
func IsEtcdSnapshot(path string) bool { return etcdmember.IsSnapshot(path) }

// rejoinIfRemoved moves the data of a member the cluster removed aside, so
// that the server joins anew, when it is told where (--server).
func rejoinIfRemoved(serverDir, join string) error {
	marker := filepath.Join(serverDir, "db", removedMarker)
	if _, err := os.Stat(marker); err != nil {
		return nil
	}
	if join == "" {
		return errors.New("this server's etcd member was removed from the cluster: start it with --server https://<a server>:6443 and the server token to join anew")
	}
	dir := filepath.Join(serverDir, "db", "etcd")
	if err := os.Rename(dir, fmt.Sprintf("%s-removed-%d", dir, time.Now().Unix())); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("move the removed member's data aside: %w", err)
	}
	return os.Remove(marker)
}

// writeServerToken writes the whole server token, with the CA's hash.
func (s *Server) writeServerToken(serverDir string) error {
	path := filepath.Join(serverDir, serverTokenFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if tok, err := joinproto.ParseToken(strings.TrimSpace(string(b))); err == nil && tok.CAHash == s.ca().Hash() {
		return nil
	}
	tok := joinproto.Token{CAHash: s.ca().Hash(), Secret: s.serverSecret}
	return atomicfile.Write(path, []byte(tok.String()+"\n"), 0o600)
}

// fetchServerBootstrap asks a server of the cluster for its bootstrap
// data, having checked it is the cluster's (its CA's hash is the token's).
func fetchServerBootstrap(ctx context.Context, server string, tok joinproto.Token) (*serverBootstrap, error) {
	fetched, err := joinproto.FetchCA(ctx, nil, server)
	if err != nil {
		return nil, err
	}
	ca, err := joinproto.TrustedBundle(fetched, joinproto.PinnedBy(tok.CAHash))
	if err != nil {
		return nil, fmt.Errorf("%s is not a server of the cluster the token names: %w", server, err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(server, "/")+serverBootstrapPath, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok.Secret)
	// One request: no idle connection is kept behind.
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("join %s: %w", server, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("join %s: %w", server, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return nil, fmt.Errorf("join %s: it keeps the cluster's state alone (started without --cluster-init), so no server can join it; restart it with --cluster-init first", server)
	default:
		return nil, fmt.Errorf("join %s refused: %s", server, strings.TrimSpace(string(body)))
	}
	var out serverBootstrap
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("join %s: %w", server, err)
	}
	if len(out.ClientURLs) == 0 {
		return nil, fmt.Errorf("join %s: it names no voting member", server)
	}
	return &out, nil
}

// serverBootstrapLimit slows guessing the server token down: wrong ones
// are refused at most this often.
var serverBootstrapLimit = rate.NewLimiter(1, 5)

// serveServerBootstrap gives a server presenting the server token the
// cluster's bootstrap data and where its etcd members are.
func (s *Server) serveServerBootstrap(w http.ResponseWriter, r *http.Request) {
	if s.member == nil {
		// Said to anyone: it is no secret, and tells a joiner what to do.
		http.Error(w, "this server keeps the cluster's state alone", http.StatusNotFound)
		return
	}
	scheme, secret, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "bearer") || subtle.ConstantTimeCompare([]byte(secret), []byte(s.serverSecret)) != 1 {
		if !serverBootstrapLimit.Allow() {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "too many attempts", http.StatusTooManyRequests)
			return
		}
		if tok, err := joinproto.ParseToken(s.token); err == nil && secret != "" && subtle.ConstantTimeCompare([]byte(secret), []byte(tok.Secret)) == 1 {
			s.log.Warn("a server join with the agents' token refused", "remote", r.RemoteAddr)
			http.Error(w, "this is the agents' join token: a server joins with the server token (DATA/server/server-token on a server of the cluster)", http.StatusForbidden)
			return
		}
		s.log.Warn("a server join refused: wrong server token", "remote", r.RemoteAddr)
		http.Error(w, "wrong server token", http.StatusUnauthorized)
		return
	}
	kv, err := s.store.Get(r.Context(), bootstrapKey)
	if err != nil {
		code := http.StatusServiceUnavailable
		if errors.Is(err, store.ErrNotFound) {
			err = errors.New("the cluster's bootstrap data is not there yet")
		}
		http.Error(w, err.Error(), code)
		return
	}
	s.log.Info("a server takes the cluster's bootstrap data to join", "remote", r.RemoteAddr)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(serverBootstrap{Sealed: kv.Value, ClientURLs: s.member.VoterClientURLs()})
}

// ResetMember is --cluster-reset on a server of the servers' own etcd:
// its member forgets the others and becomes a cluster of one with its data
// (the way out of a lost quorum), or, with a snapshot, with the snapshot's.
// The server is then started again without the flag, and the other
// servers join it anew (their DATA/server/db/etcd moved away, with
// --server). A snapshot restores on a new machine too, with no DATA/server:
// the cluster's identity is taken from the snapshot, unsealed with the
// server token (serverToken; its CA hash, when it has one, checked).
func ResetMember(ctx context.Context, dataDir, advertise, snapshotPath, serverToken string, log *slog.Logger) error {
	addr, err := advertiseAddress(advertise)
	if err != nil {
		return err
	}
	serverDir := filepath.Join(dataDir, "server")
	host, _ := os.Hostname()
	mcfg := etcdmember.Config{
		Dir: filepath.Join(serverDir, "db", "etcd"), TLSDir: filepath.Join(serverDir, "tls", "etcd"),
		NodeName: host, IP: net.IP(addr.AsSlice()), Logger: log, ForceNewCluster: true,
	}
	_, statErr := os.Stat(filepath.Join(mcfg.TLSDir, etcdmember.CAFiles[0]))
	newMachine := errors.Is(statErr, os.ErrNotExist)
	switch {
	case newMachine && snapshotPath == "":
		return errors.New("this server has no etcd certificates: a member is reset on a server that was one, with its DATA/server (a snapshot restores anywhere, with --cluster-reset-restore-path and --token)")
	case newMachine && serverToken == "":
		return errors.New("this server has no DATA/server of the cluster: restoring a snapshot on a new machine takes the cluster's identity from it, unsealed with the server token (--token K10...::server:..., DATA/server/server-token of a server of the cluster)")
	case snapshotPath == "" && !etcdmember.Initialized(mcfg.Dir):
		return fmt.Errorf("%s holds no etcd member to reset", mcfg.Dir)
	}
	if snapshotPath != "" {
		if err := etcdmember.Restore(mcfg, snapshotPath); err != nil {
			return err
		}
		mcfg.ForceNewCluster = false // the restore made a cluster of one
		if newMachine {
			if err := identityFromSnapshot(serverDir, mcfg.Dir, serverToken); err != nil {
				return err
			}
			log.Info("this server takes the cluster's identity from the snapshot (its CAs, tokens and keys)")
		}
	}
	certs, err := etcdmember.LoadCertificates(mcfg.TLSDir, false)
	if err != nil {
		return err
	}
	m, err := etcdmember.StartNew(ctx, mcfg, certs)
	if err != nil {
		return err
	}
	m.Close()
	return nil
}

// identityFromSnapshot writes the cluster's identity, as a restored
// member's data holds it sealed, into serverDir.
func identityFromSnapshot(serverDir, memberDir, serverToken string) error {
	tok, err := joinproto.ParseToken(serverToken)
	if err != nil {
		return fmt.Errorf("--token: %w", err)
	}
	sealed, err := etcdmember.ReadKey(memberDir, bootstrapKey)
	if err != nil {
		return fmt.Errorf("the snapshot holds no cluster identity (%w): is it a snapshot of servers with their own etcd?", err)
	}
	data, err := unsealBootstrap(sealed, tok.Secret)
	if err != nil {
		return fmt.Errorf("the snapshot's cluster identity does not open with this --token: give the server token of the cluster the snapshot is of")
	}
	if tok.CAHash != "" && !joinproto.PinnedBy(tok.CAHash)(data.Files["tls/ca.crt"]) {
		return errors.New("the snapshot is of another cluster than the token's (its CA's hash differs)")
	}
	return writeBootstrapFiles(serverDir, embeddedBootstrapFiles(), data)
}
