package builtin

import (
	"strings"
	"testing"

	"github.com/orch-dev/orch/internal/api/resources"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

func describe(t *testing.T, group, plural string) *resources.Resource {
	t.Helper()
	for _, r := range Resources() {
		if r.Group == group && r.Plural == plural {
			return r
		}
	}
	t.Fatalf("%s.%s is not described", plural, group)
	return nil
}

// admit runs what the registry runs on a create: defaults, then the
// metadata and the kind's own checks.
func admit(r *resources.Resource, obj runtime.Object) field.ErrorList {
	if r.Default != nil {
		r.Default(obj)
	}
	errs := resources.ValidateMeta(r, obj)
	if r.Validate != nil {
		errs = append(errs, r.Validate(obj)...)
	}
	return errs
}

func om(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name, Namespace: "default"} }

func podSpec(mut func(*corev1.PodSpec)) corev1.PodSpec {
	s := corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox:1.36"}}}
	if mut != nil {
		mut(&s)
	}
	return s
}

func template(labels map[string]string, mut func(*corev1.PodSpec)) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: podSpec(mut)}
}

var app = map[string]string{"app": "web"}

// TestInvalidObjects: each bad object is refused at the field Kubernetes
// names, with Kubernetes' error type (pkg/apis/*/validation).
func TestInvalidObjects(t *testing.T) {
	cases := []struct {
		name, group, plural string
		obj                 runtime.Object
		path                string
		typ                 field.ErrorType
	}{
		{"pod without containers", "", "pods", &corev1.Pod{ObjectMeta: om("p"), Spec: corev1.PodSpec{}}, "spec.containers", field.ErrorTypeRequired},
		{"pod name not a DNS subdomain", "", "pods", &corev1.Pod{ObjectMeta: om("Web_1"), Spec: podSpec(nil)}, "metadata.name", field.ErrorTypeInvalid},
		{"two containers of one name", "", "pods", &corev1.Pod{ObjectMeta: om("p"), Spec: podSpec(func(s *corev1.PodSpec) {
			s.Containers = append(s.Containers, corev1.Container{Name: "app", Image: "x"})
		})}, "spec.containers[1].name", field.ErrorTypeDuplicate},
		{"image with spaces around", "", "pods", &corev1.Pod{ObjectMeta: om("p"), Spec: podSpec(func(s *corev1.PodSpec) { s.Containers[0].Image = " busybox" })},
			"spec.containers[0].image", field.ErrorTypeInvalid},
		{"mount of a volume that is not there", "", "pods", &corev1.Pod{ObjectMeta: om("p"), Spec: podSpec(func(s *corev1.PodSpec) {
			s.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
		})}, "spec.containers[0].volumeMounts[0].name", field.ErrorTypeNotFound},
		{"unknown restartPolicy", "", "pods", &corev1.Pod{ObjectMeta: om("p"), Spec: podSpec(func(s *corev1.PodSpec) { s.RestartPolicy = "Sometimes" })},
			"spec.restartPolicy", field.ErrorTypeNotSupported},
		{"request above limit", "", "pods", &corev1.Pod{ObjectMeta: om("p"), Spec: podSpec(func(s *corev1.PodSpec) {
			s.Containers[0].Resources = corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}
		})}, "spec.containers[0].resources.requests[cpu]", field.ErrorTypeInvalid},
		{"Exists toleration with a value", "", "pods", &corev1.Pod{ObjectMeta: om("p"), Spec: podSpec(func(s *corev1.PodSpec) {
			s.Tolerations = []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists, Value: "v"}}
		})}, "spec.tolerations[0].operator", field.ErrorTypeInvalid},
		{"container port out of range", "", "pods", &corev1.Pod{ObjectMeta: om("p"), Spec: podSpec(func(s *corev1.PodSpec) {
			s.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 70000}}
		})}, "spec.containers[0].ports[0].containerPort", field.ErrorTypeInvalid},
		{"projected token shorter than ten minutes", "", "pods", &corev1.Pod{ObjectMeta: om("p"), Spec: podSpec(func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "t", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](60)}}}}}}}
		})}, "spec.volumes[0].projected.sources[0].serviceAccountToken.expirationSeconds", field.ErrorTypeInvalid},
		{"projected token without a path", "", "pods", &corev1.Pod{ObjectMeta: om("p"), Spec: podSpec(func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "t", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{}}}}}}}
		})}, "spec.volumes[0].projected.sources[0].serviceAccountToken.path", field.ErrorTypeRequired},
		{"token secret naming no account", "", "secrets", &corev1.Secret{ObjectMeta: om("s"), Type: corev1.SecretTypeServiceAccountToken},
			"metadata.annotations[kubernetes.io/service-account.name]", field.ErrorTypeRequired},
		{"quota of an unknown resource", "", "resourcequotas", &corev1.ResourceQuota{ObjectMeta: om("q"), Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"gpus": resource.MustParse("1")}}},
			"spec.hard[gpus]", field.ErrorTypeInvalid},
		{"negative quota", "", "resourcequotas", &corev1.ResourceQuota{ObjectMeta: om("q"), Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"pods": resource.MustParse("-1")}}},
			"spec.hard[pods]", field.ErrorTypeInvalid},
		{"fractional object count", "", "resourcequotas", &corev1.ResourceQuota{ObjectMeta: om("q"), Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"count/deployments.apps": resource.MustParse("1500m")}}},
			"spec.hard[count/deployments.apps]", field.ErrorTypeInvalid},
		{"conflicting quota scopes", "", "resourcequotas", &corev1.ResourceQuota{ObjectMeta: om("q"), Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"pods": resource.MustParse("1")},
			Scopes: []corev1.ResourceQuotaScope{corev1.ResourceQuotaScopeTerminating, corev1.ResourceQuotaScopeNotTerminating}}}, "spec.scopes", field.ErrorTypeInvalid},
		{"BestEffort scope on cpu", "", "resourcequotas", &corev1.ResourceQuota{ObjectMeta: om("q"), Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"requests.cpu": resource.MustParse("1")},
			Scopes: []corev1.ResourceQuotaScope{corev1.ResourceQuotaScopeBestEffort}}}, "spec.hard", field.ErrorTypeInvalid},
		{"service name with a dot", "", "services", &corev1.Service{ObjectMeta: om("web.v1"), Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}},
			"metadata.name", field.ErrorTypeInvalid},
		{"nodePort on a ClusterIP service", "", "services", &corev1.Service{ObjectMeta: om("web"), Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, NodePort: 30080}}}},
			"spec.ports[0].nodePort", field.ErrorTypeForbidden},
		{"two ports, one unnamed", "", "services", &corev1.Service{ObjectMeta: om("web"), Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}, {Name: "b", Port: 81}}}},
			"spec.ports[0].name", field.ErrorTypeRequired},
		{"service without ports", "", "services", &corev1.Service{ObjectMeta: om("web")}, "spec.ports", field.ErrorTypeRequired},
		{"configmap key with a slash", "", "configmaps", &corev1.ConfigMap{ObjectMeta: om("c"), Data: map[string]string{"a/b": "x"}}, "data[a/b]", field.ErrorTypeInvalid},
		{"configmap key in data and binaryData", "", "configmaps", &corev1.ConfigMap{ObjectMeta: om("c"), Data: map[string]string{"k": "x"}, BinaryData: map[string][]byte{"k": {1}}},
			"data[k]", field.ErrorTypeInvalid},
		{"configmap over 1 MiB", "", "configmaps", &corev1.ConfigMap{ObjectMeta: om("c"), Data: map[string]string{"k": strings.Repeat("x", corev1.MaxSecretSize+1)}},
			"[]", field.ErrorTypeTooLong}, // the whole object, as Kubernetes reports it
		{"registry secret that does not parse", "", "secrets", &corev1.Secret{ObjectMeta: om("s"), Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte("{")}}, "data[.dockerconfigjson]", field.ErrorTypeInvalid},
		{"registry secret without its key", "", "secrets", &corev1.Secret{ObjectMeta: om("s"), Type: corev1.SecretTypeDockerConfigJson},
			"data[.dockerconfigjson]", field.ErrorTypeRequired},
		{"node name with a slash", "", "nodes", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a/b"}}, "metadata.name", field.ErrorTypeInvalid},
		{"namespace name with a dot", "", "namespaces", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team.a"}}, "metadata.name", field.ErrorTypeInvalid},
		{"event about another namespace's object", "", "events", &corev1.Event{ObjectMeta: om("e"), InvolvedObject: corev1.ObjectReference{Namespace: "other"}},
			"involvedObject.namespace", field.ErrorTypeInvalid},
		{"deployment selector that misses its template", "apps", "deployments", &appsv1.Deployment{ObjectMeta: om("d"), Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "other"}}, Template: template(app, nil)}},
			"spec.template.metadata.labels", field.ErrorTypeInvalid},
		{"deployment without a selector", "apps", "deployments", &appsv1.Deployment{ObjectMeta: om("d"), Spec: appsv1.DeploymentSpec{Template: template(app, nil)}},
			"spec.selector", field.ErrorTypeRequired},
		{"deployment pods that do not restart", "apps", "deployments", &appsv1.Deployment{ObjectMeta: om("d"), Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: app}, Template: template(app, func(s *corev1.PodSpec) { s.RestartPolicy = corev1.RestartPolicyNever })}},
			"spec.template.spec.restartPolicy", field.ErrorTypeNotSupported},
		{"Recreate with rollingUpdate", "apps", "deployments", &appsv1.Deployment{ObjectMeta: om("d"), Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: app}, Template: template(app, nil),
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{}}}},
			"spec.strategy.rollingUpdate", field.ErrorTypeForbidden},
		{"negative replicas", "apps", "replicasets", &appsv1.ReplicaSet{ObjectMeta: om("r"), Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](-1),
			Selector: &metav1.LabelSelector{MatchLabels: app}, Template: template(app, nil)}}, "spec.replicas", field.ErrorTypeInvalid},
		{"daemonset template with a bad container", "apps", "daemonsets", &appsv1.DaemonSet{ObjectMeta: om("ds"), Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: app}, Template: template(app, func(s *corev1.PodSpec) { s.Containers[0].Name = "" })}},
			"spec.template.spec.containers[0].name", field.ErrorTypeRequired},
		{"pod sysctl of a bad name", "", "pods", &corev1.Pod{ObjectMeta: om("p"), Spec: podSpec(func(s *corev1.PodSpec) {
			s.SecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "kernel.shmmax", Value: "1"}, {Name: "foo-", Value: "bar"}}}
		})}, "spec.securityContext.sysctls[1].name", field.ErrorTypeInvalid},
		{"pod network sysctl on the host network", "", "pods", &corev1.Pod{ObjectMeta: om("p"), Spec: podSpec(func(s *corev1.PodSpec) {
			s.HostNetwork = true
			s.SecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "net.ipv4.ip_forward", Value: "1"}}}
		})}, "spec.securityContext.sysctls[0].name", field.ErrorTypeInvalid},
		{"pod resource claim from both a claim and a template", "", "pods", &corev1.Pod{ObjectMeta: om("p"), Spec: podSpec(func(s *corev1.PodSpec) {
			s.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("a"), ResourceClaimTemplateName: ptr.To("b")}}
		})}, "spec.resourceClaims[0]", field.ErrorTypeInvalid},
		{"container using a claim the pod lacks", "", "pods", &corev1.Pod{ObjectMeta: om("p"), Spec: podSpec(func(s *corev1.PodSpec) {
			s.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("a")}}
			s.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "tpu"}}
		})}, "spec.containers[0].resources.claims[0]", field.ErrorTypeNotFound},
		{"job pods that always restart", "batch", "jobs", &batchv1.Job{ObjectMeta: om("j"), Spec: batchv1.JobSpec{
			Template: template(nil, func(s *corev1.PodSpec) { s.RestartPolicy = corev1.RestartPolicyAlways })}},
			"spec.template.spec.restartPolicy", field.ErrorTypeNotSupported},
		{"indexed job without completions", "batch", "jobs", job(func(s *batchv1.JobSpec) {
			s.CompletionMode, s.Parallelism = ptr.To(batchv1.IndexedCompletion), ptr.To[int32](2)
		}),
			"spec.completions", field.ErrorTypeRequired},
		{"per-index backoff of a non-indexed job", "batch", "jobs", job(func(s *batchv1.JobSpec) { s.BackoffLimitPerIndex = ptr.To[int32](1) }),
			"spec.backoffLimitPerIndex", field.ErrorTypeForbidden},
		{"more failed indexes allowed than there are", "batch", "jobs", job(func(s *batchv1.JobSpec) {
			s.CompletionMode, s.Completions, s.BackoffLimitPerIndex, s.MaxFailedIndexes = ptr.To(batchv1.IndexedCompletion), ptr.To[int32](2), ptr.To[int32](1), ptr.To[int32](3)
		}), "spec.maxFailedIndexes", field.ErrorTypeInvalid},
		{"pod failure policy matching exit code 0", "batch", "jobs", job(func(s *batchv1.JobSpec) {
			s.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{Action: batchv1.PodFailurePolicyActionFailJob,
				OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{0, 1}}}}}
		}), "spec.podFailurePolicy.rules[0].onExitCodes.values[0]", field.ErrorTypeInvalid},
		{"pod failure policy rule with no requirement", "batch", "jobs", job(func(s *batchv1.JobSpec) {
			s.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{Action: batchv1.PodFailurePolicyActionIgnore}}}
		}), "spec.podFailurePolicy.rules[0]", field.ErrorTypeInvalid},
		{"FailIndex without per-index backoff", "batch", "jobs", job(func(s *batchv1.JobSpec) {
			s.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{Action: batchv1.PodFailurePolicyActionFailIndex,
				OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{1}}}}}
		}), "spec.podFailurePolicy.rules[0].action", field.ErrorTypeInvalid},
		{"pod failure policy with pods restarting", "batch", "jobs", job(func(s *batchv1.JobSpec) {
			s.Template.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
			s.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{Action: batchv1.PodFailurePolicyActionIgnore,
				OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget}}}}}
		}), "spec.template.spec.restartPolicy", field.ErrorTypeInvalid},
		{"success policy of a non-indexed job", "batch", "jobs", job(func(s *batchv1.JobSpec) {
			s.SuccessPolicy = &batchv1.SuccessPolicy{Rules: []batchv1.SuccessPolicyRule{{SucceededCount: ptr.To[int32](1)}}}
		}), "spec.completionMode", field.ErrorTypeInvalid},
		{"success policy index beyond completions", "batch", "jobs", job(func(s *batchv1.JobSpec) {
			s.CompletionMode, s.Completions = ptr.To(batchv1.IndexedCompletion), ptr.To[int32](3)
			s.SuccessPolicy = &batchv1.SuccessPolicy{Rules: []batchv1.SuccessPolicyRule{{SucceededIndexes: ptr.To("0,2-3")}}}
		}), "spec.successPolicy.rules[0].succeededIndexes", field.ErrorTypeInvalid},
		{"cronjob schedule out of range", "batch", "cronjobs", cronJob("c", func(cj *batchv1.CronJob) { cj.Spec.Schedule = "61 * * * *" }), "spec.schedule", field.ErrorTypeInvalid},
		{"cronjob without a schedule", "batch", "cronjobs", cronJob("c", func(cj *batchv1.CronJob) { cj.Spec.Schedule = "" }), "spec.schedule", field.ErrorTypeRequired},
		{"cronjob with TZ in its schedule", "batch", "cronjobs", cronJob("c", func(cj *batchv1.CronJob) { cj.Spec.Schedule = "TZ=UTC 0 * * * *" }), "spec.schedule", field.ErrorTypeInvalid},
		{"cronjob in the server's own zone", "batch", "cronjobs", cronJob("c", func(cj *batchv1.CronJob) { cj.Spec.TimeZone = ptr.To("Local") }), "spec.timeZone", field.ErrorTypeInvalid},
		{"cronjob in no zone there is", "batch", "cronjobs", cronJob("c", func(cj *batchv1.CronJob) { cj.Spec.TimeZone = ptr.To("Mars/Olympus_Mons") }), "spec.timeZone", field.ErrorTypeInvalid},
		{"cronjob name too long for its jobs", "batch", "cronjobs", cronJob(strings.Repeat("c", 53), nil), "metadata.name", field.ErrorTypeInvalid},
		{"cronjob of an unknown concurrency policy", "batch", "cronjobs", cronJob("c", func(cj *batchv1.CronJob) { cj.Spec.ConcurrencyPolicy = "Sometimes" }), "spec.concurrencyPolicy", field.ErrorTypeNotSupported},
		{"cronjob with a negative deadline", "batch", "cronjobs", cronJob("c", func(cj *batchv1.CronJob) { cj.Spec.StartingDeadlineSeconds = ptr.To[int64](-1) }), "spec.startingDeadlineSeconds", field.ErrorTypeInvalid},
		{"cronjob keeping a negative history", "batch", "cronjobs", cronJob("c", func(cj *batchv1.CronJob) { cj.Spec.FailedJobsHistoryLimit = ptr.To[int32](-1) }), "spec.failedJobsHistoryLimit", field.ErrorTypeInvalid},
		{"cronjob pods that always restart", "batch", "cronjobs", cronJob("c", func(cj *batchv1.CronJob) {
			cj.Spec.JobTemplate.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyAlways
		}),
			"spec.jobTemplate.spec.template.spec.restartPolicy", field.ErrorTypeNotSupported},
		{"cronjob pod without an image", "batch", "cronjobs", cronJob("c", func(cj *batchv1.CronJob) { cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Image = "" }),
			"spec.jobTemplate.spec.template.spec.containers[0].image", field.ErrorTypeRequired},
		{"pv without access modes", "", "persistentvolumes", pv(func(v *corev1.PersistentVolume) { v.Spec.AccessModes = nil }), "spec.accessModes", field.ErrorTypeRequired},
		{"pv without capacity", "", "persistentvolumes", pv(func(v *corev1.PersistentVolume) { v.Spec.Capacity = nil }), "spec.capacity", field.ErrorTypeRequired},
		{"pv of zero bytes", "", "persistentvolumes", pv(func(v *corev1.PersistentVolume) { v.Spec.Capacity[corev1.ResourceStorage] = resource.MustParse("0") }), "spec.capacity[storage]", field.ErrorTypeInvalid},
		{"pv with no source", "", "persistentvolumes", pv(func(v *corev1.PersistentVolume) { v.Spec.HostPath = nil }), "spec", field.ErrorTypeRequired},
		{"pv with two sources", "", "persistentvolumes", pv(func(v *corev1.PersistentVolume) { v.Spec.NFS = &corev1.NFSVolumeSource{Server: "nas", Path: "/x"} }), "spec", field.ErrorTypeForbidden},
		{"local pv without node affinity", "", "persistentvolumes", pv(func(v *corev1.PersistentVolume) {
			v.Spec.HostPath, v.Spec.Local = nil, &corev1.LocalVolumeSource{Path: "/mnt/disk"}
		}), "spec.nodeAffinity", field.ErrorTypeRequired},
		{"pv of an unknown reclaim policy", "", "persistentvolumes", pv(func(v *corev1.PersistentVolume) { v.Spec.PersistentVolumeReclaimPolicy = "Shred" }), "spec.persistentVolumeReclaimPolicy", field.ErrorTypeNotSupported},
		{"pvc asking no storage", "", "persistentvolumeclaims", pvc(func(c *corev1.PersistentVolumeClaim) { c.Spec.Resources.Requests = nil }), "spec.resources[storage]", field.ErrorTypeRequired},
		{"pvc asking negative storage", "", "persistentvolumeclaims", pvc(func(c *corev1.PersistentVolumeClaim) {
			c.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("-1Gi")
		}), "spec.resources[storage]", field.ErrorTypeInvalid},
		{"pvc of an unknown access mode", "", "persistentvolumeclaims", pvc(func(c *corev1.PersistentVolumeClaim) {
			c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{"ReadWriteSometimes"}
		}),
			"spec.accessModes", field.ErrorTypeNotSupported},
		{"pvc mixing ReadWriteOncePod", "", "persistentvolumeclaims", pvc(func(c *corev1.PersistentVolumeClaim) {
			c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod, corev1.ReadWriteOnce}
		}), "spec.accessModes", field.ErrorTypeForbidden},
		{"storageclass without a provisioner", "storage.k8s.io", "storageclasses", &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}}, "provisioner", field.ErrorTypeRequired},
		{"storageclass that recycles", "storage.k8s.io", "storageclasses", &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: "example.com/disk",
			ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimRecycle)}, "reclaimPolicy", field.ErrorTypeNotSupported},
		{"storageclass binding sometime", "storage.k8s.io", "storageclasses", &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: "example.com/disk",
			VolumeBindingMode: ptr.To[storagev1.VolumeBindingMode]("Later")}, "volumeBindingMode", field.ErrorTypeNotSupported},
		{"statefulset pods that stop", "apps", "statefulsets", statefulSet(func(s *appsv1.StatefulSet) { s.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever }),
			"spec.template.spec.restartPolicy", field.ErrorTypeNotSupported},
		{"statefulset managing pods sometimes", "apps", "statefulsets", statefulSet(func(s *appsv1.StatefulSet) { s.Spec.PodManagementPolicy = "Sometimes" }),
			"spec.podManagementPolicy", field.ErrorTypeNotSupported},
		{"statefulset of a negative partition", "apps", "statefulsets", statefulSet(func(s *appsv1.StatefulSet) {
			s.Spec.UpdateStrategy = appsv1.StatefulSetUpdateStrategy{Type: appsv1.RollingUpdateStatefulSetStrategyType, RollingUpdate: &appsv1.RollingUpdateStatefulSetStrategy{Partition: ptr.To[int32](-1)}}
		}), "spec.updateStrategy.rollingUpdate.partition", field.ErrorTypeInvalid},
		{"statefulset claim asking no storage", "apps", "statefulsets", statefulSet(func(s *appsv1.StatefulSet) { s.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests = nil }),
			"spec.volumeClaimTemplates[0].spec.resources[storage]", field.ErrorTypeRequired},
		{"lease of zero seconds", "coordination.k8s.io", "leases", &coordinationv1.Lease{ObjectMeta: om("l"), Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](0)}},
			"spec.leaseDurationSeconds", field.ErrorTypeInvalid},
		{"endpointslice of an unknown address type", "discovery.k8s.io", "endpointslices", &discoveryv1.EndpointSlice{ObjectMeta: om("s"), AddressType: "MAC"},
			"addressType", field.ErrorTypeNotSupported},
		// Each node's proxy writes endpoint addresses into iptables: not an
		// address, or one Services must not reach, is refused (Kubernetes'
		// checks).
		{"endpoint address that is not one", "discovery.k8s.io", "endpointslices", slice("10.42.0.5 -j ACCEPT"), "endpoints[0].addresses[0]", field.ErrorTypeInvalid},
		{"IPv6 endpoint in an IPv4 slice", "discovery.k8s.io", "endpointslices", slice("fd00::5"), "endpoints[0].addresses[0]", field.ErrorTypeInvalid},
		{"loopback endpoint", "discovery.k8s.io", "endpointslices", slice("127.0.0.1"), "endpoints[0].addresses[0]", field.ErrorTypeInvalid},
		{"link-local endpoint", "discovery.k8s.io", "endpointslices", slice("169.254.169.254"), "endpoints[0].addresses[0]", field.ErrorTypeInvalid},
		{"unspecified endpoint", "discovery.k8s.io", "endpointslices", slice("0.0.0.0"), "endpoints[0].addresses[0]", field.ErrorTypeInvalid},
		{"endpoint without an address", "discovery.k8s.io", "endpointslices", slice(), "endpoints[0].addresses", field.ErrorTypeRequired},
		{"endpoint port without a protocol", "discovery.k8s.io", "endpointslices", func() *discoveryv1.EndpointSlice {
			s := slice("10.42.0.5")
			s.Ports[0].Protocol = nil
			return s
		}(), "ports[0].protocol", field.ErrorTypeRequired},
		{"endpoint port out of range", "discovery.k8s.io", "endpointslices", func() *discoveryv1.EndpointSlice {
			s := slice("10.42.0.5")
			s.Ports[0].Port = ptr.To[int32](70000)
			return s
		}(), "ports[0].port", field.ErrorTypeInvalid},
		{"endpoint port name not a DNS label", "discovery.k8s.io", "endpointslices", func() *discoveryv1.EndpointSlice {
			s := slice("10.42.0.5")
			s.Ports[0].Name = ptr.To(`http" -j DROP`)
			return s
		}(), "ports[0].name", field.ErrorTypeInvalid},
		{"too many endpoints", "discovery.k8s.io", "endpointslices", func() *discoveryv1.EndpointSlice {
			s := slice("10.42.0.5")
			s.Endpoints = make([]discoveryv1.Endpoint, 1001)
			return s
		}(), "endpoints", field.ErrorTypeTooMany},
		{"rule without verbs", rbacGroup, "roles", role(rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}}), "rules[0].verbs", field.ErrorTypeRequired},
		{"resource rule without api groups", rbacGroup, "roles", role(rbacv1.PolicyRule{Verbs: []string{"get"}, Resources: []string{"pods"}}), "rules[0].apiGroups", field.ErrorTypeRequired},
		{"resource rule without resources", rbacGroup, "clusterroles", &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "r"},
			Rules: []rbacv1.PolicyRule{{Verbs: []string{"get"}, APIGroups: []string{""}}}}, "rules[0].resources", field.ErrorTypeRequired},
		{"a Role's non-resource URL", rbacGroup, "roles", role(rbacv1.PolicyRule{Verbs: []string{"get"}, NonResourceURLs: []string{"/healthz"}}), "rules[0].nonResourceURLs", field.ErrorTypeInvalid},
		{"a rule of resources and URLs", rbacGroup, "clusterroles", &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "r"},
			Rules: []rbacv1.PolicyRule{{Verbs: []string{"get"}, Resources: []string{"pods"}, NonResourceURLs: []string{"/metrics"}}}}, "rules[0].nonResourceURLs", field.ErrorTypeInvalid},
		{"aggregation without selectors", rbacGroup, "clusterroles", &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "r"},
			AggregationRule: &rbacv1.AggregationRule{}}, "aggregationRule.clusterRoleSelectors", field.ErrorTypeRequired},
		{"binding to a Role of a ClusterRoleBinding", rbacGroup, "clusterrolebindings", &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "b"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacGroup, Kind: "Role", Name: "r"}}, "roleRef.kind", field.ErrorTypeNotSupported},
		{"binding without a role name", rbacGroup, "rolebindings", binding(rbacv1.RoleRef{APIGroup: rbacGroup, Kind: "Role"}), "roleRef.name", field.ErrorTypeRequired},
		{"binding to another group's role", rbacGroup, "rolebindings", binding(rbacv1.RoleRef{APIGroup: "example.com", Kind: "Role", Name: "r"}), "roleRef.apiGroup", field.ErrorTypeNotSupported},
		{"subject of no kind", rbacGroup, "rolebindings", binding(rbacv1.RoleRef{APIGroup: rbacGroup, Kind: "Role", Name: "r"}, rbacv1.Subject{Kind: "Robot", Name: "x"}),
			"subjects[0].kind", field.ErrorTypeNotSupported},
		{"subject without a name", rbacGroup, "rolebindings", binding(rbacv1.RoleRef{APIGroup: rbacGroup, Kind: "Role", Name: "r"}, rbacv1.Subject{Kind: "User"}),
			"subjects[0].name", field.ErrorTypeRequired},
		{"service account of a ClusterRoleBinding without namespace", rbacGroup, "clusterrolebindings", &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "b"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacGroup, Kind: "ClusterRole", Name: "view"}, Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "default"}}},
			"subjects[0].namespace", field.ErrorTypeRequired},
		{"service account named as no service account can be", rbacGroup, "rolebindings", binding(rbacv1.RoleRef{APIGroup: rbacGroup, Kind: "Role", Name: "r"},
			rbacv1.Subject{Kind: "ServiceAccount", Name: "Bad_Name"}), "subjects[0].name", field.ErrorTypeInvalid},
		{"role name with a slash", rbacGroup, "roles", &rbacv1.Role{ObjectMeta: om("a/b")}, "metadata.name", field.ErrorTypeInvalid},
		// Kubernetes' PodDisruptionBudget checks (policy/v1).
		{"budget with minAvailable and maxUnavailable", "policy", "poddisruptionbudgets", pdb(func(s *policyv1.PodDisruptionBudgetSpec) {
			s.MinAvailable, s.MaxUnavailable = ptr.To(intstr.FromInt32(1)), ptr.To(intstr.FromInt32(1))
		}), "spec", field.ErrorTypeInvalid},
		{"budget with a negative minAvailable", "policy", "poddisruptionbudgets", pdb(func(s *policyv1.PodDisruptionBudgetSpec) {
			s.MinAvailable = ptr.To(intstr.FromInt32(-1))
		}), "spec.minAvailable", field.ErrorTypeInvalid},
		{"budget with maxUnavailable above 100%", "policy", "poddisruptionbudgets", pdb(func(s *policyv1.PodDisruptionBudgetSpec) {
			s.MaxUnavailable = ptr.To(intstr.FromString("120%"))
		}), "spec.maxUnavailable", field.ErrorTypeInvalid},
		{"budget with a percentage that is not one", "policy", "poddisruptionbudgets", pdb(func(s *policyv1.PodDisruptionBudgetSpec) {
			s.MinAvailable = ptr.To(intstr.FromString("half"))
		}), "spec.minAvailable", field.ErrorTypeInvalid},
		{"budget with an unknown unhealthyPodEvictionPolicy", "policy", "poddisruptionbudgets", pdb(func(s *policyv1.PodDisruptionBudgetSpec) {
			s.UnhealthyPodEvictionPolicy = ptr.To(policyv1.UnhealthyPodEvictionPolicyType("Sometimes"))
		}), "spec.unhealthyPodEvictionPolicy", field.ErrorTypeNotSupported},
		{"budget with an invalid selector", "policy", "poddisruptionbudgets", pdb(func(s *policyv1.PodDisruptionBudgetSpec) {
			s.Selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Near"}}}
		}), "spec.selector.matchExpressions[0].operator", field.ErrorTypeInvalid},
		// Kubernetes' NetworkPolicy checks (networking.k8s.io/v1).
		{"policy peer of nothing", netGroup, "networkpolicies", netpol(func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{}}}}
		}), "spec.ingress[0].from[0]", field.ErrorTypeRequired},
		{"policy peer of an ipBlock and a selector", netGroup, "networkpolicies", netpol(func(s *networkingv1.NetworkPolicySpec) {
			s.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{
				IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8"}, PodSelector: &metav1.LabelSelector{}}}}}
		}), "spec.egress[0].to[0]", field.ErrorTypeForbidden},
		{"policy ipBlock that is no CIDR", netGroup, "networkpolicies", netpol(func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.1"}}}}}
		}), "spec.ingress[0].from[0].ipBlock.cidr", field.ErrorTypeInvalid},
		{"policy except outside its CIDR", netGroup, "networkpolicies", netpol(func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.1.0.0/24"}}}}}}
		}), "spec.ingress[0].from[0].ipBlock.except[0]", field.ErrorTypeInvalid},
		{"policy except as wide as its CIDR", netGroup, "networkpolicies", netpol(func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.0.0.0/16"}}}}}}
		}), "spec.ingress[0].from[0].ipBlock.except[0]", field.ErrorTypeInvalid},
		{"policy port of an unknown protocol", netGroup, "networkpolicies", netpol(func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.Protocol("ICMP"))}}}}
		}), "spec.ingress[0].ports[0].protocol", field.ErrorTypeNotSupported},
		{"policy port range ending before it starts", netGroup, "networkpolicies", netpol(func(s *networkingv1.NetworkPolicySpec) {
			s.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromInt32(90)), EndPort: ptr.To[int32](80)}}}}
		}), "spec.egress[0].ports[0].endPort", field.ErrorTypeInvalid},
		{"policy port range from a named port", netGroup, "networkpolicies", netpol(func(s *networkingv1.NetworkPolicySpec) {
			s.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromString("http")), EndPort: ptr.To[int32](80)}}}}
		}), "spec.egress[0].ports[0].endPort", field.ErrorTypeInvalid},
		{"policy port range without a port", netGroup, "networkpolicies", netpol(func(s *networkingv1.NetworkPolicySpec) {
			s.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{EndPort: ptr.To[int32](80)}}}}
		}), "spec.egress[0].ports[0].endPort", field.ErrorTypeInvalid},
		{"policy port zero", netGroup, "networkpolicies", netpol(func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromInt32(0))}}}}
		}), "spec.ingress[0].ports[0].port", field.ErrorTypeInvalid},
		{"policy of an unknown type", netGroup, "networkpolicies", netpol(func(s *networkingv1.NetworkPolicySpec) {
			s.PolicyTypes = []networkingv1.PolicyType{"Sideways"}
		}), "spec.policyTypes[0]", field.ErrorTypeNotSupported},
		{"policy of three types", netGroup, "networkpolicies", netpol(func(s *networkingv1.NetworkPolicySpec) {
			s.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress, networkingv1.PolicyTypeIngress}
		}), "spec.policyTypes", field.ErrorTypeInvalid},
		{"policy with a bad pod selector", netGroup, "networkpolicies", netpol(func(s *networkingv1.NetworkPolicySpec) {
			s.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "not valid"}}
		}), "spec.podSelector.matchLabels", field.ErrorTypeInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			errs := admit(describe(t, c.group, c.plural), c.obj)
			for _, e := range errs {
				if e.Field == c.path && e.Type == c.typ {
					return
				}
			}
			t.Fatalf("want %s at %s, got %v", c.typ, c.path, errs)
		})
	}
}

