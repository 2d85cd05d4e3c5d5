package rest

import (
	"net/http"
	"slices"
	"strings"

	"github.com/orch-dev/orch/internal/api/registry"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
)

// groupVersion is one served group/version and its resources, as discovery
// lists them.
type groupVersion struct {
	schema.GroupVersion
	resources []metav1.APIResource
	// stale: another server serves it and did not answer its last check.
	stale bool
}

var allVerbs = metav1.Verbs{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}

// discoveryView is discovery as built from one catalog snapshot.
type discoveryView struct {
	generation uint64
	groups     []groupVersion
}

// groups returns discovery for the snapshot, building it once per
// catalog generation.
func (h *Handler) groups(served *registry.Served) []groupVersion {
	if v := h.discovery.Load(); v != nil && v.generation == served.Generation {
		return v.groups
	}
	v := &discoveryView{generation: served.Generation, groups: groupsOf(served.Storages)}
	h.discovery.Store(v)
	return v.groups
}

// groupsOf builds discovery from the storages, in their order (the core
// group first).
func groupsOf(storages []*registry.Storage) []groupVersion {
	byGV := map[schema.GroupVersion]*groupVersion{}
	var order []schema.GroupVersion
	for _, st := range storages {
		r := st.Resource
		gv := r.GroupVersion()
		g := byGV[gv]
		if g == nil {
			g = &groupVersion{GroupVersion: gv}
			byGV[gv] = g
			order = append(order, gv)
		}
		verbs := allVerbs
		switch {
		case r.Review != nil:
			verbs = metav1.Verbs{"create"}
		case r.Live != nil:
			verbs = metav1.Verbs{"get", "list"}
		}
		g.resources = append(g.resources, metav1.APIResource{
			Name: r.Plural, SingularName: r.Singular, Namespaced: r.Namespaced, Kind: r.Kind,
			Verbs: verbs, ShortNames: r.ShortNames, Categories: r.Categories,
		})
		for _, sub := range r.Subresources {
			res := metav1.APIResource{Name: r.Plural + "/" + sub.Name, Namespaced: r.Namespaced, Kind: r.Kind, Verbs: sub.Verbs}
			if !sub.Kind.Empty() {
				res.Kind = sub.Kind.Kind
				if sub.Kind.GroupVersion() != gv {
					res.Group, res.Version = sub.Kind.Group, sub.Kind.Version
				}
			}
			g.resources = append(g.resources, res)
		}
	}
	out := make([]groupVersion, 0, len(order))
	for _, gv := range order {
		out = append(out, *byGV[gv])
	}
	return out
}

// serveDiscovery answers /api, /apis, /apis/<group> and the per
// group/version resource lists.
func (h *Handler) serveDiscovery(w http.ResponseWriter, r *http.Request, info RequestInfo, served *registry.Served) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.writeError(w, r, apierrors.NewMethodNotSupported(schema.GroupResource{}, r.Method))
		return
	}
	groups := h.withAggregated(h.groups(served))
	segs := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if len(segs) == 1 && (segs[0] == "api" || segs[0] == "apis") && wantsAggregated(r) {
		writeAggregated(w, r, aggregated(groups, segs[0] == "api"))
		return
	}
	var obj any
	switch {
	case len(segs) == 1 && segs[0] == "api":
		obj = &metav1.APIVersions{TypeMeta: metav1.TypeMeta{Kind: "APIVersions"}, Versions: []string{"v1"},
			ServerAddressByClientCIDRs: []metav1.ServerAddressByClientCIDR{{ClientCIDR: "0.0.0.0/0", ServerAddress: r.Host}}}
	case len(segs) == 1 && segs[0] == "apis":
		list := &metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}}
		for _, name := range groupNames(groups) {
			if name != "" {
				list.Groups = append(list.Groups, apiGroup(groups, name))
			}
		}
		obj = list
	case len(segs) == 2 && segs[0] == "apis":
		if slices.Contains(groupNames(groups), segs[1]) {
			ag := apiGroup(groups, segs[1])
			ag.TypeMeta = metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}
			obj = &ag
		}
	case len(segs) == 2 && segs[0] == "api", len(segs) == 3 && segs[0] == "apis":
		for _, g := range groups {
			if g.Group == info.Group && g.Version == info.Version {
				obj = &metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
					GroupVersion: g.String(), APIResources: g.resources}
			}
		}
	}
	if obj == nil {
		h.writeError(w, r, notServed())
		return
	}
	_ = writeObject(w, r, http.StatusOK, obj, format{})
}

// withAggregated is groups with the aggregated group/versions: one that
// is also served here replaces it, the others follow.
func (h *Handler) withAggregated(groups []groupVersion) []groupVersion {
	if h.opts.Aggregated == nil {
		return groups
	}
	remote := h.opts.Aggregated()
	if len(remote) == 0 {
		return groups
	}
	out := slices.Clone(groups)
	for _, r := range remote {
		gv := groupVersion{GroupVersion: r.GroupVersion, resources: r.Resources, stale: !r.Available}
		if i := slices.IndexFunc(out, func(g groupVersion) bool { return g.GroupVersion == r.GroupVersion }); i >= 0 {
			out[i] = gv
			continue
		}
		out = append(out, gv)
	}
	return out
}

// groupNames are the served groups, each once, in discovery order.
func groupNames(groups []groupVersion) []string {
	var out []string
	for _, g := range groups {
		if !slices.Contains(out, g.Group) {
			out = append(out, g.Group)
		}
	}
	return out
}

// apiGroup lists a group's served versions, highest first as Kubernetes
// orders them (GA before beta before alpha, then by number: a custom
// resource's v2 before its v1, whatever the definition's order); the
// first is the preferred one.
func apiGroup(groups []groupVersion, name string) metav1.APIGroup {
	ag := metav1.APIGroup{Name: name}
	for _, g := range groups {
		if g.Group == name {
			ag.Versions = append(ag.Versions, metav1.GroupVersionForDiscovery{GroupVersion: g.String(), Version: g.Version})
		}
	}
	slices.SortStableFunc(ag.Versions, func(a, b metav1.GroupVersionForDiscovery) int {
		return -version.CompareKubeAwareVersionStrings(a.Version, b.Version)
	})
	ag.PreferredVersion = ag.Versions[0]
	return ag
}
