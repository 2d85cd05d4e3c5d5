// Package certificates describes the kinds of the certificates.k8s.io API
// group: CertificateSigningRequests, through which a user or a node asks
// the cluster for a certificate, someone with the right approves it, and a
// signer issues it; ClusterTrustBundles, the CA certificates a signer (or
// anyone) publishes for pods to trust.
package certificates

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/api/resources"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Resources describes the certificates.k8s.io group's kinds.
func Resources() []*resources.Resource {
	return []*resources.Resource{signingRequests(), clusterTrustBundles(), podCertificateRequests()}
}

// The subresources through which a request's status changes: approval
// carries the Approved and Denied conditions (the approver's), status the
// certificate and the other conditions (the signer's).
const (
	Approval = "approval"
	Status   = "status"
)

func signingRequests() *resources.Resource {
	return resources.Described[certificatesv1.CertificateSigningRequest, certificatesv1.CertificateSigningRequestList](&resources.Resource{
		GroupVersionKind: resources.GVK(certificatesv1.GroupName, "CertificateSigningRequest"), Plural: "certificatesigningrequests",
		Singular: "certificatesigningrequest", ShortNames: []string{"csr"}, StorageKey: "certificatesigningrequests",
		Subresources: []resources.Subresource{
			{Name: Status, Serve: resources.ServeStatus, Verbs: metav1.Verbs{"get", "patch", "update"},
				PrepareForUpdate: resources.TypedUpdate(prepareStatusUpdate),
				ValidateUpdate: resources.TypedValidateUpdate(func(csr, old *certificatesv1.CertificateSigningRequest) field.ErrorList {
					return validateUpdate(csr, old, Status)
				})},
			{Name: Approval, Serve: resources.ServeStatus, Verbs: metav1.Verbs{"get", "patch", "update"},
				PrepareForUpdate: resources.TypedUpdate(prepareApprovalUpdate),
				ValidateUpdate: resources.TypedValidateUpdate(func(csr, old *certificatesv1.CertificateSigningRequest) field.ErrorList {
					return validateUpdate(csr, old, Approval)
				})},
		},
		// Writes through status and approval keep their metadata, as
		// Kubernetes' older kinds do.
		StatusMetadata: resources.StatusMetadataAll,
		NameRule:       resources.PathSegmentName,
		// Who asks is the server's to say (admission fills it in from the
		// request's user); a request is never created approved.
		PrepareForCreate: resources.Typed(func(csr *certificatesv1.CertificateSigningRequest) {
			csr.Spec.Username, csr.Spec.UID, csr.Spec.Groups, csr.Spec.Extra = "", "", nil, nil
			csr.Status = certificatesv1.CertificateSigningRequestStatus{}
		}),
		// An update of the request itself changes its metadata only.
		PrepareForUpdate: resources.TypedUpdate(func(csr, old *certificatesv1.CertificateSigningRequest) {
			csr.Spec, csr.Status = old.Spec, old.Status
		}),
		Validate: resources.TypedValidate(func(csr *certificatesv1.CertificateSigningRequest) field.ErrorList { return validate(csr, nil) }),
		ValidateUpdate: resources.TypedValidateUpdate(func(csr, old *certificatesv1.CertificateSigningRequest) field.ErrorList {
			return validateUpdate(csr, old, "")
		}),
		Fields: resources.TypedFields(func(csr *certificatesv1.CertificateSigningRequest) fields.Set {
			return fields.Set{"spec.signerName": csr.Spec.SignerName}
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol, resources.AgeCol,
			resources.Col("SignerName", "string", 0, certificatesv1.CertificateSigningRequestSpec{}.SwaggerDoc()["signerName"]),
			resources.Col("Requestor", "string", 0, "Name of the user who asked for the certificate."),
			resources.Col("RequestedDuration", "string", 0, certificatesv1.CertificateSigningRequestSpec{}.SwaggerDoc()["expirationSeconds"]),
			resources.Col("Condition", "string", 0, certificatesv1.CertificateSigningRequestStatus{}.SwaggerDoc()["conditions"])},
		Row: resources.TypedRow(func(csr *certificatesv1.CertificateSigningRequest) []any {
			duration := "<none>"
			if s := csr.Spec.ExpirationSeconds; s != nil {
				duration = shortDuration(time.Duration(*s) * time.Second)
			}
			return []any{csr.Name, resources.Age(csr.CreationTimestamp), csr.Spec.SignerName, csr.Spec.Username, duration, Condition(csr)}
		}),
	})
}

// Condition is what `kubectl get csr` shows of a request's state:
// Approved, Denied or Failed (several, comma-separated, if it has them),
// with Issued once it has a certificate, or Pending.
func Condition(csr *certificatesv1.CertificateSigningRequest) string {
	var states []string
	for _, c := range csr.Status.Conditions {
		switch c.Type {
		case certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed:
			states = append(states, string(c.Type))
		}
	}
	if len(csr.Status.Certificate) > 0 {
		states = append(states, "Issued")
	}
	if len(states) == 0 {
		return "Pending"
	}
	return strings.Join(states, ",")
}

// shortDuration prints a duration as kubectl's human-readable form does
// for the columns that are durations (10m, 24h, 365d).
func shortDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// prepareStatusUpdate: a write to status keeps the request and the
// Approved and Denied conditions as they were (a change of their number
// is left for validation to refuse), and stamps the conditions' times.
func prepareStatusUpdate(csr, old *certificatesv1.CertificateSigningRequest) {
	csr.Spec = old.Spec
	for _, t := range []certificatesv1.RequestConditionType{certificatesv1.CertificateApproved, certificatesv1.CertificateDenied} {
		oldAt, newAt := conditionIndices(old, t), conditionIndices(csr, t)
		if len(oldAt) != len(newAt) {
			continue
		}
		for i, j := range newAt {
			csr.Status.Conditions[j] = old.Status.Conditions[oldAt[i]]
		}
	}
	stampConditions(csr, old)
}

// prepareApprovalUpdate: a write to approval changes the conditions only.
func prepareApprovalUpdate(csr, old *certificatesv1.CertificateSigningRequest) {
	stampConditions(csr, old)
	conditions := csr.Status.Conditions
	csr.Spec, csr.Status = old.Spec, old.Status
	csr.Status.Conditions = conditions
}

func conditionIndices(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) []int {
	var at []int
	for i, c := range csr.Status.Conditions {
		if c.Type == t {
			at = append(at, i)
		}
	}
	return at
}

// stampConditions sets a condition's update time when it has none, and
// its transition time to that of the same type and status before (now
// if there was none), as Kubernetes does.
func stampConditions(csr, old *certificatesv1.CertificateSigningRequest) {
	now := metav1.Now()
	for i := range csr.Status.Conditions {
		c := &csr.Status.Conditions[i]
		if c.LastUpdateTime.IsZero() {
			c.LastUpdateTime = now
		}
		if !c.LastTransitionTime.IsZero() {
			continue
		}
		c.LastTransitionTime = now
		for _, prev := range old.Status.Conditions {
			if prev.Type == c.Type && prev.Status == c.Status && !prev.LastTransitionTime.IsZero() {
				c.LastTransitionTime = prev.LastTransitionTime
				break
			}
		}
	}
}

// knownUsages are the key usages a request may name.
var knownUsages = []certificatesv1.KeyUsage{
	certificatesv1.UsageSigning, certificatesv1.UsageDigitalSignature, certificatesv1.UsageContentCommitment,
	certificatesv1.UsageKeyEncipherment, certificatesv1.UsageKeyAgreement, certificatesv1.UsageDataEncipherment,
	certificatesv1.UsageCertSign, certificatesv1.UsageCRLSign, certificatesv1.UsageEncipherOnly,
	certificatesv1.UsageDecipherOnly, certificatesv1.UsageAny, certificatesv1.UsageServerAuth,
	certificatesv1.UsageClientAuth, certificatesv1.UsageCodeSigning, certificatesv1.UsageEmailProtection,
	certificatesv1.UsageSMIME, certificatesv1.UsageIPsecEndSystem, certificatesv1.UsageIPsecTunnel,
	certificatesv1.UsageIPsecUser, certificatesv1.UsageTimestamping, certificatesv1.UsageOCSPSigning,
	certificatesv1.UsageMicrosoftSGC, certificatesv1.UsageNetscapeSGC,
}

// ParseRequest reads the PKCS#10 request of spec.request (PEM).
func ParseRequest(pemBytes []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("PEM block type must be CERTIFICATE REQUEST")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, err
	}
	return csr, nil
}

