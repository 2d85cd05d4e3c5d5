package api

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/orch-dev/orch/internal/api/etcdmember"
	"github.com/orch-dev/orch/internal/atomicfile"
	"github.com/orch-dev/orch/internal/joinproto"
	"github.com/orch-dev/orch/internal/store"
)

// Servers sharing a datastore are one cluster: the same CAs, service-account
// keys and encryption configuration, and the same networks. The first
// server to start on an empty datastore puts them there, sealed with the
// token's secret (as k3s keeps its bootstrap data in its datastore); every
// other server given that token takes them from there before it loads its
// PKI, and refuses to join when its networks differ.

// bootstrapKey is outside /registry: no API resource lists it.
const bootstrapKey = "/orch/bootstrap"

// bootstrapFiles, under DATA/server, are the cluster's identity. Each
// server issues its own serving and client certificates from them.
var bootstrapFiles = []string{
	"tls/ca.crt", "tls/ca.key", "tls/ca-previous.crt",
	"tls/front-proxy/ca.crt", "tls/front-proxy/ca.key",
	"tls/service.key", "tls/service.pub",
	"cred/encryption-config.json",
}

// bootstrapFiles are, with the servers' own etcd, these and what the
// servers share besides: the agents' token, the server token and etcd's
// CAs.
func (s *Server) bootstrapFiles() []string {
	if s.cfg.Embedded == nil {
		return bootstrapFiles
	}
	return embeddedBootstrapFiles()
}

func embeddedBootstrapFiles() []string {
	out := append(slices.Clip(bootstrapFiles), "token", serverTokenFile)
	for _, f := range etcdmember.CAFiles {
		out = append(out, "tls/etcd/"+f)
	}
	return out
}

// clusterSettings must be the same on every server.
type clusterSettings struct {
	ServiceCIDR string `json:"serviceCIDR"`
	ClusterCIDR string `json:"clusterCIDR"`
	ClusterDNS  string `json:"clusterDNS"`
}

type bootstrapData struct {
	Settings clusterSettings   `json:"settings"`
	Files    map[string][]byte `json:"files"`
}

// sealedBootstrap is what the datastore holds: AES-256-GCM under a key
// derived from the token's secret.
type sealedBootstrap struct {
	Salt       []byte `json:"salt"`
	Nonce      []byte `json:"nonce"`
	Ciphertext []byte `json:"ciphertext"`
}

const bootstrapKDFIterations = 100_000

func (s *Server) settings() clusterSettings {
	return clusterSettings{ServiceCIDR: s.cfg.ServiceCIDR, ClusterCIDR: s.cfg.ClusterCIDR, ClusterDNS: s.cfg.ClusterDNS}
}

// tokenSecret is the secret of --token, or of the token this server wrote
// on an earlier start; "" when neither exists.
func tokenSecret(given, serverDir string) (string, error) {
	if given == "" {
		b, err := os.ReadFile(filepath.Join(serverDir, "token"))
		if errors.Is(err, os.ErrNotExist) {
			return "", nil
		}
		if err != nil {
			return "", fmt.Errorf("read token: %w", err)
		}
		given = strings.TrimSpace(string(b))
	}
	tok, err := joinproto.ParseToken(given)
	if err != nil {
		return "", fmt.Errorf("token: %w", err)
	}
	return tok.Secret, nil
}

