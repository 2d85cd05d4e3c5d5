package satoken

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/clock"
)

// LegacyIssuer is the issuer of the tokens kept in
// kubernetes.io/service-account-token Secrets, as Kubernetes names it.
const LegacyIssuer = "kubernetes/serviceaccount"

// ExtendedSeconds is the lifetime a pod's projected token asks (the
// kubelet's default, 3607 s), which the API server extends to a year as
// Kubernetes does, so that pods keep a working token offline.
const ExtendedSeconds = 3607

// leeway is the clock skew a token's times are allowed, as Kubernetes'
// (go-jose's default).
const leeway = time.Minute

// maxCached bounds the verified tokens kept in memory.
const maxCached = 10000

// Ref names an object a token is bound to.
type Ref struct{ Name, UID string }

// Claims are what a service-account token says.
type Claims struct {
	Namespace          string
	ServiceAccountName string
	// ServiceAccountUID is empty in a legacy token that did not record it.
	ServiceAccountUID string
	// Pod, Secret and Node are the object the token is bound to, if any;
	// a legacy token names its Secret (without a UID).
	Pod, Secret, Node *Ref
	Audiences         []string
	ID                string
	IssuedAt, Expiry  time.Time
	// WarnAfter is set on a token whose lifetime was extended: a client
	// that still uses it after this time is one that does not reload.
	WarnAfter time.Time
	Legacy    bool
}

// Subject is the user name the token authenticates as.
func (c *Claims) Subject() string {
	return "system:serviceaccount:" + c.Namespace + ":" + c.ServiceAccountName
}

// kubernetesClaims are the private claims of a bound token, under
// "kubernetes.io", as Kubernetes writes them.
type kubernetesClaims struct {
	Namespace      string           `json:"namespace,omitempty"`
	ServiceAccount *ref             `json:"serviceaccount,omitempty"`
	Pod            *ref             `json:"pod,omitempty"`
	Secret         *ref             `json:"secret,omitempty"`
	Node           *ref             `json:"node,omitempty"`
	WarnAfter      *jwt.NumericDate `json:"warnafter,omitempty"`
}

type ref struct {
	Name string `json:"name,omitempty"`
	UID  string `json:"uid,omitempty"`
}

type privateClaims struct {
	Kubernetes *kubernetesClaims `json:"kubernetes.io,omitempty"`
}

// legacyClaims are a legacy Secret token's claims.
type legacyClaims struct {
	ServiceAccountName string `json:"kubernetes.io/serviceaccount/service-account.name,omitempty"`
	ServiceAccountUID  string `json:"kubernetes.io/serviceaccount/service-account.uid,omitempty"`
	SecretName         string `json:"kubernetes.io/serviceaccount/secret.name,omitempty"`
	Namespace          string `json:"kubernetes.io/serviceaccount/namespace,omitempty"`
}

// Issuer signs tokens and verifies them.
type Issuer struct {
	// Name is the issuer URL (the iss claim); APIAudiences the audiences
	// the API server itself accepts.
	Name         string
	APIAudiences []string
	keys         *Keys
	clock        clock.PassiveClock

	mu       sync.Mutex
	verified map[[sha256.Size]byte]*Claims
}

