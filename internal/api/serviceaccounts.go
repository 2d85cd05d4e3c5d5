package api

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/api/auth"
	"github.com/orch-dev/orch/internal/api/auth/satoken"
	"github.com/orch-dev/orch/internal/api/resources"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// Service-account token lifetimes, as Kubernetes has them.
const (
	// defaultTokenSeconds is a TokenRequest's lifetime when it asks none.
	defaultTokenSeconds = 60 * 60
	// minTokenSeconds is the shortest lifetime one may ask.
	minTokenSeconds = 10 * 60
	// extendedTokenLife is how long a pod's projected token
	// (satoken.ExtendedSeconds) lives, warning after the hour, so that a
	// client that never reloads its token keeps working (and the pod
	// keeps working offline).
	extendedTokenLife = 365 * 24 * time.Hour
)

var tokenRequestGVK = authenticationv1.SchemeGroupVersion.WithKind("TokenRequest")

// serveTokenRequests adds serviceaccounts/token to the serviceaccounts
// resource among all.
func (s *Server) serveTokenRequests(all []*resources.Resource) {
	for _, r := range all {
		if r.GroupResource() == (schema.GroupResource{Resource: "serviceaccounts"}) {
			r.Subresources = append(r.Subresources, resources.Subresource{
				Name: "token", Serve: resources.ServeAnswer, Kind: tokenRequestGVK, Verbs: metav1.Verbs{"create"},
				NewBody: func() runtime.Object { return &authenticationv1.TokenRequest{} }, Answer: s.requestToken,
			})
		}
	}
}

var (
	expirationPath = field.NewPath("spec", "expirationSeconds")
	boundRefPath   = field.NewPath("spec", "boundObjectRef")
)

// requestToken answers a TokenRequest for a service account, as
// Kubernetes' TokenRequest API: a JWT for the audiences asked (the API's
// by default), bound to a pod, secret or node that must exist (the token
// dies with it).
func (s *Server) requestToken(ctx context.Context, body, current runtime.Object, _ resources.AnswerOptions) (runtime.Object, error) {
	req, sa := body.(*authenticationv1.TokenRequest), current.(*corev1.ServiceAccount)
	if req.Spec.ExpirationSeconds == nil {
		req.Spec.ExpirationSeconds = ptr.To[int64](defaultTokenSeconds)
	}
	var errs field.ErrorList
	if secs := *req.Spec.ExpirationSeconds; secs < minTokenSeconds {
		errs = append(errs, field.Invalid(expirationPath, secs, "may not specify a duration less than 10 minutes"))
	} else if secs > 1<<32 {
		errs = append(errs, field.Invalid(expirationPath, secs, "may not specify a duration larger than 2^32 seconds"))
	}
	ref := req.Spec.BoundObjectRef
	if ref != nil {
		if ref.APIVersion != "" && ref.APIVersion != "v1" {
			errs = append(errs, field.NotSupported(boundRefPath.Child("apiVersion"), ref.APIVersion, []string{"v1"}))
		}
		if !slices.Contains([]string{"Pod", "Secret", "Node"}, ref.Kind) {
			errs = append(errs, field.NotSupported(boundRefPath.Child("kind"), ref.Kind, []string{"Pod", "Secret", "Node"}))
		}
		if ref.Name == "" {
			errs = append(errs, field.Required(boundRefPath.Child("name"), ""))
		}
	}
	if len(errs) > 0 {
		return nil, apierrors.NewInvalid(tokenRequestGVK.GroupKind(), sa.Name, errs)
	}
	if err := s.restrictNodeTokens(ctx, sa, ref); err != nil {
		return nil, err
	}
	audiences := req.Spec.Audiences
	if len(audiences) == 0 {
		audiences = s.issuer.APIAudiences
	}
	now := time.Now().Truncate(time.Second)
	c := satoken.Claims{Namespace: sa.Namespace, ServiceAccountName: sa.Name, ServiceAccountUID: string(sa.UID),
		Audiences: audiences, IssuedAt: now, Expiry: now.Add(time.Duration(*req.Spec.ExpirationSeconds) * time.Second)}
	if ref != nil {
		if err := s.bindToken(ctx, &c, sa, ref); err != nil {
			return nil, err
		}
	}
	if c.Pod != nil && *req.Spec.ExpirationSeconds == satoken.ExtendedSeconds && isSubset(audiences, s.issuer.APIAudiences) {
		c.WarnAfter, c.Expiry = c.Expiry, now.Add(extendedTokenLife)
	}
	token, err := s.issuer.Issue(c)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	out := &authenticationv1.TokenRequest{
		TypeMeta:   metav1.TypeMeta{Kind: tokenRequestGVK.Kind, APIVersion: tokenRequestGVK.GroupVersion().String()},
		ObjectMeta: metav1.ObjectMeta{Name: sa.Name, Namespace: sa.Namespace, CreationTimestamp: metav1.NewTime(now)},
		Spec:       req.Spec,
		Status: authenticationv1.TokenRequestStatus{Token: token,
			// What was asked, even when the token lives longer: clients
			// refresh by this.
			ExpirationTimestamp: metav1.NewTime(now.Add(time.Duration(*req.Spec.ExpirationSeconds) * time.Second))},
	}
	out.Spec.Audiences = audiences
	return out, nil
}