func bootstrapCipher(secret string, salt []byte) (cipher.AEAD, error) {
	key, err := pbkdf2.Key(sha256.New, secret, salt, bootstrapKDFIterations, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// pullBootstrap writes the cluster's identity from the datastore into
// serverDir; false when the datastore has none yet (this is the first
// server).
func (s *Server) pullBootstrap(ctx context.Context, serverDir, secret string) (bool, error) {
	kv, err := s.store.Get(ctx, bootstrapKey)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the cluster's bootstrap data: %w", err)
	}
	if secret == "" {
		return false, errors.New("the datastore already holds a cluster: start this server with its token (--token, from DATA/server/token on a server of it)")
	}
	data, err := unsealBootstrap(kv.Value, secret)
	if err != nil {
		return false, err
	}
	return true, s.applyBootstrap(serverDir, data)
}

// unsealBootstrap opens the sealed bootstrap data with the secret.
func unsealBootstrap(value []byte, secret string) (bootstrapData, error) {
	var sealed sealedBootstrap
	if err := json.Unmarshal(value, &sealed); err != nil {
		return bootstrapData{}, fmt.Errorf("the cluster's bootstrap data: %w", err)
	}
	aead, err := bootstrapCipher(secret, sealed.Salt)
	if err != nil {
		return bootstrapData{}, err
	}
	plain, err := aead.Open(nil, sealed.Nonce, sealed.Ciphertext, []byte(bootstrapKey))
	if err != nil {
		return bootstrapData{}, errors.New("the datastore holds a cluster made with another token: start this server with that cluster's --token")
	}
	var data bootstrapData
	if err := json.Unmarshal(plain, &data); err != nil {
		return bootstrapData{}, fmt.Errorf("the cluster's bootstrap data: %w", err)
	}
	return data, nil
}

// applyBootstrap refuses a cluster whose settings differ from this
// server's, then writes its identity into serverDir.
func (s *Server) applyBootstrap(serverDir string, data bootstrapData) error {
	if want, have := data.Settings, s.settings(); want != have {
		return fmt.Errorf("this server's networks differ from the cluster's: --service-cidr %s, --cluster-cidr %s, --cluster-dns %s on the cluster, %s, %s, %s here: every server must use the same",
			want.ServiceCIDR, want.ClusterCIDR, want.ClusterDNS, have.ServiceCIDR, have.ClusterCIDR, have.ClusterDNS)
	}
	if _, shared := data.Files["cred/encryption-config.json"]; s.cfg.SecretsEncryption && !shared {
		if _, err := os.Stat(EncryptionConfigPath(s.cfg.DataDir)); errors.Is(err, os.ErrNotExist) {
			return errors.New("--secrets-encryption is set here but the cluster's servers do not encrypt Secrets: every server must agree (turn it on for the cluster with orch secrets-encrypt)")
		}
	}
	if local, err := os.ReadFile(filepath.Join(serverDir, "tls", "ca.crt")); err == nil && !bytes.Equal(local, data.Files["tls/ca.crt"]) {
		return fmt.Errorf("this server's CA (%s) is not the cluster's: it belongs to another cluster (move DATA/server away to join this one)", filepath.Join(serverDir, "tls", "ca.crt"))
	}
	return writeBootstrapFiles(serverDir, s.bootstrapFiles(), data)
}

// writeBootstrapFiles writes the files of names that data has into
// serverDir, and removes those of bootstrapFiles it has not (the servers'
// own etcd's files it has not are kept).
func writeBootstrapFiles(serverDir string, names []string, data bootstrapData) error {
	for _, name := range names {
		content, ok := data.Files[name]
		path := filepath.Join(serverDir, filepath.FromSlash(name))
		if !ok {
			if !slices.Contains(bootstrapFiles, name) {
				continue // the servers' own etcd's files: kept as they are
			}
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return err
		}
		if err := atomicfile.Write(path, content, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return nil
}

// pushBootstrap puts this server's identity into the datastore as the
// cluster's. When another server did so first, this one's identity, if
// this start made it, is removed so that its next start joins that
// cluster; one it had before (it ran alone) is kept: its nodes trust it.
func (s *Server) pushBootstrap(ctx context.Context, serverDir, secret string, fresh bool) error {
	data := bootstrapData{Settings: s.settings(), Files: map[string][]byte{}}
	for _, name := range s.bootstrapFiles() {
		content, err := os.ReadFile(filepath.Join(serverDir, filepath.FromSlash(name)))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		data.Files[name] = content
	}
	plain, err := json.Marshal(data)
	if err != nil {
		return err
	}
	sealed := sealedBootstrap{Salt: make([]byte, 16)}
	if _, err := rand.Read(sealed.Salt); err != nil {
		return err
	}
	aead, err := bootstrapCipher(secret, sealed.Salt)
	if err != nil {
		return err
	}
	sealed.Nonce = make([]byte, aead.NonceSize())
	if _, err := rand.Read(sealed.Nonce); err != nil {
		return err
	}
	sealed.Ciphertext = aead.Seal(nil, sealed.Nonce, plain, []byte(bootstrapKey))
	value, err := json.Marshal(sealed)
	if err != nil {
		return err
	}
	_, err = s.store.Create(ctx, bootstrapKey, value)
	if errors.Is(err, store.ErrExists) {
		if !fresh {
			return errors.New("another server made the cluster in the datastore while this one, which has run alone, started: its CA is not that cluster's (move DATA/server away to join it, or empty the datastore to make the cluster from this server)")
		}
		for _, name := range s.bootstrapFiles() {
			_ = os.Remove(filepath.Join(serverDir, filepath.FromSlash(name)))
		}
		return errors.New("another server made the cluster in the datastore while this one started: start this one again to join it")
	}
	if err != nil {
		return fmt.Errorf("store the cluster's bootstrap data: %w", err)
	}
	s.log.Info("this server made the cluster in the datastore; start others with its token to join", "token", filepath.Join(serverDir, "token"))
	return nil
}
