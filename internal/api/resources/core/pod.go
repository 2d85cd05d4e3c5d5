package core

import (
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/api/resources"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

func pods() *resources.Resource {
	pods := schema.GroupResource{Resource: "pods"}
	return resources.Described[corev1.Pod, corev1.PodList](&resources.Resource{
		StatusMetadata: []string{"labels", "annotations", "finalizers"}, GroupVersionKind: resources.GVK("", "Pod"), Plural: "pods", Singular: "pod", Namespaced: true,
		ShortNames: []string{"po"}, Categories: []string{"all"}, StorageKey: "pods", HasSpec: true,
		Subresources: []resources.Subresource{
			resources.Status(),
			ephemeralContainers(),
			podResize(),
			{Name: "binding", Serve: resources.ServeAction, Kind: corev1.SchemeGroupVersion.WithKind("Binding"), Verbs: metav1.Verbs{"create"},
				NewBody: func() runtime.Object { return &corev1.Binding{} }, Created: true,
				Apply: func(body, current runtime.Object) (runtime.Object, error) {
					return bind(pods, body.(*corev1.Binding), current.(*corev1.Pod))
				}},
			{Name: "log", Serve: resources.ServeLog, Verbs: metav1.Verbs{"get"}},
			{Name: "exec", Serve: resources.ServeStream, Kind: corev1.SchemeGroupVersion.WithKind("PodExecOptions"), Verbs: metav1.Verbs{"create", "get"}},
			{Name: "attach", Serve: resources.ServeStream, Kind: corev1.SchemeGroupVersion.WithKind("PodAttachOptions"), Verbs: metav1.Verbs{"create", "get"}},
			{Name: "portforward", Serve: resources.ServeStream, Kind: corev1.SchemeGroupVersion.WithKind("PodPortForwardOptions"), Verbs: metav1.Verbs{"create", "get"}},
			{Name: "proxy", Serve: resources.ServeProxy, Kind: corev1.SchemeGroupVersion.WithKind("PodProxyOptions"), Verbs: metav1.Verbs{"create", "delete", "get", "patch", "update"}},
		},
		Default: resources.Typed(defaultPod), Validate: resources.TypedValidate(validatePod), ValidateUpdate: resources.TypedValidateUpdate(validatePodUpdate),
		Rules: func(obj, old runtime.Object) field.ErrorList {
			// Ephemeral containers come only through their subresource.
			if pod := obj.(*corev1.Pod); old == nil && len(pod.Spec.EphemeralContainers) > 0 {
				return field.ErrorList{field.Forbidden(resources.SpecPath.Child("ephemeralContainers"), "cannot be set on create")}
			}
			return nil
		},
		PrepareForCreate: resources.Typed(func(pod *corev1.Pod) {
			pod.Status = corev1.PodStatus{Phase: corev1.PodPending, QOSClass: qosClass(&pod.Spec)}
		}),
		Fields: resources.TypedFields(func(pod *corev1.Pod) fields.Set {
			return fields.Set{
				"spec.nodeName": pod.Spec.NodeName, "spec.restartPolicy": string(pod.Spec.RestartPolicy),
				"spec.schedulerName": pod.Spec.SchedulerName, "spec.serviceAccountName": pod.Spec.ServiceAccountName,
				"spec.hostNetwork": strconv.FormatBool(pod.Spec.HostNetwork), "status.phase": string(pod.Status.Phase),
				"status.podIP": pod.Status.PodIP, "status.nominatedNodeName": pod.Status.NominatedNodeName,
			}
		}),
		GracePeriod: podGracePeriod, Columns: podColumns, Row: resources.TypedRow(podRow),
	})
}

// podGracePeriod is Kubernetes' rule: a pod never bound, or already finished,
// goes at once; otherwise its kubelet gets the grace period to stop it.
func podGracePeriod(obj runtime.Object, requested *int64) int64 {
	pod := obj.(*corev1.Pod)
	if pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return 0
	}
	if requested != nil {
		return *requested
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		return *g
	}
	return corev1.DefaultTerminationGracePeriodSeconds
}

