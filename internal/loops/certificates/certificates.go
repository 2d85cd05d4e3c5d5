// Package certificates is what Kubernetes' controller manager does with
// CertificateSigningRequests, as one loop: the approver approves a node's
// request for its own client certificate once a SubjectAccessReview says
// its requester may have one (nothing else is approved without a
// person); the signer issues approved requests of the built-in signers
// with the cluster CA, or marks them Failed when a request does not fit
// its signer (kubernetes.io/legacy-unknown is never signed); the cleaner
// deletes requests once done with — issued, denied or failed an hour ago,
// pending for a day, or whose certificate has expired — so an edge board's
// store does not keep them forever.
package certificates

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	certificateslisters "k8s.io/client-go/listers/certificates/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// Sign issues a certificate for a verified request: its subject and
// names, the usages given, valid for ttl. It returns PEM.
type Sign func(req *x509.CertificateRequest, ttl time.Duration, keyUsage x509.KeyUsage, extKeyUsage []x509.ExtKeyUsage) ([]byte, error)

// Options tune the loop.
type Options struct {
	// MaxDuration is the longest a signed certificate lives (Kubernetes'
	// --cluster-signing-duration, default a year); a request's
	// expirationSeconds may ask for less.
	MaxDuration time.Duration
}

// How long requests are kept, as Kubernetes' cleaner keeps them.
const (
	doneFor    = time.Hour
	pendingFor = 24 * time.Hour
	// minDuration is the shortest certificate signed (validation refuses
	// to ask for less).
	minDuration = 10 * time.Minute
)

// Controller is the certificate requests' loop.
type Controller struct {
	client   *kube.Client
	requests certificateslisters.CertificateSigningRequestLister
	synced   []toolscache.InformerSynced
	queue    *controller.Queue[string]
	sign     Sign
	opts     Options
	env      controller.Env
}

// New registers the loop on the factory's informers; sign issues the
// certificates (nil: the loop approves and cleans, but signs nothing).
func New(client *kube.Client, factory *kube.Informers, sign Sign, opts Options, env controller.Env) (*Controller, error) {
	env = env.WithDefaults()
	if opts.MaxDuration <= 0 {
		opts.MaxDuration = 365 * 24 * time.Hour
	}
	inf := factory.CertificateSigningRequests()
	c := &Controller{client: client, requests: inf.Lister(), synced: []toolscache.InformerSynced{inf.Informer().HasSynced},
		queue: controller.NewQueue[string]("certificates", env), sign: sign, opts: opts, env: env}
	if err := c.queue.EnqueueObjects(inf.Informer(), func(_, name string) string { return name }); err != nil {
		return nil, err
	}
	return c, nil
}

// Run works the requests until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.queue.Run(ctx, workers, c.synced, c.sync)
}

func (c *Controller) sync(ctx context.Context, name string) error {
	csr, err := c.requests.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if done, err := c.clean(ctx, csr); done || err != nil {
		return err
	}
	approved, denied := approval(csr)
	switch {
	case len(csr.Status.Certificate) > 0 || denied || hasCondition(csr, certificatesv1.CertificateFailed):
		return nil
	case approved:
		return c.issue(ctx, csr)
	}
	return c.approve(ctx, csr)
}

func approval(csr *certificatesv1.CertificateSigningRequest) (approved, denied bool) {
	return hasCondition(csr, certificatesv1.CertificateApproved), hasCondition(csr, certificatesv1.CertificateDenied)
}

func hasCondition(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) bool {
	return slices.ContainsFunc(csr.Status.Conditions, func(c certificatesv1.CertificateSigningRequestCondition) bool {
		return c.Type == t && c.Status == corev1.ConditionTrue
	})
}

// clean deletes the request when it is past its time, or looks at it
// again when it will be.
func (c *Controller) clean(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (bool, error) {
	now := c.env.Clock.Now()
	deadline := c.deadline(csr)
	if deadline.After(now) {
		c.queue.AddAfter(csr.Name, deadline.Sub(now))
		return false, nil
	}
	err := c.client.CertificateSigningRequests().Delete(ctx, csr.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &csr.UID}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return true, fmt.Errorf("delete certificate request %s: %w", csr.Name, err)
	}
	c.env.Log.Info("certificate request removed", "loop", "certificates", "name", csr.Name, "state", condition(csr))
	return true, nil
}

