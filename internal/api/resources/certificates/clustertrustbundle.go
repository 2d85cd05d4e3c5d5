package certificates

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"

	"github.com/orch-dev/orch/internal/api/resources"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// maxTrustBundleSize is Kubernetes' limit on a bundle's PEM.
const maxTrustBundleSize = 1 << 20

func clusterTrustBundles() *resources.Resource {
	return resources.Described[certificatesv1.ClusterTrustBundle, certificatesv1.ClusterTrustBundleList](&resources.Resource{
		GroupVersionKind: resources.GVK(certificatesv1.GroupName, "ClusterTrustBundle"), Plural: "clustertrustbundles",
		Singular: "clustertrustbundle", StorageKey: "clustertrustbundles",
		// The name rule depends on spec.signerName: checked in Validate.
		NameRule: func(string, bool) []string { return nil },
		Validate: resources.TypedValidate(func(b *certificatesv1.ClusterTrustBundle) field.ErrorList { return validateTrustBundle(b, true) }),
		ValidateUpdate: resources.TypedValidateUpdate(func(b, old *certificatesv1.ClusterTrustBundle) field.ErrorList {
			// Validate parsed the bundle already when it changed.
			return resources.Immutable(b.Spec.SignerName, old.Spec.SignerName, field.NewPath("spec", "signerName"))
		}),
		Fields: resources.TypedFields(func(b *certificatesv1.ClusterTrustBundle) fields.Set {
			return fields.Set{"spec.signerName": b.Spec.SignerName}
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("SignerName", "string", 0, certificatesv1.ClusterTrustBundleSpec{}.SwaggerDoc()["signerName"]), resources.AgeCol},
		Row: resources.TypedRow(func(b *certificatesv1.ClusterTrustBundle) []any {
			return []any{b.Name, resources.OrNone(b.Spec.SignerName), resources.Age(b.CreationTimestamp)}
		}),
	})
}

// validateTrustBundle is Kubernetes' validation of a bundle: a name with
// its signer's prefix (<domain>:<path>:) when linked to a signer, none
// with ":" otherwise; a valid signer name; and a trust bundle of CA
// certificates only, each once, at least one.
func validateTrustBundle(b *certificatesv1.ClusterTrustBundle, parse bool) field.ErrorList {
	var errs field.ErrorList
	name := field.NewPath("metadata", "name")
	if b.Spec.SignerName == "" {
		if strings.Contains(b.Name, ":") {
			errs = append(errs, field.Invalid(name, b.Name, "ClusterTrustBundle without signer name must not have \":\" in its name"))
		} else {
			for _, msg := range validation.NameIsDNSSubdomain(b.Name, false) {
				errs = append(errs, field.Invalid(name, b.Name, msg))
			}
		}
	} else {
		errs = append(errs, ValidateSignerName(field.NewPath("spec", "signerName"), b.Spec.SignerName)...)
		prefix := strings.ReplaceAll(b.Spec.SignerName, "/", ":") + ":"
		if !strings.HasPrefix(b.Name, prefix) {
			errs = append(errs, field.Invalid(name, b.Name, fmt.Sprintf("ClusterTrustBundle for signerName %s must be named with prefix %s", b.Spec.SignerName, prefix)))
		} else {
			for _, msg := range validation.NameIsDNSSubdomain(strings.TrimPrefix(b.Name, prefix), false) {
				errs = append(errs, field.Invalid(name, b.Name, msg))
			}
		}
	}
	if parse {
		errs = append(errs, validateBundlePEM(field.NewPath("spec", "trustBundle"), b.Spec.TrustBundle)...)
	}
	return errs
}

func validateBundlePEM(path *field.Path, in string) field.ErrorList {
	if len(in) > maxTrustBundleSize {
		return field.ErrorList{field.TooLong(path, "", maxTrustBundleSize)}
	}
	var errs field.ErrorList
	seen := map[string][]int{}
	var order []string
	rest := []byte(in)
	for i := 0; ; i++ {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		bad := func(why string) {
			errs = append(errs, field.Invalid(path, "<value omitted>", fmt.Sprintf("entry %d %s", i, why)))
		}
		if b.Type != "CERTIFICATE" {
			bad("has bad block type: " + b.Type)
			continue
		}
		if len(b.Headers) != 0 {
			bad("has PEM block headers")
			continue
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		switch {
		case err != nil:
			bad("does not parse as X.509")
			continue
		case !cert.IsCA:
			bad("does not have the CA bit set")
			continue
		case !cert.BasicConstraintsValid:
			bad("has invalid basic constraints")
			continue
		}
		if _, ok := seen[string(b.Bytes)]; !ok {
			order = append(order, string(b.Bytes))
		}
		seen[string(b.Bytes)] = append(seen[string(b.Bytes)], i)
	}
	if len(errs) > 0 {
		return errs
	}
	if len(seen) == 0 {
		return field.ErrorList{field.Invalid(path, "<value omitted>", "at least one trust anchor must be provided")}
	}
	for _, k := range order {
		if at := seen[k]; len(at) > 1 {
			errs = append(errs, field.Invalid(path, "<value omitted>", fmt.Sprintf("duplicate trust anchor (indices %v)", at)))
		}
	}
	return errs
}
