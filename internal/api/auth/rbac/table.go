package rbac

import (
	"sync"

	"github.com/orch-dev/orch/internal/api/auth"
	rbacv1 "k8s.io/api/rbac/v1"
)

// maxTables bounds the compiled tables kept; past it they are dropped
// and compiled again as asked.
const maxTables = 10000

// ruleTable is what one subject is granted in one namespace, compiled so
// that deciding a request is a handful of map lookups however many
// bindings and rules the subject has: each rule is spread over the
// (verb, group, resource) cells it covers, "*" kept as its own cell.
type ruleTable struct {
	anyName map[ruleCell]bool
	names   map[ruleCell]map[string]bool
	urls    []rbacv1.PolicyRule
}

type ruleCell struct{ verb, group, resource string }

// tableKey is a subject key ("user:..." or "group:...") in a namespace
// ("" for the cluster scope).
type tableKey struct{ subject, namespace string }

// tables are the compiled tables, cleared whenever a role or binding
// changes.
type tables struct {
	mu sync.Mutex
	m  map[tableKey]*ruleTable
}

func (t *tables) get(k tableKey) *ruleTable {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[k]
}

func (t *tables) put(k tableKey, rt *ruleTable) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil || len(t.m) >= maxTables {
		t.m = map[tableKey]*ruleTable{}
	}
	t.m[k] = rt
}

func (t *tables) clear() {
	t.mu.Lock()
	t.m = nil
	t.mu.Unlock()
}

// compile spreads rules into a table.
func compile(rules []rbacv1.PolicyRule) *ruleTable {
	t := &ruleTable{anyName: map[ruleCell]bool{}, names: map[ruleCell]map[string]bool{}}
	for _, r := range rules {
		if len(r.NonResourceURLs) > 0 {
			t.urls = append(t.urls, r)
		}
		for _, v := range r.Verbs {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					c := ruleCell{v, g, res}
					if len(r.ResourceNames) == 0 {
						t.anyName[c] = true
						continue
					}
					if t.names[c] == nil {
						t.names[c] = map[string]bool{}
					}
					for _, n := range r.ResourceNames {
						t.names[c][n] = true
					}
				}
			}
		}
	}
	return t
}

// allows is Allows over every rule of the table.
func (t *ruleTable) allows(a auth.Attributes) bool {
	if !a.IsResource {
		for _, r := range t.urls {
			if Allows(r, a) {
				return true
			}
		}
		return false
	}
	resources := [3]string{a.Resource, rbacv1.ResourceAll}
	n := 2
	if a.Subresource != "" {
		resources[0] = a.Resource + "/" + a.Subresource
		resources[2] = "*/" + a.Subresource
		n = 3
	}
	for _, v := range [2]string{a.Verb, rbacv1.VerbAll} {
		for _, g := range [2]string{a.Group, rbacv1.APIGroupAll} {
			for _, res := range resources[:n] {
				c := ruleCell{v, g, res}
				if t.anyName[c] || a.Name != "" && t.names[c][a.Name] {
					return true
				}
			}
		}
	}
	return false
}

// table is the compiled table of subject in namespace: the rules of its
// ClusterRoleBindings and, in a namespace, of its RoleBindings there (a
// RoleBinding grants no URLs). x.mu is held for reading.
func (x *Index) table(subject, namespace string) *ruleTable {
	k := tableKey{subject, namespace}
	if t := x.tables.get(k); t != nil {
		return t
	}
	var rules []rbacv1.PolicyRule
	for b := range x.bySubject[subject] {
		if b.namespace != "" && b.namespace != namespace {
			continue
		}
		r, _ := x.rules(b.namespace, x.bindings[b].ref)
		for _, rule := range r {
			if b.namespace != "" && len(rule.NonResourceURLs) > 0 {
				continue
			}
			rules = append(rules, rule)
		}
	}
	t := compile(rules)
	x.tables.put(k, t)
	return t
}