// deadline is when the request is done with: an hour after it was
// issued, denied or failed (the condition's last update), a day after it
// was created while pending, and never after its certificate expires.
func (c *Controller) deadline(csr *certificatesv1.CertificateSigningRequest) time.Time {
	deadline := csr.CreationTimestamp.Add(pendingFor)
	for _, cond := range csr.Status.Conditions {
		switch cond.Type {
		case certificatesv1.CertificateDenied, certificatesv1.CertificateFailed:
		case certificatesv1.CertificateApproved:
			if len(csr.Status.Certificate) == 0 {
				continue // approved, not yet issued: the signer's to finish
			}
		default:
			continue
		}
		deadline = cond.LastUpdateTime.Add(doneFor)
		if cond.LastUpdateTime.IsZero() {
			deadline = csr.CreationTimestamp.Add(doneFor)
		}
	}
	if block, _ := pem.Decode(csr.Status.Certificate); block != nil {
		if cert, err := x509.ParseCertificate(block.Bytes); err == nil && cert.NotAfter.Before(deadline) {
			deadline = cert.NotAfter
		}
	}
	return deadline
}

func condition(csr *certificatesv1.CertificateSigningRequest) string {
	var states []string
	for _, c := range csr.Status.Conditions {
		states = append(states, string(c.Type))
	}
	if len(states) == 0 {
		return "Pending"
	}
	return strings.Join(states, ",")
}

// approve approves a pending request for a node's client certificate
// when its requester may have it: its own (selfnodeclient, what a node
// renewing its certificate asks) or any node's (nodeclient, what a
// bootstrap identity asks). Nothing else is approved here.
func (c *Controller) approve(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) error {
	if csr.Spec.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName {
		return nil
	}
	req, ok := nodeClientRequest(csr)
	if !ok {
		return nil // not a node's client certificate: a person's to decide
	}
	checks := []struct{ subresource, message string }{
		{"selfnodeclient", "Auto approving self kubelet client certificate after SubjectAccessReview."},
		{"nodeclient", "Auto approving kubelet client certificate after SubjectAccessReview."},
	}
	if csr.Spec.Username != req.Subject.CommonName {
		checks = checks[1:]
	}
	for _, check := range checks {
		allowed, err := c.mayCreate(ctx, csr, check.subresource)
		if err != nil {
			return err
		}
		if !allowed {
			continue
		}
		csr = csr.DeepCopy()
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "AutoApproved", Message: check.message,
			LastUpdateTime: metav1.NewTime(c.env.Clock.Now()),
		})
		_, err = c.client.CertificateSigningRequests().UpdateApproval(ctx, csr, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil // the informer brings the newer one
		}
		return err
	}
	return nil
}

// nodeClientRequest is the request when it has the shape of a node's
// client certificate request.
func nodeClientRequest(csr *certificatesv1.CertificateSigningRequest) (*x509.CertificateRequest, bool) {
	req, err := parseRequest(csr.Spec.Request)
	return req, err == nil && validateKubeletClient(req, csr.Spec.Usages) == nil
}

// mayCreate asks whether the request's requester may create
// certificatesigningrequests/<subresource>.
func (c *Controller) mayCreate(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, subresource string) (bool, error) {
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range csr.Spec.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	review, err := c.client.SubjectAccessReview(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: csr.Spec.Username, UID: csr.Spec.UID, Groups: csr.Spec.Groups, Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Group: certificatesv1.GroupName, Version: "*",
			Resource: "certificatesigningrequests", Subresource: subresource, Verb: "create"},
	}})
	if err != nil {
		return false, fmt.Errorf("subject access review for %s: %w", csr.Name, err)
	}
	return review.Status.Allowed, nil
}

