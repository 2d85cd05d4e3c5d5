package core

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/api/resources"
)

func endpoints() *resources.Resource {
	return resources.Described[corev1.Endpoints, corev1.EndpointsList](&resources.Resource{
		GroupVersionKind: resources.GVK("", "Endpoints"), Plural: "endpoints", Singular: "endpoints", Namespaced: true,
		ShortNames: []string{"ep"}, StorageKey: "services/endpoints", AllowCreateOnUpdate: true,
		Default: resources.Typed(defaultEndpoints), Columns: endpointsColumns, Row: resources.TypedRow(endpointsRow),
	})
}

var endpointsColumns = []metav1.TableColumnDefinition{resources.NameCol, resources.Col("Endpoints", "string", 0, corev1.Endpoints{}.SwaggerDoc()["subsets"]), resources.AgeCol}

func endpointsRow(ep *corev1.Endpoints) []any {
	var list []string
	total := 0
	for _, s := range ep.Subsets {
		for _, a := range s.Addresses {
			if len(s.Ports) == 0 {
				total++
				if len(list) < 3 {
					list = append(list, a.IP)
				}
			}
			for _, p := range s.Ports {
				total++
				if len(list) < 3 {
					list = append(list, fmt.Sprintf("%s:%d", a.IP, p.Port))
				}
			}
		}
	}
	s := strings.Join(list, ",")
	if total > len(list) {
		s += fmt.Sprintf(" + %d more...", total-len(list))
	}
	return []any{ep.Name, resources.OrNone(s), resources.Age(ep.CreationTimestamp)}
}

// defaultEndpoints is Kubernetes' default: a port's protocol is TCP
// unless it says otherwise (the EndpointSlices mirrored from custom
// Endpoints need one).
func defaultEndpoints(ep *corev1.Endpoints) {
	for i := range ep.Subsets {
		for j := range ep.Subsets[i].Ports {
			if ep.Subsets[i].Ports[j].Protocol == "" {
				ep.Subsets[i].Ports[j].Protocol = corev1.ProtocolTCP
			}
		}
	}
}
