package pods

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// Token refresh, as the kubelet's token manager: a token is asked again
// once 80 % of its lifetime has passed, or once it is a day old, with a
// few seconds' jitter so a node's pods do not all ask at once.
const (
	tokenMaxAge    = 24 * time.Hour
	tokenMaxJitter = 10 * time.Second
)

// tokens keeps the service-account tokens the node asked for its pods'
// projected volumes, each until it is due for refresh.
type tokens struct {
	clock clock.PassiveClock
	mu    sync.Mutex
	held  map[tokenKey]*authenticationv1.TokenRequest
}

type tokenKey struct {
	pod            types.UID
	serviceAccount string
	audience       string
	seconds        int64
}

// ServiceAccountToken implements volumes.Sources: the pod's token for
// the projection, asked through TokenRequest with the node's identity and
// bound to the pod; until it is due for refresh, the one asked before.
// When the server cannot be asked, the last token stands while it lives.
func (s *sources) ServiceAccountToken(ctx context.Context, pod *corev1.Pod, p *corev1.ServiceAccountTokenProjection) (string, error) {
	t := &s.m.tokens
	key := tokenKey{pod: pod.UID, serviceAccount: pod.Spec.ServiceAccountName, audience: p.Audience, seconds: ptr.Deref(p.ExpirationSeconds, 3600)}
	now := t.clock.Now()
	t.mu.Lock()
	held := t.held[key]
	t.mu.Unlock()
	if held != nil && !dueForRefresh(held, now) {
		return held.Status.Token, nil
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(key.seconds),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if p.Audience != "" {
		req.Spec.Audiences = []string{p.Audience}
	}
	got, err := s.m.api.CreateToken(ctx, pod.Namespace, pod.Spec.ServiceAccountName, req)
	if err != nil {
		if held != nil && now.Before(held.Status.ExpirationTimestamp.Time) {
			s.m.log.Debug("keeping a pod's token: a new one cannot be asked", "pod", pod.Namespace+"/"+pod.Name, "err", err)
			return held.Status.Token, nil
		}
		if !s.m.pods.HasSynced() {
			// The node runs its pods from the checkpoint, the server away
			// (a reboot offline lost the tokens, which never touch the
			// disk). A token could only be used against that server: the
			// pod starts with an empty one, filled once it can be asked.
			s.m.log.Warn("starting a pod offline without its service-account token: it comes once the server does", "pod", pod.Namespace+"/"+pod.Name, "err", err)
			s.provisional = true
			return "", nil
		}
		return "", err
	}
	t.mu.Lock()
	if t.held == nil {
		t.held = map[tokenKey]*authenticationv1.TokenRequest{}
	}
	t.held[key] = got
	t.mu.Unlock()
	return got.Status.Token, nil
}

// dueForRefresh reports whether a token has lived 80 % of what was asked,
// or a day.
func dueForRefresh(tr *authenticationv1.TokenRequest, now time.Time) bool {
	if tr.Spec.ExpirationSeconds == nil {
		return true
	}
	life := time.Duration(*tr.Spec.ExpirationSeconds) * time.Second
	exp := tr.Status.ExpirationTimestamp.Time
	issued := exp.Add(-life)
	jitter := time.Duration(rand.Int64N(int64(tokenMaxJitter)))
	return now.After(issued.Add(tokenMaxAge-jitter)) || now.After(exp.Add(-life/5-jitter))
}

// forget drops the tokens of a pod that is gone.
func (t *tokens) forget(uid types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.held {
		if k.pod == uid {
			delete(t.held, k)
		}
	}
}
