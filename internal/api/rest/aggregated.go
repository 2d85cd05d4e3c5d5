package rest

import (
	"encoding/json"
	"mime"
	"net/http"
	"slices"
	"strings"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeversion "k8s.io/apimachinery/pkg/version"
)

// aggregatedType is the media type of aggregated discovery (Kubernetes
// 1.30+): /api and /apis answer every group, version and resource in one
// document, where the older form takes a request per group version.
// kubectl and client-go ask for it first.
const aggregatedType = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"

// wantsAggregated reports whether the client's Accept header takes the
// aggregated discovery document as JSON.
func wantsAggregated(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mediaType, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil || mediaType != "application/json" {
			continue
		}
		if params["g"] == "apidiscovery.k8s.io" && params["v"] == "v2" && params["as"] == "APIGroupDiscoveryList" {
			return true
		}
	}
	return false
}

// aggregated is the aggregated discovery of the core group (legacy) or of
// every named group.
func aggregated(groups []groupVersion, legacy bool) *apidiscoveryv2.APIGroupDiscoveryList {
	list := &apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupDiscoveryList", APIVersion: "apidiscovery.k8s.io/v2"}}
	for _, name := range groupNames(groups) {
		if (name == "") != legacy {
			continue
		}
		group := apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: name}}
		for _, g := range groups {
			if g.Group != name {
				continue
			}
			version := apidiscoveryv2.APIVersionDiscovery{Version: g.Version, Freshness: apidiscoveryv2.DiscoveryFreshnessCurrent}
			if g.stale {
				version.Freshness = apidiscoveryv2.DiscoveryFreshnessStale
			}
			byName := map[string]int{}
			for _, r := range g.resources {
				parent, sub, isSub := strings.Cut(r.Name, "/")
				kind := &metav1.GroupVersionKind{Group: g.Group, Version: g.Version, Kind: r.Kind}
				if r.Group != "" || r.Version != "" {
					kind = &metav1.GroupVersionKind{Group: r.Group, Version: r.Version, Kind: r.Kind}
				}
				if isSub {
					if i, ok := byName[parent]; ok {
						version.Resources[i].Subresources = append(version.Resources[i].Subresources,
							apidiscoveryv2.APISubresourceDiscovery{Subresource: sub, ResponseKind: kind, Verbs: r.Verbs})
					}
					continue
				}
				scope := apidiscoveryv2.ScopeCluster
				if r.Namespaced {
					scope = apidiscoveryv2.ScopeNamespace
				}
				byName[r.Name] = len(version.Resources)
				version.Resources = append(version.Resources, apidiscoveryv2.APIResourceDiscovery{Resource: r.Name, ResponseKind: kind,
					Scope: scope, SingularResource: r.SingularName, Verbs: r.Verbs, ShortNames: r.ShortNames, Categories: r.Categories})
			}
			group.Versions = append(group.Versions, version)
		}
		// Highest first, the preferred one, as in the unaggregated form.
		slices.SortStableFunc(group.Versions, func(a, b apidiscoveryv2.APIVersionDiscovery) int {
			return -kubeversion.CompareKubeAwareVersionStrings(a.Version, b.Version)
		})
		list.Items = append(list.Items, group)
	}
	return list
}

// writeAggregated answers with the aggregated document.
func writeAggregated(w http.ResponseWriter, r *http.Request, list *apidiscoveryv2.APIGroupDiscoveryList) {
	body, err := json.Marshal(list)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", aggregatedType)
	w.Header().Set("Vary", "Accept")
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}
