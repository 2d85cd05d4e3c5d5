package rbac

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/auth"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// BenchmarkAuthorize is the RBAC authorizer's cost per request with
// 1,000 Roles and 1,000 RoleBindings (ten namespaces, a user each) beside
// the bootstrap policy: a request allowed by its user's binding, and one
// refused after every binding of the user and its groups was read.
// Target: p99 under 20 µs.
func BenchmarkAuthorize(b *testing.B) {
	var objs []runtime.Object
	for i := range 1000 {
		ns := fmt.Sprintf("ns-%d", i%10)
		objs = append(objs,
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("role-%d", i)}, Rules: []rbacv1.PolicyRule{
				{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{""}, Resources: []string{"pods", "services", "configmaps"}},
				{Verbs: []string{"get"}, APIGroups: []string{"apps"}, Resources: []string{"deployments"}, ResourceNames: []string{fmt.Sprintf("app-%d", i)}}}},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("binding-%d", i)},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: fmt.Sprintf("role-%d", i)},
				Subjects: []rbacv1.Subject{user(fmt.Sprintf("user-%d", i)), {Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "team-" + ns}}})
	}
	x := loaded(b, objs...)
	u := auth.User{Name: "user-42", Groups: []string{"team-ns-2", auth.GroupAuthenticated}}
	for _, c := range []struct {
		name string
		a    auth.Attributes
		want auth.Decision
	}{
		{"allowed", res("list", "", "pods", "", "ns-2", ""), auth.Allow},
		{"refused", res("delete", "", "secrets", "", "ns-2", "db"), auth.NoOpinion},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			lat := make([]time.Duration, 0, b.N)
			for b.Loop() {
				start := time.Now()
				d, _ := x.Decide(ctx, u, c.a)
				lat = append(lat, time.Since(start))
				if d != c.want {
					b.Fatalf("decision %v, want %v", d, c.want)
				}
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
		})
	}
}