// pdb is a budget over app=web, as mut makes it.
func pdb(mut func(*policyv1.PodDisruptionBudgetSpec)) *policyv1.PodDisruptionBudget {
	p := &policyv1.PodDisruptionBudget{ObjectMeta: om("web"), Spec: policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: app}}}
	mut(&p.Spec)
	return p
}

const netGroup = networkingv1.GroupName

// netpol is a policy over app=web, as mut makes it.
func netpol(mut func(*networkingv1.NetworkPolicySpec)) *networkingv1.NetworkPolicy {
	p := &networkingv1.NetworkPolicy{ObjectMeta: om("web"), Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: app}}}
	mut(&p.Spec)
	return p
}

// slice is an IPv4 EndpointSlice with one endpoint of the given addresses
// and one TCP port.
func slice(addrs ...string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{ObjectMeta: om("web-abc"), AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: addrs}},
		Ports:     []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}}}
}

const rbacGroup = rbacv1.GroupName

func role(rules ...rbacv1.PolicyRule) *rbacv1.Role {
	return &rbacv1.Role{ObjectMeta: om("r"), Rules: rules}
}

func binding(ref rbacv1.RoleRef, subjects ...rbacv1.Subject) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{ObjectMeta: om("b"), RoleRef: ref, Subjects: subjects}
}