// issue signs an approved request of a built-in signer, or marks it
// Failed when it does not fit the signer.
func (c *Controller) issue(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) error {
	if c.sign == nil {
		return nil
	}
	var check func(*x509.CertificateRequest, []certificatesv1.KeyUsage) error
	switch csr.Spec.SignerName {
	case certificatesv1.KubeAPIServerClientSignerName:
		check = func(_ *x509.CertificateRequest, usages []certificatesv1.KeyUsage) error {
			return validateClientUsages(usages)
		}
	case certificatesv1.KubeAPIServerClientKubeletSignerName:
		check = validateKubeletClient
	case certificatesv1.KubeletServingSignerName:
		check = validateKubeletServing
	default:
		return nil // another signer's, or the legacy one nobody signs for
	}
	req, err := parseRequest(csr.Spec.Request)
	if err == nil {
		err = check(req, csr.Spec.Usages)
	}
	csr = csr.DeepCopy()
	if err != nil {
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateFailed, Status: corev1.ConditionTrue, Reason: "SignerValidationFailure", Message: err.Error(),
			LastUpdateTime: metav1.NewTime(c.env.Clock.Now()),
		})
	} else {
		keyUsage, extKeyUsage, err := x509Usages(csr.Spec.Usages)
		if err != nil {
			return err
		}
		if csr.Status.Certificate, err = c.sign(req, c.duration(csr.Spec.ExpirationSeconds), keyUsage, extKeyUsage); err != nil {
			return fmt.Errorf("sign %s: %w", csr.Name, err)
		}
	}
	_, err = c.client.CertificateSigningRequests().UpdateStatus(ctx, csr, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// duration is the certificate's lifetime: what the request asks, within
// [10 minutes, MaxDuration].
func (c *Controller) duration(expirationSeconds *int32) time.Duration {
	if expirationSeconds == nil {
		return c.opts.MaxDuration
	}
	d := time.Duration(*expirationSeconds) * time.Second
	return min(max(d, minDuration), c.opts.MaxDuration)
}

func parseRequest(data []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("PEM block type must be CERTIFICATE REQUEST")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, err
	}
	return req, req.CheckSignature()
}

// validateClientUsages: a client certificate of the kube-apiserver-client
// signer is for client auth, with digital signature and key encipherment
// allowed, nothing else.
func validateClientUsages(usages []certificatesv1.KeyUsage) error {
	client := false
	for _, u := range usages {
		switch u {
		case certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment:
		case certificatesv1.UsageClientAuth:
			client = true
		default:
			return fmt.Errorf("invalid usage for client certificate: %s", u)
		}
	}
	if !client {
		return fmt.Errorf("missing required usage for client certificate: %s", certificatesv1.UsageClientAuth)
	}
	return nil
}

// usagesAre: the usages are exactly one of the allowed sets.
func usagesAre(usages []certificatesv1.KeyUsage, allowed ...[]certificatesv1.KeyUsage) bool {
	have := slices.Clone(usages)
	slices.Sort(have)
	have = slices.Compact(have)
	for _, set := range allowed {
		want := slices.Clone(set)
		slices.Sort(want)
		if slices.Equal(have, want) {
			return true
		}
	}
	return false
}

const nodePrefix = "system:node:"

// validateKubeletClient is Kubernetes' shape of a node's client
// certificate request: organization exactly system:nodes, common name
// system:node:<name>, no alternative names, and the client usages.
func validateKubeletClient(req *x509.CertificateRequest, usages []certificatesv1.KeyUsage) error {
	switch {
	case !slices.Equal(req.Subject.Organization, []string{"system:nodes"}):
		return errors.New("subject organization is not system:nodes")
	case len(req.DNSNames) > 0:
		return errors.New("DNS subjectAltNames are not allowed")
	case len(req.EmailAddresses) > 0:
		return errors.New("email subjectAltNames are not allowed")
	case len(req.IPAddresses) > 0:
		return errors.New("IP subjectAltNames are not allowed")
	case len(req.URIs) > 0:
		return errors.New("URI subjectAltNames are not allowed")
	case !strings.HasPrefix(req.Subject.CommonName, nodePrefix):
		return errors.New("subject common name does not begin with " + nodePrefix + " (a node's name)")
	case !usagesAre(usages,
		[]certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageClientAuth},
		[]certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}):
		return errors.New("usages did not match [client auth digital signature key encipherment]")
	}
	return nil
}

