// Package discovery describes the kinds of the discovery.k8s.io API group.
package discovery

import (
	"fmt"
	"strconv"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/api/resources"
	"k8s.io/apimachinery/pkg/util/validation/field"
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

func validateEndpointSlice(s *discoveryv1.EndpointSlice) field.ErrorList {
	switch s.AddressType {
	case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN:
		return nil
	case "":
		return field.ErrorList{field.Required(field.NewPath("addressType"), "")}
	}
	return field.ErrorList{field.NotSupported(field.NewPath("addressType"), s.AddressType,
		[]string{string(discoveryv1.AddressTypeFQDN), string(discoveryv1.AddressTypeIPv4), string(discoveryv1.AddressTypeIPv6)})}
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
