package rest

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/api/admission"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/streaming/pkg/httpstream/wsstream"
)

// Kubelets reach the nodes' kubelet API for the subresources served
// there.
type Kubelets interface {
	Proxy(w http.ResponseWriter, r *http.Request, node *corev1.Node, path string, query url.Values) error
}

// defaultContainerAnnotation names the container kubectl picks when a pod
// has several.
const defaultContainerAnnotation = "kubectl.kubernetes.io/default-container"

// podLog serves pods/log: the API server checks the request against the
// pod, as kube-apiserver does, and proxies it to the kubelet of the pod's
// node.
func (q *request) podLog() error {
	if q.info.Verb != "get" {
		return apierrors.NewMethodNotSupported(schema.GroupResource{Resource: "pods/log"}, q.info.Verb)
	}
	if q.h.opts.Kubelets == nil {
		return apierrors.NewServiceUnavailable("pod logs are not served: no kubelet client")
	}
	opts, errs := podLogOptions(q.r.URL.Query())
	if opts.TailLines != nil && *opts.TailLines < 0 {
		errs = append(errs, field.Invalid(field.NewPath("tailLines"), *opts.TailLines, "must be greater than or equal to 0"))
	}
	if opts.LimitBytes != nil && *opts.LimitBytes < 1 {
		errs = append(errs, field.Invalid(field.NewPath("limitBytes"), *opts.LimitBytes, "must be greater than 0"))
	}
	if opts.SinceSeconds != nil && *opts.SinceSeconds < 1 {
		errs = append(errs, field.Invalid(field.NewPath("sinceSeconds"), *opts.SinceSeconds, "must be greater than 0"))
	}
	if opts.SinceSeconds != nil && opts.SinceTime != nil {
		errs = append(errs, field.Forbidden(field.NewPath(""), "at most one of `sinceTime` or `sinceSeconds` may be specified"))
	}
	if len(errs) > 0 {
		return apierrors.NewInvalid(schema.GroupKind{Kind: "PodLogOptions"}, q.info.Name, errs)
	}
	pod, node, err := q.podOnNode()
	if err != nil {
		return err
	}
	container, err := logContainer(pod, opts.Container)
	if err != nil {
		return err
	}
	query := url.Values{}
	set := func(k string, on bool, v string) {
		if on {
			query.Set(k, v)
		}
	}
	set("follow", opts.Follow, "true")
	set("previous", opts.Previous, "true")
	set("timestamps", opts.Timestamps, "true")
	if opts.TailLines != nil {
		query.Set("tailLines", strconv.FormatInt(*opts.TailLines, 10))
	}
	if opts.LimitBytes != nil {
		query.Set("limitBytes", strconv.FormatInt(*opts.LimitBytes, 10))
	}
	if opts.SinceSeconds != nil {
		query.Set("sinceSeconds", strconv.FormatInt(*opts.SinceSeconds, 10))
	}
	if opts.SinceTime != nil {
		query.Set("sinceTime", opts.SinceTime.UTC().Format("2006-01-02T15:04:05Z07:00"))
	}
	path := "/containerLogs/" + url.PathEscape(pod.Namespace) + "/" + url.PathEscape(pod.Name) + "/" + url.PathEscape(container)
	if wsstream.IsWebSocketRequest(q.r) {
		return q.logOverWebSocket(node, path, query)
	}
	return q.h.opts.Kubelets.Proxy(q.w, q.r, node, path, query)
}