// validate is Kubernetes' validation of a request; old is the stored one
// on an update, whose existing oddities are tolerated as Kubernetes
// tolerates them (data written by older versions).
func validate(csr, old *certificatesv1.CertificateSigningRequest) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if req, err := ParseRequest(csr.Spec.Request); err != nil {
		errs = append(errs, field.Invalid(spec.Child("request"), csr.Spec.Request, err.Error()))
	} else if err := req.CheckSignature(); err != nil {
		errs = append(errs, field.Invalid(spec.Child("request"), csr.Spec.Request, err.Error()))
	}
	if len(csr.Spec.Usages) == 0 {
		errs = append(errs, field.Required(spec.Child("usages"), ""))
	}
	tolerateUnknown := old != nil && slices.ContainsFunc(old.Spec.Usages, func(u certificatesv1.KeyUsage) bool { return !slices.Contains(knownUsages, u) })
	tolerateDuplicates := old != nil && hasDuplicates(old.Spec.Usages)
	seen := map[certificatesv1.KeyUsage]bool{}
	for i, u := range csr.Spec.Usages {
		if !tolerateUnknown && !slices.Contains(knownUsages, u) {
			errs = append(errs, field.NotSupported(spec.Child("usages").Index(i), u, sortedUsages()))
		}
		if !tolerateDuplicates && seen[u] {
			errs = append(errs, field.Duplicate(spec.Child("usages").Index(i), u))
		}
		seen[u] = true
	}
	if csr.Spec.SignerName == LegacyUnknownSigner && (old == nil || old.Spec.SignerName != LegacyUnknownSigner) {
		errs = append(errs, field.Invalid(spec.Child("signerName"), csr.Spec.SignerName, "the legacy signerName is not allowed via this API version"))
	} else {
		errs = append(errs, ValidateSignerName(spec.Child("signerName"), csr.Spec.SignerName)...)
	}
	if s := csr.Spec.ExpirationSeconds; s != nil && *s < 600 {
		errs = append(errs, field.Invalid(spec.Child("expirationSeconds"), *s, "may not specify a duration less than 600 seconds (10 minutes)"))
	}
	errs = append(errs, validateConditions(csr, old)...)
	keepsCertificate := old != nil && (bytes.Equal(csr.Status.Certificate, old.Status.Certificate) || validateCertificate(old.Status.Certificate) != nil)
	if !keepsCertificate {
		if err := validateCertificate(csr.Status.Certificate); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("status", "certificate"), "<certificate data>", err.Error()))
		}
	}
	return errs
}