func isSubset(a, of []string) bool {
	for _, x := range a {
		if !slices.Contains(of, x) {
			return false
		}
	}
	return true
}

// restrictNodeTokens is NodeRestriction for tokens: a node asks only for
// tokens bound to a pod that runs on it.
func (s *Server) restrictNodeTokens(ctx context.Context, sa *corev1.ServiceAccount, ref *authenticationv1.BoundObjectReference) error {
	u, ok := auth.UserFrom(ctx)
	if !ok || !u.InGroup(auth.GroupNodes) || !strings.HasPrefix(u.Name, auth.NodeUserPrefix) {
		return nil
	}
	node := strings.TrimPrefix(u.Name, auth.NodeUserPrefix)
	gr := schema.GroupResource{Resource: "serviceaccounts/token"}
	if ref == nil || ref.Kind != "Pod" {
		return apierrors.NewForbidden(gr, sa.Name, fmt.Errorf("node requested token not bound to a pod"))
	}
	bound, err := s.graph.PodNode(ctx, sa.Namespace, ref.Name)
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	if bound != node {
		return apierrors.NewForbidden(gr, sa.Name, fmt.Errorf("node requested token bound to a pod scheduled on a different node"))
	}
	return nil
}

// bindToken binds c to the object ref names, which must exist (with the
// UID given, if any) and, for a pod, run as the service account.
func (s *Server) bindToken(ctx context.Context, c *satoken.Claims, sa *corev1.ServiceAccount, ref *authenticationv1.BoundObjectReference) error {
	var obj runtime.Object
	var err error
	switch ref.Kind {
	case "Pod":
		obj, err = s.storage("", "pods").Get(ctx, sa.Namespace, ref.Name)
	case "Secret":
		obj, err = s.storage("", "secrets").Get(ctx, sa.Namespace, ref.Name)
	case "Node":
		obj, err = s.storage("", "nodes").Get(ctx, "", ref.Name)
	}
	if err != nil {
		return err
	}
	m := obj.(metav1.Object)
	if ref.UID != "" && ref.UID != m.GetUID() {
		return apierrors.NewConflict(schema.GroupResource{Resource: strings.ToLower(ref.Kind) + "s"}, ref.Name,
			fmt.Errorf("the UID in the bound object reference (%s) does not match the UID in record. The object might have been deleted and then recreated", ref.UID))
	}
	bound := &satoken.Ref{Name: m.GetName(), UID: string(m.GetUID())}
	switch o := obj.(type) {
	case *corev1.Pod:
		if o.Spec.ServiceAccountName != sa.Name {
			return apierrors.NewBadRequest(fmt.Sprintf("cannot bind token for serviceaccount %q to pod running with different serviceaccount name.", sa.Name))
		}
		c.Pod = bound
		// A pod's token also says its node, as Kubernetes' does.
		if o.Spec.NodeName != "" {
			if n, err := s.storage("", "nodes").Get(ctx, "", o.Spec.NodeName); err == nil {
				c.Node = &satoken.Ref{Name: o.Spec.NodeName, UID: string(n.(*corev1.Node).UID)}
			}
		}
	case *corev1.Secret:
		c.Secret = bound
	case *corev1.Node:
		c.Node = bound
	}
	return nil
}

