package certificates

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/mail"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/api/resources"
	certificatesv1 "k8s.io/api/certificates/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/fields"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Kubernetes' bounds on a pod certificate request.
const (
	// MinMaxExpirationSeconds and the two maxima bound
	// spec.maxExpirationSeconds: an hour to 24 hours for the
	// kubernetes.io signers, to 91 days for the others.
	MinMaxExpirationSeconds           = 60 * 60
	KubernetesMaxMaxExpirationSeconds = 24 * 60 * 60
	MaxMaxExpirationSeconds           = 91 * 24 * 60 * 60
	maxStubPKCS10RequestSize          = 10 * 1024
	maxCertificateChainSize           = 100 * 1024
)

func podCertificateRequests() *resources.Resource {
	return resources.Described[certificatesv1.PodCertificateRequest, certificatesv1.PodCertificateRequestList](&resources.Resource{
		GroupVersionKind: resources.GVK(certificatesv1.GroupName, "PodCertificateRequest"), Plural: "podcertificaterequests",
		Singular: "podcertificaterequest", Namespaced: true, StorageKey: "podcertificaterequests",
		Subresources:   []resources.Subresource{{Name: Status, Serve: resources.ServeStatus, Verbs: metav1.Verbs{"get", "patch", "update"}, ValidateUpdate: resources.TypedValidateUpdate(validatePCRStatusUpdate)}},
		StatusMetadata: resources.StatusMetadataAll,
		PrepareForCreate: resources.Typed(func(r *certificatesv1.PodCertificateRequest) {
			r.Status = certificatesv1.PodCertificateRequestStatus{}
		}),
		PrepareForUpdate: resources.TypedUpdate(func(r, old *certificatesv1.PodCertificateRequest) { r.Status = old.Status }),
		Validate:         resources.TypedValidate(validatePCRSpec),
		ValidateUpdate: resources.TypedValidateUpdate(func(r, old *certificatesv1.PodCertificateRequest) field.ErrorList {
			if !apiequality.Semantic.DeepEqual(r.Spec, old.Spec) {
				return field.ErrorList{field.Invalid(field.NewPath("spec"), "<spec>", "field is immutable")}
			}
			return nil
		}),
		Fields: resources.TypedFields(func(r *certificatesv1.PodCertificateRequest) fields.Set {
			return fields.Set{"spec.signerName": r.Spec.SignerName, "spec.podName": r.Spec.PodName, "spec.nodeName": string(r.Spec.NodeName)}
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("PodName", "string", 0, certificatesv1.PodCertificateRequestSpec{}.SwaggerDoc()["podName"]),
			resources.Col("SignerName", "string", 0, certificatesv1.PodCertificateRequestSpec{}.SwaggerDoc()["signerName"]),
			resources.Col("State", "string", 0, "Issued, Denied, Failed or Pending."), resources.AgeCol},
		Row: resources.TypedRow(func(r *certificatesv1.PodCertificateRequest) []any {
			state := "Pending"
			for _, c := range r.Status.Conditions {
				if c.Status == metav1.ConditionTrue {
					state = c.Type
				}
			}
			return []any{r.Name, r.Spec.PodName, r.Spec.SignerName, state, resources.Age(r.CreationTimestamp)}
		}),
	})
}

// validatePCRSpec is Kubernetes' validation of a new request: the pod,
// its service account and node named and identified, a signer, a
// maxExpirationSeconds in its signer's range, and a stub PKCS#10 request
// (a key of a supported type, signed).
func validatePCRSpec(r *certificatesv1.PodCertificateRequest) field.ErrorList {
	spec := field.NewPath("spec")
	errs := ValidateSignerName(spec.Child("signerName"), r.Spec.SignerName)
	if r.Spec.UnverifiedUserAnnotations != nil {
		errs = append(errs, ValidateUserAnnotations(r.Spec.UnverifiedUserAnnotations, spec.Child("unverifiedUserAnnotations"))...)
	}
	for _, msg := range validation.NameIsDNSSubdomain(r.Spec.PodName, false) {
		errs = append(errs, field.Invalid(spec.Child("podName"), r.Spec.PodName, msg))
	}
	for _, msg := range validation.NameIsDNSSubdomain(r.Spec.ServiceAccountName, false) {
		errs = append(errs, field.Invalid(spec.Child("serviceAccountName"), r.Spec.ServiceAccountName, msg))
	}
	for _, msg := range validation.NameIsDNSSubdomain(string(r.Spec.NodeName), false) {
		errs = append(errs, field.Invalid(spec.Child("nodeName"), r.Spec.NodeName, msg))
	}
	for _, uid := range []struct {
		name  string
		value string
	}{{"podUID", string(r.Spec.PodUID)}, {"serviceAccountUID", string(r.Spec.ServiceAccountUID)}, {"nodeUID", string(r.Spec.NodeUID)}} {
		switch {
		case uid.value == "":
			errs = append(errs, field.Invalid(spec.Child(uid.name), uid.value, "must not be empty"))
		case len(uid.value) > 128:
			errs = append(errs, field.TooLong(spec.Child(uid.name), uid.value, 128))
		}
	}
	max := r.Spec.MaxExpirationSeconds
	if max == nil {
		return append(errs, field.Required(spec.Child("maxExpirationSeconds"), "must be set"))
	}
	upper := int32(MaxMaxExpirationSeconds)
	if IsKubernetesSigner(r.Spec.SignerName) {
		upper = KubernetesMaxMaxExpirationSeconds
	}
	if *max < MinMaxExpirationSeconds || *max > upper {
		errs = append(errs, field.Invalid(spec.Child("maxExpirationSeconds"), *max, fmt.Sprintf("must be in the range [%d, %d]", MinMaxExpirationSeconds, upper)))
	}
	if len(r.Spec.StubPKCS10Request) == 0 {
		errs = append(errs, field.Invalid(spec, "<spec>", "exactly one of (stubPKCS10Request) or (pkixPublicKey, proofOfPossession) must be set"))
	} else {
		errs = append(errs, validateStubRequest(r.Spec.StubPKCS10Request)...)
	}
	return errs
}

// IsKubernetesSigner reports whether the signer is in the kubernetes.io domain (or a
// subdomain of it), whose pod certificates live a day at most.
func IsKubernetesSigner(signer string) bool {
	domain, _, _ := strings.Cut(signer, "/")
	return domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io")
}

// ValidateUserAnnotations checks the annotations a pod passes to its
// certificate's signer: keys and values as object annotations'.
func ValidateUserAnnotations(annotations map[string]string, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for k := range annotations {
		for _, msg := range utilvalidation.IsQualifiedName(strings.ToLower(k)) {
			errs = append(errs, field.Invalid(path, k, msg))
		}
	}
	return append(errs, validation.ValidateAnnotations(annotations, path)...)
}

var stubPath = field.NewPath("spec", "stubPKCS10Request")

// validateStubRequest: a PKCS#10 request of a supported key type,
// correctly signed; its contents are the signer's to judge.
func validateStubRequest(der []byte) field.ErrorList {
	if len(der) > maxStubPKCS10RequestSize {
		return field.ErrorList{field.TooLong(stubPath, "", maxStubPKCS10RequestSize)}
	}
	req, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return field.ErrorList{field.Invalid(stubPath, "<request>", "must be a valid PKCS#10 CSR")}
	}
	if errs := validateKeyType(req.PublicKey, stubPath); len(errs) > 0 {
		return errs
	}
	if err := req.CheckSignature(); err != nil {
		return field.ErrorList{field.Invalid(stubPath, "<request>", "invalid signature")}
	}
	return nil
}