// LegacyUnknownSigner is the v1beta1 API's default signer, which no
// request may name through v1.
const LegacyUnknownSigner = "kubernetes.io/legacy-unknown"

func sortedUsages() []string {
	out := make([]string, len(knownUsages))
	for i, u := range knownUsages {
		out[i] = string(u)
	}
	slices.Sort(out)
	return out
}

func hasDuplicates(usages []certificatesv1.KeyUsage) bool {
	seen := map[certificatesv1.KeyUsage]bool{}
	for _, u := range usages {
		if seen[u] {
			return true
		}
		seen[u] = true
	}
	return false
}

// validateConditions: a type and a status each, Approved, Denied and
// Failed only True, Approved and Denied not both, no type twice.
func validateConditions(csr, old *certificatesv1.CertificateSigningRequest) field.ErrorList {
	var errs field.ErrorList
	path := field.NewPath("status", "conditions")
	tolerate := func(odd func(*certificatesv1.CertificateSigningRequest) bool) bool { return old != nil && odd(old) }
	bothTolerated := tolerate(func(c *certificatesv1.CertificateSigningRequest) bool {
		return len(conditionIndices(c, certificatesv1.CertificateApproved)) > 0 && len(conditionIndices(c, certificatesv1.CertificateDenied)) > 0
	})
	emptyTolerated := tolerate(func(c *certificatesv1.CertificateSigningRequest) bool { return len(conditionIndices(c, "")) > 0 })
	duplicatesTolerated := tolerate(func(c *certificatesv1.CertificateSigningRequest) bool {
		seen := map[certificatesv1.RequestConditionType]bool{}
		for _, cond := range c.Status.Conditions {
			if seen[cond.Type] {
				return true
			}
			seen[cond.Type] = true
		}
		return false
	})
	seen := map[certificatesv1.RequestConditionType]bool{}
	approved, denied := false, false
	for i, c := range csr.Status.Conditions {
		at := path.Index(i)
		if c.Type == "" && !emptyTolerated {
			errs = append(errs, field.Required(at.Child("type"), ""))
		}
		allowed := []string{string(corev1.ConditionFalse), string(corev1.ConditionTrue), string(corev1.ConditionUnknown)}
		switch c.Type {
		case certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed:
			allowed = []string{string(corev1.ConditionTrue)}
		}
		switch {
		case c.Status == "":
			errs = append(errs, field.Required(at.Child("status"), ""))
		case !slices.Contains(allowed, string(c.Status)):
			errs = append(errs, field.NotSupported(at.Child("status"), c.Status, allowed))
		}
		if !bothTolerated {
			switch c.Type {
			case certificatesv1.CertificateApproved:
				approved = true
				if denied {
					errs = append(errs, field.Invalid(path, c.Type, "Approved and Denied conditions are mutually exclusive"))
				}
			case certificatesv1.CertificateDenied:
				denied = true
				if approved {
					errs = append(errs, field.Invalid(path, c.Type, "Approved and Denied conditions are mutually exclusive"))
				}
			}
		}
		if seen[c.Type] && !duplicatesTolerated {
			errs = append(errs, field.Duplicate(at.Child("type"), c.Type))
		}
		seen[c.Type] = true
	}
	return errs
}

