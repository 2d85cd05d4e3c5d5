package resources

import (
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// The defaults below are Kubernetes' own (pkg/apis/*/v1/defaults.go and the
// DefaultTolerationSeconds admission plugin), for the fields users and
// kubectl see. An explicit value is never overwritten.

const defaultTolerationSeconds = 300

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
	case src.HostPath != nil:
		if src.HostPath.Type == nil {
			src.HostPath.Type = ptr.To(corev1.HostPathUnset)
		}
	case src.EmptyDir == nil && src.PersistentVolumeClaim == nil && src.NFS == nil && src.CSI == nil && src.Ephemeral == nil && src.Image == nil:
		// A volume with no source is an emptyDir, as in Kubernetes.
		src.EmptyDir = &corev1.EmptyDirVolumeSource{}
	}
}

// defaultTolerations is the DefaultTolerationSeconds admission plugin: a pod
// rides out a not-ready or unreachable node for five minutes unless it says
// otherwise.
func defaultTolerations(spec *corev1.PodSpec) {
	for _, key := range []string{corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable} {
		found := false
		for _, t := range spec.Tolerations {
			if (t.Key == key || t.Key == "" && t.Operator == corev1.TolerationOpExists) &&
				(t.Effect == corev1.TaintEffectNoExecute || t.Effect == "") {
				found = true
				break
			}
		}
		if !found {
			spec.Tolerations = append(spec.Tolerations, corev1.Toleration{
				Key: key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute,
				TolerationSeconds: ptr.To[int64](defaultTolerationSeconds),
			})
		}
	}
}

func defaultPod(pod *corev1.Pod) {
	defaultPodSpec(&pod.Spec)
	defaultTolerations(&pod.Spec)
	if pod.Spec.Priority == nil {
		pod.Spec.Priority = ptr.To[int32](0)
	}
	// Kubernetes' ServiceAccount admission: a pod that names no service
	// account runs as its namespace's "default" one. The deprecated
	// serviceAccount field mirrors serviceAccountName, as in v1.
	if pod.Spec.ServiceAccountName == "" {
		pod.Spec.ServiceAccountName = pod.Spec.DeprecatedServiceAccount
	}
	if pod.Spec.ServiceAccountName == "" {
		pod.Spec.ServiceAccountName = "default"
	}
	pod.Spec.DeprecatedServiceAccount = pod.Spec.ServiceAccountName
}

func defaultTemplate(t *corev1.PodTemplateSpec) { defaultPodSpec(&t.Spec) }

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

func defaultDeployment(d *appsv1.Deployment) {
	if d.Spec.Replicas == nil {
		d.Spec.Replicas = ptr.To[int32](1)
	}
	s := &d.Spec.Strategy
	if s.Type == "" {
		s.Type = appsv1.RollingUpdateDeploymentStrategyType
	}
	if s.Type == appsv1.RollingUpdateDeploymentStrategyType {
		if s.RollingUpdate == nil {
			s.RollingUpdate = &appsv1.RollingUpdateDeployment{}
		}
		if s.RollingUpdate.MaxUnavailable == nil {
			s.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromString("25%"))
		}
		if s.RollingUpdate.MaxSurge == nil {
			s.RollingUpdate.MaxSurge = ptr.To(intstr.FromString("25%"))
		}
	}
	if d.Spec.RevisionHistoryLimit == nil {
		d.Spec.RevisionHistoryLimit = ptr.To[int32](10)
	}
	if d.Spec.ProgressDeadlineSeconds == nil {
		d.Spec.ProgressDeadlineSeconds = ptr.To[int32](600)
	}
	defaultTemplate(&d.Spec.Template)
}

func defaultReplicaSet(rs *appsv1.ReplicaSet) {
	if rs.Spec.Replicas == nil {
		rs.Spec.Replicas = ptr.To[int32](1)
	}
	defaultTemplate(&rs.Spec.Template)
}

func defaultDaemonSet(ds *appsv1.DaemonSet) {
	s := &ds.Spec.UpdateStrategy
	if s.Type == "" {
		s.Type = appsv1.RollingUpdateDaemonSetStrategyType
	}
	if s.Type == appsv1.RollingUpdateDaemonSetStrategyType {
		if s.RollingUpdate == nil {
			s.RollingUpdate = &appsv1.RollingUpdateDaemonSet{}
		}
		if s.RollingUpdate.MaxUnavailable == nil {
			s.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromInt32(1))
		}
		if s.RollingUpdate.MaxSurge == nil {
			s.RollingUpdate.MaxSurge = ptr.To(intstr.FromInt32(0))
		}
	}
	if ds.Spec.RevisionHistoryLimit == nil {
		ds.Spec.RevisionHistoryLimit = ptr.To[int32](10)
	}
	defaultTemplate(&ds.Spec.Template)
}

func defaultJob(job *batchv1.Job) {
	spec := &job.Spec
	if spec.Completions == nil && spec.Parallelism == nil {
		spec.Completions = ptr.To[int32](1)
		spec.Parallelism = ptr.To[int32](1)
	}
	if spec.Parallelism == nil {
		spec.Parallelism = ptr.To[int32](1)
	}
	if spec.BackoffLimit == nil {
		spec.BackoffLimit = ptr.To[int32](6)
	}
	if spec.CompletionMode == nil {
		spec.CompletionMode = ptr.To(batchv1.NonIndexedCompletion)
	}
	if spec.Suspend == nil {
		spec.Suspend = ptr.To(false)
	}
	if spec.PodReplacementPolicy == nil {
		spec.PodReplacementPolicy = ptr.To(batchv1.TerminatingOrFailed)
	}
	if spec.ManualSelector == nil || !*spec.ManualSelector {
		// The Job gets a selector on its own uid, as Kubernetes' job strategy
		// does; the uid is set by the registry before defaults run.
		uid := string(job.UID)
		labels := map[string]string{batchv1.ControllerUidLabel: uid, batchv1.JobNameLabel: job.Name,
			"controller-uid": uid, "job-name": job.Name}
		if spec.Selector == nil {
			spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{batchv1.ControllerUidLabel: uid}}
		}
		if spec.Template.Labels == nil {
			spec.Template.Labels = map[string]string{}
		}
		for k, v := range labels {
			if _, ok := spec.Template.Labels[k]; !ok {
				spec.Template.Labels[k] = v
			}
		}
	}
	defaultTemplate(&spec.Template)
}

func defaultNamespace(ns *corev1.Namespace) {
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels[corev1.LabelMetadataName] = ns.Name
	if len(ns.Spec.Finalizers) == 0 && ns.DeletionTimestamp == nil {
		ns.Spec.Finalizers = []corev1.FinalizerName{corev1.FinalizerKubernetes}
	}
	if ns.Status.Phase == "" {
		ns.Status.Phase = corev1.NamespaceActive
	}
}

func defaultSecret(s *corev1.Secret) {
	if s.Type == "" {
		s.Type = corev1.SecretTypeOpaque
	}
	// stringData is write-only: Kubernetes folds it into data, where it
	// wins over a key of the same name, and never stores or returns it.
	for k, v := range s.StringData {
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		s.Data[k] = []byte(v)
	}
	s.StringData = nil
}
