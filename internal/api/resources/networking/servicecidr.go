// Package networking describes the kinds of the networking.k8s.io API
// group: Ingresses and their IngressClasses, NetworkPolicies, the ServiceCIDRs Services
// take their cluster IPs from and the IPAddress objects that record them.
package networking

import (
	"net/netip"
	"strings"

	"github.com/orch-dev/orch/internal/api/resources"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Resources describes the networking.k8s.io group's kinds.
func Resources() []*resources.Resource {
	return []*resources.Resource{ingresses(), ingressClasses(), networkPolicies(), serviceCIDRs(), ipAddresses()}
}

func serviceCIDRs() *resources.Resource {
	return resources.Described[networkingv1.ServiceCIDR, networkingv1.ServiceCIDRList](&resources.Resource{
		GroupVersionKind: resources.GVK("networking.k8s.io", "ServiceCIDR"), Plural: "servicecidrs", Singular: "servicecidr",
		StorageKey: "servicecidrs", HasSpec: true, Subresources: []resources.Subresource{resources.Status()},
		PrepareForCreate: resources.Typed(func(c *networkingv1.ServiceCIDR) { c.Status = networkingv1.ServiceCIDRStatus{} }),
		Validate:         resources.TypedValidate(validateServiceCIDR),
		ValidateUpdate: resources.TypedValidateUpdate(func(c, old *networkingv1.ServiceCIDR) field.ErrorList {
			// A single-stack range may gain a range of the other family.
			if len(old.Spec.CIDRs) == 1 && len(c.Spec.CIDRs) == 2 && old.Spec.CIDRs[0] == c.Spec.CIDRs[0] {
				return nil
			}
			return resources.Immutable(c.Spec.CIDRs, old.Spec.CIDRs, resources.SpecPath.Child("cidrs"))
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("CIDRs", "string", 0, networkingv1.ServiceCIDRSpec{}.SwaggerDoc()["cidrs"]), resources.AgeCol},
		Row: resources.TypedRow(func(c *networkingv1.ServiceCIDR) []any {
			return []any{c.Name, strings.Join(c.Spec.CIDRs, ","), resources.Age(c.CreationTimestamp)}
		}),
	})
}

// validateServiceCIDR: one range, or one of each family, each a canonical
// prefix.
func validateServiceCIDR(c *networkingv1.ServiceCIDR) field.ErrorList {
	path := resources.SpecPath.Child("cidrs")
	var errs field.ErrorList
	if len(c.Spec.CIDRs) == 0 || len(c.Spec.CIDRs) > 2 {
		return append(errs, field.Invalid(path, c.Spec.CIDRs, "at least one and at most two cidrs are allowed"))
	}
	var families []bool
	for i, s := range c.Spec.CIDRs {
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(path.Index(i), s, "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"))
			continue
		case p.Masked() != p || p.String() != s:
			errs = append(errs, field.Invalid(path.Index(i), s, "must be in canonical form \""+p.Masked().String()+"\""))
		}
		families = append(families, p.Addr().Is4())
	}
	if len(families) == 2 && families[0] == families[1] {
		errs = append(errs, field.Invalid(path, c.Spec.CIDRs, "may specify no more than one IP for each IP family, i.e 192.168.0.0/24 and 2001:db8::/64"))
	}
	return errs
}

func ipAddresses() *resources.Resource {
	return resources.Described[networkingv1.IPAddress, networkingv1.IPAddressList](&resources.Resource{
		GroupVersionKind: resources.GVK("networking.k8s.io", "IPAddress"), Plural: "ipaddresses", Singular: "ipaddress", ShortNames: []string{"ip"},
		StorageKey: "ipaddresses", HasSpec: true, NameRule: ipAddressName, Validate: resources.TypedValidate(validateIPAddress),
		ValidateUpdate: resources.TypedValidateUpdate(func(ip, old *networkingv1.IPAddress) field.ErrorList {
			return resources.Immutable(ip.Spec.ParentRef, old.Spec.ParentRef, resources.SpecPath.Child("parentRef"))
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("ParentRef", "string", 0, networkingv1.IPAddressSpec{}.SwaggerDoc()["parentRef"]), resources.AgeCol},
		Row: resources.TypedRow(func(ip *networkingv1.IPAddress) []any {
			ref := ""
			if r := ip.Spec.ParentRef; r != nil {
				ref = r.Resource + "/" + r.Namespace + "/" + r.Name
			}
			return []any{ip.Name, ref, resources.Age(ip.CreationTimestamp)}
		}),
	})
}

// ipAddressName: an IPAddress is named by its address, in canonical form
// (so that one address has one name); none is generated.
func ipAddressName(name string, prefix bool) []string {
	if a, err := netip.ParseAddr(name); prefix || err != nil || a.String() != name || a.Zone() != "" {
		return []string{"must be a canonical format IP address"}
	}
	return nil
}

// validateIPAddress: it names what holds the address.
func validateIPAddress(ip *networkingv1.IPAddress) field.ErrorList {
	var errs field.ErrorList
	ref := ip.Spec.ParentRef
	path := resources.SpecPath.Child("parentRef")
	if ref == nil {
		return append(errs, field.Required(path, ""))
	}
	if ref.Resource == "" {
		errs = append(errs, field.Required(path.Child("resource"), ""))
	}
	if ref.Name == "" {
		errs = append(errs, field.Required(path.Child("name"), ""))
	}
	return errs
}
