package core

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/orch-dev/orch/internal/api/resources"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

func services() *resources.Resource {
	return resources.Described[corev1.Service, corev1.ServiceList](&resources.Resource{
		StatusMetadata: resources.StatusMetadataAll, GroupVersionKind: resources.GVK("", "Service"), Plural: "services", Singular: "service", Namespaced: true,
		ShortNames: []string{"svc"}, Categories: []string{"all"}, Subresources: []resources.Subresource{resources.Status(),
			{Name: "proxy", Serve: resources.ServeProxy, Kind: corev1.SchemeGroupVersion.WithKind("ServiceProxyOptions"), Verbs: metav1.Verbs{"create", "delete", "get", "patch", "update"}}},
		StorageKey: "services/specs", NameRule: apivalidation.NameIsDNSLabel,
		Default: resources.Typed(defaultService), Validate: resources.TypedValidate(validateService), ValidateUpdate: resources.TypedValidateUpdate(validateServiceUpdate),
		PrepareForUpdate: func(obj, old runtime.Object) { dropTypeDependentFields(obj.(*corev1.Service), old.(*corev1.Service)) },
		PrepareForCreate: resources.Typed(func(s *corev1.Service) { s.Status = corev1.ServiceStatus{} }),
		Fields: resources.TypedFields(func(s *corev1.Service) fields.Set {
			return fields.Set{"spec.clusterIP": s.Spec.ClusterIP, "spec.type": string(s.Spec.Type)}
		}),
		Columns: serviceColumns, Row: resources.TypedRow(serviceRow),
	})
}

func defaultService(svc *corev1.Service) {
	spec := &svc.Spec
	if spec.Type == "" {
		spec.Type = corev1.ServiceTypeClusterIP
	}
	if spec.SessionAffinity == "" {
		spec.SessionAffinity = corev1.ServiceAffinityNone
	}
	for i := range spec.Ports {
		p := &spec.Ports[i]
		if p.Protocol == "" {
			p.Protocol = corev1.ProtocolTCP
		}
		if p.TargetPort == (intstr.IntOrString{}) {
			p.TargetPort = intstr.FromInt32(p.Port)
		}
	}
	if spec.Type == corev1.ServiceTypeExternalName {
		return
	}
	if spec.InternalTrafficPolicy == nil {
		spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyCluster)
	}
	if (spec.Type == corev1.ServiceTypeNodePort || spec.Type == corev1.ServiceTypeLoadBalancer) && spec.ExternalTrafficPolicy == "" {
		spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	}
	if spec.Type == corev1.ServiceTypeLoadBalancer && spec.AllocateLoadBalancerNodePorts == nil {
		spec.AllocateLoadBalancerNodePorts = ptr.To(true)
	}
	if spec.IPFamilyPolicy == nil {
		spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
	}
	if len(spec.IPFamilies) == 0 {
		spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	}
}

// dropTypeDependentFields is Kubernetes' rule for a Service changing type:
// what the old type needed and the new one does not (cluster IPs and IP
// families for ExternalName, node ports outside NodePort and
// LoadBalancer, the health check port, the load balancer's settings, the
// traffic policies) is dropped when the update left it as it was, so a
// user changing only the type is not refused for the rest.
func dropTypeDependentFields(svc, old *corev1.Service) {
	spec, was := &svc.Spec, &old.Spec
	if was.Type != corev1.ServiceTypeExternalName && spec.Type == corev1.ServiceTypeExternalName {
		if spec.ClusterIP == was.ClusterIP && slices.Equal(spec.ClusterIPs, was.ClusterIPs) {
			spec.ClusterIP, spec.ClusterIPs = "", nil
		}
		if slices.Equal(spec.IPFamilies, was.IPFamilies) {
			spec.IPFamilies = nil
		}
		if ptr.Equal(spec.IPFamilyPolicy, was.IPFamilyPolicy) {
			spec.IPFamilyPolicy = nil
		}
		if ptr.Equal(spec.InternalTrafficPolicy, was.InternalTrafficPolicy) {
			spec.InternalTrafficPolicy = nil
		}
	}
	usesNodePorts := func(s *corev1.ServiceSpec) bool {
		return s.Type == corev1.ServiceTypeNodePort || s.Type == corev1.ServiceTypeLoadBalancer
	}
	if usesNodePorts(was) && !usesNodePorts(spec) {
		same := len(spec.Ports) == len(was.Ports)
		for i := range spec.Ports {
			same = same && spec.Ports[i].NodePort == was.Ports[i].NodePort
		}
		if same {
			for i := range spec.Ports {
				spec.Ports[i].NodePort = 0
			}
		}
		if spec.ExternalTrafficPolicy == was.ExternalTrafficPolicy {
			spec.ExternalTrafficPolicy = ""
		}
	}
	if was.Type == corev1.ServiceTypeLoadBalancer && spec.Type != corev1.ServiceTypeLoadBalancer {
		if spec.HealthCheckNodePort == was.HealthCheckNodePort {
			spec.HealthCheckNodePort = 0
		}
		if ptr.Equal(spec.LoadBalancerClass, was.LoadBalancerClass) {
			spec.LoadBalancerClass = nil
		}
	}
	if spec.Type != corev1.ServiceTypeLoadBalancer {
		spec.AllocateLoadBalancerNodePorts = nil
	}
}

