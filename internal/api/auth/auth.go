// Package auth decides who a request comes from and what they may do.
//
// Authentication: an x509 client certificate signed by the cluster CA (CN is
// the user, O the groups), a bearer token from the token file or one a
// TokenAuthenticator knows (the service accounts' JWTs), or, for the
// server's own loops, the in-process mark of the loopback client. Requests
// with none of these are anonymous.
//
// Authorization is a chain, as kube-apiserver's: system:masters may do
// everything; system:nodes get what Kubernetes' node authorizer grants a
// kubelet (its own Node and Lease, the pods bound to it and the secrets
// and configmaps they use, events); then the rules the server adds (RBAC,
// in the rbac package) decide for everyone.
package auth

import (
	"context"
	"crypto/subtle"
	"crypto/x509"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/orch-dev/orch/internal/joinproto"
)

// Well-known users and groups.
const (
	GroupMasters       = "system:masters"
	GroupNodes         = "system:nodes"
	GroupAuthenticated = "system:authenticated"
	// Anonymous is the user of a request without credentials, and
	// GroupUnauthenticated its group.
	Anonymous            = "system:anonymous"
	GroupUnauthenticated = "system:unauthenticated"
	// ServiceAccountPrefix starts a service account's user name,
	// system:serviceaccount:<namespace>:<name>; its groups are
	// system:serviceaccounts and system:serviceaccounts:<namespace>.
	ServiceAccountPrefix = "system:serviceaccount:"
	GroupServiceAccounts = "system:serviceaccounts"
	NodeUserPrefix       = joinproto.NodeUserPrefix
	// LoopsUser is the identity the server's own control loops use.
	LoopsUser = "system:orch-loops"
)

// User is an authenticated identity.
type User struct {
	Name   string
	UID    string
	Groups []string
	Extra  map[string][]string
}

// InGroup reports whether u is in group g.
func (u User) InGroup(g string) bool { return slices.Contains(u.Groups, g) }

// Authenticator resolves a request's identity.
type Authenticator struct {
	// VerifyClient, when set, checks a client certificate chain against
	// the CAs of the moment and returns the client's certificate; the
	// handshake only asks for one. Every request is checked, as
	// kube-apiserver checks them, so that a CA no longer trusted (orch
	// certificate rotate-ca --drop-previous) is refused on connections
	// opened before, with 401 as for any certificate of an unknown CA.
	VerifyClient func(chain []*x509.Certificate) (*x509.Certificate, error)

	tokens map[string]User
	// jwts knows the service-account tokens; apiAudiences are the
	// audiences a request to the API is for.
	jwts         TokenAuthenticator
	apiAudiences []string
}

// TokenAuthenticator knows bearer tokens beyond the token file (the
// service accounts' JWTs): the user a token is, and the audiences (of
// those asked, or the API's when none are) it was accepted for.
// ErrUnknownToken is a token it does not know at all.
type TokenAuthenticator interface {
	AuthenticateToken(ctx context.Context, token string, audiences []string) (User, []string, error)
}

// ErrUnknownToken is a bearer token no authenticator knows.
var ErrUnknownToken = errors.New("invalid bearer token")

// ErrUntrustedCertificate is a client certificate no trusted CA signed.
var ErrUntrustedCertificate = errors.New("client certificate not trusted")

// NewAuthenticator reads the token file (Kubernetes' --token-auth-file CSV:
// token,user,uid,"group1,group2"); an empty path means no tokens. jwts,
// when set, knows the service-account tokens, for the API's audiences.
func NewAuthenticator(tokenFile string, jwts TokenAuthenticator, apiAudiences []string) (*Authenticator, error) {
	a := &Authenticator{tokens: map[string]User{}, jwts: jwts, apiAudiences: apiAudiences}
	if tokenFile == "" {
		return a, nil
	}
	f, err := os.Open(tokenFile)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	defer func() { _ = f.Close() }()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1
	r.Comment = '#'
	for line := 1; ; line++ {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("token file %s: %w", tokenFile, err)
		}
		if len(rec) < 2 || rec[0] == "" || rec[1] == "" {
			return nil, fmt.Errorf("token file %s line %d: want token,user[,uid[,\"groups\"]]", tokenFile, line)
		}
		u := User{Name: rec[1]}
		if len(rec) > 2 {
			u.UID = rec[2]
		}
		if len(rec) > 3 && rec[3] != "" {
			u.Groups = strings.Split(rec[3], ",")
		}
		a.tokens[rec[0]] = u
	}
	return a, nil
}