// podStream serves pods/exec, pods/attach and pods/portforward by proxying
// them, with their protocol upgrade (SPDY, or websockets kubectl tries
// first), to the kubelet of the pod's node; PodExecOptions and
// PodAttachOptions become the kubelet's parameters.
func (q *request) podStream() error {
	sub := q.info.Subresource
	if q.info.Verb != "get" && q.info.Verb != "create" {
		return apierrors.NewMethodNotSupported(schema.GroupResource{Resource: "pods/" + sub}, q.info.Verb)
	}
	if q.h.opts.Kubelets == nil {
		return apierrors.NewServiceUnavailable("pods/" + sub + " is not served: no kubelet client")
	}
	pod, node, err := q.podOnNode()
	if err != nil {
		return err
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return apierrors.NewBadRequest(fmt.Sprintf("cannot %s into a container in a completed pod; current phase is %s", map[string]string{"exec": "exec", "attach": "attach", "portforward": "port-forward"}[sub], pod.Status.Phase))
	}
	in := q.r.URL.Query()
	if err := q.admitConnect(pod, in); err != nil {
		return err
	}
	out := url.Values{}
	var path string
	switch sub {
	case "exec", "attach":
		container, err := logContainer(pod, in.Get("container"))
		if err != nil {
			return err
		}
		if sub == "exec" {
			if len(in["command"]) == 0 {
				return apierrors.NewBadRequest("you must specify at least one command for the container")
			}
			out["command"] = in["command"]
		}
		for from, to := range map[string]string{"stdin": "input", "stdout": "output", "stderr": "error", "tty": "tty"} {
			if b, _ := strconv.ParseBool(in.Get(from)); b {
				out.Set(to, "1")
			}
		}
		path = "/" + sub + "/" + url.PathEscape(pod.Namespace) + "/" + url.PathEscape(pod.Name) + "/" + url.PathEscape(container)
	case "portforward":
		out["ports"] = in["ports"]
		path = "/portForward/" + url.PathEscape(pod.Namespace) + "/" + url.PathEscape(pod.Name)
	}
	return q.h.opts.Kubelets.Proxy(q.w, q.r, node, path, out)
}

// nodeProxiedPaths are what nodes/proxy reaches of a kubelet API: the
// Summary API and the metrics endpoints, read-only, as Prometheus scrapes
// them through the API server. Kubernetes passes any path; orch's kubelet API
// answers logs, exec and the rest through the pods' own subresources,
// authorized there.
var nodeProxiedPaths = map[string]bool{"/stats/summary": true, "/metrics": true, "/metrics/resource": true, "/metrics/cadvisor": true}

// nodeProxy serves nodes/NAME/proxy/PATH: a GET passed to the node's
// kubelet API.
func (q *request) nodeProxy() error {
	if q.info.Verb != "get" {
		return apierrors.NewMethodNotSupported(schema.GroupResource{Resource: "nodes/proxy"}, q.info.Verb)
	}
	if !nodeProxiedPaths[q.info.SubPath] {
		return apierrors.NewNotFound(schema.GroupResource{Resource: "nodes/proxy"}, q.info.Name+q.info.SubPath)
	}
	if q.h.opts.Kubelets == nil {
		return apierrors.NewServiceUnavailable("nodes/proxy is not served: no kubelet client")
	}
	obj, err := q.st.Get(q.ctx(), "", q.info.Name)
	if err != nil {
		return err
	}
	return q.h.opts.Kubelets.Proxy(q.w, q.r, obj.(*corev1.Node), q.info.SubPath, url.Values{})
}

// podOnNode is the pod a pods/log, exec, attach or portforward request names and
// the node it is bound to.
func (q *request) podOnNode() (*corev1.Pod, *corev1.Node, error) {
	obj, err := q.st.Get(q.ctx(), q.namespace, q.info.Name)
	if err != nil {
		return nil, nil, err
	}
	pod := obj.(*corev1.Pod)
	if pod.Spec.NodeName == "" {
		return nil, nil, apierrors.NewBadRequest(fmt.Sprintf("pod %s does not have a host assigned", pod.Name))
	}
	nodes := q.served.Storage(corev1.SchemeGroupVersion.WithResource("nodes"))
	if nodes == nil {
		return nil, nil, apierrors.NewServiceUnavailable("nodes are not served")
	}
	node, err := nodes.Get(q.ctx(), "", pod.Spec.NodeName)
	if err != nil {
		return nil, nil, apierrors.NewServiceUnavailable(fmt.Sprintf("node %q of pod %s: %v", pod.Spec.NodeName, pod.Name, err))
	}
	return pod, node.(*corev1.Node), nil
}

