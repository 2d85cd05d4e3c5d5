package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/api/auth"
	"github.com/orch-dev/orch/internal/api/kubelet"
	"github.com/orch-dev/orch/internal/api/pki"
	"github.com/orch-dev/orch/internal/joinproto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// renewCertificates reissues, while the server runs, the certificates
// that come within 90 days of expiry (as at every start): the serving
// certificate, presented from the next handshake on, the admin client's,
// with the admin kubeconfig written again, the one it presents to the
// nodes' kubelet API and the front proxy's. A server left
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
		s.certMu.Lock()
		s.renewServing()
		s.renewAdmin()
		s.renewKubeletClient()
		// The front proxy's client certificate, reissued when it nears
		// expiry, used from the next connection to an aggregated server.
		if ca, err := s.frontProxyAuthority(s.tlsDir); err != nil {
			s.log.Error("renewing the front proxy's client certificate", "err", err)
		} else if err := s.renewFrontProxy(ca, s.tlsDir); err != nil {
			s.log.Error("renewing the front proxy's client certificate", "err", err)
		}
		s.certMu.Unlock()
	}
}

// renewKubeletClient reissues the certificate the server presents to the
// nodes' kubelet API (logs, exec, metrics) when it nears expiry.
func (s *Server) renewKubeletClient() {
	kp, err := s.ca().LoadOrIssueClient(s.tlsDir, kubeletClientName, "system:kube-apiserver", []string{auth.GroupMasters})
	if err != nil {
		s.log.Error("renewing the kubelet client certificate", "err", err)
		return
	}
	if bytes.Equal(kp.CertPEM, s.kubeletClient.CertPEM) {
		return
	}
	cert, err := kp.TLS()
	if err != nil {
		s.log.Error("renewing the kubelet client certificate", "err", err)
		return
	}
	s.kubeletClient = kp
	s.kubelets.SetCertificate(cert)
	s.log.Info("kubelet client certificate renewed")
}

// serverCertificates are the pairs under DATA/server/tls that
// orch certificate rotate reissues: everything but the CA and the
// service-account keys.
var serverCertificates = []string{"serving", "client-admin", kubeletClientName}

// CertificateRotation is what orch certificate rotate did.
type CertificateRotation struct {
	// Backup holds the certificates it replaced.
	Backup string `json:"backup"`
	// Running says whether a running server took the new ones at once
	// (else they are made at its next start).
	Running bool `json:"running"`
}

// rotateCertificates moves the server's certificates aside and issues
// new ones, in force at once.
func (s *Server) rotateCertificates() (CertificateRotation, error) {
	s.certMu.Lock()
	defer s.certMu.Unlock()
	backup, err := backUpCertificates(s.tlsDir)
	if err != nil {
		return CertificateRotation{}, err
	}
	s.renewServing()
	s.renewAdmin()
	s.renewKubeletClient()
	s.log.Info("server certificates rotated", "backup", backup)
	return CertificateRotation{Backup: backup, Running: true}, nil
}

// backUpCertificates moves the certificates under tlsDir into a backup
// directory of their own, for them to be issued again.
func backUpCertificates(tlsDir string) (string, error) {
	backup := newBackupDir(tlsDir)
	if err := os.MkdirAll(backup, 0o700); err != nil {
		return "", err
	}
	for _, name := range serverCertificates {
		for _, ext := range []string{".crt", ".key"} {
			if err := os.Rename(filepath.Join(tlsDir, name+ext), filepath.Join(backup, name+ext)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return "", fmt.Errorf("backing up %s: %w", name+ext, err)
			}
		}
	}
	return backup, nil
}

// RotateCertificates is `orch certificate rotate`: through the running
// server, which takes the new certificates at once, or in the data dir
// when none runs (they are issued at its next start).
func RotateCertificates(ctx context.Context, dataDir string) (CertificateRotation, error) {
	var out CertificateRotation
	reached, err := control(ctx, dataDir, "/certificates/rotate", nil, &out)
	if reached {
		return out, err
	}
	backup, err := backUpCertificates(filepath.Join(dataDir, "server", "tls"))
	return CertificateRotation{Backup: backup}, err
}