// validateKubeletServing is Kubernetes' shape of a node's serving
// certificate request: organization exactly system:nodes, at least one
// DNS or IP name and no others, the server usages, common name
// system:node:<name> (NodeRestriction made sure a node asks only as
// itself).
func validateKubeletServing(req *x509.CertificateRequest, usages []certificatesv1.KeyUsage) error {
	switch {
	case !slices.Equal(req.Subject.Organization, []string{"system:nodes"}):
		return errors.New("subject organization is not system:nodes")
	case len(req.DNSNames) == 0 && len(req.IPAddresses) == 0:
		return errors.New("DNS or IP subjectAltName is required")
	case len(req.EmailAddresses) > 0:
		return errors.New("email subjectAltNames are not allowed")
	case len(req.URIs) > 0:
		return errors.New("URI subjectAltNames are not allowed")
	case !usagesAre(usages,
		[]certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth},
		[]certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}):
		return errors.New("usages did not match [digital signature key encipherment server auth]")
	case !strings.HasPrefix(req.Subject.CommonName, nodePrefix):
		return errors.New("subject common name does not begin with " + nodePrefix + " (a node's name)")
	}
	return nil
}

// x509Usages turns a request's usages into the certificate's.
func x509Usages(usages []certificatesv1.KeyUsage) (x509.KeyUsage, []x509.ExtKeyUsage, error) {
	keyUsages := map[certificatesv1.KeyUsage]x509.KeyUsage{
		certificatesv1.UsageSigning: x509.KeyUsageDigitalSignature, certificatesv1.UsageDigitalSignature: x509.KeyUsageDigitalSignature,
		certificatesv1.UsageContentCommitment: x509.KeyUsageContentCommitment, certificatesv1.UsageKeyEncipherment: x509.KeyUsageKeyEncipherment,
		certificatesv1.UsageKeyAgreement: x509.KeyUsageKeyAgreement, certificatesv1.UsageDataEncipherment: x509.KeyUsageDataEncipherment,
		certificatesv1.UsageCertSign: x509.KeyUsageCertSign, certificatesv1.UsageCRLSign: x509.KeyUsageCRLSign,
		certificatesv1.UsageEncipherOnly: x509.KeyUsageEncipherOnly, certificatesv1.UsageDecipherOnly: x509.KeyUsageDecipherOnly,
	}
	extUsages := map[certificatesv1.KeyUsage]x509.ExtKeyUsage{
		certificatesv1.UsageAny: x509.ExtKeyUsageAny, certificatesv1.UsageServerAuth: x509.ExtKeyUsageServerAuth,
		certificatesv1.UsageClientAuth: x509.ExtKeyUsageClientAuth, certificatesv1.UsageCodeSigning: x509.ExtKeyUsageCodeSigning,
		certificatesv1.UsageEmailProtection: x509.ExtKeyUsageEmailProtection, certificatesv1.UsageSMIME: x509.ExtKeyUsageEmailProtection,
		certificatesv1.UsageIPsecEndSystem: x509.ExtKeyUsageIPSECEndSystem, certificatesv1.UsageIPsecTunnel: x509.ExtKeyUsageIPSECTunnel,
		certificatesv1.UsageIPsecUser: x509.ExtKeyUsageIPSECUser, certificatesv1.UsageTimestamping: x509.ExtKeyUsageTimeStamping,
		certificatesv1.UsageOCSPSigning: x509.ExtKeyUsageOCSPSigning, certificatesv1.UsageMicrosoftSGC: x509.ExtKeyUsageMicrosoftServerGatedCrypto,
		certificatesv1.UsageNetscapeSGC: x509.ExtKeyUsageNetscapeServerGatedCrypto,
	}
	var key x509.KeyUsage
	var ext []x509.ExtKeyUsage
	for _, u := range usages {
		if k, ok := keyUsages[u]; ok {
			key |= k
		} else if e, ok := extUsages[u]; ok {
			if !slices.Contains(ext, e) {
				ext = append(ext, e)
			}
		} else {
			return 0, nil, fmt.Errorf("unknown key usage %q", u)
		}
	}
	return key, ext, nil
}