// NewIssuer issues as name with keys; apiAudiences default to [name],
// as kube-apiserver's --api-audiences to its --service-account-issuer.
func NewIssuer(name string, apiAudiences []string, keys *Keys, clk clock.PassiveClock) *Issuer {
	if len(apiAudiences) == 0 {
		apiAudiences = []string{name}
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Issuer{Name: name, APIAudiences: apiAudiences, keys: keys, clock: clk, verified: map[[sha256.Size]byte]*Claims{}}
}

// Keys are the issuer's keys.
func (i *Issuer) Keys() *Keys { return i.keys }

// Issue signs a bound token; c's Audiences, IssuedAt and Expiry must be
// set, and its ID is made here when empty.
func (i *Issuer) Issue(c Claims) (string, error) {
	if c.ID == "" {
		c.ID = newID()
	}
	std := jwt.Claims{
		Issuer: i.Name, Subject: c.Subject(), Audience: jwt.Audience(c.Audiences), ID: c.ID,
		IssuedAt: jwt.NewNumericDate(c.IssuedAt), NotBefore: jwt.NewNumericDate(c.IssuedAt), Expiry: jwt.NewNumericDate(c.Expiry),
	}
	k := &kubernetesClaims{Namespace: c.Namespace, ServiceAccount: &ref{Name: c.ServiceAccountName, UID: c.ServiceAccountUID}}
	for _, b := range []struct {
		from *Ref
		to   **ref
	}{{c.Pod, &k.Pod}, {c.Secret, &k.Secret}, {c.Node, &k.Node}} {
		if b.from != nil {
			*b.to = &ref{Name: b.from.Name, UID: b.from.UID}
		}
	}
	if !c.WarnAfter.IsZero() {
		k.WarnAfter = jwt.NewNumericDate(c.WarnAfter)
	}
	raw, err := jwt.Signed(i.keys.signer).Claims(std).Claims(privateClaims{Kubernetes: k}).Serialize()
	if err != nil {
		return "", fmt.Errorf("sign service-account token: %w", err)
	}
	return raw, nil
}

// IssueLegacy signs a token for a kubernetes.io/service-account-token
// Secret: no expiry, no audience, as Kubernetes' token controller makes.
func (i *Issuer) IssueLegacy(namespace, serviceAccount, serviceAccountUID, secret string) (string, error) {
	std := jwt.Claims{Issuer: LegacyIssuer, Subject: "system:serviceaccount:" + namespace + ":" + serviceAccount}
	legacy := legacyClaims{ServiceAccountName: serviceAccount, ServiceAccountUID: serviceAccountUID, SecretName: secret, Namespace: namespace}
	raw, err := jwt.Signed(i.keys.signer).Claims(std).Claims(legacy).Serialize()
	if err != nil {
		return "", fmt.Errorf("sign legacy service-account token: %w", err)
	}
	return raw, nil
}

// Looks reports whether raw could be a service-account token at all (a
// compact JWS), so that other bearer tokens are not parsed as one.
func Looks(raw string) bool { return strings.Count(raw, ".") == 2 }

// ErrNotOurs is a token of another issuer, or not a JWT: some other
// authenticator may know it.
var ErrNotOurs = errors.New("not a service-account token of this issuer")

// Verify checks raw's signature, issuer, times and audience (one of
// audiences, or the API audiences when none are given) and returns its
// claims with Audiences narrowed to those it was accepted for. Whether
// the objects it names still exist is the caller's to check. A token's
// signature is verified once and remembered until it expires.
func (i *Issuer) Verify(raw string, audiences []string) (*Claims, error) {
	if len(audiences) == 0 {
		audiences = i.APIAudiences
	}
	sum := sha256.Sum256([]byte(raw))
	i.mu.Lock()
	c, ok := i.verified[sum]
	i.mu.Unlock()
	now := i.clock.Now()
	if !ok {
		var err error
		if c, err = i.parse(raw); err != nil {
			return nil, err
		}
	}
	if !c.Legacy {
		if now.Add(leeway).Before(c.IssuedAt) {
			return nil, errors.New("service-account token used before its issued-at time")
		}
		if !now.Add(-leeway).Before(c.Expiry) {
			if ok {
				i.mu.Lock()
				delete(i.verified, sum)
				i.mu.Unlock()
			}
			return nil, errors.New("service-account token has expired")
		}
	}
	accepted := c.Audiences
	if c.Legacy {
		// A legacy token has no audience: it is good for the API.
		accepted = i.APIAudiences
	}
	var both []string
	for _, a := range audiences {
		if slices.Contains(accepted, a) {
			both = append(both, a)
		}
	}
	if len(both) == 0 {
		return nil, fmt.Errorf("service-account token audiences %q are invalid for the target audiences %q", c.Audiences, audiences)
	}
	if !ok {
		i.remember(sum, c)
	}
	out := *c
	out.Audiences = both
	return &out, nil
}

func (i *Issuer) remember(sum [sha256.Size]byte, c *Claims) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if len(i.verified) >= maxCached {
		// Map order is random: this forgets a few arbitrary tokens, which
		// are verified again when they come back.
		n := 0
		for k := range i.verified {
			delete(i.verified, k)
			if n++; n == 16 {
				break
			}
		}
	}
	i.verified[sum] = c
}

