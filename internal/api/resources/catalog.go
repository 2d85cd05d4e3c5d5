package resources

import (
	"slices"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// typed adapts a function over one concrete type to the Resource hooks.
func typed[T runtime.Object](f func(T)) func(runtime.Object) {
	return func(o runtime.Object) { f(o.(T)) }
}

func typedValidate[T runtime.Object](f func(T) field.ErrorList) func(runtime.Object) field.ErrorList {
	return func(o runtime.Object) field.ErrorList { return f(o.(T)) }
}

func typedValidateUpdate[T runtime.Object](f func(T, T) field.ErrorList) func(runtime.Object, runtime.Object) field.ErrorList {
	return func(o, old runtime.Object) field.ErrorList { return f(o.(T), old.(T)) }
}

func typedFields[T runtime.Object](f func(T) fields.Set) func(runtime.Object) fields.Set {
	return func(o runtime.Object) fields.Set { return f(o.(T)) }
}

func typedRow[T runtime.Object](f func(T) []any) func(runtime.Object) []any {
	return func(o runtime.Object) []any { return f(o.(T)) }
}

// gvk names a kind; every group orch serves is at v1.
func gvk(group, kind string) schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: group, Version: "v1", Kind: kind}
}

// All returns the served resources, freshly built so callers may not share
// mutable state by accident.
func All() []*Resource {
	return []*Resource{
		namespaces(), pods(), nodes(), services(), endpoints(), configMaps(), secrets(), events(), serviceAccounts(),
		deployments(), replicaSets(), daemonSets(), jobs(), leases(), endpointSlices(), eventsV1(),
	}
}

func namespaces() *Resource {
	r := &Resource{GroupVersionKind: gvk("", "Namespace"), Plural: "namespaces", Singular: "namespace",
		ShortNames: []string{"ns"}, Subresources: []string{"status", "finalize"}, StorageKey: "namespaces", HasSpec: false,
		Default: typed(defaultNamespace), Columns: namespaceColumns, Row: typedRow(namespaceRow),
		Fields:           typedFields(func(ns *corev1.Namespace) fields.Set { return fields.Set{"status.phase": string(ns.Status.Phase)} }),
		PrepareForCreate: typed(func(ns *corev1.Namespace) { ns.Status = corev1.NamespaceStatus{Phase: corev1.NamespaceActive} }),
		BeginDelete: func(obj runtime.Object) bool {
			ns := obj.(*corev1.Namespace)
			ns.Status.Phase = corev1.NamespaceTerminating
			return len(ns.Spec.Finalizers) > 0
		},
	}
	r.New, r.NewList = newOf[corev1.Namespace, corev1.NamespaceList]()
	return r
}

func pods() *Resource {
	r := &Resource{GroupVersionKind: gvk("", "Pod"), Plural: "pods", Singular: "pod", Namespaced: true,
		ShortNames: []string{"po"}, Categories: []string{"all"}, Subresources: []string{"status", "binding", "log", "exec", "attach", "portforward"}, StorageKey: "pods",
		Default: typed(defaultPod), Validate: typedValidate(validatePod), ValidateUpdate: typedValidateUpdate(validatePodUpdate),
		PrepareForCreate: typed(func(pod *corev1.Pod) {
			pod.Status = corev1.PodStatus{Phase: corev1.PodPending, QOSClass: qosClass(&pod.Spec)}
		}),
		Fields: typedFields(func(pod *corev1.Pod) fields.Set {
			return fields.Set{
				"spec.nodeName": pod.Spec.NodeName, "spec.restartPolicy": string(pod.Spec.RestartPolicy),
				"spec.schedulerName": pod.Spec.SchedulerName, "spec.serviceAccountName": pod.Spec.ServiceAccountName,
				"spec.hostNetwork": strconv.FormatBool(pod.Spec.HostNetwork), "status.phase": string(pod.Status.Phase),
				"status.podIP": pod.Status.PodIP, "status.nominatedNodeName": pod.Status.NominatedNodeName,
			}
		}),
		GracePeriod: podGracePeriod, Columns: podColumns, Row: typedRow(podRow),
	}
	r.New, r.NewList = newOf[corev1.Pod, corev1.PodList]()
	return r
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

func nodes() *Resource {
	r := &Resource{GroupVersionKind: gvk("", "Node"), Plural: "nodes", Singular: "node", ShortNames: []string{"no"},
		Subresources: []string{"status"}, StorageKey: "minions",
		Fields: typedFields(func(n *corev1.Node) fields.Set {
			return fields.Set{"spec.unschedulable": strconv.FormatBool(n.Spec.Unschedulable)}
		}),
		Columns: nodeColumns, Row: typedRow(nodeRow),
		// Kubernetes' rule: a node's pod CIDRs are set once (by node IPAM)
		// and never changed; the node's network is built on them.
		ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
			n, o := obj.(*corev1.Node), old.(*corev1.Node)
			var errs field.ErrorList
			if o.Spec.PodCIDR != "" && n.Spec.PodCIDR != o.Spec.PodCIDR {
				errs = append(errs, field.Forbidden(field.NewPath("spec", "podCIDR"), "node updates may not change podCIDR except from \"\" to valid"))
			}
			if len(o.Spec.PodCIDRs) > 0 && !slices.Equal(n.Spec.PodCIDRs, o.Spec.PodCIDRs) {
				errs = append(errs, field.Forbidden(field.NewPath("spec", "podCIDRs"), "node updates may not change podCIDR except from \"\" to valid"))
			}
			return errs
		},
	}
	r.New, r.NewList = newOf[corev1.Node, corev1.NodeList]()
	return r
}