func (s *Server) renewServing() {
	kp, err := s.ca().LoadOrIssueServing(s.tlsDir, "serving", s.servingNames)
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
	kp, err := s.ca().LoadOrIssueClient(s.tlsDir, "client-admin", "system:admin", []string{auth.GroupMasters})
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

func newBackupDir(tlsDir string) string {
	return filepath.Join(tlsDir, "backup-"+strconv.FormatInt(time.Now().UnixNano(), 10))
}

// CARotation is what orch certificate rotate-ca did.
type CARotation struct {
	CertificateRotation
	// Token is the join token, whose CA hash names the new CA.
	Token string `json:"token,omitempty"`
	// Previous says whether the CA before is still trusted.
	Previous bool `json:"previous"`
}

// rotateCA replaces the cluster CA with a new one that the old endorses,
// in force at once: the server's certificates are issued again by it,
// the nodes', kubeconfigs' and pods' bundles (kube-root-ca.crt) carry
// both, and client certificates of either are accepted, so nothing that
// trusts the old CA loses the server while the nodes renew theirs. With
// dropPrevious it stops trusting the CA before instead (once the nodes
// have renewed).
func (s *Server) rotateCA(ctx context.Context, dropPrevious, force bool) (CARotation, error) {
	s.certMu.Lock()
	defer s.certMu.Unlock()
	if dropPrevious && !force {
		stale, err := s.nodesNotRenewed(ctx)
		if err != nil {
			return CARotation{}, err
		}
		if len(stale) > 0 {
			return CARotation{}, fmt.Errorf("not dropping the previous CA: nodes %s still present certificates it signed, and would lose the server: "+
				"they renew within ten minutes of the rotation, or at once when their agent restarts, and use the new ones within five minutes (--force drops it anyway)", strings.Join(stale, ", "))
		}
	}
	backup, ca, err := rotateCAFiles(s.tlsDir, dropPrevious)
	if err != nil {
		return CARotation{}, err
	}
	// What signs from now on, and what the next requests' client
	// certificates are checked against.
	s.authority.Store(ca)
	s.kubelets.SetRoots(ca.Pool())
	if s.joins != nil {
		s.joins.SetCA(ca)
	}
	s.renewServing()
	s.renewAdmin()
	s.renewKubeletClient()
	if s.cfg.KubeconfigPath != "" {
		if err := s.writeKubeconfig(s.cfg.KubeconfigPath); err != nil {
			return CARotation{}, err
		}
	}
	token, err := ca.LoadOrCreateToken(filepath.Join(s.cfg.DataDir, "server", "token"), "")
	if err != nil {
		return CARotation{}, err
	}
	s.tokenMu.Lock()
	s.token = token
	s.tokenMu.Unlock()
	s.log.Info("cluster CA rotated", "dropPrevious", dropPrevious, "backup", backup, "subject", ca.Cert.Subject.CommonName)
	return CARotation{CertificateRotation: CertificateRotation{Backup: backup, Running: true}, Token: token, Previous: ca.Rotated()}, nil
}

// nodesNotRenewed are the Ready nodes whose kubelet API presents a
// certificate the current CA did not sign (renewed together with the
// node's client certificates) or cannot be reached, and those that made
// a request with a client certificate of the previous CA within the
// last 20 seconds (their clients take a renewed one within five
// minutes; a node renews its lease every ten seconds).
func (s *Server) nodesNotRenewed(ctx context.Context) ([]string, error) {
	obj, err := s.storage("", "nodes").List(ctx, "", &metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	current := s.ca().Cert
	var stale []string
	for _, user := range s.ca().UsersOfPrevious(20 * time.Second) {
		if node, ok := strings.CutPrefix(user, auth.NodeUserPrefix); ok {
			stale = append(stale, node)
		} else if user == joinproto.ProxyUser {
			stale = append(stale, "(a node's service proxy)")
		}
	}
	for i := range obj.(*corev1.NodeList).Items {
		node := &obj.(*corev1.NodeList).Items[i]
		if !kubelet.NodeReady(node) {
			continue
		}
		cert, err := s.kubelets.ServingCertificate(ctx, node)
		if (err != nil || cert.CheckSignatureFrom(current) != nil) && !slices.Contains(stale, node.Name) {
			stale = append(stale, node.Name)
		}
	}
	slices.Sort(stale)
	return stale, nil
}

// RotateCA is `orch certificate rotate-ca`: through the running server,
// in force at once, or in the data dir when none runs (the server's
// certificates are issued by the new CA at its next start).
func RotateCA(ctx context.Context, dataDir string, dropPrevious, force bool) (CARotation, error) {
	var out CARotation
	reached, err := control(ctx, dataDir, "/certificates/rotate-ca", url.Values{"drop-previous": {strconv.FormatBool(dropPrevious)}, "force": {strconv.FormatBool(force)}}, &out)
	if reached {
		return out, err
	}
	tlsDir := filepath.Join(dataDir, "server", "tls")
	if _, err := os.Stat(filepath.Join(tlsDir, "ca.crt")); err != nil {
		return out, fmt.Errorf("no CA to rotate in %s: %w", tlsDir, err)
	}
	if dropPrevious && !force {
		return out, errors.New("no server runs to tell whether the nodes have renewed their certificates: start it, or drop the previous CA with --force")
	}
	backup, ca, err := rotateCAFiles(tlsDir, dropPrevious)
	if err != nil {
		return out, err
	}
	out.Backup, out.Previous = backup, ca.Rotated()
	out.Token, err = ca.LoadOrCreateToken(filepath.Join(dataDir, "server", "token"), "")
	return out, err
}

// rotateCAFiles makes a new CA under tlsDir, or drops the one before,
// and moves the server's certificates, issued by the old one, aside
// into the backup with the old CA's files.
func rotateCAFiles(tlsDir string, dropPrevious bool) (string, *pki.CA, error) {
	if dropPrevious {
		backup := newBackupDir(tlsDir)
		ca, err := pki.DropPreviousCA(tlsDir, backup)
		return backup, ca, err
	}
	backup, err := backUpCertificates(tlsDir)
	if err != nil {
		return "", nil, err
	}
	ca, err := pki.RotateCA(tlsDir, backup)
	return backup, ca, err
}
