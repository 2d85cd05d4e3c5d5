package api

import (
	"bytes"
	"context"
	"time"

	"github.com/orch-dev/orch/internal/api/auth"
)

// renewCertificates reissues, while the server runs, the certificates
// that come within 90 days of expiry (as at every start): the serving
// certificate, presented from the next handshake on, and the admin
// client's, with the admin kubeconfig written again. A server left
// running for years keeps valid certificates without a restart.
func (s *Server) renewCertificates(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.renewServing()
		s.renewAdmin()
	}
}

func (s *Server) renewServing() {
	kp, err := s.ca.LoadOrIssueServing(s.tlsDir, "serving", s.servingNames)
	if err != nil {
		s.log.Error("renewing the serving certificate", "err", err)
		return
	}
	cert, err := kp.TLS()
	if err != nil {
		s.log.Error("renewing the serving certificate", "err", err)
		return
	}
	if current := s.serving.Load(); current != nil && len(current.Certificate) > 0 && bytes.Equal(current.Certificate[0], cert.Certificate[0]) {
		return
	}
	s.serving.Store(&cert)
	if cert.Leaf != nil {
		s.log.Info("serving certificate renewed", "notAfter", cert.Leaf.NotAfter)
	}
}

func (s *Server) renewAdmin() {
	kp, err := s.ca.LoadOrIssueClient(s.tlsDir, "client-admin", "system:admin", []string{auth.GroupMasters})
	if err != nil {
		s.log.Error("renewing the admin certificate", "err", err)
		return
	}
	if bytes.Equal(kp.CertPEM, s.admin.CertPEM) {
		return
	}
	s.admin = kp
	if s.cfg.KubeconfigPath != "" {
		if err := s.writeKubeconfig(s.cfg.KubeconfigPath); err != nil {
			s.log.Error("writing the admin kubeconfig with its renewed certificate", "err", err)
			return
		}
	}
	s.log.Info("admin certificate renewed", "kubeconfig", s.cfg.KubeconfigPath)
}