func validateService(svc *corev1.Service) field.ErrorList {
	var errs field.ErrorList
	spec := &svc.Spec
	switch spec.Type {
	case corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
		if len(spec.Ports) == 0 && spec.ClusterIP != corev1.ClusterIPNone {
			errs = append(errs, field.Required(resources.SpecPath.Child("ports"), ""))
		}
	case corev1.ServiceTypeExternalName:
		if spec.ExternalName == "" {
			errs = append(errs, field.Required(resources.SpecPath.Child("externalName"), ""))
		}
	default:
		errs = append(errs, field.NotSupported(resources.SpecPath.Child("type"), spec.Type, []string{string(corev1.ServiceTypeClusterIP),
			string(corev1.ServiceTypeExternalName), string(corev1.ServiceTypeLoadBalancer), string(corev1.ServiceTypeNodePort)}))
	}
	names := sets.New[string]()
	for i, p := range spec.Ports {
		pp := resources.SpecPath.Child("ports").Index(i)
		if len(spec.Ports) > 1 && p.Name == "" {
			errs = append(errs, field.Required(pp.Child("name"), ""))
		}
		if p.Name != "" {
			for _, msg := range validation.IsDNS1123Label(p.Name) {
				errs = append(errs, field.Invalid(pp.Child("name"), p.Name, msg))
			}
			if names.Has(p.Name) {
				errs = append(errs, field.Duplicate(pp.Child("name"), p.Name))
			}
			names.Insert(p.Name)
		}
		for _, msg := range validation.IsValidPortNum(int(p.Port)) {
			errs = append(errs, field.Invalid(pp.Child("port"), p.Port, msg))
		}
		errs = append(errs, validateProtocol(p.Protocol, pp.Child("protocol"))...)
		if p.TargetPort.Type == intstr.String {
			for _, msg := range validation.IsValidPortName(p.TargetPort.StrVal) {
				errs = append(errs, field.Invalid(pp.Child("targetPort"), p.TargetPort.StrVal, msg))
			}
		} else if p.TargetPort.IntVal != 0 {
			for _, msg := range validation.IsValidPortNum(int(p.TargetPort.IntVal)) {
				errs = append(errs, field.Invalid(pp.Child("targetPort"), p.TargetPort.IntVal, msg))
			}
		}
		if p.NodePort != 0 && spec.Type != corev1.ServiceTypeNodePort && spec.Type != corev1.ServiceTypeLoadBalancer {
			errs = append(errs, field.Forbidden(pp.Child("nodePort"), "may not be used when `type` is 'ClusterIP'"))
		}
	}
	for k, v := range spec.Selector {
		errs = append(errs, metav1validation.ValidateLabels(map[string]string{k: v}, resources.SpecPath.Child("selector"))...)
	}
	return errs
}

func validateServiceUpdate(svc, old *corev1.Service) field.ErrorList {
	// The clusterIP may not change once set, except by leaving type
	// ExternalName; Kubernetes' rule, minus dual-stack changes.
	if old.Spec.ClusterIP != "" && old.Spec.Type != corev1.ServiceTypeExternalName && svc.Spec.Type != corev1.ServiceTypeExternalName {
		return resources.Immutable(svc.Spec.ClusterIP, old.Spec.ClusterIP, resources.SpecPath.Child("clusterIP"))
	}
	return nil
}

var serviceColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Type", "string", 0, corev1.ServiceSpec{}.SwaggerDoc()["type"]),
	resources.Col("Cluster-IP", "string", 0, corev1.ServiceSpec{}.SwaggerDoc()["clusterIP"]),
	resources.Col("External-IP", "string", 0, corev1.ServiceSpec{}.SwaggerDoc()["externalIPs"]),
	resources.Col("Port(s)", "string", 0, corev1.ServiceSpec{}.SwaggerDoc()["ports"]),
	resources.AgeCol,
	resources.Col("Selector", "string", 1, corev1.ServiceSpec{}.SwaggerDoc()["selector"]),
}

func serviceRow(svc *corev1.Service) []any {
	external := "<none>"
	switch svc.Spec.Type {
	case corev1.ServiceTypeExternalName:
		external = svc.Spec.ExternalName
	case corev1.ServiceTypeLoadBalancer:
		var ips []string
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if in.IP != "" {
				ips = append(ips, in.IP)
			} else if in.Hostname != "" {
				ips = append(ips, in.Hostname)
			}
		}
		ips = append(ips, svc.Spec.ExternalIPs...)
		external = "<pending>"
		if len(ips) > 0 {
			external = strings.Join(ips, ",")
		}
	default:
		if len(svc.Spec.ExternalIPs) > 0 {
			external = strings.Join(svc.Spec.ExternalIPs, ",")
		}
	}
	var ports []string
	for _, p := range svc.Spec.Ports {
		if p.NodePort != 0 {
			ports = append(ports, fmt.Sprintf("%d:%d/%s", p.Port, p.NodePort, p.Protocol))
		} else {
			ports = append(ports, fmt.Sprintf("%d/%s", p.Port, p.Protocol))
		}
	}
	clusterIP := svc.Spec.ClusterIP
	if clusterIP == "" {
		clusterIP = "<none>"
	}
	return []any{svc.Name, string(svc.Spec.Type), clusterIP, external, resources.OrNone(strings.Join(ports, ",")),
		resources.Age(svc.CreationTimestamp), resources.OrNone(labels.FormatLabels(svc.Spec.Selector))}
}
