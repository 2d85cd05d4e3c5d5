package pods

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// configError is a container that cannot be created as its spec stands:
// Kubernetes reports it as waiting with reason, and tries again.
type configError struct {
	reason, message string
	cause           error // what went wrong underneath, when something did
}

func (e *configError) Error() string { return e.reason + ": " + e.message }

// sources reads the ConfigMaps and Secrets a pod refers to, each once per
// sync.
type sources struct {
	m          *Manager
	namespace  string
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
	// provisional: a service-account token could not be asked for (the
	// node started its pods offline) and was left empty until it can.
	provisional bool
}

func (m *Manager) sources(namespace string) *sources {
	return &sources{m: m, namespace: namespace, configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
}

// ConfigMap is the named ConfigMap, nil when it does not exist.
func (s *sources) ConfigMap(ctx context.Context, name string) (*corev1.ConfigMap, error) {
	if cm, ok := s.configMaps[name]; ok {
		return cm, nil
	}
	cm, err := s.m.api.ConfigMaps(s.namespace).Get(ctx, name, metav1.GetOptions{})
	cp := s.m.cfg.Checkpoint
	switch {
	case apierrors.IsNotFound(err):
		cm, err = nil, nil
		if cp != nil {
			if err := cp.DeleteConfigMap(s.namespace, name); err != nil {
				s.m.log.Error("checkpoint", "configmap", s.namespace+"/"+name, "err", err)
			}
		}
	case err != nil && cp != nil && !s.m.pods.HasSynced():
		// Offline, from the checkpoint: the copy taken when it was last read.
		if saved, cerr := cp.ConfigMap(s.namespace, name); cerr == nil && saved != nil {
			cm, err = saved, nil
		}
	case err == nil && cp != nil:
		if err := cp.SaveConfigMap(cm); err != nil {
			s.m.log.Error("checkpoint", "configmap", s.namespace+"/"+name, "err", err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("configmap %q: %w", name, err)
	}
	s.configMaps[name] = cm
	return cm, nil
}

// Secret is the named Secret, nil when it does not exist.
func (s *sources) Secret(ctx context.Context, name string) (*corev1.Secret, error) {
	if sec, ok := s.secrets[name]; ok {
		return sec, nil
	}
	sec, err := s.m.api.Secrets(s.namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		sec, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("secret %q: %w", name, err)
	}
	s.secrets[name] = sec
	return sec, nil
}

// environment is a container's environment as the kubelet builds it:
// envFrom in order, then env (expanding $(VAR) references to variables
// defined before), then the service links for names not yet taken.
func (m *Manager) environment(ctx context.Context, src *sources, pod *corev1.Pod, c *corev1.Container) ([]string, error) {
	env := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := env[k]; !ok {
			order = append(order, k)
		}
		env[k] = v
	}
	for _, from := range c.EnvFrom {
		var data map[string]string
		switch {
		case from.ConfigMapRef != nil:
			cm, err := src.ConfigMap(ctx, from.ConfigMapRef.Name)
			if err != nil {
				return nil, err
			}
			if cm == nil {
				if ptrTrue(from.ConfigMapRef.Optional) {
					continue
				}
				return nil, &configError{reason: "CreateContainerConfigError", message: fmt.Sprintf("configmap %q not found", from.ConfigMapRef.Name)}
			}
			data = cm.Data
		case from.SecretRef != nil:
			sec, err := src.Secret(ctx, from.SecretRef.Name)
			if err != nil {
				return nil, err
			}
			if sec == nil {
				if ptrTrue(from.SecretRef.Optional) {
					continue
				}
				return nil, &configError{reason: "CreateContainerConfigError", message: fmt.Sprintf("secret %q not found", from.SecretRef.Name)}
			}
			data = map[string]string{}
			for k, v := range sec.Data {
				data[k] = string(v)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(data)) {
			if name := from.Prefix + k; !strings.Contains(name, "=") {
				set(name, data[k])
			}
		}
	}
	services, err := m.serviceEnv(pod)
	if err != nil {
		return nil, err
	}
	lookup := func(name string) (string, bool) {
		if v, ok := env[name]; ok {
			return v, true
		}
		v, ok := services[name]
		return v, ok
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expand(e.Value, lookup))
			continue
		}
		v, ok, err := m.envValueFrom(ctx, src, pod, c, e.ValueFrom)
		if err != nil {
			return nil, err
		}
		if ok {
			set(e.Name, v)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(services)) {
		if _, ok := env[k]; !ok {
			set(k, services[k])
		}
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+env[k])
	}
	return out, nil
}

// envValueFrom resolves one env var's source; ok is false for an optional
// source that is missing.
func (m *Manager) envValueFrom(ctx context.Context, src *sources, pod *corev1.Pod, c *corev1.Container, from *corev1.EnvVarSource) (string, bool, error) {
	switch {
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := src.ConfigMap(ctx, ref.Name)
		if err != nil {
			return "", false, err
		}
		if cm == nil {
			if ptrTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, &configError{reason: "CreateContainerConfigError", message: fmt.Sprintf("configmap %q not found", ref.Name)}
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			if b, bin := cm.BinaryData[ref.Key]; bin {
				return string(b), true, nil
			}
			if ptrTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, &configError{reason: "CreateContainerConfigError", message: fmt.Sprintf("couldn't find key %s in ConfigMap %s/%s", ref.Key, pod.Namespace, ref.Name)}
		}
		return v, true, nil
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		sec, err := src.Secret(ctx, ref.Name)
		if err != nil {
			return "", false, err
		}
		if sec == nil {
			if ptrTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, &configError{reason: "CreateContainerConfigError", message: fmt.Sprintf("secret %q not found", ref.Name)}
		}
		v, ok := sec.Data[ref.Key]
		if !ok {
			if ptrTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, &configError{reason: "CreateContainerConfigError", message: fmt.Sprintf("couldn't find key %s in Secret %s/%s", ref.Key, pod.Namespace, ref.Name)}
		}
		return string(v), true, nil
	case from.FieldRef != nil:
		v, err := m.podField(pod, from.FieldRef.FieldPath)
		return v, err == nil, err
	case from.ResourceFieldRef != nil:
		v, err := m.resourceField(pod, c, from.ResourceFieldRef)
		return v, err == nil, err
	}
	return "", false, &configError{reason: "CreateContainerConfigError", message: "env valueFrom names no source"}
}

// podField is a pod field the downward API exposes.
func (m *Manager) podField(pod *corev1.Pod, path string) (string, error) {
	if key, ok := subscript(path, "metadata.labels"); ok {
		return pod.Labels[key], nil
	}
	if key, ok := subscript(path, "metadata.annotations"); ok {
		return pod.Annotations[key], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return m.cfg.NodeIP, nil
	case "status.podIP", "status.podIPs":
		m.mu.Lock()
		defer m.mu.Unlock()
		if st := m.running[pod.UID]; st != nil {
			return st.ip, nil
		}
		return pod.Status.PodIP, nil
	}
	return "", &configError{reason: "CreateContainerConfigError", message: fmt.Sprintf("unsupported fieldRef %q", path)}
}

// subscript parses field['key'].
func subscript(path, field string) (string, bool) {
	rest, ok := strings.CutPrefix(path, field+"['")
	if !ok || !strings.HasSuffix(rest, "']") {
		return "", false
	}
	return strings.TrimSuffix(rest, "']"), true
}

// formatMap is the downward API's file format for labels and annotations:
// key="value" lines, sorted, values quoted as Go does.
func formatMap(m map[string]string) string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(k + "=" + strconv.Quote(m[k]))
	}
	return b.String()
}