func validateKeyType(key crypto.PublicKey, path *field.Path) field.ErrorList {
	switch pub := key.(type) {
	case ed25519.PublicKey:
	case *ecdsa.PublicKey:
		if pub.Curve != elliptic.P256() && pub.Curve != elliptic.P384() && pub.Curve != elliptic.P521() {
			return field.ErrorList{field.Invalid(path, "curve "+pub.Curve.Params().Name, "elliptic public keys must use curve P256, P384, or P521")}
		}
	case *rsa.PublicKey:
		if bits := pub.Size() * 8; bits != 3072 && bits != 4096 {
			return field.ErrorList{field.Invalid(path, fmt.Sprintf("%d-bit modulus", bits), "RSA keys must have modulus size 3072 or 4096")}
		}
	default:
		return field.ErrorList{field.Invalid(path, "<key>", "unknown public key type; supported types are Ed25519, ECDSA, and RSA")}
	}
	return nil
}

// The condition types a pod certificate request ends with.
const (
	pcrIssued = certificatesv1.PodCertificateRequestConditionTypeIssued
	pcrDenied = certificatesv1.PodCertificateRequestConditionTypeDenied
	pcrFailed = certificatesv1.PodCertificateRequestConditionTypeFailed
)

func pcrHas(r *certificatesv1.PodCertificateRequest, t string) bool {
	for _, c := range r.Status.Conditions {
		if c.Type == t && c.Status == metav1.ConditionTrue {
			return true
		}
	}
	return false
}