func services() *Resource {
	r := &Resource{GroupVersionKind: gvk("", "Service"), Plural: "services", Singular: "service", Namespaced: true,
		ShortNames: []string{"svc"}, Categories: []string{"all"}, Subresources: []string{"status"}, StorageKey: "services/specs",
		Default: typed(defaultService), Validate: typedValidate(validateService), ValidateUpdate: typedValidateUpdate(validateServiceUpdate),
		PrepareForCreate: typed(func(s *corev1.Service) { s.Status = corev1.ServiceStatus{} }),
		Fields: typedFields(func(s *corev1.Service) fields.Set {
			return fields.Set{"spec.clusterIP": s.Spec.ClusterIP, "spec.type": string(s.Spec.Type)}
		}),
		Columns: serviceColumns, Row: typedRow(serviceRow),
	}
	r.New, r.NewList = newOf[corev1.Service, corev1.ServiceList]()
	return r
}

func endpoints() *Resource {
	r := &Resource{GroupVersionKind: gvk("", "Endpoints"), Plural: "endpoints", Singular: "endpoints", Namespaced: true,
		ShortNames: []string{"ep"}, StorageKey: "services/endpoints", AllowCreateOnUpdate: true,
		Columns: endpointsColumns, Row: typedRow(endpointsRow),
	}
	r.New, r.NewList = newOf[corev1.Endpoints, corev1.EndpointsList]()
	return r
}

func configMaps() *Resource {
	r := &Resource{GroupVersionKind: gvk("", "ConfigMap"), Plural: "configmaps", Singular: "configmap", Namespaced: true,
		ShortNames: []string{"cm"}, StorageKey: "configmaps", Validate: typedValidate(validateConfigMap),
		ValidateUpdate: typedValidateUpdate(func(cm, old *corev1.ConfigMap) field.ErrorList {
			errs := validateImmutableData(cm.Immutable, old.Immutable, cm.Data, old.Data)
			return append(errs, validateImmutableData(cm.Immutable, old.Immutable, cm.BinaryData, old.BinaryData)...)
		}),
		Columns: configMapColumns, Row: typedRow(configMapRow),
	}
	r.New, r.NewList = newOf[corev1.ConfigMap, corev1.ConfigMapList]()
	return r
}

func secrets() *Resource {
	r := &Resource{GroupVersionKind: gvk("", "Secret"), Plural: "secrets", Singular: "secret", Namespaced: true,
		StorageKey: "secrets", Default: typed(defaultSecret), Validate: typedValidate(validateSecret),
		ValidateUpdate: typedValidateUpdate(func(s, old *corev1.Secret) field.ErrorList {
			errs := immutable(s.Type, old.Type, field.NewPath("type"))
			return append(errs, validateImmutableData(s.Immutable, old.Immutable, s.Data, old.Data)...)
		}),
		Fields:  typedFields(func(s *corev1.Secret) fields.Set { return fields.Set{"type": string(s.Type)} }),
		Columns: secretColumns, Row: typedRow(secretRow),
	}
	r.New, r.NewList = newOf[corev1.Secret, corev1.SecretList]()
	return r
}

