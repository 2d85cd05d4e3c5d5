package plugins

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/orch-dev/orch/internal/api/registry"
	"github.com/orch-dev/orch/internal/quota"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// quotaBatches gather the creates of a namespace waiting for quota
// admission, as Kubernetes' quota admission does: one of them checks the
// whole batch in order against the quotas and charges it in one status
// write per quota, so that creates at once are neither serialized on a
// write each nor able to overshoot a hard limit together.
type quotaBatches struct {
	mu      sync.Mutex
	pending map[string][]*quotaRequest
	running map[string]bool
}

// quotaRequest is one create waiting for its answer.
type quotaRequest struct {
	gr     schema.GroupResource
	obj    runtime.Object
	name   string
	dryRun bool
	done   chan error
}

// admitQuota is Kubernetes' ResourceQuota admission for creates of gr: an
// object that would take a quota of its namespace past a hard limit is
// refused with Kubernetes' message, a pod under a quota of compute
// resources must say them, and what is admitted is charged to the
// quotas' status.used at once (the quota loop recounts from the objects
// later, and gives back what was deleted).
func (p *Plugins) admitQuota(gr schema.GroupResource) Func {
	return func(ctx context.Context, obj, old runtime.Object) error {
		if old != nil {
			return nil
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return apierrors.NewBadRequest(err.Error())
		}
		// Most namespaces have no quota: their creates (every event, every
		// pod) skip the batching, at the cost of one cached list.
		if none, err := p.noQuotas(ctx, m.GetNamespace()); err != nil || none {
			return err
		}
		req := &quotaRequest{gr: gr, obj: obj, name: m.GetName(), dryRun: registry.DryRun(ctx), done: make(chan error, 1)}
		ns := m.GetNamespace()
		b := &p.quota
		b.mu.Lock()
		if b.pending == nil {
			b.pending, b.running = map[string][]*quotaRequest{}, map[string]bool{}
		}
		b.pending[ns] = append(b.pending[ns], req)
		lead := !b.running[ns]
		b.running[ns] = true
		b.mu.Unlock()
		if lead {
			// Drained apart from this request, which would otherwise
			// answer only once no create of the namespace waits.
			go p.drainQuota(context.WithoutCancel(ctx), ns)
		}
		return <-req.done
	}
}

// noQuotas reports whether the namespace has no ResourceQuota, from the
// watch cache as it stands.
func (p *Plugins) noQuotas(ctx context.Context, ns string) (bool, error) {
	list, err := p.storage("", "resourcequotas").List(ctx, ns, &metav1.ListOptions{ResourceVersion: "0", Limit: 1})
	if err != nil {
		return false, err
	}
	return len(list.(*corev1.ResourceQuotaList).Items) == 0, nil
}

