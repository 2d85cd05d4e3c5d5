// Package encryption keeps chosen resources (secrets) encrypted at rest,
// as kube-apiserver's --encryption-provider-config does: a store wrapper
// encrypts each value before it is written (so the database, its
// write-ahead log and snapshots hold only ciphertext) and decrypts it when
// read. The configuration is Kubernetes' EncryptionConfiguration
// (apiserver.config.k8s.io/v1) with the aescbc, secretbox and identity
// providers; the transformers, and with them the bytes on disk, are
// Kubernetes' own (k8s.io/apiserver's), so the values are those
// kube-apiserver writes. The configuration's types are restated here: the
// k8s.io/apiserver API types would add 0.2 MB to a binary at its budget.
package encryption

import (
	"bytes"
	"crypto/aes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/orch-dev/orch/internal/atomicfile"
	"k8s.io/apiserver/pkg/storage/value"
	aestransformer "k8s.io/apiserver/pkg/storage/value/encrypt/aes"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	"k8s.io/apiserver/pkg/storage/value/encrypt/secretbox"
	"sigs.k8s.io/yaml"
)

// Config is an EncryptionConfiguration.
type Config struct {
	APIVersion string           `json:"apiVersion"`
	Kind       string           `json:"kind"`
	Resources  []ResourceConfig `json:"resources"`
}

// ResourceConfig is how some resources are stored: written with the first
// provider, read with whichever matches.
type ResourceConfig struct {
	Resources []string         `json:"resources"`
	Providers []ProviderConfig `json:"providers"`
}

// ProviderConfig is one provider; exactly one field is set. KMS and
// AES-GCM are Kubernetes' too and refused here by name: KMS needs a
// plugin, and AES-GCM keys must be rotated every 200k writes.
type ProviderConfig struct {
	AESCBC    *KeysConfig `json:"aescbc,omitempty"`
	Secretbox *KeysConfig `json:"secretbox,omitempty"`
	Identity  *struct{}   `json:"identity,omitempty"`
	AESGCM    *KeysConfig `json:"aesgcm,omitempty"`
	KMS       any         `json:"kms,omitempty"`
}

// KeysConfig lists a provider's keys, the first one writing.
type KeysConfig struct {
	Keys []Key `json:"keys"`
}

// Key is a named secret, base64-encoded.
type Key struct {
	Name   string `json:"name"`
	Secret string `json:"secret"`
}

const (
	apiVersion = "apiserver.config.k8s.io/v1"
	kind       = "EncryptionConfiguration"
)

// Load reads and checks the configuration at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("encryption configuration: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("encryption configuration %s: %w", path, err)
	}
	return c, nil
}

// Parse reads a configuration (YAML or JSON), strictly: an unknown field
// is an error rather than a provider silently not used.
func Parse(data []byte) (*Config, error) {
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, err
	}
	if c.APIVersion != apiVersion || c.Kind != kind {
		return nil, fmt.Errorf("apiVersion %q, kind %q: want %s, %s", c.APIVersion, c.Kind, apiVersion, kind)
	}
	seen := map[string]bool{}
	for i, rc := range c.Resources {
		if len(rc.Resources) == 0 || len(rc.Providers) == 0 {
			return nil, fmt.Errorf("resources[%d]: resources and providers are required", i)
		}
		for _, r := range rc.Resources {
			if seen[r] {
				return nil, fmt.Errorf("resources[%d]: %q is configured twice", i, r)
			}
			seen[r] = true
		}
		if _, err := rc.transformer(); err != nil {
			return nil, fmt.Errorf("resources[%d].%w", i, err)
		}
	}
	return &c, nil
}

// Generate is k3s's --secrets-encryption configuration: secrets written
// with a new AES-CBC key, and read in plain text too (those stored before
// encryption was on) until they are encrypted again.
func Generate() (*Config, error) {
	key, err := newKey("aescbckey")
	if err != nil {
		return nil, err
	}
	return &Config{APIVersion: apiVersion, Kind: kind, Resources: []ResourceConfig{{
		Resources: []string{"secrets"},
		Providers: []ProviderConfig{{AESCBC: &KeysConfig{Keys: []Key{key}}}, {Identity: &struct{}{}}},
	}}}, nil
}

// newKey is a random 256-bit key, named by when it was made (and a random
// tail: two rotations within a second must not share a name).
func newKey(prefix string) (Key, error) {
	secret := make([]byte, 32+3)
	if _, err := rand.Read(secret); err != nil {
		return Key{}, err
	}
	name := prefix + "-" + time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(secret[32:])
	return Key{Name: name, Secret: base64.StdEncoding.EncodeToString(secret[:32])}, nil
}

// Save writes the configuration to path atomically, readable by root only
// (it holds the keys).
func (c *Config) Save(path string) error {
	data, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(path, data, 0o600)
}

// Clone is a deep copy of c, to change without touching c.
func (c *Config) Clone() (*Config, error) {
	data, err := yaml.Marshal(c)
	if err != nil {
		return nil, err
	}
	return Parse(data)
}

// For is the configuration of resource ("secrets", "configmaps",
// "deployments.apps"), or nil.
func (c *Config) For(resource string) *ResourceConfig {
	for i := range c.Resources {
		for _, r := range c.Resources[i].Resources {
			if r == resource {
				return &c.Resources[i]
			}
		}
	}
	return nil
}

