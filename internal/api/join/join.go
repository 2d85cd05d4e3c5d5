// Package join is how a machine becomes a node: the wire shape of the
// request an agent sends, once it has checked the server's CA against its
// join token, and the server's handler that answers it with the node's
// certificates. The agent keeps its private keys: it sends certificate
// requests, and the server decides the names in what it signs.
//
// The token admits a machine, not an identity: a node name is bound to the
// first machine that joins with it by that machine's node password (a
// hash kept by the server, as k3s keeps one in a Secret), a node's serving
// certificate names only the node and its own addresses (never the API
// server's Service names or addresses), and each source address gets a
// few attempts a second.
package join

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orch-dev/orch/internal/api/auth"
	"github.com/orch-dev/orch/internal/api/pki"
	"github.com/orch-dev/orch/internal/joinproto"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/util/validation"
)

// ErrWrongPassword is what Passwords.Verify returns for a node name
// another machine holds.
var ErrWrongPassword = errors.New("the node name belongs to another machine")

// Passwords binds node names to the machines that joined with them.
type Passwords interface {
	// Verify binds node to password on its first join and afterwards
	// returns ErrWrongPassword for any other password.
	Verify(ctx context.Context, node, password string) error
}

// Policy is what the server keeps out of node certificates.
type Policy struct {
	// ReservedNames are the API server's own names (kubernetes,
	// kubernetes.default.svc, ...): no node may be named so.
	ReservedNames []string
	// ClusterDomain is the cluster's DNS domain: a node named under it,
	// or under svc, would be a Service's name.
	ClusterDomain string
	// ServiceCIDR holds the Services' addresses, which no node has.
	ServiceCIDR netip.Prefix
}

// Rate of join attempts from one source address: a burst, then one a
// second; enough for a node, too few to guess a token.
const (
	attemptsPerSecond = 1
	attemptBurst      = 10
	// trackedSources bounds the limiter's memory under a flood from many
	// addresses.
	trackedSources = 4096
)

// Handler answers join requests that carry the join secret, and nodes'
// renewals of their certificates, which carry their current client
// certificate instead.
type Handler struct {
	ca        atomic.Pointer[pki.CA]
	secret    atomic.Pointer[string]
	passwords Passwords
	policy    Policy
	log       *slog.Logger

	mu      sync.Mutex
	sources map[string]*rate.Limiter
}

// NewHandler signs node certificates with ca for holders of secret.
func NewHandler(ca *pki.CA, secret string, passwords Passwords, policy Policy, log *slog.Logger) *Handler {
	h := &Handler{passwords: passwords, policy: policy, log: log, sources: map[string]*rate.Limiter{}}
	h.SetSecret(secret)
	h.ca.Store(ca)
	return h
}

// SetCA signs with ca from now on (orch certificate rotate-ca); the
// answers carry its bundle, which the nodes take.
func (h *Handler) SetCA(ca *pki.CA) { h.ca.Store(ca) }