// TestValidObjects: what kubectl create and the controllers send passes.
func TestValidObjects(t *testing.T) {
	cases := []struct {
		group, plural string
		obj           runtime.Object
	}{
		{"", "pods", &corev1.Pod{ObjectMeta: om("web-1"), Spec: podSpec(nil)}},
		{"", "services", &corev1.Service{ObjectMeta: om("web"), Spec: corev1.ServiceSpec{Selector: app, Ports: []corev1.ServicePort{{Port: 80}}}}},
		{"", "nodes", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "pi-1.lan"}}},
		{"apps", "deployments", &appsv1.Deployment{ObjectMeta: om("web"), Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: app}, Template: template(app, nil)}}},
		{"batch", "jobs", &batchv1.Job{ObjectMeta: om("once"), Spec: batchv1.JobSpec{Template: template(nil, func(s *corev1.PodSpec) { s.RestartPolicy = corev1.RestartPolicyNever })}}},
		{"batch", "jobs", job(func(s *batchv1.JobSpec) {
			s.CompletionMode, s.Completions, s.BackoffLimitPerIndex, s.MaxFailedIndexes = ptr.To(batchv1.IndexedCompletion), ptr.To[int32](5), ptr.To[int32](1), ptr.To[int32](2)
			s.SuccessPolicy = &batchv1.SuccessPolicy{Rules: []batchv1.SuccessPolicyRule{{SucceededIndexes: ptr.To("0,2-4"), SucceededCount: ptr.To[int32](2)}}}
			s.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{
				{Action: batchv1.PodFailurePolicyActionFailIndex, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{1, 2}}},
				{Action: batchv1.PodFailurePolicyActionIgnore, OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget}}}}}
		})},
		{"batch", "cronjobs", cronJob("nightly", func(cj *batchv1.CronJob) { cj.Spec.Schedule, cj.Spec.TimeZone = "@daily", ptr.To("America/New_York") })},
		{"batch", "cronjobs", cronJob("weekdays", func(cj *batchv1.CronJob) { cj.Spec.Schedule = "30 6-16/4 * * 1-5" })},
		{"", "persistentvolumes", pv(nil)},
		{"", "persistentvolumeclaims", pvc(nil)},
		{"storage.k8s.io", "storageclasses", &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "local-path"}, Provisioner: "orch.dev/local-path",
			VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}},
		{"apps", "statefulsets", statefulSet(nil)},
		{"policy", "poddisruptionbudgets", pdb(func(s *policyv1.PodDisruptionBudgetSpec) { s.MinAvailable = ptr.To(intstr.FromString("50%")) })},
		{"policy", "poddisruptionbudgets", pdb(func(s *policyv1.PodDisruptionBudgetSpec) {
			s.MaxUnavailable, s.UnhealthyPodEvictionPolicy = ptr.To(intstr.FromInt32(0)), ptr.To(policyv1.AlwaysAllow)
		})},
		{"discovery.k8s.io", "endpointslices", slice("10.42.0.5", "192.168.1.20")},
		// Selecting every pod, from every namespace; a named port; a range.
		{netGroup, "networkpolicies", netpol(func(s *networkingv1.NetworkPolicySpec) {
			s.PodSelector = metav1.LabelSelector{}
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}, {IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/16", Except: []string{"192.168.1.0/24"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromString("http"))}, {Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromInt32(53)), EndPort: ptr.To[int32](60)}}}}
			s.Egress = []networkingv1.NetworkPolicyEgressRule{{}}
		})},
		// Kubernetes takes names with colons, verbs it does not know and
		// subjects without their API group (defaulted).
		{rbacGroup, "clusterroles", &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "system:custom"}, Rules: []rbacv1.PolicyRule{
			{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}},
			{Verbs: []string{"frobnicate"}, APIGroups: []string{"example.com"}, Resources: []string{"widgets/status"}, ResourceNames: []string{"w"}},
			{Verbs: []string{"get"}, NonResourceURLs: []string{"/metrics", "/logs/*"}}}}},
		// A roleRef without its API group is RBAC's, as Kubernetes defaults it.
		{rbacGroup, "rolebindings", binding(rbacv1.RoleRef{Kind: "Role", Name: "extension-apiserver-authentication-reader"})},
		{rbacGroup, "rolebindings", binding(rbacv1.RoleRef{APIGroup: rbacGroup, Kind: "ClusterRole", Name: "view"},
			rbacv1.Subject{Kind: "User", Name: "alice@example.com"}, rbacv1.Subject{Kind: "Group", Name: "system:authenticated"},
			rbacv1.Subject{Kind: "ServiceAccount", Name: "default"})},
	}
	for _, c := range cases {
		if errs := admit(describe(t, c.group, c.plural), c.obj); len(errs) > 0 {
			t.Errorf("%s: %v", c.plural, errs)
		}
	}
}

