package resources

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
)

// The tables mirror the columns Kubernetes' printers give `kubectl get`
// (priority 1 columns are the extra ones of -o wide).

func col(name, typ string, priority int32, desc string) metav1.TableColumnDefinition {
	format := ""
	if name == "Name" {
		format = "name"
	}
	return metav1.TableColumnDefinition{Name: name, Type: typ, Format: format, Priority: priority, Description: desc}
}

var (
	nameCol = col("Name", "string", 0, metav1.ObjectMeta{}.SwaggerDoc()["name"])
	ageCol  = col("Age", "string", 0, metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"])
)

// DefaultColumns is the table of a resource without its own printer.
var DefaultColumns = []metav1.TableColumnDefinition{nameCol, col("Created At", "date", 0, metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"])}

// DefaultRow is the row of a resource without its own printer.
func DefaultRow(obj runtime.Object) []any {
	m, err := meta.Accessor(obj)
	if err != nil {
		return []any{"", ""}
	}
	return []any{m.GetName(), m.GetCreationTimestamp().UTC().Format(time.RFC3339)}
}

func age(t metav1.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(time.Since(t.Time))
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

func containersAndImages(spec *corev1.PodSpec) (string, string) {
	var names, images []string
	for _, c := range spec.Containers {
		names = append(names, c.Name)
		images = append(images, c.Image)
	}
	return strings.Join(names, ","), strings.Join(images, ",")
}

func selectorString(sel *metav1.LabelSelector) string {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return "<error>"
	}
	return orNone(s.String())
}

var podColumns = []metav1.TableColumnDefinition{
	nameCol,
	col("Ready", "string", 0, "The aggregate readiness state of this pod for accepting traffic."),
	col("Status", "string", 0, "The aggregate status of the containers in this pod."),
	col("Restarts", "string", 0, "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
	ageCol,
	col("IP", "string", 1, corev1.PodStatus{}.SwaggerDoc()["podIP"]),
	col("Node", "string", 1, corev1.PodSpec{}.SwaggerDoc()["nodeName"]),
	col("Nominated Node", "string", 1, corev1.PodStatus{}.SwaggerDoc()["nominatedNodeName"]),
	col("Readiness Gates", "string", 1, corev1.PodSpec{}.SwaggerDoc()["readinessGates"]),
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
	return []any{pod.Name, fmt.Sprintf("%d/%d", ready, len(pod.Spec.Containers)), reason, restartStr, age(pod.CreationTimestamp),
		ip, orNone(pod.Spec.NodeName), orNone(pod.Status.NominatedNodeName), gates}
}

var nodeColumns = []metav1.TableColumnDefinition{
	nameCol,
	col("Status", "string", 0, "The status of the node"),
	col("Roles", "string", 0, "The roles of the node"),
	ageCol,
	col("Version", "string", 0, corev1.NodeSystemInfo{}.SwaggerDoc()["kubeletVersion"]),
	col("Internal-IP", "string", 1, corev1.NodeStatus{}.SwaggerDoc()["addresses"]),
	col("External-IP", "string", 1, corev1.NodeStatus{}.SwaggerDoc()["addresses"]),
	col("OS-Image", "string", 1, corev1.NodeSystemInfo{}.SwaggerDoc()["osImage"]),
	col("Kernel-Version", "string", 1, corev1.NodeSystemInfo{}.SwaggerDoc()["kernelVersion"]),
	col("Container-Runtime", "string", 1, corev1.NodeSystemInfo{}.SwaggerDoc()["containerRuntimeVersion"]),
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
	return []any{n.Name, status, orNone(strings.Join(roles, ",")), age(n.CreationTimestamp), info.KubeletVersion,
		internal, external, orNone(info.OSImage), orNone(info.KernelVersion), orNone(info.ContainerRuntimeVersion)}
}

var namespaceColumns = []metav1.TableColumnDefinition{nameCol, col("Status", "string", 0, "The status of the namespace"), ageCol}

func namespaceRow(ns *corev1.Namespace) []any {
	return []any{ns.Name, string(ns.Status.Phase), age(ns.CreationTimestamp)}
}

var serviceColumns = []metav1.TableColumnDefinition{
	nameCol,
	col("Type", "string", 0, corev1.ServiceSpec{}.SwaggerDoc()["type"]),
	col("Cluster-IP", "string", 0, corev1.ServiceSpec{}.SwaggerDoc()["clusterIP"]),
	col("External-IP", "string", 0, corev1.ServiceSpec{}.SwaggerDoc()["externalIPs"]),
	col("Port(s)", "string", 0, corev1.ServiceSpec{}.SwaggerDoc()["ports"]),
	ageCol,
	col("Selector", "string", 1, corev1.ServiceSpec{}.SwaggerDoc()["selector"]),
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
	return []any{svc.Name, string(svc.Spec.Type), clusterIP, external, orNone(strings.Join(ports, ",")),
		age(svc.CreationTimestamp), orNone(labels.FormatLabels(svc.Spec.Selector))}
}

var endpointsColumns = []metav1.TableColumnDefinition{nameCol, col("Endpoints", "string", 0, corev1.Endpoints{}.SwaggerDoc()["subsets"]), ageCol}

func endpointsRow(ep *corev1.Endpoints) []any {
	var list []string
	total := 0
	for _, s := range ep.Subsets {
		for _, a := range s.Addresses {
			if len(s.Ports) == 0 {
				total++
				if len(list) < 3 {
					list = append(list, a.IP)
				}
			}
			for _, p := range s.Ports {
				total++
				if len(list) < 3 {
					list = append(list, fmt.Sprintf("%s:%d", a.IP, p.Port))
				}
			}
		}
	}
	s := strings.Join(list, ",")
	if total > len(list) {
		s += fmt.Sprintf(" + %d more...", total-len(list))
	}
	return []any{ep.Name, orNone(s), age(ep.CreationTimestamp)}
}

var configMapColumns = []metav1.TableColumnDefinition{nameCol, col("Data", "integer", 0, corev1.ConfigMap{}.SwaggerDoc()["data"]), ageCol}

func configMapRow(cm *corev1.ConfigMap) []any {
	return []any{cm.Name, int64(len(cm.Data) + len(cm.BinaryData)), age(cm.CreationTimestamp)}
}

var secretColumns = []metav1.TableColumnDefinition{nameCol, col("Type", "string", 0, corev1.Secret{}.SwaggerDoc()["type"]),
	col("Data", "string", 0, corev1.Secret{}.SwaggerDoc()["data"]), ageCol}

func secretRow(s *corev1.Secret) []any {
	return []any{s.Name, string(s.Type), int64(len(s.Data)), age(s.CreationTimestamp)}
}

var serviceAccountColumns = []metav1.TableColumnDefinition{nameCol, col("Secrets", "string", 0, corev1.ServiceAccount{}.SwaggerDoc()["secrets"]), ageCol}

func serviceAccountRow(sa *corev1.ServiceAccount) []any {
	return []any{sa.Name, int64(len(sa.Secrets)), age(sa.CreationTimestamp)}
}

var eventColumns = []metav1.TableColumnDefinition{
	col("Last Seen", "string", 0, corev1.Event{}.SwaggerDoc()["lastTimestamp"]),
	col("Type", "string", 0, corev1.Event{}.SwaggerDoc()["type"]),
	col("Reason", "string", 0, corev1.Event{}.SwaggerDoc()["reason"]),
	col("Object", "string", 0, corev1.Event{}.SwaggerDoc()["involvedObject"]),
	col("Subobject", "string", 1, corev1.ObjectReference{}.SwaggerDoc()["fieldPath"]),
	col("Source", "string", 1, corev1.Event{}.SwaggerDoc()["source"]),
	col("Message", "string", 0, corev1.Event{}.SwaggerDoc()["message"]),
	col("First Seen", "string", 1, corev1.Event{}.SwaggerDoc()["firstTimestamp"]),
	col("Count", "string", 1, corev1.Event{}.SwaggerDoc()["count"]),
	{Name: "Name", Type: "string", Format: "name", Priority: 1, Description: metav1.ObjectMeta{}.SwaggerDoc()["name"]},
}

func eventRow(e *corev1.Event) []any {
	first, last := e.FirstTimestamp, e.LastTimestamp
	if last.IsZero() {
		last = metav1.NewTime(e.EventTime.Time)
	}
	if first.IsZero() {
		first = last
	}
	lastSeen := age(last)
	if e.Series != nil {
		lastSeen = fmt.Sprintf("%s (x%d over %s)", age(metav1.NewTime(e.Series.LastObservedTime.Time)), e.Series.Count, age(first))
	} else if e.Count > 1 {
		lastSeen = fmt.Sprintf("%s (x%d over %s)", lastSeen, e.Count, age(first))
	}
	obj := strings.ToLower(e.InvolvedObject.Kind) + "/" + e.InvolvedObject.Name
	source := e.Source.Component
	if source == "" {
		source = e.ReportingController
	}
	if e.Source.Host != "" {
		source += ", " + e.Source.Host
	}
	return []any{lastSeen, e.Type, e.Reason, obj, e.InvolvedObject.FieldPath, source,
		strings.TrimSpace(e.Message), age(first), int64(e.Count), e.Name}
}

var eventsV1Columns = []metav1.TableColumnDefinition{
	col("Last Seen", "string", 0, eventsv1.Event{}.SwaggerDoc()["eventTime"]),
	col("Type", "string", 0, eventsv1.Event{}.SwaggerDoc()["type"]),
	col("Reason", "string", 0, eventsv1.Event{}.SwaggerDoc()["reason"]),
	col("Object", "string", 0, eventsv1.Event{}.SwaggerDoc()["regarding"]),
	col("Message", "string", 0, eventsv1.Event{}.SwaggerDoc()["note"]),
}

func eventsV1Row(e *eventsv1.Event) []any {
	last := e.EventTime.Time
	if e.Series != nil {
		last = e.Series.LastObservedTime.Time
	} else if !e.DeprecatedLastTimestamp.IsZero() {
		last = e.DeprecatedLastTimestamp.Time
	}
	return []any{age(metav1.NewTime(last)), e.Type, e.Reason, strings.ToLower(e.Regarding.Kind) + "/" + e.Regarding.Name, strings.TrimSpace(e.Note)}
}

var deploymentColumns = []metav1.TableColumnDefinition{
	nameCol,
	col("Ready", "string", 0, "Number of the pod with ready state"),
	col("Up-to-date", "string", 0, appsv1.DeploymentStatus{}.SwaggerDoc()["updatedReplicas"]),
	col("Available", "string", 0, appsv1.DeploymentStatus{}.SwaggerDoc()["availableReplicas"]),
	ageCol,
	col("Containers", "string", 1, "Names of each container in the template."),
	col("Images", "string", 1, "Images referenced by each container in the template."),
	col("Selector", "string", 1, appsv1.DeploymentSpec{}.SwaggerDoc()["selector"]),
}

func replicas(n *int32) int32 {
	if n == nil {
		return 1
	}
	return *n
}

func deploymentRow(d *appsv1.Deployment) []any {
	names, images := containersAndImages(&d.Spec.Template.Spec)
	return []any{d.Name, fmt.Sprintf("%d/%d", d.Status.ReadyReplicas, replicas(d.Spec.Replicas)), int64(d.Status.UpdatedReplicas),
		int64(d.Status.AvailableReplicas), age(d.CreationTimestamp), names, images, selectorString(d.Spec.Selector)}
}

var replicaSetColumns = []metav1.TableColumnDefinition{
	nameCol,
	col("Desired", "integer", 0, appsv1.ReplicaSetSpec{}.SwaggerDoc()["replicas"]),
	col("Current", "integer", 0, appsv1.ReplicaSetStatus{}.SwaggerDoc()["replicas"]),
	col("Ready", "integer", 0, appsv1.ReplicaSetStatus{}.SwaggerDoc()["readyReplicas"]),
	ageCol,
	col("Containers", "string", 1, "Names of each container in the template."),
	col("Images", "string", 1, "Images referenced by each container in the template."),
	col("Selector", "string", 1, appsv1.ReplicaSetSpec{}.SwaggerDoc()["selector"]),
}

func replicaSetRow(rs *appsv1.ReplicaSet) []any {
	names, images := containersAndImages(&rs.Spec.Template.Spec)
	return []any{rs.Name, int64(replicas(rs.Spec.Replicas)), int64(rs.Status.Replicas), int64(rs.Status.ReadyReplicas),
		age(rs.CreationTimestamp), names, images, selectorString(rs.Spec.Selector)}
}

var daemonSetColumns = []metav1.TableColumnDefinition{
	nameCol,
	col("Desired", "integer", 0, appsv1.DaemonSetStatus{}.SwaggerDoc()["desiredNumberScheduled"]),
	col("Current", "integer", 0, appsv1.DaemonSetStatus{}.SwaggerDoc()["currentNumberScheduled"]),
	col("Ready", "integer", 0, appsv1.DaemonSetStatus{}.SwaggerDoc()["numberReady"]),
	col("Up-to-date", "integer", 0, appsv1.DaemonSetStatus{}.SwaggerDoc()["updatedNumberScheduled"]),
	col("Available", "integer", 0, appsv1.DaemonSetStatus{}.SwaggerDoc()["numberAvailable"]),
	col("Node Selector", "string", 0, corev1.PodSpec{}.SwaggerDoc()["nodeSelector"]),
	ageCol,
	col("Containers", "string", 1, "Names of each container in the template."),
	col("Images", "string", 1, "Images referenced by each container in the template."),
	col("Selector", "string", 1, appsv1.DaemonSetSpec{}.SwaggerDoc()["selector"]),
}

func daemonSetRow(ds *appsv1.DaemonSet) []any {
	names, images := containersAndImages(&ds.Spec.Template.Spec)
	s := ds.Status
	return []any{ds.Name, int64(s.DesiredNumberScheduled), int64(s.CurrentNumberScheduled), int64(s.NumberReady),
		int64(s.UpdatedNumberScheduled), int64(s.NumberAvailable), orNone(labels.FormatLabels(ds.Spec.Template.Spec.NodeSelector)),
		age(ds.CreationTimestamp), names, images, selectorString(ds.Spec.Selector)}
}

var jobColumns = []metav1.TableColumnDefinition{
	nameCol,
	col("Status", "string", 0, "Status of the job."),
	col("Completions", "string", 0, batchv1.JobStatus{}.SwaggerDoc()["succeeded"]),
	col("Duration", "string", 0, "Time required to complete the job."),
	ageCol,
	col("Containers", "string", 1, "Names of each container in the template."),
	col("Images", "string", 1, "Images referenced by each container in the template."),
	col("Selector", "string", 1, batchv1.JobSpec{}.SwaggerDoc()["selector"]),
}

func jobRow(job *batchv1.Job) []any {
	completions := fmt.Sprintf("%d/1 of %d", job.Status.Succeeded, ptrOr(job.Spec.Parallelism, 1))
	if job.Spec.Completions != nil {
		completions = fmt.Sprintf("%d/%d", job.Status.Succeeded, *job.Spec.Completions)
	}
	status := "Running"
	for _, c := range job.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			status = "Complete"
		case batchv1.JobFailed:
			status = "Failed"
		case batchv1.JobSuspended:
			status = "Suspended"
		case batchv1.JobFailureTarget:
			status = "FailureTarget"
		case batchv1.JobSuccessCriteriaMet:
			status = "SuccessCriteriaMet"
		}
	}
	if job.DeletionTimestamp != nil {
		status = "Terminating"
	}
	dur := ""
	if job.Status.StartTime != nil {
		end := time.Now()
		if job.Status.CompletionTime != nil {
			end = job.Status.CompletionTime.Time
		}
		dur = duration.HumanDuration(end.Sub(job.Status.StartTime.Time))
	}
	names, images := containersAndImages(&job.Spec.Template.Spec)
	return []any{job.Name, status, completions, dur, age(job.CreationTimestamp), names, images, selectorString(job.Spec.Selector)}
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

var leaseColumns = []metav1.TableColumnDefinition{nameCol, col("Holder", "string", 0, coordinationv1.LeaseSpec{}.SwaggerDoc()["holderIdentity"]), ageCol}

func leaseRow(l *coordinationv1.Lease) []any {
	return []any{l.Name, ptrOr(l.Spec.HolderIdentity, ""), age(l.CreationTimestamp)}
}

var endpointSliceColumns = []metav1.TableColumnDefinition{
	nameCol,
	col("AddressType", "string", 0, discoveryv1.EndpointSlice{}.SwaggerDoc()["addressType"]),
	col("Ports", "string", 0, discoveryv1.EndpointSlice{}.SwaggerDoc()["ports"]),
	col("Endpoints", "string", 0, discoveryv1.EndpointSlice{}.SwaggerDoc()["endpoints"]),
	ageCol,
}

func endpointSliceRow(s *discoveryv1.EndpointSlice) []any {
	var ports []string
	for _, p := range s.Ports {
		if p.Port != nil {
			ports = append(ports, strconv.Itoa(int(*p.Port)))
		}
	}
	var addrs []string
	total := 0
	for _, e := range s.Endpoints {
		for _, a := range e.Addresses {
			total++
			if len(addrs) < 3 {
				addrs = append(addrs, a)
			}
		}
	}
	eps := strings.Join(addrs, ",")
	if total > len(addrs) {
		eps += fmt.Sprintf(" + %d more...", total-len(addrs))
	}
	portStr := strings.Join(ports, ",")
	if len(s.Ports) == 0 {
		portStr = "<unset>"
	}
	return []any{s.Name, string(s.AddressType), portStr, orNone(eps), age(s.CreationTimestamp)}
}