// IssueLegacyToken signs the token of a kubernetes.io/service-account-token
// Secret, for the loop that fills them in.
func (s *Server) IssueLegacyToken(namespace, serviceAccount, serviceAccountUID, secret string) (string, error) {
	return s.issuer.IssueLegacy(namespace, serviceAccount, serviceAccountUID, secret)
}

// AuthenticateToken implements auth.TokenAuthenticator for the service
// accounts' tokens: the signature, times and audience, then that what
// the token names still exists, as Kubernetes' service-account
// authenticator checks on every request.
func (s *Server) AuthenticateToken(ctx context.Context, raw string, audiences []string) (auth.User, []string, error) {
	c, err := s.issuer.Verify(raw, audiences)
	if errors.Is(err, satoken.ErrNotOurs) {
		return auth.User{}, nil, auth.ErrUnknownToken
	}
	if err != nil {
		return auth.User{}, nil, err
	}
	uid, ok, err := s.accounts.UID(ctx, c.Namespace, c.ServiceAccountName)
	if err != nil {
		return auth.User{}, nil, err
	}
	if !ok {
		return auth.User{}, nil, fmt.Errorf("service account %s/%s has been deleted", c.Namespace, c.ServiceAccountName)
	}
	if c.ServiceAccountUID != "" && c.ServiceAccountUID != uid {
		return auth.User{}, nil, fmt.Errorf("service account UID (%s) does not match claim (%s)", uid, c.ServiceAccountUID)
	}
	u := auth.User{Name: c.Subject(), UID: uid, Groups: []string{auth.GroupServiceAccounts, auth.GroupServiceAccounts + ":" + c.Namespace}}
	extra := map[string][]string{}
	if c.Legacy {
		if err := s.checkLegacySecret(ctx, c, raw, uid); err != nil {
			return auth.User{}, nil, err
		}
	} else {
		if err := s.checkBound(ctx, c, extra); err != nil {
			return auth.User{}, nil, err
		}
		if c.ID != "" {
			extra["authentication.kubernetes.io/credential-id"] = []string{"JTI=" + c.ID}
		}
	}
	if len(extra) > 0 {
		u.Extra = extra
	}
	return u, c.Audiences, nil
}

// checkBound checks that the pod, secret or node a token is bound to
// still exists, and records it in the user's extra as Kubernetes does.
func (s *Server) checkBound(ctx context.Context, c *satoken.Claims, extra map[string][]string) error {
	if c.Pod != nil {
		uid, deleted, ok, err := s.graph.Pod(ctx, c.Namespace, c.Pod.Name)
		if err != nil {
			return err
		}
		// A pod being deleted keeps its token through its grace period
		// and a minute after, as in Kubernetes.
		if !ok || uid != c.Pod.UID || !deleted.IsZero() && deleted.Add(time.Minute).Before(time.Now()) {
			return fmt.Errorf("pod %s/%s (uid %s) the token is bound to no longer exists", c.Namespace, c.Pod.Name, c.Pod.UID)
		}
		extra["authentication.kubernetes.io/pod-name"] = []string{c.Pod.Name}
		extra["authentication.kubernetes.io/pod-uid"] = []string{c.Pod.UID}
	}
	if c.Secret != nil {
		obj, err := s.storage("", "secrets").Get(ctx, c.Namespace, c.Secret.Name)
		if err != nil || string(obj.(*corev1.Secret).UID) != c.Secret.UID {
			return fmt.Errorf("secret %s/%s the token is bound to no longer exists", c.Namespace, c.Secret.Name)
		}
	}
	if c.Node != nil {
		obj, err := s.storage("", "nodes").Get(ctx, "", c.Node.Name)
		// A pod's token names its node only for the record: the pod is
		// what it is bound to.
		if c.Pod == nil && (err != nil || string(obj.(*corev1.Node).UID) != c.Node.UID) {
			return fmt.Errorf("node %s the token is bound to no longer exists", c.Node.Name)
		}
		extra["authentication.kubernetes.io/node-name"] = []string{c.Node.Name}
		extra["authentication.kubernetes.io/node-uid"] = []string{c.Node.UID}
	}
	return nil
}

