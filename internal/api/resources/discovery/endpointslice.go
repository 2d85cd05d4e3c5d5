// Package discovery describes the kinds of the discovery.k8s.io API group.
package discovery

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// Resources describes the discovery.k8s.io group's kinds.
func Resources() []*resources.Resource { return []*resources.Resource{endpointSlices()} }

func endpointSlices() *resources.Resource {
	return resources.Described[discoveryv1.EndpointSlice, discoveryv1.EndpointSliceList](&resources.Resource{
		GroupVersionKind: resources.GVK("discovery.k8s.io", "EndpointSlice"), Plural: "endpointslices", Singular: "endpointslice",
		Namespaced: true, StorageKey: "endpointslices", Validate: resources.TypedValidate(validateEndpointSlice),
		ValidateUpdate: resources.TypedValidateUpdate(func(s, old *discoveryv1.EndpointSlice) field.ErrorList {
			return resources.Immutable(s.AddressType, old.AddressType, field.NewPath("addressType"))
		}),
		Columns: endpointSliceColumns, Row: resources.TypedRow(endpointSliceRow),
	})
}

// The bounds Kubernetes sets on an EndpointSlice.
const (
	maxEndpoints = 1000
	maxAddresses = 100
	maxPorts     = 100
)

// validateEndpointSlice checks a slice as Kubernetes does: every address
// of its type (an IP, and not an unspecified, loopback or link-local
// one, which a Service must never send traffic to), host names and port
// names DNS labels, protocols known, and the counts bounded. Each node's
// service proxy writes these addresses into its iptables rules.
func validateEndpointSlice(s *discoveryv1.EndpointSlice) field.ErrorList {
	var errs field.ErrorList
	switch s.AddressType {
	case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN:
	case "":
		return field.ErrorList{field.Required(field.NewPath("addressType"), "")}
	default:
		return field.ErrorList{field.NotSupported(field.NewPath("addressType"), s.AddressType,
			[]string{string(discoveryv1.AddressTypeFQDN), string(discoveryv1.AddressTypeIPv4), string(discoveryv1.AddressTypeIPv6)})}
	}
	endpoints := field.NewPath("endpoints")
	if len(s.Endpoints) > maxEndpoints {
		return append(errs, field.TooMany(endpoints, len(s.Endpoints), maxEndpoints))
	}
	for i, e := range s.Endpoints {
		addresses := endpoints.Index(i).Child("addresses")
		switch {
		case len(e.Addresses) == 0:
			errs = append(errs, field.Required(addresses, "must contain at least 1 address"))
		case len(e.Addresses) > maxAddresses:
			errs = append(errs, field.TooMany(addresses, len(e.Addresses), maxAddresses))
		}
		for j, a := range e.Addresses {
			errs = append(errs, validateAddress(s.AddressType, a, addresses.Index(j))...)
		}
		if e.Hostname != nil {
			for _, msg := range validation.IsDNS1123Label(*e.Hostname) {
				errs = append(errs, field.Invalid(endpoints.Index(i).Child("hostname"), *e.Hostname, msg))
			}
		}
	}
	ports := field.NewPath("ports")
	if len(s.Ports) > maxPorts {
		return append(errs, field.TooMany(ports, len(s.Ports), maxPorts))
	}
	names := map[string]bool{}
	for i, p := range s.Ports {
		name := ptr.Deref(p.Name, "")
		if name != "" {
			for _, msg := range validation.IsDNS1123Label(name) {
				errs = append(errs, field.Invalid(ports.Index(i).Child("name"), name, msg))
			}
		}
		if names[name] {
			errs = append(errs, field.Duplicate(ports.Index(i).Child("name"), name))
		}
		names[name] = true
		switch {
		case p.Protocol == nil:
			errs = append(errs, field.Required(ports.Index(i).Child("protocol"), ""))
		case *p.Protocol != corev1.ProtocolTCP && *p.Protocol != corev1.ProtocolUDP && *p.Protocol != corev1.ProtocolSCTP:
			errs = append(errs, field.NotSupported(ports.Index(i).Child("protocol"), *p.Protocol, []string{string(corev1.ProtocolSCTP), string(corev1.ProtocolTCP), string(corev1.ProtocolUDP)}))
		}
		if p.Port != nil {
			for _, msg := range validation.IsInRange(int(*p.Port), 0, 65535) {
				errs = append(errs, field.Invalid(ports.Index(i).Child("port"), *p.Port, msg))
			}
		}
		if p.AppProtocol != nil {
			for _, msg := range content.IsLabelKey(*p.AppProtocol) {
				errs = append(errs, field.Invalid(ports.Index(i).Child("appProtocol"), *p.AppProtocol, msg))
			}
		}
	}
	return errs
}

// validateAddress checks one endpoint address against the slice's type.
func validateAddress(typ discoveryv1.AddressType, a string, path *field.Path) field.ErrorList {
	if typ == discoveryv1.AddressTypeFQDN {
		return validation.IsFullyQualifiedDomainName(path, a)
	}
	if errs := validation.IsValidIP(path, a); len(errs) > 0 {
		return errs
	}
	ip := netip.MustParseAddr(a)
	switch {
	case typ == discoveryv1.AddressTypeIPv4 && !ip.Is4():
		return field.ErrorList{field.Invalid(path, a, "must be an IPv4 address")}
	case typ == discoveryv1.AddressTypeIPv6 && !ip.Is6():
		return field.ErrorList{field.Invalid(path, a, "must be an IPv6 address")}
	case ip.IsUnspecified():
		return field.ErrorList{field.Invalid(path, a, "may not be unspecified (0.0.0.0)")}
	case ip.IsLoopback():
		return field.ErrorList{field.Invalid(path, a, "may not be in the loopback range (127.0.0.0/8, ::1/128)")}
	case ip.IsLinkLocalUnicast():
		return field.ErrorList{field.Invalid(path, a, "may not be in the link-local range (169.254.0.0/16, fe80::/10)")}
	case ip.IsLinkLocalMulticast():
		return field.ErrorList{field.Invalid(path, a, "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)")}
	}
	return nil
}

var endpointSliceColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("AddressType", "string", 0, discoveryv1.EndpointSlice{}.SwaggerDoc()["addressType"]),
	resources.Col("Ports", "string", 0, discoveryv1.EndpointSlice{}.SwaggerDoc()["ports"]),
	resources.Col("Endpoints", "string", 0, discoveryv1.EndpointSlice{}.SwaggerDoc()["endpoints"]),
	resources.AgeCol,
}

func endpointSliceRow(s *discoveryv1.EndpointSlice) []any {
	var ports []string
	for _, p := range s.Ports {
		if p.Port != nil {
			ports = append(ports, strconv.Itoa(int(*p.Port)))
		}
	}
	var addrs []string
	total := 0
	for _, e := range s.Endpoints {
		for _, a := range e.Addresses {
			total++
			if len(addrs) < 3 {
				addrs = append(addrs, a)
			}
		}
	}
	eps := strings.Join(addrs, ",")
	if total > len(addrs) {
		eps += fmt.Sprintf(" + %d more...", total-len(addrs))
	}
	portStr := strings.Join(ports, ",")
	if len(s.Ports) == 0 {
		portStr = "<unset>"
	}
	return []any{s.Name, string(s.AddressType), portStr, resources.OrNone(eps), resources.Age(s.CreationTimestamp)}
}
