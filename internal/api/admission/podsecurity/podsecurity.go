// Package podsecurity is Kubernetes' Pod Security Admission, built in as
// in every Kubernetes since 1.25: namespace labels
// pod-security.kubernetes.io/{enforce,audit,warn}[-version] choose a
// level (privileged, baseline, restricted) that pods in the namespace are
// checked against — enforce refuses a pod, warn tells the client, audit
// marks the request; the templates of pods' controllers (Deployments,
// Jobs, ...) get warn and audit, never enforce. The checks are Kubernetes'
// own (k8s.io/pod-security-admission/policy, the single-job library
// kube-apiserver uses); this package is the admission around them, with
// the cluster's defaults and exemptions from a PodSecurityConfiguration.
package podsecurity

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	admissionapi "k8s.io/pod-security-admission/admission/api"
	"k8s.io/pod-security-admission/admission/api/load"
	"k8s.io/pod-security-admission/admission/api/validation"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/yaml"
)

// Config is the cluster's defaults (for namespaces without labels) and
// what is exempt from any check.
type Config struct {
	Defaults api.Policy
	// Exempt usernames (the requester), runtime class names and
	// namespaces.
	Usernames, RuntimeClasses, Namespaces []string
}

// DefaultConfig is Kubernetes': privileged at the latest version, nothing
// exempt.
func DefaultConfig() Config {
	latest := api.LevelVersion{Level: api.LevelPrivileged, Version: api.LatestVersion()}
	return Config{Defaults: api.Policy{Enforce: latest, Audit: latest, Warn: latest}}
}

// LoadConfig reads the configuration file kube-apiserver and k3s take
// (--pod-security-admission-config-file): an AdmissionConfiguration
// whose PodSecurity plugin holds a PodSecurityConfiguration (inline, or
// by path), or a PodSecurityConfiguration by itself. An empty path is
// the default.
func LoadConfig(path string) (Config, error) {
	if path == "" {
		return DefaultConfig(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("pod security admission configuration: %w", err)
	}
	data, err = podSecurityPart(data, path)
	if err != nil {
		return Config{}, fmt.Errorf("pod security admission configuration %s: %w", path, err)
	}
	cfg, err := load.LoadFromData(data)
	if err != nil {
		return Config{}, fmt.Errorf("pod security admission configuration %s: %w", path, err)
	}
	if errs := validation.ValidatePodSecurityConfiguration(cfg); len(errs) > 0 {
		return Config{}, fmt.Errorf("pod security admission configuration %s: %w", path, errs.ToAggregate())
	}
	return fromConfiguration(cfg)
}

// podSecurityPart is the PodSecurityConfiguration in data, which may be
// an AdmissionConfiguration naming it.
func podSecurityPart(data []byte, path string) ([]byte, error) {
	var head struct {
		Kind    string `json:"kind"`
		Plugins []struct {
			Name          string          `json:"name"`
			Path          string          `json:"path"`
			Configuration json.RawMessage `json:"configuration"`
		} `json:"plugins"`
	}
	if err := yaml.Unmarshal(data, &head); err != nil {
		return nil, err
	}
	if head.Kind != "AdmissionConfiguration" {
		return data, nil
	}
	for _, p := range head.Plugins {
		if p.Name != "PodSecurity" {
			continue
		}
		if len(p.Configuration) > 0 {
			return p.Configuration, nil
		}
		if p.Path == "" {
			return nil, nil // the plugin named, without a configuration: the defaults
		}
		file := p.Path
		if !filepath.IsAbs(file) {
			file = filepath.Join(filepath.Dir(path), file)
		}
		return os.ReadFile(file)
	}
	return nil, nil
}

func fromConfiguration(c *admissionapi.PodSecurityConfiguration) (Config, error) {
	var cfg Config
	for _, m := range []struct {
		into           *api.LevelVersion
		level, version string
	}{
		{&cfg.Defaults.Enforce, c.Defaults.Enforce, c.Defaults.EnforceVersion},
		{&cfg.Defaults.Audit, c.Defaults.Audit, c.Defaults.AuditVersion},
		{&cfg.Defaults.Warn, c.Defaults.Warn, c.Defaults.WarnVersion},
	} {
		level, err := api.ParseLevel(m.level)
		if err != nil {
			return Config{}, err
		}
		version, err := api.ParseVersion(m.version)
		if err != nil {
			return Config{}, err
		}
		*m.into = api.LevelVersion{Level: level, Version: version}
	}
	cfg.Usernames, cfg.RuntimeClasses, cfg.Namespaces = c.Exemptions.Usernames, c.Exemptions.RuntimeClasses, c.Exemptions.Namespaces
	return cfg, nil
}

// Namespaces reads a namespace, and lists the pods of one (for the check
// of a namespace's new enforce level against the pods it has).
type Namespaces interface {
	Namespace(ctx context.Context, name string) (*corev1.Namespace, error)
	Pods(ctx context.Context, namespace string) ([]*corev1.Pod, error)
}

// Admission is the Pod Security admission of one API server.
type Admission struct {
	cfg        Config
	evaluator  policy.Evaluator
	namespaces Namespaces
}

// New returns the admission for cfg, reading namespaces and pods through
// namespaces.
func New(cfg Config, namespaces Namespaces) (*Admission, error) {
	evaluator, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		return nil, fmt.Errorf("pod security checks: %w", err)
	}
	return &Admission{cfg: cfg, evaluator: evaluator, namespaces: namespaces}, nil
}

