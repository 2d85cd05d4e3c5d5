package pods

import (
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestDueForRefresh: a pod's token is asked again once 80 % of its
// asked lifetime has passed, or once it is a day old, as the kubelet's
// token manager does (jitter of up to ten seconds earlier).
func TestDueForRefresh(t *testing.T) {
	issued := time.Unix(1_800_000_000, 0)
	token := func(seconds int64) *authenticationv1.TokenRequest {
		return &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(seconds)},
			Status: authenticationv1.TokenRequestStatus{ExpirationTimestamp: metav1.NewTime(issued.Add(time.Duration(seconds) * time.Second))}}
	}
	for _, tc := range []struct {
		name    string
		seconds int64
		age     time.Duration
		due     bool
	}{
		{"new hour token", 3607, time.Minute, false},
		{"hour token at 70 %", 3607, 42 * time.Minute, false},
		{"hour token at 81 %", 3607, 49 * time.Minute, true},
		{"two-day token at half a day", 2 * 86400, 12 * time.Hour, false},
		{"two-day token a day old", 2 * 86400, 24*time.Hour + time.Second, true},
		{"expired", 600, time.Hour, true},
	} {
		if got := dueForRefresh(token(tc.seconds), issued.Add(tc.age)); got != tc.due {
			t.Errorf("%s: due %v, want %v", tc.name, got, tc.due)
		}
	}
	if !dueForRefresh(&authenticationv1.TokenRequest{}, issued) {
		t.Error("a token of unknown lifetime is kept")
	}
}
