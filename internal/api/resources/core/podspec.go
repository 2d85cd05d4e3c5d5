package core

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/orch-dev/orch/internal/api/resources/certificates"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// The defaults below are Kubernetes' own (pkg/apis/core/v1/defaults.go and
// the DefaultTolerationSeconds admission plugin), for the fields users and
// kubectl see. An explicit value is never overwritten.

func defaultPodSpec(spec *corev1.PodSpec) {
	if spec.RestartPolicy == "" {
		spec.RestartPolicy = corev1.RestartPolicyAlways
	}
	if spec.DNSPolicy == "" {
		spec.DNSPolicy = corev1.DNSClusterFirst
	}
	if spec.TerminationGracePeriodSeconds == nil {
		spec.TerminationGracePeriodSeconds = ptr.To[int64](corev1.DefaultTerminationGracePeriodSeconds)
	}
	if spec.SchedulerName == "" {
		spec.SchedulerName = corev1.DefaultSchedulerName
	}
	if spec.SecurityContext == nil {
		spec.SecurityContext = &corev1.PodSecurityContext{}
	}
	if spec.EnableServiceLinks == nil {
		spec.EnableServiceLinks = ptr.To(corev1.DefaultEnableServiceLinks)
	}
	if spec.HostNetwork {
		for i := range spec.Containers {
			defaultHostPorts(spec.Containers[i].Ports)
		}
		for i := range spec.InitContainers {
			defaultHostPorts(spec.InitContainers[i].Ports)
		}
	}
	for i := range spec.InitContainers {
		defaultContainer(&spec.InitContainers[i])
	}
	for i := range spec.Containers {
		defaultContainer(&spec.Containers[i])
	}
	defaultEphemeralContainers(spec)
	for i := range spec.Volumes {
		defaultVolume(&spec.Volumes[i])
	}
}

// defaultHostPorts makes a host-network pod's hostPort equal its containerPort.
func defaultHostPorts(ports []corev1.ContainerPort) {
	for i := range ports {
		if ports[i].HostPort == 0 {
			ports[i].HostPort = ports[i].ContainerPort
		}
	}
}

func defaultContainer(c *corev1.Container) {
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = pullPolicyFor(c.Image)
	}
	if c.TerminationMessagePath == "" {
		c.TerminationMessagePath = corev1.TerminationMessagePathDefault
	}
	if c.TerminationMessagePolicy == "" {
		c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
	}
	for i := range c.Ports {
		if c.Ports[i].Protocol == "" {
			c.Ports[i].Protocol = corev1.ProtocolTCP
		}
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		defaultProbe(p)
	}
	for i := range c.Env {
		if ref := c.Env[i].ValueFrom; ref != nil && ref.FieldRef != nil && ref.FieldRef.APIVersion == "" {
			ref.FieldRef.APIVersion = "v1"
		}
	}
}

// pullPolicyFor is Kubernetes' rule: Always for :latest or an untagged
// image, IfNotPresent for anything pinned.
func pullPolicyFor(image string) corev1.PullPolicy {
	if strings.Contains(image, "@") {
		return corev1.PullIfNotPresent
	}
	name := image[strings.LastIndex(image, "/")+1:]
	_, tag, tagged := strings.Cut(name, ":")
	if !tagged || tag == "latest" {
		return corev1.PullAlways
	}
	return corev1.PullIfNotPresent
}

func defaultProbe(p *corev1.Probe) {
	if p == nil {
		return
	}
	if p.TimeoutSeconds == 0 {
		p.TimeoutSeconds = 1
	}
	if p.PeriodSeconds == 0 {
		p.PeriodSeconds = 10
	}
	if p.SuccessThreshold == 0 {
		p.SuccessThreshold = 1
	}
	if p.FailureThreshold == 0 {
		p.FailureThreshold = 3
	}
	if p.HTTPGet != nil {
		if p.HTTPGet.Path == "" {
			p.HTTPGet.Path = "/"
		}
		if p.HTTPGet.Scheme == "" {
			p.HTTPGet.Scheme = corev1.URISchemeHTTP
		}
	}
}