func qosClass(spec *corev1.PodSpec) corev1.PodQOSClass {
	requests, limits := false, false
	guaranteed := true
	for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, hasReq := c.Resources.Requests[res]
			lim, hasLim := c.Resources.Limits[res]
			requests = requests || hasReq && !req.IsZero()
			limits = limits || hasLim && !lim.IsZero()
			if !hasLim || hasReq && req.Cmp(lim) != 0 {
				guaranteed = false
			}
		}
	}
	switch {
	case !requests && !limits:
		return corev1.PodQOSBestEffort
	case guaranteed:
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

const defaultTolerationSeconds = 300

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
	// A limit without a request makes the request the limit: on pods only,
	// not on templates (Kubernetes' SetDefaults_Pod), before LimitRange
	// admission fills in what is still missing.
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			requestsFromLimits(&list[i].Resources)
		}
	}
	if pod.Spec.Resources != nil {
		requestsFromLimits(pod.Spec.Resources)
	}
	defaultTolerations(&pod.Spec)
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

func requestsFromLimits(r *corev1.ResourceRequirements) {
	for name, limit := range r.Limits {
		if _, ok := r.Requests[name]; !ok {
			if r.Requests == nil {
				r.Requests = corev1.ResourceList{}
			}
			r.Requests[name] = limit.DeepCopy()
		}
	}
}

func validatePod(pod *corev1.Pod) field.ErrorList {
	return validatePodSpec(&pod.Spec, resources.SpecPath)
}

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
	if onlyAddedTolerations(pod.Spec.Tolerations, old.Spec.Tolerations) {
		mutable.Tolerations = pod.Spec.Tolerations
	}
	if !apiequality.Semantic.DeepEqual(mutable, &pod.Spec) {
		return field.ErrorList{field.Forbidden(resources.SpecPath, "pod updates may not change fields other than `spec.containers[*].image`, "+
			"`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations), "+
			"`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)")}
	}
	return nil
}

// onlyAddedTolerations: every toleration the pod had it still has, in any
// order, with only its tolerationSeconds changed, as Kubernetes allows.
func onlyAddedTolerations(tolerations, old []corev1.Toleration) bool {
	for _, o := range old {
		found := false
		for _, t := range tolerations {
			o.TolerationSeconds = t.TolerationSeconds
			if apiequality.Semantic.DeepEqual(o, t) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// bind assigns a pod to a node, as the scheduler does through pods/binding;
// the checks and messages are Kubernetes' BindingREST's.
func bind(gr schema.GroupResource, b *corev1.Binding, current *corev1.Pod) (runtime.Object, error) {
	if b.Target.Kind != "" && b.Target.Kind != "Node" {
		return nil, apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Binding").GroupKind(), current.Name, field.ErrorList{
			field.NotSupported(field.NewPath("target", "kind"), b.Target.Kind, []string{"Node"})})
	}
	if b.Target.Name == "" {
		return nil, apierrors.NewBadRequest("binding target.name (the node) is required")
	}
	pod := current.DeepCopy()
	if pod.DeletionTimestamp != nil {
		return nil, apierrors.NewConflict(gr, pod.Name, fmt.Errorf("pod %s is being deleted, cannot be assigned to a host", pod.Name))
	}
	if pod.Spec.NodeName != "" {
		return nil, apierrors.NewConflict(gr, pod.Name, fmt.Errorf("pod %s is already assigned to node %q", pod.Name, pod.Spec.NodeName))
	}
	if b.UID != "" && b.UID != pod.UID {
		return nil, apierrors.NewConflict(gr, pod.Name, fmt.Errorf("Precondition failed: UID in precondition: %v, UID in object meta: %v", b.UID, pod.UID)) //nolint:staticcheck // Kubernetes' own wording
	}
	pod.Spec.NodeName = b.Target.Name
	for k, v := range b.Annotations {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[k] = v
	}
	setPodScheduled(pod)
	pod.ResourceVersion = ""
	return pod, nil
}

func setPodScheduled(pod *corev1.Pod) {
	now := metav1.Now()
	for i := range pod.Status.Conditions {
		if c := &pod.Status.Conditions[i]; c.Type == corev1.PodScheduled {
			if c.Status != corev1.ConditionTrue {
				c.LastTransitionTime = now
			}
			c.Status, c.Reason, c.Message = corev1.ConditionTrue, "", ""
			return
		}
	}
	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now})
}

var podColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Ready", "string", 0, "The aggregate readiness state of this pod for accepting traffic."),
	resources.Col("Status", "string", 0, "The aggregate status of the containers in this pod."),
	resources.Col("Restarts", "string", 0, "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
	resources.AgeCol,
	resources.Col("IP", "string", 1, corev1.PodStatus{}.SwaggerDoc()["podIP"]),
	resources.Col("Node", "string", 1, corev1.PodSpec{}.SwaggerDoc()["nodeName"]),
	resources.Col("Nominated Node", "string", 1, corev1.PodStatus{}.SwaggerDoc()["nominatedNodeName"]),
	resources.Col("Readiness Gates", "string", 1, corev1.PodSpec{}.SwaggerDoc()["readinessGates"]),
}

// podRow follows Kubernetes' printPod: the reason shown is the most telling
// container state, "Terminating" once deletion started.
func podRow(pod *corev1.Pod) []any {
	restarts, ready := 0, 0
	var lastRestart time.Time
	reason := string(pod.Status.Phase)
	if pod.Status.Reason != "" {
		reason = pod.Status.Reason
	}
	initializing := false
	for i, c := range pod.Status.InitContainerStatuses {
		restarts += int(c.RestartCount)
		if c.LastTerminationState.Terminated != nil && c.LastTerminationState.Terminated.FinishedAt.After(lastRestart) {
			lastRestart = c.LastTerminationState.Terminated.FinishedAt.Time
		}
		switch {
		case c.State.Terminated != nil && c.State.Terminated.ExitCode == 0:
			continue
		case c.State.Terminated != nil:
			if c.State.Terminated.Reason != "" {
				reason = "Init:" + c.State.Terminated.Reason
			} else if c.State.Terminated.Signal != 0 {
				reason = fmt.Sprintf("Init:Signal:%d", c.State.Terminated.Signal)
			} else {
				reason = fmt.Sprintf("Init:ExitCode:%d", c.State.Terminated.ExitCode)
			}
			initializing = true
		case c.State.Waiting != nil && c.State.Waiting.Reason != "" && c.State.Waiting.Reason != "PodInitializing":
			reason = "Init:" + c.State.Waiting.Reason
			initializing = true
		default:
			reason = fmt.Sprintf("Init:%d/%d", i, len(pod.Spec.InitContainers))
			initializing = true
		}
		break
	}
	if !initializing {
		restarts = 0
		hasRunning := false
		for i := len(pod.Status.ContainerStatuses) - 1; i >= 0; i-- {
			c := pod.Status.ContainerStatuses[i]
			restarts += int(c.RestartCount)
			if c.LastTerminationState.Terminated != nil && c.LastTerminationState.Terminated.FinishedAt.After(lastRestart) {
				lastRestart = c.LastTerminationState.Terminated.FinishedAt.Time
			}
			switch {
			case c.State.Waiting != nil && c.State.Waiting.Reason != "":
				reason = c.State.Waiting.Reason
			case c.State.Terminated != nil && c.State.Terminated.Reason != "":
				reason = c.State.Terminated.Reason
			case c.State.Terminated != nil && c.State.Terminated.Signal != 0:
				reason = fmt.Sprintf("Signal:%d", c.State.Terminated.Signal)
			case c.State.Terminated != nil:
				reason = fmt.Sprintf("ExitCode:%d", c.State.Terminated.ExitCode)
			case c.Ready && c.State.Running != nil:
				hasRunning = true
				ready++
			}
		}
		if reason == "Completed" && hasRunning {
			reason = "Running"
		}
	}
	if pod.DeletionTimestamp != nil {
		reason = "Terminating"
	}
	restartStr := strconv.Itoa(restarts)
	if !lastRestart.IsZero() {
		restartStr = fmt.Sprintf("%d (%s ago)", restarts, duration.HumanDuration(time.Since(lastRestart)))
	}
	ip := "<none>"
	if pod.Status.PodIP != "" {
		ip = pod.Status.PodIP
	}
	gates := "<none>"
	if n := len(pod.Spec.ReadinessGates); n > 0 {
		met := 0
		for _, g := range pod.Spec.ReadinessGates {
			for _, c := range pod.Status.Conditions {
				if c.Type == g.ConditionType && c.Status == corev1.ConditionTrue {
					met++
				}
			}
		}
		gates = fmt.Sprintf("%d/%d", met, n)
	}
	return []any{pod.Name, fmt.Sprintf("%d/%d", ready, len(pod.Spec.Containers)), reason, restartStr, resources.Age(pod.CreationTimestamp),
		ip, resources.OrNone(pod.Spec.NodeName), resources.OrNone(pod.Status.NominatedNodeName), gates}
}
