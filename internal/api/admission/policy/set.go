package policy

import (
	"slices"
	"sync"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

// object is a policy or a binding as the watches deliver them.
type object interface {
	runtime.Object
	GetName() string
	GetResourceVersion() string
}

// set keeps one kind of policy and its bindings from their watches: each
// policy compiled once per version, and the bindings of existing policies
// published in name order, as requests read them without a lock.
type set[P, B object, C any] struct {
	compile  func(P) C
	policyOf func(B) string     // the policy a binding names
	match    func(B) *matchPart // the binding's own match, or nil

	mu       sync.Mutex
	policies map[string]P
	bindings map[string]B
	compiled map[string]compiledAt[C]
	snapshot atomic.Pointer[[]binding[B, C]]
}

type compiledAt[C any] struct {
	resourceVersion string
	c               C
}

// binding is one binding with its compiled policy, ready to evaluate.
type binding[B any, C any] struct {
	binding B
	policy  C
	nsSel   labels.Selector
	objSel  labels.Selector
}

// matchPart is a binding's match, for its selectors.
type matchPart struct{ nsSel, objSel *metav1.LabelSelector }

func newSet[P, B object, C any](compile func(P) C, policyOf func(B) string, match func(B) *matchPart) *set[P, B, C] {
	return &set[P, B, C]{compile: compile, policyOf: policyOf, match: match,
		policies: map[string]P{}, bindings: map[string]B{}, compiled: map[string]compiledAt[C]{}}
}

// bound is what requests read.
func (s *set[P, B, C]) bound() []binding[B, C] {
	if p := s.snapshot.Load(); p != nil {
		return *p
	}
	return nil
}

// setFollower is the watch follower of one of the two kinds.
type setFollower[P, B object, C any] struct {
	s        *set[P, B, C]
	policies bool
}

func (f setFollower[P, B, C]) Replace(objs []runtime.Object) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	if f.policies {
		f.s.policies = map[string]P{}
	} else {
		f.s.bindings = map[string]B{}
	}
	for _, o := range objs {
		f.s.put(o)
	}
	f.s.rebuild()
}

func (f setFollower[P, B, C]) Set(obj runtime.Object) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	f.s.put(obj)
	f.s.rebuild()
}

func (f setFollower[P, B, C]) Delete(obj runtime.Object) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	switch o := obj.(type) {
	case P:
		delete(f.s.policies, o.GetName())
	case B:
		delete(f.s.bindings, o.GetName())
	}
	f.s.rebuild()
}

func (s *set[P, B, C]) put(obj runtime.Object) {
	switch o := obj.(type) {
	case P:
		s.policies[o.GetName()] = o
	case B:
		s.bindings[o.GetName()] = o
	}
}

// rebuild compiles what changed and publishes the bindings.
func (s *set[P, B, C]) rebuild() {
	compiled := map[string]compiledAt[C]{}
	for name, p := range s.policies {
		if c, ok := s.compiled[name]; ok && c.resourceVersion == p.GetResourceVersion() {
			compiled[name] = c
			continue
		}
		compiled[name] = compiledAt[C]{p.GetResourceVersion(), s.compile(p)}
	}
	s.compiled = compiled
	names := make([]string, 0, len(s.bindings))
	for n := range s.bindings {
		names = append(names, n)
	}
	slices.Sort(names)
	var out []binding[B, C]
	for _, n := range names {
		b := s.bindings[n]
		p, ok := compiled[s.policyOf(b)]
		if !ok {
			continue // Kubernetes ignores a binding of a missing policy
		}
		bb := binding[B, C]{binding: b, policy: p.c, nsSel: labels.Everything(), objSel: labels.Everything()}
		if m := s.match(b); m != nil {
			bb.nsSel, _ = selectorOf(m.nsSel)
			bb.objSel, _ = selectorOf(m.objSel)
		}
		out = append(out, bb)
	}
	s.snapshot.Store(&out)
}
