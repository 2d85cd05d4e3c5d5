package resources

import (
	"encoding/json"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The checks below follow Kubernetes' pkg/apis/*/validation for what users
// hit: names, required fields, enums, selectors that must match their
// template, and immutable fields, with the same field paths and messages.

var (
	metaPath = field.NewPath("metadata")
	specPath = field.NewPath("spec")
)

// ValidateMeta checks an object's metadata; nameFn is the resource's rule for
// names (DNS subdomain for most, DNS label for namespaces and services).
func ValidateMeta(r *Resource, obj runtime.Object) field.ErrorList {
	m, err := meta.Accessor(obj)
	if err != nil {
		return field.ErrorList{field.InternalError(metaPath, err)}
	}
	nameFn := apivalidation.NameIsDNSSubdomain
	switch r.Plural {
	case "namespaces", "services":
		nameFn = apivalidation.NameIsDNSLabel
	case "nodes", "events":
		nameFn = func(name string, prefix bool) []string { return pathSegmentName(name) }
	}
	errs := apivalidation.ValidateObjectMetaAccessor(m, r.Namespaced, nameFn, metaPath)
	errs = append(errs, metav1validation.ValidateLabels(m.GetLabels(), metaPath.Child("labels"))...)
	return errs
}

// pathSegmentName is Kubernetes' rule for names that only need to fit in a
// URL path segment (events, and nodes which often carry FQDNs).
func pathSegmentName(name string) []string {
	for _, bad := range []string{".", ".."} {
		if name == bad {
			return []string{fmt.Sprintf("may not be '%s'", bad)}
		}
	}
	for _, bad := range []string{"/", "%"} {
		if strings.Contains(name, bad) {
			return []string{fmt.Sprintf("may not contain '%s'", bad)}
		}
	}
	return nil
}

func validatePodSpec(spec *corev1.PodSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(spec.Containers) == 0 {
		errs = append(errs, field.Required(path.Child("containers"), ""))
	}
	names := sets.New[string]()
	errs = append(errs, validateContainers(spec.InitContainers, path.Child("initContainers"), names)...)
	errs = append(errs, validateContainers(spec.Containers, path.Child("containers"), names)...)
	volumes := sets.New[string]()
	for i, v := range spec.Volumes {
		p := path.Child("volumes").Index(i)
		if v.Name == "" {
			errs = append(errs, field.Required(p.Child("name"), ""))
		} else if msgs := validation.IsDNS1123Label(v.Name); len(msgs) > 0 {
			errs = append(errs, field.Invalid(p.Child("name"), v.Name, strings.Join(msgs, "; ")))
		} else if volumes.Has(v.Name) {
			errs = append(errs, field.Duplicate(p.Child("name"), v.Name))
		}
		volumes.Insert(v.Name)
	}
	for _, list := range []struct {
		cs   []corev1.Container
		path *field.Path
	}{{spec.InitContainers, path.Child("initContainers")}, {spec.Containers, path.Child("containers")}} {
		for i, c := range list.cs {
			for j, m := range c.VolumeMounts {
				if !volumes.Has(m.Name) {
					errs = append(errs, field.NotFound(list.path.Index(i).Child("volumeMounts").Index(j).Child("name"), m.Name))
				}
			}
		}
	}
	switch spec.RestartPolicy {
	case corev1.RestartPolicyAlways, corev1.RestartPolicyOnFailure, corev1.RestartPolicyNever:
	case "":
		errs = append(errs, field.Required(path.Child("restartPolicy"), ""))
	default:
		errs = append(errs, field.NotSupported(path.Child("restartPolicy"), spec.RestartPolicy,
			[]string{string(corev1.RestartPolicyAlways), string(corev1.RestartPolicyOnFailure), string(corev1.RestartPolicyNever)}))
	}
	switch spec.DNSPolicy {
	case corev1.DNSClusterFirst, corev1.DNSClusterFirstWithHostNet, corev1.DNSDefault, corev1.DNSNone, "":
	default:
		errs = append(errs, field.NotSupported(path.Child("dnsPolicy"), spec.DNSPolicy,
			[]string{string(corev1.DNSClusterFirstWithHostNet), string(corev1.DNSClusterFirst), string(corev1.DNSDefault), string(corev1.DNSNone)}))
	}
	if g := spec.TerminationGracePeriodSeconds; g != nil && *g < 0 {
		errs = append(errs, field.Invalid(path.Child("terminationGracePeriodSeconds"), *g, "must be greater than or equal to 0"))
	}
	if d := spec.ActiveDeadlineSeconds; d != nil && *d <= 0 {
		errs = append(errs, field.Invalid(path.Child("activeDeadlineSeconds"), *d, "must be greater than 0"))
	}
	for k, v := range spec.NodeSelector {
		errs = append(errs, metav1validation.ValidateLabels(map[string]string{k: v}, path.Child("nodeSelector"))...)
	}
	for i, t := range spec.Tolerations {
		p := path.Child("tolerations").Index(i)
		switch t.Operator {
		case corev1.TolerationOpEqual, "":
		case corev1.TolerationOpExists:
			if t.Value != "" {
				errs = append(errs, field.Invalid(p.Child("operator"), t.Value, "value must be empty when `operator` is 'Exists'"))
			}
		default:
			errs = append(errs, field.NotSupported(p.Child("operator"), t.Operator, []string{string(corev1.TolerationOpEqual), string(corev1.TolerationOpExists)}))
		}
		if t.Key == "" && t.Operator != corev1.TolerationOpExists {
			errs = append(errs, field.Invalid(p.Child("operator"), t.Operator, "operator must be Exists when `key` is empty, which means \"match all values and all keys\""))
		}
	}
	return errs
}

func validateContainers(cs []corev1.Container, path *field.Path, names sets.Set[string]) field.ErrorList {
	var errs field.ErrorList
	for i, c := range cs {
		p := path.Index(i)
		if c.Name == "" {
			errs = append(errs, field.Required(p.Child("name"), ""))
		} else if msgs := validation.IsDNS1123Label(c.Name); len(msgs) > 0 {
			errs = append(errs, field.Invalid(p.Child("name"), c.Name, strings.Join(msgs, "; ")))
		} else if names.Has(c.Name) {
			errs = append(errs, field.Duplicate(p.Child("name"), c.Name))
		}
		names.Insert(c.Name)
		if strings.TrimSpace(c.Image) == "" {
			errs = append(errs, field.Required(p.Child("image"), ""))
		} else if c.Image != strings.TrimSpace(c.Image) {
			errs = append(errs, field.Invalid(p.Child("image"), c.Image, "must not have leading or trailing whitespace"))
		}
		switch c.ImagePullPolicy {
		case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever, "":
		default:
			errs = append(errs, field.NotSupported(p.Child("imagePullPolicy"), c.ImagePullPolicy,
				[]string{string(corev1.PullAlways), string(corev1.PullIfNotPresent), string(corev1.PullNever)}))
		}
		portNames := sets.New[string]()
		for j, port := range c.Ports {
			pp := p.Child("ports").Index(j)
			for _, msg := range validation.IsValidPortNum(int(port.ContainerPort)) {
				errs = append(errs, field.Invalid(pp.Child("containerPort"), port.ContainerPort, msg))
			}
			if port.HostPort != 0 {
				for _, msg := range validation.IsValidPortNum(int(port.HostPort)) {
					errs = append(errs, field.Invalid(pp.Child("hostPort"), port.HostPort, msg))
				}
			}
			if port.Name != "" {
				for _, msg := range validation.IsValidPortName(port.Name) {
					errs = append(errs, field.Invalid(pp.Child("name"), port.Name, msg))
				}
				if portNames.Has(port.Name) {
					errs = append(errs, field.Duplicate(pp.Child("name"), port.Name))
				}
				portNames.Insert(port.Name)
			}
			errs = append(errs, validateProtocol(port.Protocol, pp.Child("protocol"))...)
		}
		for j, e := range c.Env {
			if e.Name == "" {
				errs = append(errs, field.Required(p.Child("env").Index(j).Child("name"), ""))
			}
		}
		for name, q := range c.Resources.Requests {
			if q.Sign() < 0 {
				errs = append(errs, field.Invalid(p.Child("resources", "requests").Key(string(name)), q.String(), "must be greater than or equal to 0"))
			}
			if lim, ok := c.Resources.Limits[name]; ok && q.Cmp(lim) > 0 {
				errs = append(errs, field.Invalid(p.Child("resources", "requests").Key(string(name)), q.String(),
					fmt.Sprintf("must be less than or equal to %s limit of %s", name, lim.String())))
			}
		}
		for name, q := range c.Resources.Limits {
			if q.Sign() < 0 {
				errs = append(errs, field.Invalid(p.Child("resources", "limits").Key(string(name)), q.String(), "must be greater than or equal to 0"))
			}
		}
	}
	return errs
}

func validateProtocol(proto corev1.Protocol, path *field.Path) field.ErrorList {
	switch proto {
	case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
		return nil
	case "":
		return field.ErrorList{field.Required(path, "")}
	}
	return field.ErrorList{field.NotSupported(path, proto, []string{string(corev1.ProtocolSCTP), string(corev1.ProtocolTCP), string(corev1.ProtocolUDP)})}
}

func validatePod(pod *corev1.Pod) field.ErrorList { return validatePodSpec(&pod.Spec, specPath) }

// validatePodUpdate allows only the pod spec changes Kubernetes allows.
func validatePodUpdate(pod, old *corev1.Pod) field.ErrorList {
	mutable := old.Spec.DeepCopy()
	for i := range mutable.Containers {
		if i < len(pod.Spec.Containers) {
			mutable.Containers[i].Image = pod.Spec.Containers[i].Image
		}
	}
	for i := range mutable.InitContainers {
		if i < len(pod.Spec.InitContainers) {
			mutable.InitContainers[i].Image = pod.Spec.InitContainers[i].Image
		}
	}
	mutable.ActiveDeadlineSeconds = pod.Spec.ActiveDeadlineSeconds
	mutable.TerminationGracePeriodSeconds = pod.Spec.TerminationGracePeriodSeconds
	if len(pod.Spec.Tolerations) >= len(old.Spec.Tolerations) &&
		apiequality.Semantic.DeepEqual(pod.Spec.Tolerations[:len(old.Spec.Tolerations)], old.Spec.Tolerations) {
		mutable.Tolerations = pod.Spec.Tolerations
	}
	if !apiequality.Semantic.DeepEqual(mutable, &pod.Spec) {
		return field.ErrorList{field.Forbidden(specPath, "pod updates may not change fields other than `spec.containers[*].image`, "+
			"`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations), "+
			"`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)")}
	}
	return nil
}

// validateSelectorTemplate is the rule every workload shares: a selector
// that is required, valid, not empty, and matching the template's labels.
func validateSelectorTemplate(sel *metav1.LabelSelector, tmpl *corev1.PodTemplateSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if sel == nil {
		return append(errs, field.Required(path.Child("selector"), ""))
	}
	errs = append(errs, metav1validation.ValidateLabelSelector(sel, metav1validation.LabelSelectorValidationOptions{}, path.Child("selector"))...)
	if len(sel.MatchLabels)+len(sel.MatchExpressions) == 0 {
		errs = append(errs, field.Invalid(path.Child("selector"), sel, "empty selector is invalid for deployment"))
	}
	if s, err := metav1.LabelSelectorAsSelector(sel); err == nil && !s.Matches(labels.Set(tmpl.Labels)) {
		errs = append(errs, field.Invalid(path.Child("template", "metadata", "labels"), tmpl.Labels, "`selector` does not match template `labels`"))
	}
	errs = append(errs, metav1validation.ValidateLabels(tmpl.Labels, path.Child("template", "metadata", "labels"))...)
	return append(errs, validatePodSpec(&tmpl.Spec, path.Child("template", "spec"))...)
}

func validateReplicas(n *int32, path *field.Path) field.ErrorList {
	if n != nil && *n < 0 {
		return field.ErrorList{field.Invalid(path, *n, "must be greater than or equal to 0")}
	}
	return nil
}

func validateDeployment(d *appsv1.Deployment) field.ErrorList {
	errs := validateReplicas(d.Spec.Replicas, specPath.Child("replicas"))
	errs = append(errs, validateSelectorTemplate(d.Spec.Selector, &d.Spec.Template, specPath)...)
	if d.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyAlways {
		errs = append(errs, field.NotSupported(specPath.Child("template", "spec", "restartPolicy"), d.Spec.Template.Spec.RestartPolicy, []string{string(corev1.RestartPolicyAlways)}))
	}
	switch d.Spec.Strategy.Type {
	case appsv1.RecreateDeploymentStrategyType:
		if d.Spec.Strategy.RollingUpdate != nil {
			errs = append(errs, field.Forbidden(specPath.Child("strategy", "rollingUpdate"), "may not be specified when strategy `type` is 'Recreate'"))
		}
	case appsv1.RollingUpdateDeploymentStrategyType:
	default:
		errs = append(errs, field.NotSupported(specPath.Child("strategy", "type"), d.Spec.Strategy.Type,
			[]string{string(appsv1.RecreateDeploymentStrategyType), string(appsv1.RollingUpdateDeploymentStrategyType)}))
	}
	return errs
}

func validateReplicaSet(rs *appsv1.ReplicaSet) field.ErrorList {
	errs := validateReplicas(rs.Spec.Replicas, specPath.Child("replicas"))
	return append(errs, validateSelectorTemplate(rs.Spec.Selector, &rs.Spec.Template, specPath)...)
}

func validateDaemonSet(ds *appsv1.DaemonSet) field.ErrorList {
	return validateSelectorTemplate(ds.Spec.Selector, &ds.Spec.Template, specPath)
}

func validateJob(job *batchv1.Job) field.ErrorList {
	errs := validateReplicas(job.Spec.Parallelism, specPath.Child("parallelism"))
	errs = append(errs, validateReplicas(job.Spec.Completions, specPath.Child("completions"))...)
	errs = append(errs, validateReplicas(job.Spec.BackoffLimit, specPath.Child("backoffLimit"))...)
	errs = append(errs, validateSelectorTemplate(job.Spec.Selector, &job.Spec.Template, specPath)...)
	if p := job.Spec.Template.Spec.RestartPolicy; p != corev1.RestartPolicyOnFailure && p != corev1.RestartPolicyNever {
		errs = append(errs, field.NotSupported(specPath.Child("template", "spec", "restartPolicy"), p,
			[]string{string(corev1.RestartPolicyOnFailure), string(corev1.RestartPolicyNever)}))
	}
	return errs
}

// immutable reports a change to a field Kubernetes forbids changing.
func immutable(newVal, oldVal any, path *field.Path) field.ErrorList {
	return apivalidation.ValidateImmutableField(newVal, oldVal, path)
}

func validateService(svc *corev1.Service) field.ErrorList {
	var errs field.ErrorList
	spec := &svc.Spec
	switch spec.Type {
	case corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
		if len(spec.Ports) == 0 && spec.ClusterIP != corev1.ClusterIPNone {
			errs = append(errs, field.Required(specPath.Child("ports"), ""))
		}
	case corev1.ServiceTypeExternalName:
		if spec.ExternalName == "" {
			errs = append(errs, field.Required(specPath.Child("externalName"), ""))
		}
	default:
		errs = append(errs, field.NotSupported(specPath.Child("type"), spec.Type, []string{string(corev1.ServiceTypeClusterIP),
			string(corev1.ServiceTypeExternalName), string(corev1.ServiceTypeLoadBalancer), string(corev1.ServiceTypeNodePort)}))
	}
	names := sets.New[string]()
	for i, p := range spec.Ports {
		pp := specPath.Child("ports").Index(i)
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
		errs = append(errs, metav1validation.ValidateLabels(map[string]string{k: v}, specPath.Child("selector"))...)
	}
	return errs
}

func validateServiceUpdate(svc, old *corev1.Service) field.ErrorList {
	// The clusterIP may not change once set, except by leaving type
	// ExternalName; Kubernetes' rule, minus dual-stack changes.
	if old.Spec.ClusterIP != "" && old.Spec.Type != corev1.ServiceTypeExternalName && svc.Spec.Type != corev1.ServiceTypeExternalName {
		return immutable(svc.Spec.ClusterIP, old.Spec.ClusterIP, specPath.Child("clusterIP"))
	}
	return nil
}

func validateDataKeys[V any](data map[string]V, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for k := range data {
		for _, msg := range validation.IsConfigMapKey(k) {
			errs = append(errs, field.Invalid(path.Key(k), k, msg))
		}
	}
	return errs
}

func validateConfigMap(cm *corev1.ConfigMap) field.ErrorList {
	errs := validateDataKeys(cm.Data, field.NewPath("data"))
	errs = append(errs, validateDataKeys(cm.BinaryData, field.NewPath("binaryData"))...)
	size := 0
	for k, v := range cm.Data {
		size += len(v)
		if _, ok := cm.BinaryData[k]; ok {
			errs = append(errs, field.Invalid(field.NewPath("data").Key(k), k, "duplicate of key present in binaryData"))
		}
	}
	for _, v := range cm.BinaryData {
		size += len(v)
	}
	if size > corev1.MaxSecretSize {
		// The whole object's path, as Kubernetes reports it.
		errs = append(errs, field.TooLong(field.NewPath(""), "", corev1.MaxSecretSize))
	}
	return errs
}

func validateSecret(s *corev1.Secret) field.ErrorList {
	errs := validateDataKeys(s.Data, field.NewPath("data"))
	size := 0
	for _, v := range s.Data {
		size += len(v)
	}
	if size > corev1.MaxSecretSize {
		errs = append(errs, field.TooLong(field.NewPath("data"), "", corev1.MaxSecretSize))
	}
	// A registry credential must parse, as Kubernetes checks: a node would
	// otherwise find out only when it pulls.
	for typ, key := range map[corev1.SecretType]string{corev1.SecretTypeDockerConfigJson: corev1.DockerConfigJsonKey, corev1.SecretTypeDockercfg: corev1.DockerConfigKey} {
		if s.Type != typ {
			continue
		}
		data, ok := s.Data[key]
		if !ok {
			errs = append(errs, field.Required(field.NewPath("data").Key(key), ""))
			continue
		}
		var parsed map[string]any
		if err := json.Unmarshal(data, &parsed); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("data").Key(key), "<secret contents redacted>", err.Error()))
		}
	}
	return errs
}