// Rotate puts a new AES-CBC key first in resource's providers, the keys
// before it kept for reading: what is written from now on uses the new
// key.
func (c *Config) Rotate(resource string) (Key, error) {
	rc := c.For(resource)
	if rc == nil {
		return Key{}, fmt.Errorf("%s are not encrypted", resource)
	}
	key, err := newKey("aescbckey")
	if err != nil {
		return Key{}, err
	}
	rc.Providers = append([]ProviderConfig{{AESCBC: &KeysConfig{Keys: []Key{key}}}}, rc.Providers...)
	return key, nil
}

// Prune drops the keys of resource's providers that no stored value uses
// (inUse counts values by KeyName), but for the writing one and identity.
func (c *Config) Prune(resource string, inUse map[string]int) {
	rc := c.For(resource)
	if rc == nil {
		return
	}
	var kept []ProviderConfig
	for i, p := range rc.Providers {
		keys := p.keys()
		if keys == nil || i == 0 {
			kept = append(kept, p)
			continue
		}
		var left []Key
		for _, k := range keys.Keys {
			if inUse[p.kind()+":"+k.Name] > 0 {
				left = append(left, k)
			}
		}
		if len(left) > 0 {
			keys.Keys = left
			kept = append(kept, p)
		}
	}
	rc.Providers = kept
}

func (p ProviderConfig) keys() *KeysConfig {
	switch {
	case p.AESCBC != nil:
		return p.AESCBC
	case p.Secretbox != nil:
		return p.Secretbox
	}
	return nil
}

func (p ProviderConfig) kind() string {
	switch {
	case p.AESCBC != nil:
		return "aescbc"
	case p.Secretbox != nil:
		return "secretbox"
	}
	return "identity"
}

// WriteKey names what resource's values are written with:
// "aescbc:NAME", "secretbox:NAME" or "identity".
func (c *Config) WriteKey(resource string) string {
	rc := c.For(resource)
	if rc == nil {
		return "identity"
	}
	p := rc.Providers[0]
	if k := p.keys(); k != nil {
		return p.kind() + ":" + k.Keys[0].Name
	}
	return "identity"
}

// KeyName names what a stored value was written with, from its prefix,
// as WriteKey does.
func KeyName(stored []byte) string {
	for _, kind := range []string{"aescbc", "secretbox"} {
		prefix := []byte("k8s:enc:" + kind + ":v1:")
		if rest, ok := bytes.CutPrefix(stored, prefix); ok {
			if name, _, ok := bytes.Cut(rest, []byte(":")); ok {
				return kind + ":" + string(name)
			}
		}
	}
	if bytes.HasPrefix(stored, []byte("k8s:enc:")) {
		return "unknown"
	}
	return "identity"
}

// transformer is Kubernetes' for the providers: a prefix per key
// ("k8s:enc:aescbc:v1:NAME:"), identity none; the first writes, and a
// value read with another is stale.
func (rc *ResourceConfig) transformer() (value.Transformer, error) {
	var list []value.PrefixTransformer
	names := map[string]bool{}
	for i, p := range rc.Providers {
		set := 0
		for _, b := range []bool{p.AESCBC != nil, p.Secretbox != nil, p.Identity != nil, p.AESGCM != nil, p.KMS != nil} {
			if b {
				set++
			}
		}
		if set != 1 {
			return nil, fmt.Errorf("providers[%d]: exactly one provider must be given", i)
		}
		switch {
		case p.AESGCM != nil:
			return nil, fmt.Errorf("providers[%d]: aesgcm is not supported by orch: use aescbc or secretbox", i)
		case p.KMS != nil:
			return nil, fmt.Errorf("providers[%d]: kms is not supported by orch: use aescbc or secretbox", i)
		case p.Identity != nil:
			list = append(list, value.PrefixTransformer{Transformer: identity.NewEncryptCheckTransformer()})
			continue
		}
		keys := p.keys()
		if len(keys.Keys) == 0 {
			return nil, fmt.Errorf("providers[%d].%s.keys: at least one key is required", i, p.kind())
		}
		for j, k := range keys.Keys {
			where := fmt.Sprintf("providers[%d].%s.keys[%d]", i, p.kind(), j)
			if k.Name == "" || names[k.Name] {
				return nil, fmt.Errorf("%s.name: %q: a key needs a name of its own", where, k.Name)
			}
			names[k.Name] = true
			secret, err := base64.StdEncoding.DecodeString(k.Secret)
			if err != nil {
				return nil, fmt.Errorf("%s.secret: not base64: %w", where, err)
			}
			var t value.Transformer
			if p.AESCBC != nil {
				if n := len(secret); n != 16 && n != 24 && n != 32 {
					return nil, fmt.Errorf("%s.secret: aescbc keys are 16, 24 or 32 bytes, this one is %d", where, n)
				}
				block, err := aes.NewCipher(secret)
				if err != nil {
					return nil, fmt.Errorf("%s.secret: %w", where, err)
				}
				t = aestransformer.NewCBCTransformer(block)
			} else {
				if len(secret) != 32 {
					return nil, fmt.Errorf("%s.secret: secretbox keys are 32 bytes, this one is %d", where, len(secret))
				}
				t = secretbox.NewSecretboxTransformer([32]byte(secret))
			}
			list = append(list, value.PrefixTransformer{Prefix: []byte("k8s:enc:" + p.kind() + ":v1:" + k.Name + ":"), Transformer: t})
		}
	}
	return value.NewPrefixTransformers(nil, list...), nil
}
