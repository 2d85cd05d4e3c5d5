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
	corev1 "k8s.io/api/core/v1"
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

var podCertificateRequests = certificatesv1.Resource("podcertificaterequests")

// admitPodCertificateRequest is what Kubernetes checks of a pod
// certificate request: a node creates one only for a pod running on it,
// with the pod's, its service account's and its own names and UIDs
// (NodeRestriction); a signer's answer through status needs the right to
// sign for the request's signer.
func (s *Server) admitPodCertificateRequest(ctx context.Context, obj, old runtime.Object) error {
	r, ok := obj.(*certificatesv1.PodCertificateRequest)
	if !ok {
		return nil
	}
	u, known := auth.UserFrom(ctx)
	if !known {
		return nil
	}
	if prev, ok := old.(*certificatesv1.PodCertificateRequest); ok {
		if a := admission.AttributesFrom(ctx); a != nil && a.Subresource == "status" && !apiequality.Semantic.DeepEqual(r.Status, prev.Status) &&
			!s.mayForSigner(ctx, u, "sign", prev.Spec.SignerName) {
			return apierrors.NewForbidden(podCertificateRequests, r.Name, fmt.Errorf("user %q is not permitted to \"sign\" for signer %q", u.Name, prev.Spec.SignerName))
		}
		return nil
	}
	if !u.InGroup(auth.GroupNodes) || !strings.HasPrefix(u.Name, auth.NodeUserPrefix) {
		return nil
	}
	node := strings.TrimPrefix(u.Name, auth.NodeUserPrefix)
	forbid := func(format string, args ...any) error {
		return apierrors.NewForbidden(podCertificateRequests, r.Name, fmt.Errorf(format, args...))
	}
	if string(r.Spec.NodeName) != node {
		return forbid("PodCertificateRequest.Spec.NodeName=%q, which is not the requesting node %q", r.Spec.NodeName, node)
	}
	n, err := s.storage("", "nodes").Get(ctx, "", node)
	if err != nil {
		return forbid("while retrieving node %q named in the PodCertificateRequest: %v", node, err)
	}
	if n.(*corev1.Node).UID != r.Spec.NodeUID {
		return apierrors.NewConflict(podCertificateRequests, r.Name, fmt.Errorf("PodCertificateRequest names node UID %q, inconsistent with the running node (%q)", r.Spec.NodeUID, n.(*corev1.Node).UID))
	}
	p, err := s.storage("", "pods").Get(ctx, r.Namespace, r.Spec.PodName)
	if err != nil {
		return forbid("while retrieving pod %q named in the PodCertificateRequest: %v", r.Namespace+"/"+r.Spec.PodName, err)
	}
	pod := p.(*corev1.Pod)
	switch {
	case pod.UID != r.Spec.PodUID:
		return apierrors.NewConflict(podCertificateRequests, r.Name, fmt.Errorf("PodCertificateRequest for pod %q contains pod UID (%q) which differs from running pod %q", r.Namespace+"/"+r.Spec.PodName, r.Spec.PodUID, pod.UID))
	case pod.Spec.NodeName != node:
		return forbid("pod %q is not running on node %q named in the PodCertificateRequest", r.Namespace+"/"+r.Spec.PodName, node)
	case pod.Annotations[corev1.MirrorPodAnnotationKey] != "":
		return forbid("pod %q is a mirror pod", r.Namespace+"/"+r.Spec.PodName)
	case pod.Spec.ServiceAccountName != r.Spec.ServiceAccountName:
		return forbid("PodCertificateRequest for pod %q contains serviceAccountName (%q) that differs from running pod (%q)", r.Namespace+"/"+r.Spec.PodName, r.Spec.ServiceAccountName, pod.Spec.ServiceAccountName)
	}
	sa, err := s.storage("", "serviceaccounts").Get(ctx, r.Namespace, r.Spec.ServiceAccountName)
	if err != nil {
		return forbid("while retrieving service account %q named in the PodCertificateRequest: %v", r.Namespace+"/"+r.Spec.ServiceAccountName, err)
	}
	if sa.(*corev1.ServiceAccount).UID != r.Spec.ServiceAccountUID {
		return apierrors.NewConflict(podCertificateRequests, r.Name, fmt.Errorf("PodCertificateRequest for pod %q names service account UID %q, inconsistent with the service account (%q)", r.Namespace+"/"+r.Spec.PodName, r.Spec.ServiceAccountUID, sa.(*corev1.ServiceAccount).UID))
	}
	return nil
}