func events() *Resource {
	r := &Resource{GroupVersionKind: gvk("", "Event"), Plural: "events", Singular: "event", Namespaced: true,
		ShortNames: []string{"ev"}, StorageKey: "events", Volatile: []string{"*"}, AllowCreateOnUpdate: true,
		Validate: typedValidate(validateEvent), Fields: typedFields(eventFields),
		Columns: eventColumns, Row: typedRow(eventRow),
	}
	r.New, r.NewList = newOf[corev1.Event, corev1.EventList]()
	return r
}

func eventFields(e *corev1.Event) fields.Set {
	source := e.Source.Component
	if source == "" {
		source = e.ReportingController
	}
	return fields.Set{
		"involvedObject.kind": e.InvolvedObject.Kind, "involvedObject.namespace": e.InvolvedObject.Namespace,
		"involvedObject.name": e.InvolvedObject.Name, "involvedObject.uid": string(e.InvolvedObject.UID),
		"involvedObject.apiVersion": e.InvolvedObject.APIVersion, "involvedObject.resourceVersion": e.InvolvedObject.ResourceVersion,
		"involvedObject.fieldPath": e.InvolvedObject.FieldPath, "reason": e.Reason, "reportingComponent": e.ReportingController,
		"source": source, "type": e.Type,
	}
}

func serviceAccounts() *Resource {
	r := &Resource{GroupVersionKind: gvk("", "ServiceAccount"), Plural: "serviceaccounts", Singular: "serviceaccount",
		Namespaced: true, ShortNames: []string{"sa"}, StorageKey: "serviceaccounts",
		Columns: serviceAccountColumns, Row: typedRow(serviceAccountRow),
	}
	r.New, r.NewList = newOf[corev1.ServiceAccount, corev1.ServiceAccountList]()
	return r
}

func deployments() *Resource {
	r := &Resource{GroupVersionKind: gvk("apps", "Deployment"), Plural: "deployments", Singular: "deployment", Namespaced: true,
		ShortNames: []string{"deploy"}, Categories: []string{"all"}, Subresources: []string{"status", "scale"}, StorageKey: "deployments",
		HasSpec: true, Default: typed(defaultDeployment), Validate: typedValidate(validateDeployment),
		ValidateUpdate: typedValidateUpdate(func(d, old *appsv1.Deployment) field.ErrorList {
			return immutable(d.Spec.Selector, old.Spec.Selector, specPath.Child("selector"))
		}),
		PrepareForCreate: typed(func(d *appsv1.Deployment) { d.Status = appsv1.DeploymentStatus{} }),
		Columns:          deploymentColumns, Row: typedRow(deploymentRow),
	}
	r.New, r.NewList = newOf[appsv1.Deployment, appsv1.DeploymentList]()
	return r
}

func replicaSets() *Resource {
	r := &Resource{GroupVersionKind: gvk("apps", "ReplicaSet"), Plural: "replicasets", Singular: "replicaset", Namespaced: true,
		ShortNames: []string{"rs"}, Categories: []string{"all"}, Subresources: []string{"status", "scale"}, StorageKey: "replicasets",
		HasSpec: true, Default: typed(defaultReplicaSet), Validate: typedValidate(validateReplicaSet),
		ValidateUpdate: typedValidateUpdate(func(rs, old *appsv1.ReplicaSet) field.ErrorList {
			return immutable(rs.Spec.Selector, old.Spec.Selector, specPath.Child("selector"))
		}),
		PrepareForCreate: typed(func(rs *appsv1.ReplicaSet) { rs.Status = appsv1.ReplicaSetStatus{} }),
		Fields: typedFields(func(rs *appsv1.ReplicaSet) fields.Set {
			return fields.Set{"status.replicas": strconv.Itoa(int(rs.Status.Replicas))}
		}),
		Columns: replicaSetColumns, Row: typedRow(replicaSetRow),
	}
	r.New, r.NewList = newOf[appsv1.ReplicaSet, appsv1.ReplicaSetList]()
	return r
}