// Request is what the admission needs of a write.
type Request struct {
	User        string
	Subresource string
	Namespace   string
	Name        string
	// Resource is the written resource, for the error Kubernetes
	// returns.
	Resource schema.GroupResource
}

// Verdict is the admission's answer: an error refuses the write (a
// Kubernetes Forbidden or Invalid); Warnings go to the client; Audit is
// what the audit level found (Kubernetes writes it as the audit event's
// annotation pod-security.kubernetes.io/audit-violations).
type Verdict struct {
	Err      error
	Warnings []string
	Audit    string
}

// ignoredPodSubresources are the writes through a pod's subresources that
// are not the pod's own spec.
var ignoredPodSubresources = map[string]bool{"exec": true, "attach": true, "binding": true, "eviction": true, "log": true,
	"portforward": true, "proxy": true, "status": true}

// AdmitPod checks a pod created, or updated in a way that matters (its
// images, containers or ephemeral containers), against its namespace's
// levels.
func (a *Admission) AdmitPod(ctx context.Context, r Request, pod, old *corev1.Pod) Verdict {
	if ignoredPodSubresources[r.Subresource] || a.exempt(r) {
		return Verdict{}
	}
	if old != nil && !significantUpdate(pod, old) {
		return Verdict{}
	}
	nsPolicy, nsErrs, err := a.policyOf(ctx, r.Namespace)
	if err != nil {
		return Verdict{Err: apierrors.NewInternalError(fmt.Errorf("failed to lookup namespace %q", r.Namespace))}
	}
	if len(nsErrs) == 0 && nsPolicy.FullyPrivileged() {
		return Verdict{}
	}
	return a.evaluate(r, nsPolicy, &pod.ObjectMeta, &pod.Spec, true)
}

// AdmitController warns and audits (never refuses) a controller's pod
// template: a Deployment whose pods the namespace would refuse is told so
// when it is applied, not when its ReplicaSet fails to make pods.
func (a *Admission) AdmitController(ctx context.Context, r Request, obj runtime.Object) Verdict {
	if r.Subresource != "" || a.exempt(r) {
		return Verdict{}
	}
	meta, spec := podTemplate(obj)
	if spec == nil {
		return Verdict{}
	}
	nsPolicy, nsErrs, err := a.policyOf(ctx, r.Namespace)
	if err != nil {
		return Verdict{Audit: fmt.Sprintf("failed to lookup namespace %q: %v", r.Namespace, err)}
	}
	if len(nsErrs) == 0 && nsPolicy.Warn.Level == api.LevelPrivileged && nsPolicy.Audit.Level == api.LevelPrivileged {
		return Verdict{}
	}
	return a.evaluate(r, nsPolicy, meta, spec, false)
}

// podTemplate is the pod metadata and spec of the kinds that make pods.
func podTemplate(obj runtime.Object) (*metav1.ObjectMeta, *corev1.PodSpec) {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		return &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
	case *appsv1.ReplicaSet:
		return &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
	case *appsv1.StatefulSet:
		return &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
	case *appsv1.DaemonSet:
		return &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
	case *batchv1.Job:
		return &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
	case *batchv1.CronJob:
		return &o.Spec.JobTemplate.Spec.Template.ObjectMeta, &o.Spec.JobTemplate.Spec.Template.Spec
	case *corev1.ReplicationController:
		if o.Spec.Template != nil {
			return &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
		}
	case *corev1.PodTemplate:
		return &o.Template.ObjectMeta, &o.Template.Spec
	}
	return nil, nil
}

