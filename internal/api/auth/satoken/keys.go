// Package satoken issues and verifies service-account tokens: JWTs signed
// by a key in the server's data dir, with Kubernetes' claims, so that a
// pod's projected token, `kubectl create token` and a legacy token Secret
// mean here what they mean to kube-apiserver.
//
// Keys rotate as files: service.key signs; service.pub holds every public
// key that verifies (the signing key's is added when missing), so a new
// service.key leaves tokens of the old one valid until their expiry or
// until its block is removed from service.pub.
package satoken

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/orch-dev/orch/internal/atomicfile"
	"k8s.io/client-go/util/keyutil"
)

// Key files under the server's tls directory.
const (
	SigningKeyFile = "service.key"
	PublicKeysFile = "service.pub"
)

// Keys are the signing key and every key a token may be verified with.
type Keys struct {
	signer    jose.Signer
	signKID   string
	verifying map[string]verifyingKey // by key ID
	set       jose.JSONWebKeySet
}

type verifyingKey struct {
	key crypto.PublicKey
	alg jose.SignatureAlgorithm
}

// LoadOrCreateKeys reads the keys under dir, making a signing key (ECDSA
// P-256: quick to make on a small board, ES256 as Kubernetes accepts)
// when there is none.
func LoadOrCreateKeys(dir string) (*Keys, error) {
	keyPath := filepath.Join(dir, SigningKeyFile)
	priv, err := readSigningKey(keyPath)
	if errors.Is(err, os.ErrNotExist) {
		priv, err = createSigningKey(keyPath)
	}
	if err != nil {
		return nil, err
	}
	pubPath := filepath.Join(dir, PublicKeysFile)
	var pubs []crypto.PublicKey
	if b, err := os.ReadFile(pubPath); err == nil {
		keys, err := keyutil.ParsePublicKeysPEM(b)
		if err != nil {
			return nil, fmt.Errorf("service-account public keys %s: %w", pubPath, err)
		}
		for _, key := range keys {
			pubs = append(pubs, key)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("service-account public keys: %w", err)
	}
	k := &Keys{verifying: map[string]verifyingKey{}}
	own := priv.Public()
	if k.signKID, err = KeyID(own); err != nil {
		return nil, err
	}
	for _, pub := range pubs {
		if err := k.add(pub); err != nil {
			return nil, fmt.Errorf("service-account public keys %s: %w", pubPath, err)
		}
	}
	if _, ok := k.verifying[k.signKID]; !ok {
		if err := k.add(own); err != nil {
			return nil, err
		}
		if err := writePublicKeys(pubPath, append(pubs, own)); err != nil {
			return nil, err
		}
	}
	alg := k.verifying[k.signKID].alg
	opts := (&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), k.signKID)
	if k.signer, err = jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: priv}, opts); err != nil {
		return nil, fmt.Errorf("service-account signer: %w", err)
	}
	return k, nil
}

func (k *Keys) add(pub crypto.PublicKey) error {
	var alg jose.SignatureAlgorithm
	switch p := pub.(type) {
	case *rsa.PublicKey:
		alg = jose.RS256
	case *ecdsa.PublicKey:
		switch p.Curve {
		case elliptic.P256():
			alg = jose.ES256
		case elliptic.P384():
			alg = jose.ES384
		case elliptic.P521():
			alg = jose.ES512
		default:
			return fmt.Errorf("unsupported elliptic curve %s", p.Curve.Params().Name)
		}
	default:
		return fmt.Errorf("unsupported public key type %T", pub)
	}
	kid, err := KeyID(pub)
	if err != nil {
		return err
	}
	if _, ok := k.verifying[kid]; ok {
		return nil
	}
	k.verifying[kid] = verifyingKey{key: pub, alg: alg}
	k.set.Keys = append(k.set.Keys, jose.JSONWebKey{Key: pub, KeyID: kid, Algorithm: string(alg), Use: "sig"})
	return nil
}

// JWKS is the public keys as a JSON Web Key Set, for /openid/v1/jwks.
func (k *Keys) JWKS() jose.JSONWebKeySet { return k.set }

// Algorithms are the signature algorithms the keys verify.
func (k *Keys) Algorithms() []string {
	seen := map[jose.SignatureAlgorithm]bool{}
	var out []string
	for _, v := range k.set.Keys {
		if a := jose.SignatureAlgorithm(v.Algorithm); !seen[a] {
			seen[a] = true
			out = append(out, v.Algorithm)
		}
	}
	return out
}

// KeyID is Kubernetes' key ID of a public key: the unpadded base64url
// SHA-256 of its PKIX encoding, so that the same key has the same kid
// here and in any issuer's discovery document.
func KeyID(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("key ID: %w", err)
	}
	sum := sha256.Sum256(der)
	return base64.RawURLEncoding.EncodeToString(sum[:]), nil
}

func readSigningKey(path string) (crypto.Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	key, err := keyutil.ParsePrivateKeyPEM(b)
	if err != nil {
		return nil, fmt.Errorf("service-account signing key %s: %w", path, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("service-account signing key %s cannot sign", path)
	}
	switch signer.(type) {
	case *rsa.PrivateKey, *ecdsa.PrivateKey:
		return signer, nil
	}
	return nil, fmt.Errorf("service-account signing key %s: want an RSA or ECDSA key, not %T", path, key)
}

func createSigningKey(path string) (crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate service-account key: %w", err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal service-account key: %w", err)
	}
	if err := atomicfile.Write(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	return key, nil
}

func writePublicKeys(path string, pubs []crypto.PublicKey) error {
	var out []byte
	for _, pub := range pubs {
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			return fmt.Errorf("marshal service-account public key: %w", err)
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})...)
	}
	return atomicfile.Write(path, out, 0o644)
}