// validatePCRStatusUpdate is Kubernetes' validation of a signer's answer:
// one final condition (Issued, Denied or Failed), nothing after it; a
// denial or failure only that; an issued chain whose leaf is for the
// requested key, with notBefore/notAfter as in the certificate (notBefore
// within 5 minutes of now), a lifetime from an hour to
// maxExpirationSeconds, and beginRefreshAt at least 10 minutes inside it.
func validatePCRStatusUpdate(r, old *certificatesv1.PodCertificateRequest) field.ErrorList {
	status := field.NewPath("status")
	conds := status.Child("conditions")
	var errs field.ErrorList
	final := 0
	for i, c := range r.Status.Conditions {
		switch c.Type {
		case pcrIssued, pcrDenied, pcrFailed:
			final++
			if final > 1 {
				errs = append(errs, field.Invalid(conds.Index(i).Child("type"), c.Type, `There may be at most one condition with type "Issued", "Denied", or "Failed"`))
			}
			if c.Status != metav1.ConditionTrue {
				errs = append(errs, field.NotSupported(conds.Index(i).Child("status"), c.Status, []string{string(metav1.ConditionTrue)}))
			}
		default:
			errs = append(errs, field.NotSupported(conds.Index(i).Child("type"), c.Type, []string{pcrIssued, pcrDenied, pcrFailed}))
		}
	}
	errs = append(errs, metav1validation.ValidateConditions(r.Status.Conditions, conds)...)
	if len(errs) > 0 {
		return errs
	}
	unchanged := func(detail string) field.ErrorList {
		if apiequality.Semantic.DeepEqual(r.Status, old.Status) {
			return nil
		}
		return field.ErrorList{field.Invalid(status, "<status>", detail)}
	}
	if pcrHas(old, pcrIssued) || pcrHas(old, pcrDenied) || pcrHas(old, pcrFailed) {
		return unchanged("immutable after PodCertificateRequest is issued, denied, or failed")
	}
	if pcrHas(r, pcrDenied) || pcrHas(r, pcrFailed) {
		if !apiequality.Semantic.DeepEqual(r.Status, certificatesv1.PodCertificateRequestStatus{Conditions: r.Status.Conditions}) {
			return field.ErrorList{field.Invalid(status, "<status>", "non-condition status fields must be empty when denying or failing the PodCertificateRequest")}
		}
		return nil
	}
	if !pcrHas(r, pcrIssued) {
		return unchanged(`status is immutable unless transitioning to "Issued", "Denied", or "Failed"`)
	}
	return validateIssued(r, old)
}