// ControllerResources are the kinds AdmitController checks.
var ControllerResources = []schema.GroupResource{
	{Group: "apps", Resource: "deployments"}, {Group: "apps", Resource: "replicasets"}, {Group: "apps", Resource: "statefulsets"},
	{Group: "apps", Resource: "daemonsets"}, {Group: "batch", Resource: "jobs"}, {Group: "batch", Resource: "cronjobs"},
	{Resource: "replicationcontrollers"}, {Resource: "podtemplates"},
}

// AdmitNamespace refuses a namespace whose labels name no level or
// version (on create, or when an update changes them), and, when an
// update makes its enforce level stricter, warns which of its pods the
// new level would refuse.
func (a *Admission) AdmitNamespace(ctx context.Context, r Request, ns, old *corev1.Namespace) Verdict {
	if r.Subresource != "" {
		return Verdict{}
	}
	newPolicy, newErrs := api.PolicyToEvaluate(ns.Labels, a.cfg.Defaults)
	invalid := Verdict{Err: apierrors.NewInvalid(schema.GroupKind{Kind: "Namespace"}, ns.Name, newErrs)}
	if old == nil {
		if len(newErrs) > 0 {
			return invalid
		}
		return Verdict{Warnings: a.exemptNamespaceWarning(ns, newPolicy)}
	}
	oldPolicy, oldErrs := api.PolicyToEvaluate(old.Labels, a.cfg.Defaults)
	if len(newErrs) > 0 && (len(oldErrs) == 0 || newErrs.ToAggregate().Error() != oldErrs.ToAggregate().Error()) {
		return invalid
	}
	switch {
	case newPolicy.Enforce == oldPolicy.Enforce, newPolicy.Enforce.Level == api.LevelPrivileged,
		newPolicy.Enforce.Version == oldPolicy.Enforce.Version && api.CompareLevels(newPolicy.Enforce.Level, oldPolicy.Enforce.Level) < 1:
		return Verdict{}
	case slices.Contains(a.cfg.Namespaces, ns.Name):
		return Verdict{Warnings: a.exemptNamespaceWarning(ns, newPolicy)}
	}
	return Verdict{Warnings: a.checkPods(ctx, ns.Name, newPolicy.Enforce)}
}

// Kubernetes' bounds on the check of a namespace's pods.
const (
	maxPodsToCheck  = 3000
	podCheckTimeout = time.Second
)

