package networking

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/orch-dev/orch/internal/api/resources"
	"github.com/orch-dev/orch/internal/ingressclass"
	networkingv1 "k8s.io/api/networking/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

func ingresses() *resources.Resource {
	return resources.Described[networkingv1.Ingress, networkingv1.IngressList](&resources.Resource{
		GroupVersionKind: resources.GVK("networking.k8s.io", "Ingress"), Plural: "ingresses", Singular: "ingress",
		Namespaced: true, ShortNames: []string{"ing"}, StorageKey: "ingresses", HasSpec: true,
		// Kubernetes' status strategy keeps only the spec: metadata goes through.
		StatusMetadata:   resources.StatusMetadataAll,
		Subresources:     []resources.Subresource{resources.Status()},
		PrepareForCreate: resources.Typed(func(in *networkingv1.Ingress) { in.Status = networkingv1.IngressStatus{} }),
		Validate:         resources.TypedValidate(validateIngress),
		Rules: func(obj, old runtime.Object) field.ErrorList {
			in := obj.(*networkingv1.Ingress)
			if old != nil {
				return nil
			}
			// On create only, as Kubernetes: the old annotation and the
			// field may not disagree.
			if v, ok := in.Annotations[ingressclass.Annotation]; ok && in.Spec.IngressClassName != nil && v != *in.Spec.IngressClassName {
				return field.ErrorList{field.Invalid(field.NewPath("annotations").Child(ingressclass.Annotation), v, "must match `ingressClassName` when both are specified")}
			}
			return nil
		},
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("Class", "string", 0, networkingv1.IngressSpec{}.SwaggerDoc()["ingressClassName"]),
			resources.Col("Hosts", "string", 0, networkingv1.IngressRule{}.SwaggerDoc()["host"]),
			resources.Col("Address", "string", 0, "Address is a list of IP addresses and hostnames the Ingress is reached at."),
			resources.Col("Ports", "string", 0, "Ports of the load balancer."),
			resources.AgeCol},
		Row: resources.TypedRow(ingressRow),
	})
}

func ingressRow(in *networkingv1.Ingress) []any {
	class := "<none>"
	if in.Spec.IngressClassName != nil {
		class = *in.Spec.IngressClassName
	}
	var hosts []string
	for _, r := range in.Spec.Rules {
		if r.Host != "" {
			hosts = append(hosts, r.Host)
		}
	}
	hostList := "*"
	if len(hosts) > 3 {
		hostList = strings.Join(hosts[:3], ",") + fmt.Sprintf(" + %d more...", len(hosts)-3)
	} else if len(hosts) > 0 {
		hostList = strings.Join(hosts, ",")
	}
	var addrs []string
	for _, lb := range in.Status.LoadBalancer.Ingress {
		if lb.IP != "" {
			addrs = append(addrs, lb.IP)
		} else if lb.Hostname != "" {
			addrs = append(addrs, lb.Hostname)
		}
	}
	ports := "80"
	if len(in.Spec.TLS) > 0 {
		ports = "80, 443"
	}
	return []any{in.Name, class, hostList, strings.Join(addrs, ","), ports, resources.Age(in.CreationTimestamp)}
}

var (
	// What a path of type Exact or Prefix may not hold, as Kubernetes.
	badPathParts    = []string{"//", "/./", "/../", "%2f", "%2F"}
	badPathSuffixes = []string{"/..", "/."}
	pathTypes       = []string{string(networkingv1.PathTypeExact), string(networkingv1.PathTypeImplementationSpecific), string(networkingv1.PathTypePrefix)}
)

