package encryption

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/store"
	"github.com/orch-dev/orch/internal/store/boltstore"
)

const aesKey = "c2VjcmV0IGlzIHNlY3VyZSwgaSB0aGluayBzbyAwMTI=" // 32 bytes

func TestParse(t *testing.T) {
	header := "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\n"
	for _, tc := range []struct {
		name, config, err string
	}{
		{"aescbc then identity", header + "resources:\n- resources: [secrets]\n  providers:\n  - aescbc:\n      keys:\n      - {name: k1, secret: " + aesKey + "}\n  - identity: {}\n", ""},
		{"secretbox", header + "resources:\n- resources: [secrets]\n  providers:\n  - secretbox:\n      keys:\n      - {name: k1, secret: " + aesKey + "}\n", ""},
		{"identity only", header + "resources:\n- resources: [secrets]\n  providers:\n  - identity: {}\n", ""},
		{"wrong kind", "apiVersion: v1\nkind: ConfigMap\n", "want apiserver.config.k8s.io/v1, EncryptionConfiguration"},
		{"unknown field", header + "resources:\n- resources: [secrets]\n  providers:\n  - aescbc:\n      keyz: []\n", "unknown field"},
		{"aesgcm", header + "resources:\n- resources: [secrets]\n  providers:\n  - aesgcm:\n      keys:\n      - {name: k1, secret: " + aesKey + "}\n", "aesgcm is not supported"},
		{"kms", header + "resources:\n- resources: [secrets]\n  providers:\n  - kms: {name: vault}\n", "kms is not supported"},
		{"two providers in one", header + "resources:\n- resources: [secrets]\n  providers:\n  - identity: {}\n    aescbc: {keys: [{name: k1, secret: " + aesKey + "}]}\n", "exactly one provider"},
		{"no key", header + "resources:\n- resources: [secrets]\n  providers:\n  - aescbc: {keys: []}\n", "at least one key"},
		{"key not base64", header + "resources:\n- resources: [secrets]\n  providers:\n  - aescbc: {keys: [{name: k1, secret: '!!'}]}\n", "providers[0].aescbc.keys[0].secret: not base64"},
		{"short key", header + "resources:\n- resources: [secrets]\n  providers:\n  - aescbc: {keys: [{name: k1, secret: c2hvcnQ=}]}\n", "16, 24 or 32 bytes, this one is 5"},
		{"short secretbox key", header + "resources:\n- resources: [secrets]\n  providers:\n  - secretbox: {keys: [{name: k1, secret: c2hvcnQ=}]}\n", "secretbox keys are 32 bytes"},
		{"same key name twice", header + "resources:\n- resources: [secrets]\n  providers:\n  - aescbc: {keys: [{name: k1, secret: " + aesKey + "}, {name: k1, secret: " + aesKey + "}]}\n", "a key needs a name of its own"},
		{"a resource twice", header + "resources:\n- resources: [secrets]\n  providers: [{identity: {}}]\n- resources: [secrets]\n  providers: [{identity: {}}]\n", `"secrets" is configured twice`},
		{"no providers", header + "resources:\n- resources: [secrets]\n", "resources and providers are required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.config))
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("Parse: %v, want %q", err, tc.err)
			}
		})
	}
}