// SetSecret replaces the join secret (orch token rotate): joins with the
// old one are refused from now on; nodes that joined keep their
// certificates.
func (h *Handler) SetSecret(secret string) { h.secret.Store(&secret) }

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.allow(r.RemoteAddr) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "too many join attempts from this address", http.StatusTooManyRequests)
		return
	}
	// A node renews its certificates with the ones it holds, as the
	// kubelet rotates its own: the join token may have been rotated since
	// it joined.
	renewing, byCertificate := h.nodeOf(r)
	scheme, secret, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !byCertificate && (!strings.EqualFold(scheme, "bearer") || subtle.ConstantTimeCompare([]byte(secret), []byte(*h.secret.Load())) != 1) {
		h.log.Warn("join refused: wrong token", "remote", r.RemoteAddr)
		http.Error(w, "join refused", http.StatusUnauthorized)
		return
	}
	var req joinproto.Request
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil {
		http.Error(w, fmt.Sprintf("join request: %v", err), http.StatusBadRequest)
		return
	}
	if byCertificate && req.NodeName != renewing {
		h.log.Warn("renewal refused: a node asked for another's certificates", "node", renewing, "asked", req.NodeName, "remote", r.RemoteAddr)
		http.Error(w, fmt.Sprintf("renewal refused: node %q may renew its own certificates only", renewing), http.StatusForbidden)
		return
	}
	if err := h.check(req); err != nil {
		h.log.Warn("join refused", "node", req.NodeName, "remote", r.RemoteAddr, "err", err)
		http.Error(w, fmt.Sprintf("join request: %v", err), http.StatusBadRequest)
		return
	}
	if err := h.passwords.Verify(r.Context(), req.NodeName, req.NodePassword); err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, ErrWrongPassword) {
			code = http.StatusForbidden
			err = fmt.Errorf("node %q already joined from another machine (its node password differs); delete the Node to free the name", req.NodeName)
		}
		h.log.Warn("join refused", "node", req.NodeName, "remote", r.RemoteAddr, "err", err)
		http.Error(w, fmt.Sprintf("join refused: %v", err), code)
		return
	}
	resp, err := h.sign(req)
	if err != nil {
		http.Error(w, fmt.Sprintf("join request: %v", err), http.StatusBadRequest)
		return
	}
	if byCertificate {
		h.log.Info("node certificates renewed", "node", req.NodeName, "remote", r.RemoteAddr)
	} else {
		h.log.Info("node joined", "node", req.NodeName, "remote", r.RemoteAddr)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// allow spends one of the source address's attempts.
func (h *Handler) allow(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	l, ok := h.sources[host]
	if !ok {
		if len(h.sources) >= trackedSources {
			// Forget the sources whose buckets have refilled: they are
			// where a fresh one would start.
			now := time.Now()
			for k, v := range h.sources {
				if v.TokensAt(now) >= attemptBurst {
					delete(h.sources, k)
				}
			}
			if len(h.sources) >= trackedSources {
				return false
			}
		}
		l = rate.NewLimiter(attemptsPerSecond, attemptBurst)
		h.sources[host] = l
	}
	return l.Allow()
}

// nodeOf is the node whose client certificate, verified against the
// cluster CA, the request carries.
func (h *Handler) nodeOf(r *http.Request) (string, bool) {
	if r.TLS == nil {
		return "", false
	}
	cert, err := h.ca.Load().VerifyClient(r.TLS.PeerCertificates)
	if err != nil {
		return "", false
	}
	name, ok := strings.CutPrefix(cert.Subject.CommonName, auth.NodeUserPrefix)
	if !ok || name == "" || !slices.Contains(cert.Subject.Organization, auth.GroupNodes) {
		return "", false
	}
	return name, true
}

// check refuses names and addresses that are not a node's own to have.
func (h *Handler) check(req joinproto.Request) error {
	if errs := validation.IsDNS1123Subdomain(req.NodeName); len(errs) > 0 {
		return fmt.Errorf("node name %q: %s", req.NodeName, strings.Join(errs, "; "))
	}
	name := strings.ToLower(req.NodeName)
	for _, reserved := range h.policy.ReservedNames {
		if name == strings.ToLower(reserved) {
			return fmt.Errorf("node name %q is the API server's own name", req.NodeName)
		}
	}
	for _, suffix := range []string{".svc", ".svc." + h.policy.ClusterDomain, "." + h.policy.ClusterDomain} {
		if h.policy.ClusterDomain != "" && strings.HasSuffix(name, suffix) {
			return fmt.Errorf("node name %q is a name in the cluster's DNS domain", req.NodeName)
		}
	}
	if len(req.NodePassword) < 16 {
		return errors.New("nodePassword: the agent must send its node password (an agent older than the server?)")
	}
	for _, a := range req.Addresses {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return fmt.Errorf("address %q is not an IP", a)
		}
		if h.policy.ServiceCIDR.IsValid() && h.policy.ServiceCIDR.Contains(ip.Unmap()) {
			return fmt.Errorf("address %s is in the service CIDR %s: a Service's address, not a node's", a, h.policy.ServiceCIDR)
		}
		if ip.IsUnspecified() || ip.IsMulticast() {
			return fmt.Errorf("address %s is not a node's", a)
		}
	}
	return nil
}

func (h *Handler) sign(req joinproto.Request) (*joinproto.Response, error) {
	var ips []net.IP
	for _, a := range req.Addresses {
		ips = append(ips, net.ParseIP(a))
	}
	ca := h.ca.Load()
	client, err := ca.SignCSR([]byte(req.ClientCSR), pki.Request{
		CommonName: auth.NodeUserPrefix + req.NodeName, Organization: []string{auth.GroupNodes}, Client: true})
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	serving, err := ca.SignCSR([]byte(req.ServingCSR), pki.Request{
		CommonName: req.NodeName, DNSNames: []string{req.NodeName}, IPs: ips, Server: true})
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	answer := &joinproto.Response{CA: string(ca.Bundle()), ClientCert: string(client), ServingCert: string(serving)}
	if req.ProxyCSR != "" {
		proxy, err := ca.SignCSR([]byte(req.ProxyCSR), pki.Request{CommonName: joinproto.ProxyUser, Client: true})
		if err != nil {
			return nil, fmt.Errorf("service proxy's certificate: %w", err)
		}
		answer.ProxyCert = string(proxy)
	}
	return answer, nil
}
