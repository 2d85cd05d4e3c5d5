package api

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/api/admission"
	"github.com/orch-dev/orch/internal/api/auth"
	"github.com/orch-dev/orch/internal/api/resources/certificates"
	certificatesv1 "k8s.io/api/certificates/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
)

var signingRequests = certificatesv1.Resource("certificatesigningrequests")

// admitSigningRequest is what Kubernetes' admission does with a
// CertificateSigningRequest: on create, the request's requester is the
// user who sent it (spec.username, uid, groups, extra: never what the body
// says), a client certificate of the kube-apiserver-client signer may not
// name system:masters (CertificateSubjectRestriction), and a node may ask
// a node certificate only for itself (NodeRestriction); through approval,
// the user must be allowed to approve for the request's signer
// (CertificateApproval); through status, a change of the certificate or
// the conditions needs the right to sign for it (CertificateSigning).
func (s *Server) admitSigningRequest(ctx context.Context, obj, old runtime.Object) error {
	csr, ok := obj.(*certificatesv1.CertificateSigningRequest)
	if !ok {
		return nil
	}
	u, known := auth.UserFrom(ctx)
	if old == nil {
		if known {
			csr.Spec.Username, csr.Spec.UID, csr.Spec.Groups = u.Name, u.UID, slices.Clone(u.Groups)
			csr.Spec.Extra = nil
			for k, v := range u.Extra {
				if csr.Spec.Extra == nil {
					csr.Spec.Extra = map[string]certificatesv1.ExtraValue{}
				}
				csr.Spec.Extra[k] = slices.Clone(v)
			}
		}
		return admitRequestSubject(csr, u, known)
	}
	prev := old.(*certificatesv1.CertificateSigningRequest)
	a := admission.AttributesFrom(ctx)
	if !known || a == nil {
		return nil // the server's own writes
	}
	switch a.Subresource {
	case certificates.Approval:
		if !s.mayForSigner(ctx, u, "approve", prev.Spec.SignerName) {
			return apierrors.NewForbidden(signingRequests, csr.Name, fmt.Errorf("user not permitted to approve requests with signerName %q", prev.Spec.SignerName))
		}
	case certificates.Status:
		if apiequality.Semantic.DeepEqual(csr.Status.Certificate, prev.Status.Certificate) && apiequality.Semantic.DeepEqual(csr.Status.Conditions, prev.Status.Conditions) {
			return nil
		}
		if !s.mayForSigner(ctx, u, "sign", prev.Spec.SignerName) {
			return apierrors.NewForbidden(signingRequests, csr.Name, fmt.Errorf("user not permitted to sign requests with signerName %q", prev.Spec.SignerName))
		}
	}
	return nil
}

// admitRequestSubject refuses what no one may ask for: a client
// certificate in the group system:masters (which no authorizer could
// take back), and a node's certificate for another node.
func admitRequestSubject(csr *certificatesv1.CertificateSigningRequest, u auth.User, known bool) error {
	signer := csr.Spec.SignerName
	isNode := known && u.InGroup(auth.GroupNodes) && strings.HasPrefix(u.Name, auth.NodeUserPrefix)
	nodeSigner := signer == certificatesv1.KubeletServingSignerName || signer == certificatesv1.KubeAPIServerClientKubeletSignerName
	if signer != certificatesv1.KubeAPIServerClientSignerName && (!isNode || !nodeSigner) {
		return nil
	}
	req, err := certificates.ParseRequest(csr.Spec.Request)
	if err != nil {
		return apierrors.NewForbidden(signingRequests, csr.Name, fmt.Errorf("failed to parse CSR: %w", err))
	}
	if signer == certificatesv1.KubeAPIServerClientSignerName {
		if slices.Contains(req.Subject.Organization, auth.GroupMasters) {
			return apierrors.NewForbidden(signingRequests, csr.Name, fmt.Errorf("use of %s signer with %s group is not allowed", signer, auth.GroupMasters))
		}
		return nil
	}
	if req.Subject.CommonName != u.Name {
		return apierrors.NewForbidden(signingRequests, csr.Name, fmt.Errorf("can only create a node CSR with CN=%s", u.Name))
	}
	return nil
}

// mayForSigner: u may verb (approve, sign) for the signer, by its name or
// by its domain's wildcard (kubernetes.io/*), as Kubernetes asks.
func (s *Server) mayForSigner(ctx context.Context, u auth.User, verb, signer string) bool {
	domain, _, _ := strings.Cut(signer, "/")
	for _, name := range []string{signer, domain + "/*"} {
		if s.authz.Authorize(ctx, u, auth.Attributes{Verb: verb, Group: certificatesv1.GroupName, Resource: "signers", Name: name, IsResource: true}) == nil {
			return true
		}
	}
	return false
}

// SignCertificate issues the certificate of an approved
// CertificateSigningRequest with the cluster CA (the certificate loop's
// signer): the one that signs every client certificate the API server
// trusts, so a user's certificate from kubernetes.io/kube-apiserver-client
// authenticates as its subject's CN and O.
func (s *Server) SignCertificate(req *x509.CertificateRequest, ttl time.Duration, keyUsage x509.KeyUsage, extKeyUsage []x509.ExtKeyUsage) ([]byte, error) {
	return s.ca().SignRequest(req, ttl, keyUsage, extKeyUsage)
}

var trustBundles = certificatesv1.Resource("clustertrustbundles")

// admitTrustBundle is Kubernetes' ClusterTrustBundleAttest: a bundle
// linked to a signer may be written only by who may attest for it (the
// verb attest on signers, by name or domain wildcard), unless the write
// changes nothing but what the garbage collector sets.
func (s *Server) admitTrustBundle(ctx context.Context, obj, old runtime.Object) error {
	b, ok := obj.(*certificatesv1.ClusterTrustBundle)
	if !ok || b.Spec.SignerName == "" {
		return nil
	}
	u, known := auth.UserFrom(ctx)
	if !known {
		return nil // the server's own writes
	}
	if prev, ok := old.(*certificatesv1.ClusterTrustBundle); ok && onlyCollectorFields(b, prev) {
		return nil
	}
	if !s.mayForSigner(ctx, u, "attest", b.Spec.SignerName) {
		return apierrors.NewForbidden(trustBundles, b.Name, fmt.Errorf("user not permitted to attest for signerName %q", b.Spec.SignerName))
	}
	return nil
}

// onlyCollectorFields: the update changes nothing but owner references
// and finalizers.
func onlyCollectorFields(b, old *certificatesv1.ClusterTrustBundle) bool {
	a, p := b.DeepCopy(), old.DeepCopy()
	for _, x := range []*certificatesv1.ClusterTrustBundle{a, p} {
		x.OwnerReferences, x.Finalizers, x.ResourceVersion, x.ManagedFields = nil, nil, "", nil
	}
	return apiequality.Semantic.DeepEqual(a, p)
}