func defaultVolume(v *corev1.Volume) {
	src := &v.VolumeSource
	switch {
	case src.ConfigMap != nil:
		if src.ConfigMap.DefaultMode == nil {
			src.ConfigMap.DefaultMode = ptr.To(corev1.ConfigMapVolumeSourceDefaultMode)
		}
	case src.Secret != nil:
		if src.Secret.DefaultMode == nil {
			src.Secret.DefaultMode = ptr.To(corev1.SecretVolumeSourceDefaultMode)
		}
	case src.DownwardAPI != nil:
		if src.DownwardAPI.DefaultMode == nil {
			src.DownwardAPI.DefaultMode = ptr.To(corev1.DownwardAPIVolumeSourceDefaultMode)
		}
	case src.Projected != nil:
		if src.Projected.DefaultMode == nil {
			src.Projected.DefaultMode = ptr.To(corev1.ProjectedVolumeSourceDefaultMode)
		}
		for _, s := range src.Projected.Sources {
			if t := s.ServiceAccountToken; t != nil && t.ExpirationSeconds == nil {
				t.ExpirationSeconds = ptr.To[int64](60 * 60)
			}
		}
	case src.HostPath != nil:
		if src.HostPath.Type == nil {
			src.HostPath.Type = ptr.To(corev1.HostPathUnset)
		}
	case src.EmptyDir == nil && src.PersistentVolumeClaim == nil && src.NFS == nil && src.CSI == nil && src.Ephemeral == nil && src.Image == nil:
		// A volume with no source is an emptyDir, as in Kubernetes.
		src.EmptyDir = &corev1.EmptyDirVolumeSource{}
	}
}

// DefaultPodTemplate applies the pod spec defaults to a workload's template.
func DefaultPodTemplate(t *corev1.PodTemplateSpec) { defaultPodSpec(&t.Spec) }

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
		if v.Projected != nil {
			errs = append(errs, validateTokenProjections(v.Projected, p.Child("projected"))...)
		}
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
	errs = append(errs, validateEphemeralContainers(spec, path.Child("ephemeralContainers"), names, volumes)...)
	for i, c := range spec.Containers {
		errs = append(errs, validateResizePolicy(c.ResizePolicy, path.Child("containers").Index(i).Child("resizePolicy"), spec.RestartPolicy)...)
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
	errs = append(errs, ValidateTolerations(spec.Tolerations, path.Child("tolerations"))...)
	if sc := spec.SecurityContext; sc != nil {
		errs = append(errs, validateSysctls(sc.Sysctls, spec, path.Child("securityContext", "sysctls"))...)
	}
	return append(errs, validateResourceClaims(spec, path)...)
}

// validateResourceClaims checks a pod's resource claims as Kubernetes
// does: named uniquely (DNS labels), each from a claim or a template
// (exactly one), and containers using only claims the pod has.
func validateResourceClaims(spec *corev1.PodSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	claims := sets.New[string]()
	for i, c := range spec.ResourceClaims {
		p := path.Child("resourceClaims").Index(i)
		switch msgs := validation.IsDNS1123Label(c.Name); {
		case c.Name == "":
			errs = append(errs, field.Required(p.Child("name"), ""))
		case len(msgs) > 0:
			errs = append(errs, field.Invalid(p.Child("name"), c.Name, strings.Join(msgs, "; ")))
		case claims.Has(c.Name):
			errs = append(errs, field.Duplicate(p.Child("name"), c.Name))
		}
		claims.Insert(c.Name)
		if (c.ResourceClaimName == nil) == (c.ResourceClaimTemplateName == nil) {
			errs = append(errs, field.Invalid(p, c, "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`"))
		}
	}
	for _, list := range []struct {
		cs   []corev1.Container
		path *field.Path
	}{{spec.InitContainers, path.Child("initContainers")}, {spec.Containers, path.Child("containers")}} {
		for i, c := range list.cs {
			for j, rc := range c.Resources.Claims {
				if !claims.Has(rc.Name) {
					errs = append(errs, field.NotFound(list.path.Index(i).Child("resources", "claims").Index(j), rc.Name))
				}
			}
		}
	}
	return errs
}