// checkPods evaluates a namespace's pods against a new enforce level:
// one warning per distinct reason, naming one pod and how many others.
func (a *Admission) checkPods(ctx context.Context, namespace string, enforce api.LevelVersion) []string {
	ctx, cancel := context.WithTimeout(ctx, podCheckTimeout)
	defer cancel()
	pods, err := a.namespaces.Pods(ctx, namespace)
	if err != nil {
		return []string{"failed to list pods while checking new PodSecurity enforce level"}
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	total := len(pods)
	if len(pods) > maxPodsToCheck {
		pods = pods[:maxPodsToCheck]
	}
	type seen struct {
		pod   string
		count int
	}
	byReason := map[string]*seen{}
	var reasons []string
	checked := len(pods)
	for i, pod := range pods {
		res := policy.AggregateCheckResults(a.evaluator.EvaluatePod(enforce, &pod.ObjectMeta, &pod.Spec))
		if !res.Allowed {
			reason := res.ForbiddenReason()
			if s, ok := byReason[reason]; ok {
				s.count++
			} else {
				byReason[reason] = &seen{pod: pod.Name, count: 1}
				reasons = append(reasons, reason)
			}
		}
		if ctx.Err() != nil {
			checked = i + 1
			break
		}
	}
	var warnings []string
	if checked < total {
		warnings = append(warnings, fmt.Sprintf("new PodSecurity enforce level only checked against the first %d of %d existing pods", checked, total))
	}
	if len(reasons) > 0 {
		warnings = append(warnings, fmt.Sprintf("existing pods in namespace %q violate the new PodSecurity enforce level %q", namespace, enforce.String()))
	}
	var perPod []string
	for _, reason := range reasons {
		s := byReason[reason]
		switch s.count {
		case 1:
			perPod = append(perPod, fmt.Sprintf("%s: %s", s.pod, reason))
		case 2:
			perPod = append(perPod, fmt.Sprintf("%s (and 1 other pod): %s", s.pod, reason))
		default:
			perPod = append(perPod, fmt.Sprintf("%s (and %d other pods): %s", s.pod, s.count-1, reason))
		}
	}
	sort.Strings(perPod)
	return append(warnings, perPod...)
}

// exemptNamespaceWarning tells who labels an exempt namespace that its
// labels are ignored.
func (a *Admission) exemptNamespaceWarning(ns *corev1.Namespace, p api.Policy) []string {
	if !slices.Contains(a.cfg.Namespaces, ns.Name) || p.FullyPrivileged() || p.Equivalent(&a.cfg.Defaults) {
		return nil
	}
	var modes []string
	for _, m := range []struct {
		name, level, version string
		lv                   api.LevelVersion
	}{
		{"enforce", api.EnforceLevelLabel, api.EnforceVersionLabel, p.Enforce},
		{"audit", api.AuditLevelLabel, api.AuditVersionLabel, p.Audit},
		{"warn", api.WarnLevelLabel, api.WarnVersionLabel, p.Warn},
	} {
		_, hasLevel := ns.Labels[m.level]
		_, hasVersion := ns.Labels[m.version]
		if m.lv.Level != api.LevelPrivileged && (hasLevel || hasVersion) {
			modes = append(modes, m.name+"="+m.lv.String())
		}
	}
	return []string{fmt.Sprintf("namespace %q is exempt from Pod Security, and the policy (%s) will be ignored", ns.Name, strings.Join(modes, ", "))}
}

func (a *Admission) exempt(r Request) bool {
	return slices.Contains(a.cfg.Namespaces, r.Namespace) || slices.Contains(a.cfg.Usernames, r.User)
}

func (a *Admission) policyOf(ctx context.Context, namespace string) (api.Policy, field.ErrorList, error) {
	ns, err := a.namespaces.Namespace(ctx, namespace)
	if err != nil {
		return api.Policy{}, nil, err
	}
	p, errs := api.PolicyToEvaluate(ns.Labels, a.cfg.Defaults)
	return p, errs, nil
}

// evaluate is Kubernetes' evaluation of one pod (or template): enforce
// (for pods) refuses, audit is recorded, warn is told unless the write
// is refused anyway. A runtime class exempt skips it all.
func (a *Admission) evaluate(r Request, p api.Policy, meta *metav1.ObjectMeta, spec *corev1.PodSpec, enforce bool) Verdict {
	if spec.RuntimeClassName != nil && slices.Contains(a.cfg.RuntimeClasses, *spec.RuntimeClassName) {
		return Verdict{}
	}
	var v Verdict
	results := map[api.LevelVersion]policy.AggregateCheckResult{}
	check := func(lv api.LevelVersion) policy.AggregateCheckResult {
		if res, ok := results[lv]; ok {
			return res
		}
		res := policy.AggregateCheckResults(a.evaluator.EvaluatePod(lv, meta, spec))
		results[lv] = res
		return res
	}
	if enforce {
		if res := check(p.Enforce); !res.Allowed {
			v.Err = apierrors.NewForbidden(r.Resource, r.Name, fmt.Errorf("violates PodSecurity %q: %s", p.Enforce.String(), res.ForbiddenDetail()))
		}
	}
	if res := check(p.Audit); !res.Allowed {
		v.Audit = fmt.Sprintf("would violate PodSecurity %q: %s", p.Audit.String(), res.ForbiddenDetail())
	}
	if v.Err == nil {
		if res := check(p.Warn); !res.Allowed {
			v.Warnings = append(v.Warnings, fmt.Sprintf("would violate PodSecurity %q: %s", p.Warn.String(), res.ForbiddenDetail()))
		}
	}
	return v
}

// significantUpdate is Kubernetes' test of whether a pod update needs
// checking: containers added or removed, an image changed, an ephemeral
// container added or changed.
func significantUpdate(pod, old *corev1.Pod) bool {
	if len(pod.Spec.Containers) != len(old.Spec.Containers) || len(pod.Spec.InitContainers) != len(old.Spec.InitContainers) {
		return true
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Image != old.Spec.Containers[i].Image {
			return true
		}
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Image != old.Spec.InitContainers[i].Image {
			return true
		}
	}
	for _, c := range pod.Spec.EphemeralContainers {
		i := slices.IndexFunc(old.Spec.EphemeralContainers, func(o corev1.EphemeralContainer) bool { return o.Name == c.Name })
		if i < 0 || old.Spec.EphemeralContainers[i].Image != c.Image {
			return true
		}
	}
	return false
}
