package rest

import (
	"net/http"
	"sort"
	"strings"

	"github.com/orch-dev/orch/internal/api/registry"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// groupVersion is one served group/version and its resources, as discovery
// lists them.
type groupVersion struct {
	schema.GroupVersion
	resources []metav1.APIResource
}

var allVerbs = metav1.Verbs{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}

// groupsOf builds discovery from the storages: the core group first, then
// the others in a stable order.
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
		g.resources = append(g.resources, metav1.APIResource{
			Name: r.Plural, SingularName: r.Singular, Namespaced: r.Namespaced, Kind: r.Kind,
			Verbs: allVerbs, ShortNames: r.ShortNames, Categories: r.Categories,
		})
		for _, sub := range r.Subresources {
			res := metav1.APIResource{Name: r.Plural + "/" + sub, Namespaced: r.Namespaced, Kind: r.Kind, Verbs: metav1.Verbs{"get", "patch", "update"}}
			switch sub {
			case "scale":
				res.Group, res.Version, res.Kind = "autoscaling", "v1", "Scale"
			case "binding":
				res.Kind, res.Verbs = "Binding", metav1.Verbs{"create"}
			case "finalize":
				res.Verbs = metav1.Verbs{"update"}
			case "log":
				res.Verbs = metav1.Verbs{"get"}
			case "exec":
				res.Kind, res.Verbs = "PodExecOptions", metav1.Verbs{"create", "get"}
			case "attach":
				res.Kind, res.Verbs = "PodAttachOptions", metav1.Verbs{"create", "get"}
			case "portforward":
				res.Kind, res.Verbs = "PodPortForwardOptions", metav1.Verbs{"create", "get"}
			}
			g.resources = append(g.resources, res)
		}
	}
	sort.SliceStable(order, func(i, j int) bool { return order[i].Group == "" && order[j].Group != "" })
	out := make([]groupVersion, 0, len(order))
	for _, gv := range order {
		out = append(out, *byGV[gv])
	}
	return out
}

// serveDiscovery answers /api, /apis, /apis/<group> and the per
// group/version resource lists.
func (h *Handler) serveDiscovery(w http.ResponseWriter, r *http.Request, info RequestInfo) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.writeError(w, r, apierrors.NewMethodNotSupported(schema.GroupResource{}, r.Method))
		return
	}
	segs := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	var obj any
	switch {
	case len(segs) == 1 && segs[0] == "api":
		obj = &metav1.APIVersions{TypeMeta: metav1.TypeMeta{Kind: "APIVersions"}, Versions: []string{"v1"},
			ServerAddressByClientCIDRs: []metav1.ServerAddressByClientCIDR{{ClientCIDR: "0.0.0.0/0", ServerAddress: r.Host}}}
	case len(segs) == 1 && segs[0] == "apis":
		list := &metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}}
		for _, g := range h.groups {
			if g.Group != "" {
				list.Groups = append(list.Groups, apiGroup(g))
			}
		}
		obj = list
	case len(segs) == 2 && segs[0] == "apis":
		for _, g := range h.groups {
			if g.Group == segs[1] {
				ag := apiGroup(g)
				ag.TypeMeta = metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}
				obj = &ag
			}
		}
	case len(segs) == 2 && segs[0] == "api", len(segs) == 3 && segs[0] == "apis":
		for _, g := range h.groups {
			if g.Group == info.Group && g.Version == info.Version {
				obj = &metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
					GroupVersion: g.String(), APIResources: g.resources}
			}
		}
	}
	if obj == nil {
		h.writeError(w, r, apierrors.NewNotFound(schema.GroupResource{}, ""))
		return
	}
	_ = writeObject(w, r, http.StatusOK, obj, format{})
}

func apiGroup(g groupVersion) metav1.APIGroup {
	v := metav1.GroupVersionForDiscovery{GroupVersion: g.String(), Version: g.Version}
	return metav1.APIGroup{Name: g.Group, Versions: []metav1.GroupVersionForDiscovery{v}, PreferredVersion: v}
}
