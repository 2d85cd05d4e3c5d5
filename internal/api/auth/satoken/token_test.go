package satoken

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	clocktesting "k8s.io/utils/clock/testing"
)

const issuerName = "https://kubernetes.default.svc.cluster.local"

func newIssuer(t testing.TB, dir string, clk *clocktesting.FakeClock) *Issuer {
	t.Helper()
	keys, err := LoadOrCreateKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	return NewIssuer(issuerName, nil, keys, clk)
}

func podToken(now time.Time) Claims {
	return Claims{Namespace: "ns", ServiceAccountName: "sa", ServiceAccountUID: "sa-uid",
		Pod: &Ref{Name: "p", UID: "pod-uid"}, Audiences: []string{issuerName}, IssuedAt: now, Expiry: now.Add(time.Hour)}
}

func TestIssueAndVerify(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	iss := newIssuer(t, t.TempDir(), clk)
	raw, err := iss.Issue(podToken(clk.Now()))
	if err != nil {
		t.Fatal(err)
	}
	c, err := iss.Verify(raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Subject() != "system:serviceaccount:ns:sa" || c.ServiceAccountUID != "sa-uid" || c.Pod == nil || c.Pod.UID != "pod-uid" || c.ID == "" {
		t.Fatalf("claims %+v", c)
	}
	// The claims are Kubernetes' shape, for anyone reading the token.
	payload, _ := base64.RawURLEncoding.DecodeString(strings.Split(raw, ".")[1])
	var m map[string]any
	if err := json.Unmarshal(payload, &m); err != nil {
		t.Fatal(err)
	}
	k8s := m["kubernetes.io"].(map[string]any)
	if m["sub"] != "system:serviceaccount:ns:sa" || k8s["namespace"] != "ns" || k8s["pod"].(map[string]any)["uid"] != "pod-uid" || k8s["serviceaccount"].(map[string]any)["name"] != "sa" {
		t.Fatalf("payload %s", payload)
	}
}

func TestVerifyRefuses(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	dir := t.TempDir()
	iss := newIssuer(t, dir, clk)
	other := newIssuer(t, t.TempDir(), clk)
	good, err := iss.Issue(podToken(clk.Now()))
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(good, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	enc := func(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
	// The payload changed under the same signature: another namespace.
	forged := parts[0] + "." + enc([]byte(strings.Replace(string(payload), `"namespace":"ns"`, `"namespace":"kube-system"`, 1))) + "." + parts[2]
	noneHeader := enc([]byte(`{"alg":"none","typ":"JWT"}`))
	// HS256 keyed with the public key, the classic confusion.
	pubDER, _ := x509.MarshalPKIXPublicKey(iss.keys.verifying[iss.keys.signKID].key)
	hsHeader := enc([]byte(`{"alg":"HS256","typ":"JWT"}`))
	mac := hmac.New(sha256.New, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}))
	mac.Write([]byte(hsHeader + "." + parts[1]))
	otherKey, err := other.Issue(podToken(clk.Now()))
	if err != nil {
		t.Fatal(err)
	}
	expired := podToken(clk.Now().Add(-3 * time.Hour))
	expiredRaw, _ := iss.Issue(expired)
	future := podToken(clk.Now().Add(time.Hour))
	futureRaw, _ := iss.Issue(future)
	otherAudience := podToken(clk.Now())
	otherAudience.Audiences = []string{"vault"}
	otherAudienceRaw, _ := iss.Issue(otherAudience)
	// Signed by our key, but as another issuer: some other authenticator's.
	foreignKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	foreignSigner, _ := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: foreignKey}, nil)
	foreign, _ := jwt.Signed(foreignSigner).Claims(jwt.Claims{Issuer: "https://accounts.example.com", Subject: "x"}).Serialize()
	for name, raw := range map[string]string{
		"forged payload":     forged,
		"alg none":           noneHeader + "." + parts[1] + ".",
		"HS256 with the key": hsHeader + "." + parts[1] + "." + enc(mac.Sum(nil)),
		"another key":        otherKey,
		"expired":            expiredRaw,
		"not yet valid":      futureRaw,
		"other audience":     otherAudienceRaw,
		"other issuer":       foreign,
		"not a JWT":          "abc.def",
		"garbage":            "a.b.c",
		"truncated":          good[:len(good)-5],
	} {
		if c, err := iss.Verify(raw, nil); err == nil {
			t.Errorf("%s: accepted as %+v", name, c)
		}
	}
	if _, err := iss.Verify(otherAudienceRaw, []string{"vault"}); err != nil {
		t.Errorf("the token's own audience: %v", err)
	}
	// A remembered token still expires.
	if _, err := iss.Verify(good, nil); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Hour + 2*leeway)
	if _, err := iss.Verify(good, nil); err == nil {
		t.Error("a remembered token was accepted after its expiry")
	}
}