// podLogOptions parses PodLogOptions from a query (k8s.io/api carries no
// conversion from url.Values for it).
func podLogOptions(q url.Values) (corev1.PodLogOptions, field.ErrorList) {
	var opts corev1.PodLogOptions
	var errs field.ErrorList
	boolean := func(name string) bool {
		v := q.Get(name)
		if v == "" {
			return false
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, field.Invalid(field.NewPath(name), v, "must be true or false"))
		}
		return b
	}
	integer := func(name string) *int64 {
		v := q.Get(name)
		if v == "" {
			return nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			errs = append(errs, field.Invalid(field.NewPath(name), v, "must be an integer"))
			return nil
		}
		return &n
	}
	opts.Container = q.Get("container")
	opts.Follow, opts.Previous, opts.Timestamps = boolean("follow"), boolean("previous"), boolean("timestamps")
	opts.TailLines, opts.LimitBytes, opts.SinceSeconds = integer("tailLines"), integer("limitBytes"), integer("sinceSeconds")
	if v := q.Get("sinceTime"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			errs = append(errs, field.Invalid(field.NewPath("sinceTime"), v, "must be an RFC 3339 time"))
		} else {
			mt := metav1.NewTime(t)
			opts.SinceTime = &mt
		}
	}
	return opts, errs
}

// logContainer is the container a log request means: the one named, the
// pod's only one, or its default-container annotation's; otherwise the
// request must name one, as kube-apiserver says.
func logContainer(pod *corev1.Pod, name string) (string, error) {
	var names, initNames []string
	for _, c := range pod.Spec.Containers {
		names = append(names, c.Name)
	}
	for _, c := range pod.Spec.InitContainers {
		initNames = append(initNames, c.Name)
	}
	if name == "" {
		if d := pod.Annotations[defaultContainerAnnotation]; d != "" {
			name = d
		} else if len(names) == 1 {
			return names[0], nil
		} else {
			msg := fmt.Sprintf("a container name must be specified for pod %s, choose one of: [%s]", pod.Name, strings.Join(names, " "))
			if len(initNames) > 0 {
				msg += fmt.Sprintf(" or one of the init containers: [%s]", strings.Join(initNames, " "))
			}
			return "", apierrors.NewBadRequest(msg)
		}
	}
	valid := append(names, initNames...)
	for _, c := range pod.Spec.EphemeralContainers {
		valid = append(valid, c.Name) // kubectl debug attaches to one, logs read one
	}
	for _, n := range valid {
		if n == name {
			return name, nil
		}
	}
	return "", apierrors.NewBadRequest(fmt.Sprintf("container %s is not valid for pod %s", name, pod.Name))
}

// admitConnect puts an exec, attach or port-forward to the cluster's
// admission as a CONNECT, its options the object, as Kubernetes does:
// policy engines refuse exec into some pods this way.
func (q *request) admitConnect(pod *corev1.Pod, in url.Values) error {
	ext := q.st.External
	if ext == nil || !ext.Active() {
		return nil
	}
	var opts runtime.Object
	flag := func(name string) bool { b, _ := strconv.ParseBool(in.Get(name)); return b }
	switch q.info.Subresource {
	case "exec":
		opts = &corev1.PodExecOptions{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodExecOptions"}, Container: in.Get("container"), Command: in["command"],
			Stdin: flag("stdin"), Stdout: flag("stdout"), Stderr: flag("stderr"), TTY: flag("tty")}
	case "attach":
		opts = &corev1.PodAttachOptions{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodAttachOptions"}, Container: in.Get("container"),
			Stdin: flag("stdin"), Stdout: flag("stdout"), Stderr: flag("stderr"), TTY: flag("tty")}
	default:
		pf := &corev1.PodPortForwardOptions{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodPortForwardOptions"}}
		for _, p := range in["ports"] {
			for _, one := range strings.Split(p, ",") {
				if n, err := strconv.ParseInt(strings.TrimSpace(one), 10, 32); err == nil {
					pf.Ports = append(pf.Ports, int32(n))
				}
			}
		}
		opts = pf
	}
	a := &admission.Attributes{Resource: q.st.Resource, Operation: admission.Connect, Subresource: q.info.Subresource,
		Namespace: pod.Namespace, Name: pod.Name, Object: opts, Options: opts}
	if err := ext.Mutate(q.ctx(), a); err != nil {
		return err
	}
	return ext.Validate(q.ctx(), a)
}