// drainQuota admits the namespace's waiting creates, batch after batch,
// until none wait.
func (p *Plugins) drainQuota(ctx context.Context, ns string) {
	b := &p.quota
	var batch []*quotaRequest
	defer func() {
		// A batch that went wrong fails, and the namespace's creates are
		// not left waiting for a drainer that is gone.
		if r := recover(); r != nil {
			b.mu.Lock()
			rest := append(batch, b.pending[ns]...)
			delete(b.pending, ns)
			delete(b.running, ns)
			b.mu.Unlock()
			for _, req := range rest {
				select {
				case req.done <- apierrors.NewInternalError(fmt.Errorf("quota admission: %v", r)):
				default: // answered before it went wrong
				}
			}
			p.log.Error("quota admission panicked", "namespace", ns, "panic", r)
		}
	}()
	for {
		b.mu.Lock()
		batch = b.pending[ns]
		delete(b.pending, ns)
		if len(batch) == 0 {
			delete(b.running, ns)
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		p.admitQuotaBatch(ctx, ns, batch)
	}
}

// admitQuotaBatch decides a batch in order against the quotas as they
// stand, each admitted create counting for those after it, then charges
// what was admitted.
func (p *Plugins) admitQuotaBatch(ctx context.Context, ns string, batch []*quotaRequest) {
	// Any recent list will do: each charge is checked again against the
	// quota as stored. When the list was behind (the batch before was
	// charged since, a new quota not yet counted) and a charge does not
	// fit or a request is refused, the batch is decided again on the
	// quotas as stored, rather than refused on a stale count.
	answers, charged := p.decideQuotaBatch(ctx, ns, batch, "0")
	if !charged {
		answers, _ = p.decideQuotaBatch(ctx, ns, batch, "")
	}
	for i, r := range batch {
		r.done <- answers[i]
	}
}

// decideQuotaBatch decides each request of the batch on the quotas
// listed at resourceVersion and charges the admitted ones; it returns
// each request's answer, and false when a charge did not fit the quota
// as stored, or a request was refused on the cache's quotas (nothing was
// charged then).
func (p *Plugins) decideQuotaBatch(ctx context.Context, ns string, batch []*quotaRequest, resourceVersion string) ([]error, bool) {
	answers := make([]error, len(batch))
	list, err := p.storage("", "resourcequotas").List(ctx, ns, &metav1.ListOptions{ResourceVersion: resourceVersion})
	if err != nil {
		for i := range answers {
			answers[i] = err
		}
		return answers, true
	}
	quotas := list.(*corev1.ResourceQuotaList).Items
	if len(quotas) == 0 {
		return answers, true
	}
	for i := range quotas {
		// The batch counts on its own copy: the listed objects are the
		// watch cache's.
		quotas[i].Status.Used = quotas[i].Status.Used.DeepCopy()
	}
	// sort.Slice, not slices.SortFunc: a generic sort of a struct type
	// costs the binary budget (design.md) some 16 KB.
	sort.Slice(quotas, func(i, j int) bool { return quotas[i].Name < quotas[j].Name })
	charged := map[string]corev1.ResourceList{} // by quota, what the batch adds
	refused := false
	for k, r := range batch {
		amounts, err := chargesFor(quotas, r)
		if err != nil {
			answers[k] = apierrors.NewForbidden(r.gr, r.name, err)
			refused = true
			continue
		}
		if r.dryRun {
			continue
		}
		for i, amount := range amounts {
			if len(amount) == 0 {
				continue
			}
			q := &quotas[i]
			quota.Add(&q.Status.Used, amount, false)
			total := charged[q.Name]
			quota.Add(&total, amount, false)
			charged[q.Name] = total
		}
	}
	if refused && resourceVersion == "0" {
		// A refusal is made on the quotas as stored, not on a cache that
		// may not have a new quota's first count yet ("status unknown")
		// or a recount that freed room: nothing is charged, and the
		// batch is decided again.
		return answers, false
	}
	names := make([]string, 0, len(charged))
	for name := range charged {
		names = append(names, name)
	}
	slices.Sort(names)
	for i, name := range names {
		if err := p.chargeQuota(ctx, ns, name, charged[name], false); err != nil {
			for _, done := range names[:i] {
				_ = p.chargeQuota(ctx, ns, done, charged[done], true)
			}
			for k, r := range batch {
				if answers[k] == nil && !r.dryRun {
					answers[k] = apierrors.NewForbidden(r.gr, r.name, err)
				}
			}
			return answers, false
		}
	}
	return answers, true
}

// chargesFor is what r charges each quota (by index, nil where none), or
// why a quota refuses it.
func chargesFor(quotas []corev1.ResourceQuota, r *quotaRequest) ([]corev1.ResourceList, error) {
	usage := quota.Usage(r.gr, r.obj)
	out := make([]corev1.ResourceList, len(quotas))
	for i := range quotas {
		q := &quotas[i]
		if !quota.Matches(q, r.obj) {
			continue
		}
		if pod, ok := r.obj.(*corev1.Pod); ok && !quota.Finished(pod) {
			if missing := quota.Unspecified(q, pod); len(missing) > 0 {
				return nil, fmt.Errorf("failed quota: %s: must specify %s", q.Name, strings.Join(missing, "; "))
			}
		}
		amount := quota.Limited(q.Spec.Hard, usage)
		if len(amount) == 0 {
			continue
		}
		if err := fits(q, amount); err != nil {
			return nil, err
		}
		out[i] = amount
	}
	return out, nil
}

// fits reports, as Kubernetes words it, a quota whose usage is not known
// yet or that amount would take past its hard limit.
func fits(q *corev1.ResourceQuota, amount corev1.ResourceList) error {
	var unknown []string
	requested, used, limited := corev1.ResourceList{}, corev1.ResourceList{}, corev1.ResourceList{}
	for r, want := range amount {
		have, ok := q.Status.Used[r]
		hard := q.Spec.Hard[r]
		if _, counted := q.Status.Hard[r]; !ok || !counted {
			unknown = append(unknown, string(r))
			continue
		}
		total := have.DeepCopy()
		total.Add(want)
		if total.Cmp(hard) > 0 {
			requested[r], used[r], limited[r] = want, have, hard
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return fmt.Errorf("status unknown for quota: %s, resources: %s", q.Name, strings.Join(unknown, ","))
	}
	if len(requested) > 0 {
		return fmt.Errorf("exceeded quota: %s, requested: %s, used: %s, limited: %s", q.Name, quota.String(requested), quota.String(used), quota.String(limited))
	}
	return nil
}

// chargeQuota adds amount to the quota's status.used (or takes it back),
// checking again against the quota as it now is (the loop may have
// recounted it meanwhile).
func (p *Plugins) chargeQuota(ctx context.Context, namespace, name string, amount corev1.ResourceList, refund bool) error {
	_, _, err := p.storage("", "resourcequotas").Update(ctx, namespace, name, func(_ context.Context, current runtime.Object) (runtime.Object, error) {
		if current == nil {
			return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "resourcequotas"}, name)
		}
		q := current.(*corev1.ResourceQuota).DeepCopy()
		if !refund {
			if err := fits(q, amount); err != nil {
				return nil, err
			}
		}
		quota.Add(&q.Status.Used, amount, refund)
		return q, nil
	}, registry.UpdateOptions{Subresource: "status"})
	return err
}