// validateIngress is Kubernetes' validation of an Ingress: rules or a
// default backend, hosts as DNS names (a leading *. allowed), typed
// absolute paths, each backend a Service (by port name or number) or a
// resource, TLS hosts and Secret names, and the status's addresses.
func validateIngress(in *networkingv1.Ingress) field.ErrorList {
	var errs field.ErrorList
	spec, path := &in.Spec, resources.SpecPath
	if len(spec.Rules) == 0 && spec.DefaultBackend == nil {
		errs = append(errs, field.Invalid(path, spec.Rules, "either `defaultBackend` or `rules` must be specified"))
	}
	if spec.DefaultBackend != nil {
		errs = append(errs, validateIngressBackend(spec.DefaultBackend, path.Child("defaultBackend"))...)
	}
	for i, rule := range spec.Rules {
		rp := path.Child("rules").Index(i)
		if rule.Host != "" {
			hp := rp.Child("host")
			if _, err := netip.ParseAddr(rule.Host); err == nil {
				errs = append(errs, field.Invalid(hp, rule.Host, "must be a DNS name, not an IP address"))
			}
			errs = append(errs, hostErrors(hp, rule.Host)...)
		}
		if rule.HTTP == nil {
			continue
		}
		pp := rp.Child("http", "paths")
		if len(rule.HTTP.Paths) == 0 {
			errs = append(errs, field.Required(pp, ""))
		}
		for j := range rule.HTTP.Paths {
			errs = append(errs, validateIngressPath(&rule.HTTP.Paths[j], pp.Index(j))...)
		}
	}
	for i, tls := range spec.TLS {
		tp := path.Child("tls").Index(i)
		for j, host := range tls.Hosts {
			errs = append(errs, hostErrors(tp.Child("hosts").Index(j), host)...)
		}
		if tls.SecretName != "" {
			for _, msg := range apivalidation.NameIsDNSSubdomain(tls.SecretName, false) {
				errs = append(errs, field.Invalid(tp.Child("secretName"), tls.SecretName, msg))
			}
		}
	}
	if spec.IngressClassName != nil {
		for _, msg := range apivalidation.NameIsDNSSubdomain(*spec.IngressClassName, false) {
			errs = append(errs, field.Invalid(path.Child("ingressClassName"), *spec.IngressClassName, msg))
		}
	}
	for i, lb := range in.Status.LoadBalancer.Ingress {
		lp := field.NewPath("status", "loadBalancer", "ingress").Index(i)
		if lb.IP != "" {
			if _, err := netip.ParseAddr(lb.IP); err != nil {
				errs = append(errs, field.Invalid(lp.Child("ip"), lb.IP, "must be a valid IP address"))
			}
		}
		if lb.Hostname != "" {
			for _, msg := range validation.IsDNS1123Subdomain(lb.Hostname) {
				errs = append(errs, field.Invalid(lp.Child("hostname"), lb.Hostname, msg))
			}
			if _, err := netip.ParseAddr(lb.Hostname); err == nil {
				errs = append(errs, field.Invalid(lp.Child("hostname"), lb.Hostname, "must be a DNS name, not an IP address"))
			}
		}
	}
	return errs
}

// hostErrors: a DNS name, or one whose first label is a lone *.
func hostErrors(path *field.Path, host string) field.ErrorList {
	var errs field.ErrorList
	check := validation.IsDNS1123Subdomain
	if strings.Contains(host, "*") {
		check = validation.IsWildcardDNS1123Subdomain
	}
	for _, msg := range check(host) {
		errs = append(errs, field.Invalid(path, host, msg))
	}
	return errs
}

func validateIngressPath(p *networkingv1.HTTPIngressPath, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if p.PathType == nil {
		return append(errs, field.Required(path.Child("pathType"), "pathType must be specified"))
	}
	switch *p.PathType {
	case networkingv1.PathTypeExact, networkingv1.PathTypePrefix:
		if !strings.HasPrefix(p.Path, "/") {
			errs = append(errs, field.Invalid(path.Child("path"), p.Path, "must be an absolute path"))
		}
		for _, bad := range badPathParts {
			if strings.Contains(p.Path, bad) {
				errs = append(errs, field.Invalid(path.Child("path"), p.Path, fmt.Sprintf("must not contain '%s'", bad)))
			}
		}
		for _, bad := range badPathSuffixes {
			if strings.HasSuffix(p.Path, bad) {
				errs = append(errs, field.Invalid(path.Child("path"), p.Path, fmt.Sprintf("cannot end with '%s'", bad)))
			}
		}
	case networkingv1.PathTypeImplementationSpecific:
		if p.Path != "" && !strings.HasPrefix(p.Path, "/") {
			errs = append(errs, field.Invalid(path.Child("path"), p.Path, "must be an absolute path"))
		}
	default:
		errs = append(errs, field.NotSupported(path.Child("pathType"), *p.PathType, pathTypes))
	}
	return append(errs, validateIngressBackend(&p.Backend, path.Child("backend"))...)
}

func validateIngressBackend(b *networkingv1.IngressBackend, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch {
	case b.Resource != nil && b.Service != nil:
		return append(errs, field.Invalid(path, "", "cannot set both resource and service backends"))
	case b.Resource != nil:
		r, rp := b.Resource, path.Child("resource")
		if r.APIGroup != nil {
			for _, msg := range validation.IsDNS1123Subdomain(*r.APIGroup) {
				errs = append(errs, field.Invalid(rp.Child("apiGroup"), *r.APIGroup, msg))
			}
		}
		errs = append(errs, segmentErrors(rp.Child("kind"), r.Kind)...)
		errs = append(errs, segmentErrors(rp.Child("name"), r.Name)...)
	case b.Service != nil:
		sp := path.Child("service")
		if b.Service.Name == "" {
			errs = append(errs, field.Required(sp.Child("name"), ""))
		} else {
			// RelaxedServiceNameValidation, GA in 1.37: a DNS label.
			for _, msg := range apivalidation.NameIsDNSLabel(b.Service.Name, false) {
				errs = append(errs, field.Invalid(sp.Child("name"), b.Service.Name, msg))
			}
		}
		port := b.Service.Port
		switch {
		case port.Name != "" && port.Number != 0:
			errs = append(errs, field.Invalid(path, "", "cannot set both port name & port number"))
		case port.Name != "":
			for _, msg := range validation.IsValidPortName(port.Name) {
				errs = append(errs, field.Invalid(sp.Child("port", "name"), port.Name, msg))
			}
		case port.Number != 0:
			for _, msg := range validation.IsValidPortNum(int(port.Number)) {
				errs = append(errs, field.Invalid(sp.Child("port", "number"), port.Number, msg))
			}
		default:
			errs = append(errs, field.Required(path, "port name or number is required"))
		}
	default:
		errs = append(errs, field.Invalid(path, "", "resource or service backend is required"))
	}
	return errs
}