// resourceField is a container's request or limit in divisor units,
// rounded up; an unset limit is the node's allocatable, as Kubernetes
// does.
func (m *Manager) resourceField(pod *corev1.Pod, c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	if ref.ContainerName != "" {
		c = nil
		for i := range pod.Spec.Containers {
			if pod.Spec.Containers[i].Name == ref.ContainerName {
				c = &pod.Spec.Containers[i]
			}
		}
		for i := range pod.Spec.InitContainers {
			if pod.Spec.InitContainers[i].Name == ref.ContainerName {
				c = &pod.Spec.InitContainers[i]
			}
		}
		if c == nil {
			return "", &configError{reason: "CreateContainerConfigError", message: fmt.Sprintf("resourceFieldRef names no container %q", ref.ContainerName)}
		}
	}
	kind, name, _ := strings.Cut(ref.Resource, ".")
	rn := corev1.ResourceName(name)
	var q resource.Quantity
	var ok bool
	switch kind {
	case "limits":
		q, ok = c.Resources.Limits[rn]
	case "requests":
		q, ok = c.Resources.Requests[rn]
	default:
		return "", &configError{reason: "CreateContainerConfigError", message: fmt.Sprintf("unsupported resourceFieldRef %q", ref.Resource)}
	}
	if !ok && kind == "limits" {
		q, ok = m.cfg.Allocatable[rn]
	}
	if !ok && rn != corev1.ResourceCPU && rn != corev1.ResourceMemory && rn != corev1.ResourceEphemeralStorage {
		return "", &configError{reason: "CreateContainerConfigError", message: fmt.Sprintf("unsupported resourceFieldRef %q", ref.Resource)}
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	if rn == corev1.ResourceCPU {
		return strconv.FormatInt(int64(math.Ceil(float64(q.MilliValue())/float64(divisor.MilliValue()))), 10), nil
	}
	return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(divisor.Value()))), 10), nil
}