// parse verifies raw's signature with the key its header names and reads
// its claims.
func (i *Issuer) parse(raw string) (*Claims, error) {
	if !Looks(raw) {
		return nil, ErrNotOurs
	}
	tok, err := jwt.ParseSigned(raw, []jose.SignatureAlgorithm{jose.RS256, jose.ES256, jose.ES384, jose.ES512})
	if err != nil {
		return nil, ErrNotOurs
	}
	// Only the issuer is read before the signature is checked, to tell a
	// token of another issuer (some other authenticator's) apart.
	var unverified jwt.Claims
	if err := tok.UnsafeClaimsWithoutVerification(&unverified); err != nil {
		return nil, ErrNotOurs
	}
	if unverified.Issuer != i.Name && unverified.Issuer != LegacyIssuer {
		return nil, ErrNotOurs
	}
	var candidates []verifyingKey
	if kid := tok.Headers[0].KeyID; kid != "" {
		if k, ok := i.keys.verifying[kid]; ok {
			candidates = append(candidates, k)
		}
	} else {
		for _, k := range i.keys.verifying {
			candidates = append(candidates, k)
		}
	}
	var std jwt.Claims
	var private privateClaims
	var legacy legacyClaims
	verified := false
	for _, k := range candidates {
		if string(k.alg) != tok.Headers[0].Algorithm {
			continue
		}
		if err := tok.Claims(k.key, &std, &private, &legacy); err == nil {
			verified = true
			break
		}
	}
	if !verified {
		return nil, errors.New("service-account token: invalid signature")
	}
	if std.Issuer == LegacyIssuer {
		if legacy.Namespace == "" || legacy.ServiceAccountName == "" || legacy.SecretName == "" ||
			std.Subject != "system:serviceaccount:"+legacy.Namespace+":"+legacy.ServiceAccountName {
			return nil, errors.New("legacy service-account token: its claims are incomplete")
		}
		return &Claims{Legacy: true, Namespace: legacy.Namespace, ServiceAccountName: legacy.ServiceAccountName,
			ServiceAccountUID: legacy.ServiceAccountUID, Secret: &Ref{Name: legacy.SecretName}}, nil
	}
	k := private.Kubernetes
	if k == nil || k.Namespace == "" || k.ServiceAccount == nil || k.ServiceAccount.Name == "" || std.Expiry == nil ||
		std.Subject != "system:serviceaccount:"+k.Namespace+":"+k.ServiceAccount.Name {
		return nil, errors.New("service-account token: its claims are incomplete")
	}
	c := &Claims{Namespace: k.Namespace, ServiceAccountName: k.ServiceAccount.Name, ServiceAccountUID: k.ServiceAccount.UID,
		Audiences: std.Audience, ID: std.ID, Expiry: std.Expiry.Time()}
	if std.IssuedAt != nil {
		c.IssuedAt = std.IssuedAt.Time()
	}
	if std.NotBefore != nil && std.NotBefore.Time().After(c.IssuedAt) {
		c.IssuedAt = std.NotBefore.Time()
	}
	if k.WarnAfter != nil {
		c.WarnAfter = k.WarnAfter.Time()
	}
	for _, b := range []struct {
		from *ref
		to   **Ref
	}{{k.Pod, &c.Pod}, {k.Secret, &c.Secret}, {k.Node, &c.Node}} {
		if b.from != nil {
			*b.to = &Ref{Name: b.from.Name, UID: b.from.UID}
		}
	}
	return c, nil
}

// newID is a token's jti, a UUID as Kubernetes makes.
func newID() string { return string(uuid.NewUUID()) }