func daemonSets() *Resource {
	r := &Resource{GroupVersionKind: gvk("apps", "DaemonSet"), Plural: "daemonsets", Singular: "daemonset", Namespaced: true,
		ShortNames: []string{"ds"}, Categories: []string{"all"}, Subresources: []string{"status"}, StorageKey: "daemonsets",
		HasSpec: true, Default: typed(defaultDaemonSet), Validate: typedValidate(validateDaemonSet),
		ValidateUpdate: typedValidateUpdate(func(ds, old *appsv1.DaemonSet) field.ErrorList {
			return immutable(ds.Spec.Selector, old.Spec.Selector, specPath.Child("selector"))
		}),
		PrepareForCreate: typed(func(ds *appsv1.DaemonSet) { ds.Status = appsv1.DaemonSetStatus{} }),
		Columns:          daemonSetColumns, Row: typedRow(daemonSetRow),
	}
	r.New, r.NewList = newOf[appsv1.DaemonSet, appsv1.DaemonSetList]()
	return r
}

func jobs() *Resource {
	r := &Resource{GroupVersionKind: gvk("batch", "Job"), Plural: "jobs", Singular: "job", Namespaced: true, OrphanByDefault: true,
		Categories: []string{"all"}, Subresources: []string{"status"}, StorageKey: "jobs",
		HasSpec: true, Default: typed(defaultJob), Validate: typedValidate(validateJob),
		ValidateUpdate: typedValidateUpdate(func(job, old *batchv1.Job) field.ErrorList {
			errs := immutable(job.Spec.Selector, old.Spec.Selector, specPath.Child("selector"))
			errs = append(errs, immutable(job.Spec.Completions, old.Spec.Completions, specPath.Child("completions"))...)
			return append(errs, immutable(job.Spec.Template, old.Spec.Template, specPath.Child("template"))...)
		}),
		PrepareForCreate: typed(func(job *batchv1.Job) { job.Status = batchv1.JobStatus{} }),
		Fields: typedFields(func(job *batchv1.Job) fields.Set {
			return fields.Set{"status.successful": strconv.Itoa(int(job.Status.Succeeded))}
		}),
		Columns: jobColumns, Row: typedRow(jobRow),
	}
	r.New, r.NewList = newOf[batchv1.Job, batchv1.JobList]()
	return r
}

func leases() *Resource {
	r := &Resource{GroupVersionKind: gvk("coordination.k8s.io", "Lease"), Plural: "leases", Singular: "lease", Namespaced: true,
		StorageKey: "leases", Volatile: []string{corev1.NamespaceNodeLease}, AllowCreateOnUpdate: true,
		Validate: typedValidate(validateLease), Columns: leaseColumns, Row: typedRow(leaseRow),
	}
	r.New, r.NewList = newOf[coordinationv1.Lease, coordinationv1.LeaseList]()
	return r
}

func endpointSlices() *Resource {
	r := &Resource{GroupVersionKind: gvk("discovery.k8s.io", "EndpointSlice"), Plural: "endpointslices", Singular: "endpointslice",
		Namespaced: true, StorageKey: "endpointslices", Validate: typedValidate(validateEndpointSlice),
		ValidateUpdate: typedValidateUpdate(func(s, old *discoveryv1.EndpointSlice) field.ErrorList {
			return immutable(s.AddressType, old.AddressType, field.NewPath("addressType"))
		}),
		Columns: endpointSliceColumns, Row: typedRow(endpointSliceRow),
	}
	r.New, r.NewList = newOf[discoveryv1.EndpointSlice, discoveryv1.EndpointSliceList]()
	return r
}

// eventsV1 serves the same stored Events as core v1 in the events.k8s.io
// shape, as Kubernetes does: one set of objects, two views.
func eventsV1() *Resource {
	r := &Resource{GroupVersionKind: gvk("events.k8s.io", "Event"), Plural: "events", Singular: "event", Namespaced: true,
		StorageKey: "events", Volatile: []string{"*"}, AllowCreateOnUpdate: true,
		Columns: eventsV1Columns, Row: typedRow(eventsV1Row),
		Fields: typedFields(func(e *eventsv1.Event) fields.Set {
			set := eventFields(EventToCore(e))
			for _, k := range []string{"kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath"} {
				set["regarding."+k] = set["involvedObject."+k]
				delete(set, "involvedObject."+k)
			}
			set["reportingController"] = e.ReportingController
			return set
		}),
		StorageNew: func() runtime.Object { return &corev1.Event{} },
		ToStorage:  func(o runtime.Object) runtime.Object { return EventToCore(o.(*eventsv1.Event)) },
		FromStorage: func(o runtime.Object) runtime.Object {
			return EventFromCore(o.(*corev1.Event))
		},
	}
	r.New, r.NewList = newOf[eventsv1.Event, eventsv1.EventList]()
	return r
}