// validateImmutableData enforces `immutable: true` on ConfigMaps and Secrets.
func validateImmutableData(isImmutable, wasImmutable *bool, data, oldData any) field.ErrorList {
	if wasImmutable == nil || !*wasImmutable {
		return nil
	}
	var errs field.ErrorList
	if isImmutable == nil || !*isImmutable {
		errs = append(errs, field.Forbidden(field.NewPath("immutable"), "field is immutable when `immutable` is set"))
	}
	if !apiequality.Semantic.DeepEqual(data, oldData) {
		errs = append(errs, field.Forbidden(field.NewPath("data"), "field is immutable when `immutable` is set"))
	}
	return errs
}

func validateLease(l *coordinationv1.Lease) field.ErrorList {
	var errs field.ErrorList
	if d := l.Spec.LeaseDurationSeconds; d != nil && *d <= 0 {
		errs = append(errs, field.Invalid(specPath.Child("leaseDurationSeconds"), *d, "must be greater than 0"))
	}
	if t := l.Spec.LeaseTransitions; t != nil && *t < 0 {
		errs = append(errs, field.Invalid(specPath.Child("leaseTransitions"), *t, "must be greater than or equal to 0"))
	}
	return errs
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

func validateEvent(e *corev1.Event) field.ErrorList {
	var errs field.ErrorList
	if e.InvolvedObject.Namespace != "" && e.Namespace != "" && e.InvolvedObject.Namespace != e.Namespace {
		errs = append(errs, field.Invalid(field.NewPath("involvedObject", "namespace"), e.InvolvedObject.Namespace, "does not match event.namespace"))
	}
	return errs
}