// TestInvalidUpdates: fields Kubernetes makes immutable stay so.
func TestInvalidUpdates(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: om("web"), Spec: corev1.ServiceSpec{ClusterIP: "10.43.0.10", Ports: []corev1.ServicePort{{Port: 80}}}}
	moved := svc.DeepCopy()
	moved.Spec.ClusterIP = "10.43.0.11"
	pod := &corev1.Pod{ObjectMeta: om("p"), Spec: podSpec(nil)}
	restarted := pod.DeepCopy()
	restarted.Spec.RestartPolicy = corev1.RestartPolicyNever
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: corev1.NodeSpec{PodCIDR: "10.42.1.0/24"}}
	renumbered := node.DeepCopy()
	renumbered.Spec.PodCIDR = "10.42.2.0/24"
	secret := &corev1.Secret{ObjectMeta: om("s"), Type: corev1.SecretTypeOpaque}
	retyped := secret.DeepCopy()
	retyped.Type = corev1.SecretTypeBasicAuth
	frozen := &corev1.ConfigMap{ObjectMeta: om("c"), Immutable: ptr.To(true), Data: map[string]string{"k": "1"}}
	thawed := frozen.DeepCopy()
	thawed.Data["k"] = "2"
	dep := &appsv1.Deployment{ObjectMeta: om("d"), Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: app}}}
	reselected := dep.DeepCopy()
	reselected.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}}
	job := &batchv1.Job{ObjectMeta: om("j"), Spec: batchv1.JobSpec{Completions: ptr.To[int32](1)}}
	more := job.DeepCopy()
	more.Spec.Completions = ptr.To[int32](3)
	sts := statefulSet(nil)
	renamed := sts.DeepCopy()
	renamed.Spec.ServiceName = "other"
	claim := pvc(nil)
	regrown := claim.DeepCopy()
	regrown.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: "example.com/disk"}
	reprovisioned := class.DeepCopy()
	reprovisioned.Provisioner = "example.com/other"
	rb := binding(rbacv1.RoleRef{APIGroup: rbacGroup, Kind: "ClusterRole", Name: "view"})
	rebound := rb.DeepCopy()
	rebound.RoleRef.Name = "admin"
	cases := []struct {
		group, plural string
		obj, old      runtime.Object
		path          string
	}{
		{rbacGroup, "rolebindings", rebound, rb, "roleRef"},
		{"", "services", moved, svc, "spec.clusterIP"},
		{"", "pods", restarted, pod, "spec"},
		{"", "nodes", renumbered, node, "spec.podCIDR"},
		{"", "secrets", retyped, secret, "type"},
		{"", "configmaps", thawed, frozen, "data"},
		{"apps", "deployments", reselected, dep, "spec.selector"},
		{"batch", "jobs", more, job, "spec.completions"},
		{"apps", "statefulsets", renamed, sts, "spec"},
		{"", "persistentvolumeclaims", regrown, claim, "spec"},
		{"storage.k8s.io", "storageclasses", reprovisioned, class, "provisioner"},
	}
	for _, c := range cases {
		t.Run(c.plural, func(t *testing.T) {
			errs := describe(t, c.group, c.plural).ValidateUpdate(c.obj, c.old)
			for _, e := range errs {
				if e.Field == c.path {
					return
				}
			}
			t.Fatalf("want an error at %s, got %v", c.path, errs)
		})
	}
}