func openStore(t *testing.T) store.Store {
	t.Helper()
	s, err := boltstore.Open(t.TempDir(), boltstore.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestEncryptedStore: values are written in Kubernetes' format
// (k8s:enc:aescbc:v1:NAME: and ciphertext), read back, watched in plain
// text; values stored before encryption still read; after a rotation the
// new key writes and the old one still reads; reencrypt moves every value
// to the new key and pruning then drops the old one; a value whose key
// is gone is an error naming it, never garbage.
func TestEncryptedStore(t *testing.T) {
	ctx := context.Background()
	raw := openStore(t)
	const prefix = "/registry/secrets/"
	if _, err := raw.Create(ctx, prefix+"default/old", []byte(`{"kind":"Secret","data":"plain-before"}`)); err != nil {
		t.Fatal(err)
	}
	cfg, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	first := cfg.WriteKey("secrets")
	s, err := Wrap(raw, "secrets", cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Watch(ctx, prefix, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	secret := []byte(`{"kind":"Secret","data":"hunter2-value"}`)
	kv, err := s.Create(ctx, prefix+"default/a", secret)
	if err != nil || !bytes.Equal(kv.Value, secret) {
		t.Fatalf("Create: %q, %v", kv.Value, err)
	}
	stored, _ := raw.Get(ctx, prefix+"default/a")
	name := strings.TrimPrefix(first, "aescbc:")
	if !bytes.HasPrefix(stored.Value, []byte("k8s:enc:aescbc:v1:"+name+":")) || bytes.Contains(stored.Value, []byte("hunter2")) {
		t.Fatalf("stored: %q", stored.Value)
	}
	select {
	case ev := <-w.Events():
		if !bytes.Equal(ev.KV.Value, secret) {
			t.Errorf("watched: %q", ev.KV.Value)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no watch event")
	}
	for key, want := range map[string]string{"a": string(secret), "old": `{"kind":"Secret","data":"plain-before"}`} {
		if got, err := s.Get(ctx, prefix+"default/"+key); err != nil || string(got.Value) != want {
			t.Errorf("Get %s: %q, %v", key, got.Value, err)
		}
	}
	if usage, err := s.Usage(ctx, prefix); err != nil || usage[first] != 1 || usage["identity"] != 1 {
		t.Errorf("usage: %v, %v", usage, err)
	}

	// Rotate: a new key writes, the old one reads.
	next, err := cfg.Clone()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := next.Rotate("secrets"); err != nil {
		t.Fatal(err)
	}
	second := next.WriteKey("secrets")
	if second == first {
		t.Fatalf("the rotated key is the old one: %s", second)
	}
	if err := s.Reload(next); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, prefix+"default/b", secret); err != nil {
		t.Fatal(err)
	}
	if got, err := s.List(ctx, prefix, store.ListOptions{}); err != nil || len(got.KVs) != 3 {
		t.Fatalf("List after rotation: %v, %v", got, err)
	}
	if usage, _ := s.Usage(ctx, prefix); usage[first] != 1 || usage[second] != 1 || usage["identity"] != 1 {
		t.Errorf("usage after rotation: %v", usage)
	}
	// Reencrypt: everything under the new key; the old key can go.
	n, err := s.Reencrypt(ctx, prefix, second)
	if err != nil || n != 2 {
		t.Fatalf("Reencrypt: %d, %v; want 2 rewritten", n, err)
	}
	usage, _ := s.Usage(ctx, prefix)
	if usage[second] != 3 || len(usage) != 1 {
		t.Errorf("usage after reencrypt: %v", usage)
	}
	next.Prune("secrets", usage)
	data, _ := os.ReadFile(writeConfig(t, next))
	if strings.Contains(string(data), name) || !strings.Contains(string(data), "identity") {
		t.Errorf("pruned configuration still has the old key %s (or lost identity):\n%s", name, data)
	}
	if err := s.Reload(next); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"a", "b", "old"} {
		if _, err := s.Get(ctx, prefix+"default/"+key); err != nil {
			t.Errorf("Get %s after pruning: %v", key, err)
		}
	}
	// A value no configured key wrote.
	other, _ := Generate()
	if _, err := raw.Create(ctx, prefix+"default/foreign", mustEncrypt(t, other, prefix+"default/foreign")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, prefix+"default/foreign"); err == nil || !strings.Contains(err.Error(), "decrypting "+prefix+"default/foreign") {
		t.Errorf("a value of an unknown key: %v", err)
	}
}

func writeConfig(t *testing.T, c *Config) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cred", "encryption-config.json")
	if err := c.Save(path); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("saved configuration: %v, %v; want mode 0600", st.Mode(), err)
	}
	back, err := Load(path)
	if err != nil || back.WriteKey("secrets") != c.WriteKey("secrets") {
		t.Fatalf("Load after Save: %v", err)
	}
	return path
}

func mustEncrypt(t *testing.T, c *Config, key string) []byte {
	t.Helper()
	s, err := Wrap(openStore(t), "secrets", c)
	if err != nil {
		t.Fatal(err)
	}
	data, err := s.to(context.Background(), key, []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}
