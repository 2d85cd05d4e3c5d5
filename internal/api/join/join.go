// Package join is how a machine becomes a node: the wire shape of the
// request an agent sends, once it has checked the server's CA against its
// join token, and the server's handler that answers it with the node's
// certificates. The agent keeps its private keys: it sends certificate
// requests, and the server decides the names in what it signs.
package join

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"github.com/orch-dev/orch/internal/api/auth"
	"github.com/orch-dev/orch/internal/api/pki"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Path is where the server takes join requests.
const Path = "/orch/v1/join"

// Request is what an agent sends, with the join secret as a bearer token.
type Request struct {
	NodeName string `json:"nodeName"`
	// Addresses are the node's IPs, for its :10250 serving certificate.
	Addresses []string `json:"addresses"`
	// ClientCSR and ServingCSR are PEM certificate requests for the keys
	// the agent made and keeps.
	ClientCSR  string `json:"clientCSR"`
	ServingCSR string `json:"servingCSR"`
}

// Response carries the node's certificates and the cluster CA.
type Response struct {
	CA          string `json:"ca"`
	ClientCert  string `json:"clientCert"`
	ServingCert string `json:"servingCert"`
}

// Handler answers join requests that carry the join secret.
type Handler struct {
	ca     *pki.CA
	secret string
	log    *slog.Logger
}

// NewHandler signs node certificates with ca for holders of secret.
func NewHandler(ca *pki.CA, secret string, log *slog.Logger) *Handler {
	return &Handler{ca: ca, secret: secret, log: log}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	scheme, secret, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "bearer") || subtle.ConstantTimeCompare([]byte(secret), []byte(h.secret)) != 1 {
		h.log.Warn("join refused: wrong token", "remote", r.RemoteAddr)
		http.Error(w, "join refused: the token's secret is not this server's", http.StatusUnauthorized)
		return
	}
	var req Request
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil {
		http.Error(w, fmt.Sprintf("join request: %v", err), http.StatusBadRequest)
		return
	}
	resp, err := h.sign(req)
	if err != nil {
		http.Error(w, fmt.Sprintf("join request: %v", err), http.StatusBadRequest)
		return
	}
	h.log.Info("node joined", "node", req.NodeName, "remote", r.RemoteAddr)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

func (h *Handler) sign(req Request) (*Response, error) {
	if errs := validation.IsDNS1123Subdomain(req.NodeName); len(errs) > 0 {
		return nil, fmt.Errorf("node name %q: %s", req.NodeName, strings.Join(errs, "; "))
	}
	var ips []net.IP
	for _, a := range req.Addresses {
		ip := net.ParseIP(a)
		if ip == nil {
			return nil, fmt.Errorf("address %q is not an IP", a)
		}
		ips = append(ips, ip)
	}
	client, err := h.ca.SignCSR([]byte(req.ClientCSR), pki.Request{
		CommonName: auth.NodeUserPrefix + req.NodeName, Organization: []string{auth.GroupNodes}, Client: true})
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	serving, err := h.ca.SignCSR([]byte(req.ServingCSR), pki.Request{
		CommonName: req.NodeName, DNSNames: []string{req.NodeName}, IPs: ips, Server: true})
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	return &Response{CA: string(h.ca.CertPEM), ClientCert: string(client), ServingCert: string(serving)}, nil
}