// checkLegacySecret checks that a legacy token is still the one its
// Secret holds, for the service account it names.
func (s *Server) checkLegacySecret(ctx context.Context, c *satoken.Claims, raw, saUID string) error {
	obj, err := s.storage("", "secrets").Get(ctx, c.Namespace, c.Secret.Name)
	if err != nil {
		return fmt.Errorf("the token's secret %s/%s: %w", c.Namespace, c.Secret.Name, err)
	}
	sec := obj.(*corev1.Secret)
	if sec.DeletionTimestamp != nil || subtle.ConstantTimeCompare(sec.Data[corev1.ServiceAccountTokenKey], []byte(raw)) != 1 {
		return fmt.Errorf("the token's secret %s/%s no longer holds it", c.Namespace, c.Secret.Name)
	}
	if want := sec.Annotations[corev1.ServiceAccountUIDKey]; want != "" && want != saUID {
		return fmt.Errorf("the token's secret %s/%s belongs to another service account", c.Namespace, c.Secret.Name)
	}
	return nil
}

// serviceAccountUIDs is the server's in-memory view of which service
// accounts exist, kept from a watch, so that authenticating a token is
// a map lookup.
type serviceAccountUIDs struct {
	mu     sync.RWMutex
	uids   map[saKey]string
	synced chan struct{}
	once   sync.Once
}

// saKey names a service account.
type saKey struct{ namespace, name string }

func newServiceAccountUIDs() *serviceAccountUIDs {
	return &serviceAccountUIDs{uids: map[saKey]string{}, synced: make(chan struct{})}
}

func saRef(obj runtime.Object) saKey {
	sa := obj.(*corev1.ServiceAccount)
	return saKey{sa.Namespace, sa.Name}
}

// Replace implements follower.
func (i *serviceAccountUIDs) Replace(objs []runtime.Object) {
	fresh := make(map[saKey]string, len(objs))
	for _, o := range objs {
		fresh[saRef(o)] = string(o.(*corev1.ServiceAccount).UID)
	}
	i.mu.Lock()
	i.uids = fresh
	i.mu.Unlock()
	i.once.Do(func() { close(i.synced) })
}

// Set implements follower.
func (i *serviceAccountUIDs) Set(obj runtime.Object) {
	i.mu.Lock()
	i.uids[saRef(obj)] = string(obj.(*corev1.ServiceAccount).UID)
	i.mu.Unlock()
}

// Delete implements follower.
func (i *serviceAccountUIDs) Delete(obj runtime.Object) {
	i.mu.Lock()
	delete(i.uids, saRef(obj))
	i.mu.Unlock()
}

// UID is the service account's UID; ok is false when it does not exist.
// It waits up to five seconds for the first list.
func (i *serviceAccountUIDs) UID(ctx context.Context, namespace, name string) (string, bool, error) {
	select {
	case <-i.synced:
	default:
		wait, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		select {
		case <-i.synced:
		case <-wait.Done():
			return "", false, errors.New("the service accounts are not known yet")
		}
	}
	i.mu.RLock()
	defer i.mu.RUnlock()
	uid, ok := i.uids[saKey{namespace, name}]
	return uid, ok, nil
}

// serveIssuerDiscovery serves the service-account issuer's OpenID
// discovery document and its keys, as Kubernetes does, so that other
// systems can verify the cluster's tokens.
func (s *Server) serveIssuerDiscovery(mux *http.ServeMux) {
	jwksPath := "/openid/v1/jwks"
	config, _ := json.Marshal(map[string]any{
		"issuer":                                s.issuer.Name,
		"jwks_uri":                              strings.TrimSuffix(s.issuer.Name, "/") + jwksPath,
		"response_types_supported":              []string{"id_token"},
		"subject_types_supported":               []string{"public"},
		"id_token_signing_alg_values_supported": s.issuer.Keys().Algorithms(),
	})
	jwks, _ := json.Marshal(s.issuer.Keys().JWKS())
	serve := func(contentType string, body []byte) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", contentType)
			w.Header().Set("Cache-Control", "public, max-age=3600")
			_, _ = w.Write(body)
		}
	}
	mux.Handle("GET /.well-known/openid-configuration", serve("application/json", config))
	mux.Handle("GET "+jwksPath, serve("application/jwk-set+json", jwks))
}