// inProcessKey carries the user of a request made inside the server.
type inProcessKey struct{}

// InProcess marks ctx as a request made inside the server process by u:
// the control loops' loopback client. Only code in this process can set
// it; a request from the network never carries it.
func InProcess(ctx context.Context, u User) context.Context {
	return context.WithValue(ctx, inProcessKey{}, u)
}

// Authenticate returns the request's user; ok is false for an anonymous
// request, err is set for a bearer token that matches nobody.
func (a *Authenticator) Authenticate(r *http.Request) (u User, ok bool, err error) {
	if u, ok := r.Context().Value(inProcessKey{}).(User); ok {
		return withAuthenticated(u), true, nil
	}
	var certErr error
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && a.VerifyClient != nil {
		cert, err := a.VerifyClient(r.TLS.PeerCertificates)
		if err == nil {
			u = User{Name: cert.Subject.CommonName, Groups: append([]string{}, cert.Subject.Organization...)}
			return withAuthenticated(u), true, nil
		}
		certErr = fmt.Errorf("%w: %w", ErrUntrustedCertificate, err)
	}
	h := r.Header.Get("Authorization")
	if h == "" {
		return User{}, false, certErr
	}
	scheme, token, _ := strings.Cut(h, " ")
	token = strings.TrimSpace(token)
	if !strings.EqualFold(scheme, "bearer") || token == "" {
		return User{}, false, ErrUnknownToken
	}
	u, _, err = a.AuthenticateToken(r.Context(), token, nil)
	if err != nil {
		return User{}, false, err
	}
	return u, true, nil
}

// AuthenticateToken is the user a bearer token is, for one of audiences
// (the API's when none are given), as a TokenReview asks; the audiences
// returned are those it was accepted for. A token-file token is good
// for the API's audiences only, as Kubernetes treats tokens that know
// no audience.
func (a *Authenticator) AuthenticateToken(ctx context.Context, token string, audiences []string) (User, []string, error) {
	for t, u := range a.tokens {
		if subtle.ConstantTimeCompare([]byte(t), []byte(token)) == 1 {
			if len(audiences) == 0 {
				return withAuthenticated(u), a.apiAudiences, nil
			}
			var both []string
			for _, aud := range audiences {
				if slices.Contains(a.apiAudiences, aud) {
					both = append(both, aud)
				}
			}
			if len(both) == 0 {
				return User{}, nil, fmt.Errorf("token audiences %q are invalid for the target audiences %q", a.apiAudiences, audiences)
			}
			return withAuthenticated(u), both, nil
		}
	}
	if a.jwts == nil {
		return User{}, nil, ErrUnknownToken
	}
	u, accepted, err := a.jwts.AuthenticateToken(ctx, token, audiences)
	if err != nil {
		return User{}, nil, err
	}
	return withAuthenticated(u), accepted, nil
}

func withAuthenticated(u User) User {
	if !u.InGroup(GroupAuthenticated) {
		u.Groups = append(u.Groups, GroupAuthenticated)
	}
	return u
}

// userKey carries the identity a request runs as, for admission.
type userKey struct{}

// WithUser records in ctx the identity the request runs as.
func WithUser(ctx context.Context, u User) context.Context {
	return context.WithValue(ctx, userKey{}, u)
}

// UserFrom is the identity the request runs as; ok is false outside a
// request (the server's own start-up writes).
func UserFrom(ctx context.Context) (User, bool) {
	u, ok := ctx.Value(userKey{}).(User)
	return u, ok
}