// serviceEnv is the service links Kubernetes gives every container: the
// API server's (default/kubernetes) and, unless enableServiceLinks is
// false, those of the pod's namespace's services with a cluster IP.
func (m *Manager) serviceEnv(pod *corev1.Pod) (map[string]string, error) {
	env := map[string]string{}
	if m.services == nil {
		return env, nil
	}
	all, err := m.services.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	links := pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks
	byName := map[string]*corev1.Service{}
	for _, svc := range all {
		if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		if svc.Namespace == metav1.NamespaceDefault && svc.Name == "kubernetes" {
			if _, taken := byName[svc.Name]; !taken {
				byName[svc.Name] = svc
			}
		} else if svc.Namespace == pod.Namespace && links {
			byName[svc.Name] = svc
		}
	}
	for _, svc := range byName {
		addServiceEnv(env, svc)
	}
	return env, nil
}

func serviceEnvName(name string) string { return strings.ToUpper(strings.ReplaceAll(name, "-", "_")) }

// addServiceEnv adds NAME_SERVICE_HOST/PORT and the Docker-link style
// variables.
func addServiceEnv(env map[string]string, svc *corev1.Service) {
	prefix := serviceEnvName(svc.Name)
	env[prefix+"_SERVICE_HOST"] = svc.Spec.ClusterIP
	for i, p := range svc.Spec.Ports {
		if i == 0 {
			env[prefix+"_SERVICE_PORT"] = strconv.Itoa(int(p.Port))
		}
		if p.Name != "" {
			env[prefix+"_SERVICE_PORT_"+serviceEnvName(p.Name)] = strconv.Itoa(int(p.Port))
		}
	}
	for i, p := range svc.Spec.Ports {
		proto := strings.ToLower(string(p.Protocol))
		url := fmt.Sprintf("%s://%s:%d", proto, svc.Spec.ClusterIP, p.Port)
		if i == 0 {
			env[prefix+"_PORT"] = url
		}
		portPrefix := fmt.Sprintf("%s_PORT_%d_%s", prefix, p.Port, strings.ToUpper(proto))
		env[portPrefix] = url
		env[portPrefix+"_PROTO"] = proto
		env[portPrefix+"_PORT"] = strconv.Itoa(int(p.Port))
		env[portPrefix+"_ADDR"] = svc.Spec.ClusterIP
	}
}

// expand replaces $(VAR) with VAR's value when it is defined and $$ with
// $, leaving other text as it is: Kubernetes' expansion for env values,
// command and args.
func expand(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

func ptrTrue(b *bool) bool { return b != nil && *b }