// segmentErrors: required, and usable as a path segment.
func segmentErrors(path *field.Path, value string) field.ErrorList {
	if value == "" {
		return field.ErrorList{field.Required(path, "")}
	}
	var errs field.ErrorList
	for _, msg := range resources.PathSegmentName(value, false) {
		errs = append(errs, field.Invalid(path, value, msg))
	}
	return errs
}

// maxControllerLength is how long an IngressClass's controller may be.
const maxControllerLength = 250

func ingressClasses() *resources.Resource {
	return resources.Described[networkingv1.IngressClass, networkingv1.IngressClassList](&resources.Resource{
		GroupVersionKind: resources.GVK("networking.k8s.io", "IngressClass"), Plural: "ingressclasses", Singular: "ingressclass",
		StorageKey: "ingressclasses", HasSpec: true,
		Default: resources.Typed(func(c *networkingv1.IngressClass) {
			if c.Spec.Parameters != nil && c.Spec.Parameters.Scope == nil {
				c.Spec.Parameters.Scope = ptr.To(networkingv1.IngressClassParametersReferenceScopeCluster)
			}
		}),
		Validate: resources.TypedValidate(validateIngressClass),
		ValidateUpdate: resources.TypedValidateUpdate(func(c, old *networkingv1.IngressClass) field.ErrorList {
			return resources.Immutable(c.Spec.Controller, old.Spec.Controller, resources.SpecPath.Child("controller"))
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("Controller", "string", 0, networkingv1.IngressClassSpec{}.SwaggerDoc()["controller"]),
			resources.Col("Parameters", "string", 0, networkingv1.IngressClassSpec{}.SwaggerDoc()["parameters"]),
			resources.AgeCol},
		Row: resources.TypedRow(func(c *networkingv1.IngressClass) []any {
			params := "<none>"
			if p := c.Spec.Parameters; p != nil {
				params = p.Kind + "/" + p.Name
				if p.APIGroup != nil && *p.APIGroup != "" {
					params = *p.APIGroup + "/" + params
				}
			}
			return []any{c.Name, c.Spec.Controller, params, resources.Age(c.CreationTimestamp)}
		}),
	})
}

// validateIngressClass is Kubernetes' validation of an IngressClass: a
// domain-prefixed controller name, and parameters naming a kind and an
// object at the cluster scope or in a namespace.
func validateIngressClass(c *networkingv1.IngressClass) field.ErrorList {
	var errs field.ErrorList
	cp := resources.SpecPath.Child("controller")
	if len(c.Spec.Controller) > maxControllerLength {
		errs = append(errs, field.TooLong(cp, "", maxControllerLength))
	}
	errs = append(errs, validation.IsDomainPrefixedPath(cp, c.Spec.Controller)...)
	p := c.Spec.Parameters
	if p == nil {
		return errs
	}
	pp := resources.SpecPath.Child("parameters")
	if p.APIGroup != nil {
		for _, msg := range validation.IsDNS1123Subdomain(*p.APIGroup) {
			errs = append(errs, field.Invalid(pp.Child("apiGroup"), *p.APIGroup, msg))
		}
	}
	errs = append(errs, segmentErrors(pp.Child("kind"), p.Kind)...)
	errs = append(errs, segmentErrors(pp.Child("name"), p.Name)...)
	switch scope := ptr.Deref(p.Scope, ""); scope {
	case "":
		errs = append(errs, field.Required(pp.Child("scope"), ""))
	case networkingv1.IngressClassParametersReferenceScopeNamespace:
		if p.Namespace == nil {
			errs = append(errs, field.Required(pp.Child("namespace"), "`parameters.scope` is set to 'Namespace'"))
		} else {
			for _, msg := range apivalidation.ValidateNamespaceName(*p.Namespace, false) {
				errs = append(errs, field.Invalid(pp.Child("namespace"), *p.Namespace, msg))
			}
		}
	case networkingv1.IngressClassParametersReferenceScopeCluster:
		if p.Namespace != nil {
			errs = append(errs, field.Forbidden(pp.Child("namespace"), "`parameters.scope` is set to 'Cluster'"))
		}
	default:
		errs = append(errs, field.NotSupported(pp.Child("scope"), scope, []string{networkingv1.IngressClassParametersReferenceScopeCluster, networkingv1.IngressClassParametersReferenceScopeNamespace}))
	}
	return errs
}
