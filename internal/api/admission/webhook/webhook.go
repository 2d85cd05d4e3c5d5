// Package webhook is Kubernetes' dynamic admission control: the
// MutatingWebhookConfigurations and ValidatingWebhookConfigurations of
// admissionregistration.k8s.io/v1, called over HTTPS with AdmissionReview
// v1 in Kubernetes' order — mutating webhooks one after another (their
// JSON patches applied, those asking to be reinvoked called again once a
// later one changed the object), validating webhooks all at once — and
// with its rules, selectors, match conditions, failure policies,
// timeouts and dry-run rules.
//
// The configurations are kept in memory from a watch (Dispatcher is the
// watch's follower for both kinds); with none, a request costs a pointer
// load.
package webhook

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/orch-dev/orch/internal/api/admission"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// ServiceResolver finds where a webhook's Service is served: a ready
// endpoint's address (host:port) for the Service's port; and connects
// to such an address, or a URL's (a pod's may be reachable only through
// its node).
type ServiceResolver interface {
	ResolveService(ctx context.Context, namespace, name string, port int32) (string, error)
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

// NamespaceLabels returns a namespace's labels, for namespace selectors.
type NamespaceLabels func(ctx context.Context, name string) (map[string]string, error)

// Conditions compiles a webhook's matchConditions (CEL); nil when the
// server has no CEL, which refuses webhooks that carry any.
type Conditions interface {
	Compile(conds []admissionregistrationv1.MatchCondition) (Matcher, error)
}

// Matcher evaluates compiled match conditions for one request.
type Matcher interface {
	Match(ctx context.Context, a *admission.Attributes) (bool, error)
}

// Dispatcher calls the cluster's admission webhooks.
type Dispatcher struct {
	services   ServiceResolver
	namespaces NamespaceLabels
	conditions Conditions
	log        *slog.Logger

	mu         sync.Mutex
	configs    map[bool]map[string]runtime.Object // by mutating, then name
	mutating   atomic.Pointer[[]*hook]
	validating atomic.Pointer[[]*hook]
}

// New returns a dispatcher with no webhooks until it is fed.
func New(services ServiceResolver, namespaces NamespaceLabels, conditions Conditions, log *slog.Logger) *Dispatcher {
	return &Dispatcher{services: services, namespaces: namespaces, conditions: conditions, log: log,
		configs: map[bool]map[string]runtime.Object{true: {}, false: {}}}
}

// Follower is the watch follower of one configuration kind.
type Follower struct {
	d        *Dispatcher
	mutating bool
}

// Mutating is the follower of the mutating webhook configurations.
func (d *Dispatcher) Mutating() Follower { return Follower{d, true} }

// Validating is the follower of the validating webhook configurations.
func (d *Dispatcher) Validating() Follower { return Follower{d, false} }

// Replace sets every configuration of the kind, as a watch lists them.
func (f Follower) Replace(objs []runtime.Object) {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	m := map[string]runtime.Object{}
	for _, o := range objs {
		m[configName(o)] = o
	}
	f.d.configs[f.mutating] = m
	f.d.rebuild(f.mutating)
}

// Set adds or changes one configuration.
func (f Follower) Set(obj runtime.Object) {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	f.d.configs[f.mutating][configName(obj)] = obj
	f.d.rebuild(f.mutating)
}

// Delete removes one configuration.
func (f Follower) Delete(obj runtime.Object) {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	delete(f.d.configs[f.mutating], configName(obj))
	f.d.rebuild(f.mutating)
}

func configName(obj runtime.Object) string {
	switch c := obj.(type) {
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		return c.Name
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		return c.Name
	}
	return ""
}

// rebuild makes the snapshot requests read, configurations in name order
// and each one's webhooks in their order, as Kubernetes calls them. The
// webhooks of an unchanged configuration keep their clients.
func (d *Dispatcher) rebuild(mutating bool) {
	target := &d.validating
	if mutating {
		target = &d.mutating
	}
	old := map[hookKey]*hook{}
	if prev := target.Load(); prev != nil {
		for _, h := range *prev {
			old[h.key] = h
		}
	}
	names := make([]string, 0, len(d.configs[mutating]))
	for n := range d.configs[mutating] {
		names = append(names, n)
	}
	slices.Sort(names)
	var hooks []*hook
	for _, n := range names {
		for _, h := range d.hooksOf(d.configs[mutating][n]) {
			if prev, ok := old[h.key]; ok {
				h = prev
			}
			delete(old, h.key)
			hooks = append(hooks, h)
		}
	}
	for _, h := range old {
		h.close()
	}
	target.Store(&hooks)
}

// hookKey tells one version of one webhook from another.
type hookKey struct {
	config          types.UID
	resourceVersion string
	index           int
}

// hook is one webhook ready to call.
type hook struct {
	key      hookKey
	config   string
	mutating bool
	admissionregistrationv1.ValidatingWebhook
	reinvoke bool
	nsSel    labels.Selector
	objSel   labels.Selector
	matcher  Matcher
	// broken is why the webhook cannot be called (a selector or match
	// condition that does not compile): each matching request then fails
	// as its failure policy says.
	broken error

	clientOnce sync.Once
	client     *Client
}

func (h *hook) close() {
	h.client.CloseIdleConnections()
}

func (h *hook) failOpen() bool {
	return h.FailurePolicy != nil && *h.FailurePolicy == admissionregistrationv1.Ignore
}

// hooksOf reads one configuration's webhooks as Kubernetes would call
// them: defaults filled in where the stored object lacks them.
func (d *Dispatcher) hooksOf(obj runtime.Object) []*hook {
	var out []*hook
	switch c := obj.(type) {
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		for i, w := range c.Webhooks {
			h := &hook{key: hookKey{c.UID, c.ResourceVersion, i}, config: c.Name, mutating: true, ValidatingWebhook: admissionregistrationv1.ValidatingWebhook{
				Name: w.Name, ClientConfig: w.ClientConfig, Rules: w.Rules, FailurePolicy: w.FailurePolicy, MatchPolicy: w.MatchPolicy,
				NamespaceSelector: w.NamespaceSelector, ObjectSelector: w.ObjectSelector, SideEffects: w.SideEffects, TimeoutSeconds: w.TimeoutSeconds,
				AdmissionReviewVersions: w.AdmissionReviewVersions, MatchConditions: w.MatchConditions,
			}, reinvoke: w.ReinvocationPolicy != nil && *w.ReinvocationPolicy == admissionregistrationv1.IfNeededReinvocationPolicy}
			out = append(out, d.prepare(h))
		}
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		for i, w := range c.Webhooks {
			out = append(out, d.prepare(&hook{key: hookKey{c.UID, c.ResourceVersion, i}, config: c.Name, ValidatingWebhook: w}))
		}
	}
	return out
}

func (d *Dispatcher) prepare(h *hook) *hook {
	var err error
	if h.nsSel, err = selector(h.NamespaceSelector); err != nil {
		h.broken = err
	}
	if h.objSel, err = selector(h.ObjectSelector); err != nil {
		h.broken = err
	}
	if len(h.MatchConditions) > 0 && h.broken == nil {
		if d.conditions == nil {
			h.broken = errNoCEL
		} else if h.matcher, err = d.conditions.Compile(h.MatchConditions); err != nil {
			h.broken = err
		}
	}
	return h
}

// Active reports whether any webhook is configured.
func (d *Dispatcher) Active() bool {
	m, v := d.mutating.Load(), d.validating.Load()
	return m != nil && len(*m) > 0 || v != nil && len(*v) > 0
}