func job(mut func(*batchv1.JobSpec)) *batchv1.Job {
	j := &batchv1.Job{ObjectMeta: om("j"), Spec: batchv1.JobSpec{Template: template(nil, func(s *corev1.PodSpec) { s.RestartPolicy = corev1.RestartPolicyNever })}}
	mut(&j.Spec)
	return j
}

func cronJob(name string, mut func(*batchv1.CronJob)) *batchv1.CronJob {
	cj := &batchv1.CronJob{ObjectMeta: om(name), Spec: batchv1.CronJobSpec{Schedule: "*/5 * * * *",
		JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: template(nil, func(s *corev1.PodSpec) { s.RestartPolicy = corev1.RestartPolicyOnFailure })}}}}
	if mut != nil {
		mut(cj)
	}
	return cj
}

func pv(mut func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	v := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "disk-1"}, Spec: corev1.PersistentVolumeSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
		PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv/disk-1"}}}}
	if mut != nil {
		mut(v)
	}
	return v
}

func pvc(mut func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{ObjectMeta: om("data"), Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if mut != nil {
		mut(c)
	}
	return c
}

func statefulSet(mut func(*appsv1.StatefulSet)) *appsv1.StatefulSet {
	s := &appsv1.StatefulSet{ObjectMeta: om("db"), Spec: appsv1.StatefulSetSpec{ServiceName: "db", Selector: &metav1.LabelSelector{MatchLabels: app},
		Template: template(app, func(s *corev1.PodSpec) {
			s.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
		}), VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"}, Spec: pvc(nil).Spec}}}}
	if mut != nil {
		mut(s)
	}
	return s
}
