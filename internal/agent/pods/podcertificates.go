package pods

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/agent/volumes"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// podCertificates keeps the keys and certificates of the node's pods'
// podCertificate volumes, as the kubelet's pod certificate manager: for
// each source a key made on the node (it never leaves it), a
// PodCertificateRequest for it, the certificate its signer issued, and a
// new key and request once the certificate is due for refresh
// (status.beginRefreshAt) — the old one served until the new one is
// issued.
type podCertificates struct {
	clock clock.PassiveClock
	mu    sync.Mutex
	held  map[podCertificateKey]*podCertificate
	// nodeUID is the node's, read once.
	nodeUID types.UID
}

type podCertificateKey struct {
	pod    types.UID
	volume string
	index  int
}

// podCertificate is one source's state: the issued credentials, and the
// request in flight (first, or a refresh).
type podCertificate struct {
	// mu serializes the source's setups (a pod's start and the periodic
	// refresh of its volumes).
	mu             sync.Mutex
	key, chain     []byte
	beginRefreshAt time.Time
	pending        string // the request waiting for its signer
	pendingKey     []byte
	failed         string // why the last request was denied or failed
}

func (c *podCertificates) forget(pod types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.held {
		if k.pod == pod {
			delete(c.held, k)
		}
	}
}

// waiting is the error a volume's setup returns while its certificate is
// not issued: the pod waits in ContainerCreating and is tried again.
func waiting(format string, args ...any) error {
	return &volumes.Error{Reason: "ContainerCreating", Message: fmt.Sprintf(format, args...)}
}

// PodCertificate implements volumes.Sources.
func (s *sources) PodCertificate(ctx context.Context, pod *corev1.Pod, volume string, index int, p *corev1.PodCertificateProjection) ([]byte, []byte, error) {
	c := &s.m.podCerts
	key := podCertificateKey{pod: pod.UID, volume: volume, index: index}
	c.mu.Lock()
	if c.held == nil {
		c.held = map[podCertificateKey]*podCertificate{}
	}
	st := c.held[key]
	if st == nil {
		st = &podCertificate{}
		c.held[key] = st
	}
	c.mu.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	now := c.clock.Now()
	if st.chain != nil && now.Before(st.beginRefreshAt) {
		return st.key, st.chain, nil
	}
	if st.pending != "" {
		done, err := s.collect(ctx, pod.Namespace, st)
		if err != nil {
			return s.orLast(st, err)
		}
		if done && st.chain != nil && st.pending == "" {
			return st.key, st.chain, nil
		}
		if !done {
			return s.orLast(st, waiting("waiting for PodCertificateRequest %s/%s to be issued by %s", pod.Namespace, st.pending, p.SignerName))
		}
	}
	if err := s.request(ctx, pod, p, st); err != nil {
		return s.orLast(st, err)
	}
	return s.orLast(st, waiting("waiting for PodCertificateRequest %s/%s to be issued by %s", pod.Namespace, st.pending, p.SignerName))
}

// orLast serves the credentials issued before while a refresh waits;
// with none, the error.
func (s *sources) orLast(st *podCertificate, err error) ([]byte, []byte, error) {
	if st.chain != nil {
		return st.key, st.chain, nil
	}
	return nil, nil, err
}

// collect reads the pending request: issued, it becomes the credentials;
// denied or failed, it is dropped (a new one is made, as the kubelet
// retries). It reports whether the request is settled.
func (s *sources) collect(ctx context.Context, namespace string, st *podCertificate) (bool, error) {
	req, err := s.m.api.PodCertificateRequests(namespace).Get(ctx, st.pending, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		st.pending, st.pendingKey = "", nil
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("podcertificaterequest %s/%s: %w", namespace, st.pending, err)
	}
	for _, cond := range req.Status.Conditions {
		if cond.Status != metav1.ConditionTrue {
			continue
		}
		switch cond.Type {
		case certificatesv1.PodCertificateRequestConditionTypeIssued:
			st.key, st.chain = st.pendingKey, []byte(req.Status.CertificateChain)
			st.beginRefreshAt = time.Now().Add(time.Hour)
			if req.Status.BeginRefreshAt != nil {
				st.beginRefreshAt = req.Status.BeginRefreshAt.Time
			}
			st.pending, st.pendingKey, st.failed = "", nil, ""
			return true, nil
		case certificatesv1.PodCertificateRequestConditionTypeDenied, certificatesv1.PodCertificateRequestConditionTypeFailed:
			st.failed = fmt.Sprintf("PodCertificateRequest %s/%s %s: %s", namespace, req.Name, cond.Type, cond.Message)
			st.pending, st.pendingKey = "", nil
			return true, waiting("%s", st.failed)
		}
	}
	return false, nil
}

// request makes a key of the source's type and asks for its certificate.
func (s *sources) request(ctx context.Context, pod *corev1.Pod, p *corev1.PodCertificateProjection, st *podCertificate) error {
	c := &s.m.podCerts
	priv, err := newKey(p.KeyType)
	if err != nil {
		return &volumes.Error{Reason: "CreateContainerConfigError", Message: err.Error()}
	}
	stub, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, priv)
	if err != nil {
		return fmt.Errorf("certificate request: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return fmt.Errorf("private key: %w", err)
	}
	c.mu.Lock()
	nodeUID := c.nodeUID
	c.mu.Unlock()
	if nodeUID == "" {
		node, err := s.m.api.Nodes().Get(ctx, s.m.cfg.Node, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("node %s: %w", s.m.cfg.Node, err)
		}
		c.mu.Lock()
		c.nodeUID, nodeUID = node.UID, node.UID
		c.mu.Unlock()
	}
	account := pod.Spec.ServiceAccountName
	if account == "" {
		account = "default"
	}
	sa, err := s.m.api.ServiceAccounts(pod.Namespace).Get(ctx, account, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("service account %s/%s: %w", pod.Namespace, account, err)
	}
	maxSeconds := p.MaxExpirationSeconds
	if maxSeconds == nil {
		d := int32(24 * 60 * 60) // Kubernetes' default: a day
		maxSeconds = &d
	}
	req, err := s.m.api.PodCertificateRequests(pod.Namespace).Create(ctx, &certificatesv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, GenerateName: "req-",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}}},
		Spec: certificatesv1.PodCertificateRequestSpec{SignerName: p.SignerName, PodName: pod.Name, PodUID: pod.UID,
			ServiceAccountName: account, ServiceAccountUID: sa.UID, NodeName: types.NodeName(s.m.cfg.Node), NodeUID: nodeUID,
			MaxExpirationSeconds: maxSeconds, StubPKCS10Request: stub, UnverifiedUserAnnotations: p.UserAnnotations},
	}, metav1.CreateOptions{})
	if apierrors.IsConflict(err) {
		c.mu.Lock()
		c.nodeUID = "" // the node registered again: read its UID anew
		c.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("podcertificaterequest for %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	st.pending, st.pendingKey = req.Name, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	return nil
}

// newKey makes a private key of a podCertificate source's key type.
func newKey(keyType string) (crypto.Signer, error) {
	switch keyType {
	case "RSA3072":
		return rsa.GenerateKey(rand.Reader, 3072)
	case "RSA4096":
		return rsa.GenerateKey(rand.Reader, 4096)
	case "ECDSAP256":
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case "ECDSAP384":
		return ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case "ECDSAP521":
		return ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	case "ED25519":
		_, key, err := ed25519.GenerateKey(rand.Reader)
		return key, err
	}
	return nil, fmt.Errorf("unsupported podCertificate keyType %q", keyType)
}