// sysctlName is Kubernetes' rule for a sysctl's name: dot- or
// slash-separated segments of lower-case alphanumerics, '-' and '_'.
var sysctlName = regexp.MustCompile(`^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$`)

// validateSysctls checks a pod's sysctls as Kubernetes does: well-formed
// names, each once, and no network (ipc) sysctl for a pod sharing the
// node's network (ipc) namespace.
func validateSysctls(sysctls []corev1.Sysctl, spec *corev1.PodSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := sets.New[string]()
	for i, s := range sysctls {
		p := path.Index(i).Child("name")
		switch {
		case s.Name == "":
			errs = append(errs, field.Required(p, ""))
		case len(s.Name) > 253 || !sysctlName.MatchString(s.Name):
			errs = append(errs, field.Invalid(p, s.Name, "must have at most 253 characters and match regex "+sysctlName.String()))
		case seen.Has(s.Name):
			errs = append(errs, field.Duplicate(p, s.Name))
		}
		seen.Insert(s.Name)
		name := strings.ReplaceAll(s.Name, "/", ".")
		switch {
		case spec.HostNetwork && strings.HasPrefix(name, "net."):
			errs = append(errs, field.Invalid(p, s.Name, "may not be specified when 'hostNetwork' is true"))
		case spec.HostIPC && (strings.HasPrefix(name, "kernel.shm") || strings.HasPrefix(name, "kernel.msg") || name == "kernel.sem" || strings.HasPrefix(name, "fs.mqueue.")):
			errs = append(errs, field.Invalid(p, s.Name, "may not be specified when 'hostIPC' is true"))
		}
	}
	return errs
}

