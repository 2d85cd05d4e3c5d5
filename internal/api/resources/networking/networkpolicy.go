package networking

import (
	"net/netip"

	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// networkPolicies are enforced by every node for its own pods
// (internal/netpolicy).
func networkPolicies() *resources.Resource {
	return resources.Described[networkingv1.NetworkPolicy, networkingv1.NetworkPolicyList](&resources.Resource{
		GroupVersionKind: resources.GVK("networking.k8s.io", "NetworkPolicy"), Plural: "networkpolicies", Singular: "networkpolicy",
		Namespaced: true, ShortNames: []string{"netpol"}, StorageKey: "networkpolicies", HasSpec: true,
		Default:  resources.Typed(defaultNetworkPolicy),
		Validate: resources.TypedValidate(validateNetworkPolicy),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("Pod-Selector", "string", 0, networkingv1.NetworkPolicySpec{}.SwaggerDoc()["podSelector"]),
			resources.AgeCol},
		Row: resources.TypedRow(func(p *networkingv1.NetworkPolicy) []any {
			return []any{p.Name, metav1.FormatLabelSelector(&p.Spec.PodSelector), resources.Age(p.CreationTimestamp)}
		}),
	})
}

// defaultNetworkPolicy is Kubernetes' v1 defaulting: ports are TCP unless
// said, and a policy that names no types is an Ingress policy, and an
// Egress one too when it has egress rules.
func defaultNetworkPolicy(p *networkingv1.NetworkPolicy) {
	for i := range p.Spec.Ingress {
		defaultPorts(p.Spec.Ingress[i].Ports)
	}
	for i := range p.Spec.Egress {
		defaultPorts(p.Spec.Egress[i].Ports)
	}
	if len(p.Spec.PolicyTypes) == 0 {
		p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		if len(p.Spec.Egress) > 0 {
			p.Spec.PolicyTypes = append(p.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		}
	}
}

func defaultPorts(ports []networkingv1.NetworkPolicyPort) {
	for i := range ports {
		if ports[i].Protocol == nil {
			ports[i].Protocol = ptr.To(corev1.ProtocolTCP)
		}
	}
}

var (
	policyProtocols = []string{string(corev1.ProtocolTCP), string(corev1.ProtocolUDP), string(corev1.ProtocolSCTP)}
	policyTypes     = []string{string(networkingv1.PolicyTypeIngress), string(networkingv1.PolicyTypeEgress)}
)

// validateNetworkPolicy is Kubernetes' validation of a NetworkPolicy:
// label selectors, ports (a number or a name, a range only from a number
// up), peers (one ipBlock alone, or pod and namespace selectors), an
// ipBlock's except strictly inside its CIDR, and at most the two types.
func validateNetworkPolicy(p *networkingv1.NetworkPolicy) field.ErrorList {
	spec, path := &p.Spec, resources.SpecPath
	errs := metav1validation.ValidateLabelSelector(&spec.PodSelector, metav1validation.LabelSelectorValidationOptions{}, path.Child("podSelector"))
	for i, rule := range spec.Ingress {
		rp := path.Child("ingress").Index(i)
		for j := range rule.Ports {
			errs = append(errs, validatePolicyPort(&rule.Ports[j], rp.Child("ports").Index(j))...)
		}
		for j := range rule.From {
			errs = append(errs, validatePolicyPeer(&rule.From[j], rp.Child("from").Index(j))...)
		}
	}
	for i, rule := range spec.Egress {
		rp := path.Child("egress").Index(i)
		for j := range rule.Ports {
			errs = append(errs, validatePolicyPort(&rule.Ports[j], rp.Child("ports").Index(j))...)
		}
		for j := range rule.To {
			errs = append(errs, validatePolicyPeer(&rule.To[j], rp.Child("to").Index(j))...)
		}
	}
	if len(spec.PolicyTypes) > len(policyTypes) {
		return append(errs, field.Invalid(path.Child("policyTypes"), &spec.PolicyTypes, "may not specify more than two policyTypes"))
	}
	for i, t := range spec.PolicyTypes {
		if t != networkingv1.PolicyTypeIngress && t != networkingv1.PolicyTypeEgress {
			errs = append(errs, field.NotSupported(path.Child("policyTypes").Index(i), t, policyTypes))
		}
	}
	return errs
}

func validatePolicyPort(port *networkingv1.NetworkPolicyPort, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if port.Protocol != nil && *port.Protocol != corev1.ProtocolTCP && *port.Protocol != corev1.ProtocolUDP && *port.Protocol != corev1.ProtocolSCTP {
		errs = append(errs, field.NotSupported(path.Child("protocol"), *port.Protocol, policyProtocols))
	}
	switch {
	case port.Port == nil:
		if port.EndPort != nil {
			errs = append(errs, field.Invalid(path.Child("endPort"), *port.EndPort, "may not be specified when `port` is not specified"))
		}
	case port.Port.Type == intstr.Int:
		for _, msg := range validation.IsValidPortNum(int(port.Port.IntVal)) {
			errs = append(errs, field.Invalid(path.Child("port"), port.Port.IntVal, msg))
		}
		if port.EndPort != nil {
			if *port.EndPort < port.Port.IntVal {
				errs = append(errs, field.Invalid(path.Child("endPort"), *port.EndPort, "must be greater than or equal to `port`"))
			}
			for _, msg := range validation.IsValidPortNum(int(*port.EndPort)) {
				errs = append(errs, field.Invalid(path.Child("endPort"), *port.EndPort, msg))
			}
		}
	default:
		if port.EndPort != nil {
			errs = append(errs, field.Invalid(path.Child("endPort"), *port.EndPort, "may not be specified when `port` is non-numeric"))
		}
		for _, msg := range validation.IsValidPortName(port.Port.StrVal) {
			errs = append(errs, field.Invalid(path.Child("port"), port.Port.StrVal, msg))
		}
	}
	return errs
}

func validatePolicyPeer(peer *networkingv1.NetworkPolicyPeer, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	peers := 0
	if peer.PodSelector != nil {
		peers++
		errs = append(errs, metav1validation.ValidateLabelSelector(peer.PodSelector, metav1validation.LabelSelectorValidationOptions{}, path.Child("podSelector"))...)
	}
	if peer.NamespaceSelector != nil {
		peers++
		errs = append(errs, metav1validation.ValidateLabelSelector(peer.NamespaceSelector, metav1validation.LabelSelectorValidationOptions{}, path.Child("namespaceSelector"))...)
	}
	if peer.IPBlock != nil {
		peers++
		errs = append(errs, validateIPBlock(peer.IPBlock, path.Child("ipBlock"))...)
	}
	switch {
	case peers == 0:
		errs = append(errs, field.Required(path, "must specify a peer"))
	case peers > 1 && peer.IPBlock != nil:
		errs = append(errs, field.Forbidden(path, "may not specify both ipBlock and another peer"))
	}
	return errs
}

// validateIPBlock: a CIDR, and each exception a CIDR strictly inside it.
func validateIPBlock(b *networkingv1.IPBlock, path *field.Path) field.ErrorList {
	if b.CIDR == "" {
		return field.ErrorList{field.Required(path.Child("cidr"), "")}
	}
	errs := validation.IsValidCIDRForLegacyField(path.Child("cidr"), b.CIDR, true, nil)
	block, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return errs
	}
	for i, s := range b.Except {
		ep := path.Child("except").Index(i)
		errs = append(errs, validation.IsValidCIDRForLegacyField(ep, s, true, nil)...)
		except, err := netip.ParsePrefix(s)
		if err != nil {
			continue
		}
		if !block.Contains(except.Addr()) || block.Bits() >= except.Bits() {
			errs = append(errs, field.Invalid(ep, s, "must be a strict subset of `cidr`"))
		}
	}
	return errs
}
