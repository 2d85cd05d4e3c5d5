package api_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orch-dev/orch/internal/api"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// storeFiles is everything the store wrote: its database and its
// write-ahead log.
func storeFiles(t *testing.T, dir string) []byte {
	t.Helper()
	var all []byte
	for _, name := range []string{"orch.db", "orch.wal"} {
		data, err := os.ReadFile(filepath.Join(dir, "server", "db", name))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, data...)
	}
	return all
}

// TestSecretsEncryption: with --secrets-encryption a Secret's data is
// nowhere in the store's files (database or log) in clear or in base64,
// while its name and a ConfigMap's data are; clients read it as ever.
// orch secrets-encrypt rotates the key (old values still read) and
// reencrypts every Secret with the new one, dropping the old key from the
// configuration. A restart without the flag keeps the configuration in
// force; a configuration that does not parse stops the server with its
// path and reason.
func TestSecretsEncryption(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ts := startServerWith(t, dir, 0, func(c *api.Config) { c.SecretsEncryption = true })
	const password = "hunter2-in-the-clear"
	mk := func(ts *testServer, name string) {
		t.Helper()
		if _, err := ts.client.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name},
			StringData: map[string]string{"password": password}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mk(ts, "db-pass")
	if _, err := ts.client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"},
		Data: map[string]string{"mode": "plain-configmap-value"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	files := storeFiles(t, dir)
	for _, secret := range []string{password, base64.StdEncoding.EncodeToString([]byte(password))} {
		if bytes.Contains(files, []byte(secret)) {
			t.Errorf("the store's files hold the secret's data %q", secret)
		}
	}
	if !bytes.Contains(files, []byte("/registry/secrets/default/db-pass")) || !bytes.Contains(files, []byte("plain-configmap-value")) {
		t.Error("the store's files lack the secret's key or the ConfigMap's data: not the files written")
	}
	if !bytes.Contains(files, []byte("k8s:enc:aescbc:v1:aescbckey-")) {
		t.Error("no value in kube-apiserver's aescbc format")
	}
	read := func(ts *testServer, name string) {
		t.Helper()
		s, err := ts.client.CoreV1().Secrets("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil || string(s.Data["password"]) != password {
			t.Fatalf("reading secret %s: %v %v", name, s, err)
		}
	}
	read(ts, "db-pass")

	status, err := api.SecretsEncrypt(ctx, dir, "status")
	if err != nil || !status.Enabled || len(status.Resources) != 1 || status.Resources[0].Resource != "secrets" {
		t.Fatalf("status: %+v, %v", status, err)
	}
	first := status.Resources[0].WriteKey
	if status.Resources[0].Stored[first] < 1 || !strings.Contains(status.String(), "written with "+first) {
		t.Errorf("status:\n%s", status)
	}
	rotated, err := api.SecretsEncrypt(ctx, dir, "rotate")
	if err != nil {
		t.Fatal(err)
	}
	second := rotated.Resources[0].WriteKey
	if second == first {
		t.Fatalf("rotate kept the key %s", first)
	}
	mk(ts, "after-rotation")
	read(ts, "db-pass")
	read(ts, "after-rotation")
	before, _ := api.SecretsEncrypt(ctx, dir, "status")
	if before.Resources[0].Stored[second] != 1 || before.Resources[0].Stored[first] < 1 {
		t.Errorf("after rotating, one secret under the new key and the rest under the old: %v", before.Resources[0].Stored)
	}
	after, err := api.SecretsEncrypt(ctx, dir, "reencrypt")
	if err != nil {
		t.Fatal(err)
	}
	if r := after.Resources[0]; len(r.Stored) != 1 || r.Stored[second] != before.Resources[0].Stored[first]+1 || r.Rewritten != before.Resources[0].Stored[first] {
		t.Errorf("after reencrypt: %+v (before %v)", r, before.Resources[0].Stored)
	}
	config, err := os.ReadFile(api.EncryptionConfigPath(dir))
	if err != nil || strings.Contains(string(config), strings.TrimPrefix(first, "aescbc:")) {
		t.Errorf("the old key is still configured (%v):\n%s", err, config)
	}
	read(ts, "db-pass")

	// A restart without the flag: still encrypted, still read.
	addr := ts.srv.URL()
	ts.stop()
	ts = restartOn(t, dir, strings.TrimPrefix(addr, "https://"))
	read(ts, "db-pass")
	mk(ts, "after-restart")
	if bytes.Contains(storeFiles(t, dir), []byte(password)) {
		t.Error("written in clear after a restart without --secrets-encryption")
	}
	ts.stop()

	// A broken configuration is refused by name.
	if err := os.WriteFile(api.EncryptionConfigPath(dir), []byte("kind: Nope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := api.New(ctx, api.Config{DataDir: dir, BindAddress: "127.0.0.1", AdvertiseAddress: "192.0.2.10"}); err == nil ||
		!strings.Contains(err.Error(), api.EncryptionConfigPath(dir)) {
		t.Errorf("a broken encryption configuration: %v", err)
	}
}

// TestSecretsEncryptWithoutIt: the commands say what is wrong when the
// server does not encrypt, or does not run.
func TestSecretsEncryptWithoutIt(t *testing.T) {
	ctx := context.Background()
	ts := startServer(t, "")
	if st, err := api.SecretsEncrypt(ctx, ts.dir, "status"); err != nil || st.Enabled || st.String() != "Encryption Status: Disabled\n" {
		t.Errorf("status: %+v, %v", st, err)
	}
	if _, err := api.SecretsEncrypt(ctx, ts.dir, "rotate"); err == nil || !strings.Contains(err.Error(), "start the server with --secrets-encryption") {
		t.Errorf("rotate: %v", err)
	}
	if _, err := api.SecretsEncrypt(ctx, t.TempDir(), "status"); err == nil || !strings.Contains(err.Error(), "no orch server runs on") {
		t.Errorf("status with no server: %v", err)
	}
}