// ValidateTolerations checks tolerations at path: a known operator, no
// value with Exists, a key unless Exists.
func ValidateTolerations(tolerations []corev1.Toleration, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, t := range tolerations {
		p := path.Index(i)
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

// validateTokenProjections checks a projected volume's service-account
// token sources as Kubernetes does (a path, and a lifetime from ten
// minutes to 2^32 seconds), and its clusterTrustBundle and podCertificate
// sources.
func validateTokenProjections(v *corev1.ProjectedVolumeSource, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, s := range v.Sources {
		if s.ClusterTrustBundle != nil {
			errs = append(errs, validateTrustBundleProjection(s.ClusterTrustBundle, path.Child("sources").Index(i).Child("clusterTrustBundle"))...)
		}
		if s.PodCertificate != nil {
			errs = append(errs, validatePodCertificateProjection(s.PodCertificate, path.Child("sources").Index(i).Child("podCertificate"))...)
		}
		t := s.ServiceAccountToken
		if t == nil {
			continue
		}
		p := path.Child("sources").Index(i).Child("serviceAccountToken")
		if t.Path == "" {
			errs = append(errs, field.Required(p.Child("path"), ""))
		}
		if secs := ptr.Deref(t.ExpirationSeconds, 3600); secs < 10*60 {
			errs = append(errs, field.Invalid(p.Child("expirationSeconds"), secs, "may not specify a duration less than 10 minutes"))
		} else if secs > 1<<32 {
			errs = append(errs, field.Invalid(p.Child("expirationSeconds"), secs, "may not specify a duration larger than 2^32 seconds"))
		}
	}
	return errs
}

// validateTrustBundleProjection: a bundle by name (no selector) or a
// signer's (with a valid selector), and a path.
func validateTrustBundleProjection(b *corev1.ClusterTrustBundleProjection, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch {
	case b.Name != nil && b.SignerName != nil:
		errs = append(errs, field.Invalid(p, "<projection>", "only one of name and signerName may be used"))
	case b.Name != nil:
		if *b.Name == "" {
			errs = append(errs, field.Required(p.Child("name"), "must be a valid object name"))
		}
		if b.LabelSelector != nil {
			errs = append(errs, field.Invalid(p.Child("labelSelector"), "<selector>", "labelSelector must be unset if name is specified"))
		}
	case b.SignerName != nil:
		errs = append(errs, certificates.ValidateSignerName(p.Child("signerName"), *b.SignerName)...)
		errs = append(errs, metav1validation.ValidateLabelSelector(b.LabelSelector, metav1validation.LabelSelectorValidationOptions{}, p.Child("labelSelector"))...)
	default:
		errs = append(errs, field.Required(p, "either name or signerName must be specified"))
	}
	if b.Path == "" {
		errs = append(errs, field.Required(p.Child("path"), ""))
	}
	return errs
}

// validatePodCertificateProjection is Kubernetes' check of a
// podCertificate source: a signer, a key type, maxExpirationSeconds from
// an hour to the signer's maximum (a day for kubernetes.io signers, 91
// days for others), and at least one path.
func validatePodCertificateProjection(c *corev1.PodCertificateProjection, p *field.Path) field.ErrorList {
	errs := certificates.ValidateSignerName(p.Child("signerName"), c.SignerName)
	if c.UserAnnotations != nil {
		errs = append(errs, certificates.ValidateUserAnnotations(c.UserAnnotations, p.Child("userAnnotations"))...)
	}
	keyTypes := []string{"RSA3072", "RSA4096", "ECDSAP256", "ECDSAP384", "ECDSAP521", "ED25519"}
	if !slices.Contains(keyTypes, c.KeyType) {
		errs = append(errs, field.NotSupported(p.Child("keyType"), c.KeyType, keyTypes))
	}
	if m := c.MaxExpirationSeconds; m != nil {
		if *m < certificates.MinMaxExpirationSeconds {
			errs = append(errs, field.Invalid(p.Child("maxExpirationSeconds"), *m, "if provided, maxExpirationSeconds must be >= 3600"))
		}
		upper := int32(certificates.MaxMaxExpirationSeconds)
		if certificates.IsKubernetesSigner(c.SignerName) {
			upper = certificates.KubernetesMaxMaxExpirationSeconds
		}
		if *m > upper {
			errs = append(errs, field.Invalid(p.Child("maxExpirationSeconds"), *m, fmt.Sprintf("if provided, maxExpirationSeconds must be <= %d", upper)))
		}
	}
	if c.CredentialBundlePath == "" && c.KeyPath == "" && c.CertificateChainPath == "" {
		errs = append(errs, field.Required(p, "specify at least one of credentialBundlePath, keyPath, and certificateChainPath"))
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

// ValidatePodTemplate is the rule every workload shares: a selector
// that is required, valid, not empty, and matching the template's labels,
// over a valid pod template.
func ValidatePodTemplate(sel *metav1.LabelSelector, tmpl *corev1.PodTemplateSpec, path *field.Path) field.ErrorList {
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
	return append(errs, ValidatePodTemplateSpec(tmpl, path.Child("template"))...)
}

// ValidatePodTemplateSpec checks a pod template at path on its own, as a
// template whose selector its controller makes (a CronJob's job template).
func ValidatePodTemplateSpec(tmpl *corev1.PodTemplateSpec, path *field.Path) field.ErrorList {
	errs := metav1validation.ValidateLabels(tmpl.Labels, path.Child("metadata", "labels"))
	errs = append(errs, validatePodSpec(&tmpl.Spec, path.Child("spec"))...)
	if len(tmpl.Spec.EphemeralContainers) > 0 {
		errs = append(errs, field.Forbidden(path.Child("spec", "ephemeralContainers"), "ephemeral containers not allowed in pod template"))
	}
	return errs
}

// ContainersAndImages are a workload table's Containers and Images cells.
func ContainersAndImages(spec *corev1.PodSpec) (string, string) {
	var names, images []string
	for _, c := range spec.Containers {
		names = append(names, c.Name)
		images = append(images, c.Image)
	}
	return strings.Join(names, ","), strings.Join(images, ",")
}