func TestLegacyToken(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	iss := newIssuer(t, t.TempDir(), clk)
	raw, err := iss.IssueLegacy("ns", "sa", "sa-uid", "sa-token-x")
	if err != nil {
		t.Fatal(err)
	}
	clk.Step(10 * 365 * 24 * time.Hour) // no expiry
	c, err := iss.Verify(raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Legacy || c.Secret.Name != "sa-token-x" || c.Subject() != "system:serviceaccount:ns:sa" {
		t.Fatalf("claims %+v", c)
	}
	if _, err := iss.Verify(raw, []string{"vault"}); err == nil {
		t.Error("a legacy token was accepted for an audience other than the API's")
	}
}

// TestKeyRotation: a new signing key leaves the old one's tokens valid
// while its public key stays in service.pub, and refused once removed.
func TestKeyRotation(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	dir := t.TempDir()
	old := newIssuer(t, dir, clk)
	oldToken, _ := old.Issue(podToken(clk.Now()))
	if err := os.Remove(filepath.Join(dir, SigningKeyFile)); err != nil {
		t.Fatal(err)
	}
	rotated := newIssuer(t, dir, clk)
	if rotated.keys.signKID == old.keys.signKID || len(rotated.JWKSKeys()) != 2 {
		t.Fatalf("after rotation: signing kid %s, %d keys", rotated.keys.signKID, len(rotated.JWKSKeys()))
	}
	if _, err := rotated.Verify(oldToken, nil); err != nil {
		t.Fatalf("old token after rotation: %v", err)
	}
	newToken, _ := rotated.Issue(podToken(clk.Now()))
	// Keep only the new key's block: the old tokens are revoked.
	pem1, _ := os.ReadFile(filepath.Join(dir, PublicKeysFile))
	blocks := strings.SplitAfter(string(pem1), "-----END PUBLIC KEY-----\n")
	if err := os.WriteFile(filepath.Join(dir, PublicKeysFile), []byte(blocks[1]), 0o644); err != nil {
		t.Fatal(err)
	}
	revoked := newIssuer(t, dir, clk)
	if _, err := revoked.Verify(oldToken, nil); err == nil {
		t.Error("a token of a removed key was accepted")
	}
	if _, err := revoked.Verify(newToken, nil); err != nil {
		t.Errorf("the new key's token: %v", err)
	}
}

func (i *Issuer) JWKSKeys() []jose.JSONWebKey { return i.keys.JWKS().Keys }

// BenchmarkVerify: a token seen before costs a hash and a map lookup;
// the first sight of one costs a signature check.
func BenchmarkVerify(b *testing.B) {
	clk := clocktesting.NewFakeClock(time.Now())
	iss := newIssuer(b, b.TempDir(), clk)
	raw, _ := iss.Issue(podToken(clk.Now()))
	b.Run("remembered", func(b *testing.B) {
		for b.Loop() {
			if _, err := iss.Verify(raw, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("first", func(b *testing.B) {
		for b.Loop() {
			if _, err := iss.parse(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
}