func validateIssued(r, old *certificatesv1.PodCertificateRequest) field.ErrorList {
	chainPath := field.NewPath("status", "certificateChain")
	notBeforePath, notAfterPath, refreshPath := field.NewPath("status", "notBefore"), field.NewPath("status", "notAfter"), field.NewPath("status", "beginRefreshAt")
	invalid := func(p *field.Path, v any, msg string) field.ErrorList {
		return field.ErrorList{field.Invalid(p, v, msg)}
	}
	chain := r.Status.CertificateChain
	if len(chain) > maxCertificateChainSize {
		return field.ErrorList{field.TooLong(chainPath, "", maxCertificateChainSize)}
	}
	leafBlock, rest := pem.Decode([]byte(chain))
	if leafBlock == nil {
		return invalid(chainPath, "<chain>", "issued certificate chain must contain at least one certificate")
	}
	if leafBlock.Type != "CERTIFICATE" {
		return invalid(chainPath, "<chain>", "issued certificate chain must consist entirely of CERTIFICATE PEM blocks")
	}
	leaf, err := x509.ParseCertificate(leafBlock.Bytes)
	if err != nil {
		return invalid(chainPath, "<chain>", "leaf certificate does not parse as valid X.509")
	}
	var errs field.ErrorList
	for _, name := range leaf.DNSNames {
		switch {
		case name == "":
			errs = append(errs, field.Invalid(chainPath, name, "leaf certificate should not contain empty DNSName"))
		case strings.Contains(name, ".."):
			errs = append(errs, field.Invalid(chainPath, name, "leaf certificate's DNSName should not contain '..'"))
		case strings.HasPrefix(name, ".") || strings.HasSuffix(name, "."):
			errs = append(errs, field.Invalid(chainPath, name, "leaf certificate's DNSName should not start or end with '.'"))
		}
	}
	for _, addr := range leaf.EmailAddresses {
		if _, err := mail.ParseAddress(addr); err != nil {
			errs = append(errs, field.Invalid(chainPath, addr, "leaf certificate should not contain invalid EmailAddress"))
		}
	}
	req, err := x509.ParseCertificateRequest(old.Spec.StubPKCS10Request)
	if err != nil {
		return append(errs, field.Invalid(stubPath, "<request>", "must be a valid PKCS#10 CSR"))
	}
	want := req.PublicKey
	if k, ok := want.(interface{ Equal(crypto.PublicKey) bool }); !ok || !k.Equal(leaf.PublicKey) {
		return append(errs, field.Invalid(chainPath, "<chain>", "leaf certificate was not issued to the requested public key"))
	}
	st := r.Status
	if st.NotBefore == nil {
		errs = append(errs, field.Required(notBeforePath, "must be present and consistent with the issued certificate"))
	}
	if st.NotAfter == nil {
		errs = append(errs, field.Required(notAfterPath, "must be present and consistent with the issued certificate"))
	}
	if st.BeginRefreshAt == nil {
		errs = append(errs, field.Required(refreshPath, "must be present and in the range [notbefore+10min, notafter-10min]"))
	}
	if len(errs) > 0 {
		return errs
	}
	now := time.Now()
	notBefore, notAfter, refresh := st.NotBefore.Time, st.NotAfter.Time, st.BeginRefreshAt.Time
	switch lifetime := leaf.NotAfter.Sub(leaf.NotBefore); {
	case !st.NotBefore.Time.Equal(leaf.NotBefore):
		return invalid(notBeforePath, st.NotBefore.Time, "must be set to the NotBefore time encoded in the leaf certificate")
	case notBefore.Before(now.Add(-5*time.Minute)) || notBefore.After(now.Add(5*time.Minute)):
		return invalid(notBeforePath, st.NotBefore.Time, "must be set to within 5 minutes of kube-apiserver's current time")
	case !st.NotAfter.Time.Equal(leaf.NotAfter):
		return invalid(notAfterPath, st.NotAfter.Time, "must be set to the NotAfter time encoded in the leaf certificate")
	case lifetime < time.Hour:
		return invalid(chainPath, lifetime, "leaf certificate lifetime must be >= 1 hour")
	case lifetime > time.Duration(*r.Spec.MaxExpirationSeconds)*time.Second:
		return invalid(chainPath, lifetime, fmt.Sprintf("leaf certificate lifetime must be <= spec.maxExpirationSeconds (%v)", *r.Spec.MaxExpirationSeconds))
	case refresh.Before(notBefore.Add(10 * time.Minute)):
		return invalid(refreshPath, st.BeginRefreshAt.Time, "must be at least 10 minutes after status.notBefore")
	case refresh.After(notAfter.Add(-10 * time.Minute)):
		return invalid(refreshPath, st.BeginRefreshAt.Time, "must be at least 10 minutes before status.notAfter")
	}
	for {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return invalid(chainPath, "<chain>", "issued certificate chain must consist entirely of CERTFICATE PEM blocks")
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return invalid(chainPath, "<chain>", "intermediate certificate does not parse as valid X.509")
		}
	}
	return nil
}
