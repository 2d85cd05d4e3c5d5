package core

import (
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/api/resources"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func nodes() *resources.Resource {
	return resources.Described[corev1.Node, corev1.NodeList](&resources.Resource{
		StatusMetadata: resources.StatusMetadataAll, GroupVersionKind: resources.GVK("", "Node"), Plural: "nodes", Singular: "node", ShortNames: []string{"no"},
		Subresources: []resources.Subresource{resources.Status(),
			{Name: "proxy", Serve: resources.ServeNodeProxy, Kind: corev1.SchemeGroupVersion.WithKind("NodeProxyOptions"), Verbs: metav1.Verbs{"get"}}},
		StorageKey: "minions",
		NameRule:   resources.PathSegmentName,
		Fields: resources.TypedFields(func(n *corev1.Node) fields.Set {
			return fields.Set{"spec.unschedulable": strconv.FormatBool(n.Spec.Unschedulable)}
		}),
		Columns: nodeColumns, Row: resources.TypedRow(nodeRow),
		// Kubernetes' rule: a node's pod CIDRs are set once (by node IPAM)
		// and never changed; the node's network is built on them.
		ValidateUpdate: resources.TypedValidateUpdate(func(n, o *corev1.Node) field.ErrorList {
			var errs field.ErrorList
			if o.Spec.PodCIDR != "" && n.Spec.PodCIDR != o.Spec.PodCIDR {
				errs = append(errs, field.Forbidden(field.NewPath("spec", "podCIDR"), "node updates may not change podCIDR except from \"\" to valid"))
			}
			if len(o.Spec.PodCIDRs) > 0 && !slices.Equal(n.Spec.PodCIDRs, o.Spec.PodCIDRs) {
				errs = append(errs, field.Forbidden(field.NewPath("spec", "podCIDRs"), "node updates may not change podCIDR except from \"\" to valid"))
			}
			return errs
		}),
	})
}

var nodeColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Status", "string", 0, "The status of the node"),
	resources.Col("Roles", "string", 0, "The roles of the node"),
	resources.AgeCol,
	resources.Col("Version", "string", 0, corev1.NodeSystemInfo{}.SwaggerDoc()["kubeletVersion"]),
	resources.Col("Internal-IP", "string", 1, corev1.NodeStatus{}.SwaggerDoc()["addresses"]),
	resources.Col("External-IP", "string", 1, corev1.NodeStatus{}.SwaggerDoc()["addresses"]),
	resources.Col("OS-Image", "string", 1, corev1.NodeSystemInfo{}.SwaggerDoc()["osImage"]),
	resources.Col("Kernel-Version", "string", 1, corev1.NodeSystemInfo{}.SwaggerDoc()["kernelVersion"]),
	resources.Col("Container-Runtime", "string", 1, corev1.NodeSystemInfo{}.SwaggerDoc()["containerRuntimeVersion"]),
}

func nodeRow(n *corev1.Node) []any {
	status := "Unknown"
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			status = "NotReady"
			if c.Status == corev1.ConditionTrue {
				status = "Ready"
			}
		}
	}
	if n.Spec.Unschedulable {
		status += ",SchedulingDisabled"
	}
	var roles []string
	for k, v := range n.Labels {
		switch {
		case strings.HasPrefix(k, "node-role.kubernetes.io/"):
			if role := strings.TrimPrefix(k, "node-role.kubernetes.io/"); role != "" {
				roles = append(roles, role)
			}
		case k == "kubernetes.io/role" && v != "":
			roles = append(roles, v)
		}
	}
	sort.Strings(roles)
	internal, external := "<none>", "<none>"
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP && internal == "<none>" {
			internal = a.Address
		}
		if a.Type == corev1.NodeExternalIP && external == "<none>" {
			external = a.Address
		}
	}
	info := n.Status.NodeInfo
	return []any{n.Name, status, resources.OrNone(strings.Join(roles, ",")), resources.Age(n.CreationTimestamp), info.KubeletVersion,
		internal, external, resources.OrNone(info.OSImage), resources.OrNone(info.KernelVersion), resources.OrNone(info.ContainerRuntimeVersion)}
}