// validateCertificate: one or more CERTIFICATE PEM blocks without
// headers, each holding a certificate; text around them is allowed.
func validateCertificate(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	blocks := 0
	for {
		block, rest := pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return fmt.Errorf("only CERTIFICATE PEM blocks are allowed, found %q", block.Type)
		}
		if len(block.Headers) != 0 {
			return errors.New("no PEM block headers are permitted")
		}
		certs, err := x509.ParseCertificates(block.Bytes)
		if err != nil {
			return err
		}
		if len(certs) == 0 {
			return errors.New("found CERTIFICATE PEM block containing 0 certificates")
		}
		blocks++
		data = rest
	}
	if blocks == 0 {
		return errors.New("must contain at least one CERTIFICATE PEM block")
	}
	return nil
}

// validateUpdate is Kubernetes' validation of an update through the
// request itself (""), its status or its approval: no condition of type
// Approved, Denied or Failed removed; Approved and Denied added or
// changed only through approval; the certificate set only through status,
// and only once.
func validateUpdate(csr, old *certificatesv1.CertificateSigningRequest, subresource string) field.ErrorList {
	errs := validate(csr, old)
	path := field.NewPath("status", "conditions")
	for _, t := range []certificatesv1.RequestConditionType{certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed} {
		before, after := conditionsOf(old, t), conditionsOf(csr, t)
		switch {
		case len(after) < len(before):
			errs = append(errs, field.Forbidden(path, fmt.Sprintf("updates may not remove a condition of type %q", t)))
		case subresource == Approval || t == certificatesv1.CertificateFailed:
		case len(after) > len(before):
			errs = append(errs, field.Forbidden(path, fmt.Sprintf("updates may not add a condition of type %q", t)))
		case !apiequality.Semantic.DeepEqual(before, after):
			errs = append(errs, field.Forbidden(path, fmt.Sprintf("updates may not modify a condition of type %q", t)))
		}
	}
	if !bytes.Equal(csr.Status.Certificate, old.Status.Certificate) {
		if subresource != Status {
			errs = append(errs, field.Forbidden(field.NewPath("status", "certificate"), "updates may not set certificate content"))
		} else if len(old.Status.Certificate) > 0 {
			errs = append(errs, field.Forbidden(field.NewPath("status", "certificate"), "updates may not modify existing certificate content"))
		}
	}
	return errs
}

func conditionsOf(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) []certificatesv1.CertificateSigningRequestCondition {
	var out []certificatesv1.CertificateSigningRequestCondition
	for _, c := range csr.Status.Conditions {
		if c.Type == t {
			out = append(out, c)
		}
	}
	return out
}

// ValidateSignerName checks a signer's name, as Kubernetes does: a signer is named <domain>/<path>, the domain of at
// least two DNS labels, the path of DNS subdomains separated by dots.
func ValidateSignerName(path *field.Path, name string) field.ErrorList {
	if name == "" {
		return field.ErrorList{field.Required(path, "")}
	}
	domain, rest, ok := strings.Cut(name, "/")
	if !ok || strings.Contains(rest, "/") {
		return field.ErrorList{field.Invalid(path, name, "must be a fully qualified domain and path of the form 'example.com/signer-name'")}
	}
	var errs field.ErrorList
	if len(domain) > validation.DNS1123SubdomainMaxLength {
		errs = append(errs, field.TooLong(path, "", validation.DNS1123SubdomainMaxLength))
	}
	labels := strings.Split(domain, ".")
	for _, l := range labels {
		if msgs := validation.IsDNS1123Label(l); len(msgs) > 0 {
			for _, m := range msgs {
				errs = append(errs, field.Invalid(path, domain, fmt.Sprintf("validating label %q: %s", l, m)))
			}
			break
		}
	}
	if len(labels) < 2 {
		errs = append(errs, field.Invalid(path, domain, "should be a domain with at least two segments separated by dots"))
	}
	for _, l := range strings.Split(rest, ".") {
		if msgs := validation.IsDNS1123Subdomain(l); len(msgs) > 0 {
			for _, m := range msgs {
				errs = append(errs, field.Invalid(path, rest, fmt.Sprintf("validating label %q: %s", l, m)))
			}
			break
		}
	}
	if limit := 2*validation.DNS1123SubdomainMaxLength + validation.DNS1123LabelMaxLength + 2; len(name) > limit {
		errs = append(errs, field.TooLong(path, "", limit))
	}
	return errs
}
