package auth

import (
	"context"
	"strings"
	"testing"
)

// TestChain: the first rule that allows or denies decides, as in
// kube-apiserver's union of authorizers; a rule added after the built-in
// ones (RBAC's place) can grant what they have no opinion on, a node's
// extra rights included, but not undo a Deny before it.
func TestChain(t *testing.T) {
	ctx := context.Background()
	alice := User{Name: "alice", Groups: []string{"system:authenticated"}}
	node := User{Name: NodeUserPrefix + "n1", Groups: []string{GroupNodes}}
	getPods := Attributes{Verb: "get", Resource: "pods", Namespace: "default", Name: "web", IsResource: true}
	otherNode := Attributes{Verb: "get", Resource: "nodes", Name: "n2", IsResource: true}
	ownNode := Attributes{Verb: "get", Resource: "nodes", Name: "n1", IsResource: true}
	grantAlicePods := RuleFunc(func(_ context.Context, u User, a Attributes) (Decision, string) {
		if u.Name == "alice" && a.Resource == "pods" {
			return Allow, ""
		}
		return NoOpinion, ""
	})
	grantNodesNodes := RuleFunc(func(_ context.Context, u User, a Attributes) (Decision, string) {
		if u.InGroup(GroupNodes) && a.Resource == "nodes" {
			return Allow, ""
		}
		return NoOpinion, ""
	})
	denyAlice := RuleFunc(func(_ context.Context, u User, _ Attributes) (Decision, string) {
		if u.Name == "alice" {
			return Deny, "alice is locked out"
		}
		return NoOpinion, ""
	})
	for _, tc := range []struct {
		name  string
		z     *Authorizer
		u     User
		a     Attributes
		allow bool
		why   string
	}{
		{"masters may", NewAuthorizer(nil), User{Name: "admin", Groups: []string{GroupMasters}}, getPods, true, ""},
		{"no rule for alice", NewAuthorizer(nil), alice, getPods, false, ""},
		{"a later rule grants", NewAuthorizer(nil, grantAlicePods), alice, getPods, true, ""},
		{"a Deny stops the chain", NewAuthorizer(nil, denyAlice, grantAlicePods), alice, getPods, false, "alice is locked out"},
		{"a node reads its own Node", NewAuthorizer(nil), node, ownNode, true, ""},
		{"a node may not read another's", NewAuthorizer(nil), node, otherNode, false, `node "n1" can only read and modify its own Node object`},
		{"unless a later rule grants it", NewAuthorizer(nil, grantNodesNodes), node, otherNode, true, ""},
	} {
		err := tc.z.Authorize(ctx, tc.u, tc.a)
		if (err == nil) != tc.allow || err != nil && !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}
