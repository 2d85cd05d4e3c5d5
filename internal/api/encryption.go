package api

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/orch-dev/orch/internal/api/encryption"
	"github.com/orch-dev/orch/internal/api/registry"
	"github.com/orch-dev/orch/internal/api/resources"
	"github.com/orch-dev/orch/internal/store"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// EncryptionConfigPath is where the server keeps its EncryptionConfiguration
// (k3s's server/cred/encryption-config.json): made by --secrets-encryption,
// changed by orch secrets-encrypt rotate and reencrypt. It holds the keys:
// without it the encrypted values cannot be read (a snapshot restored
// needs it too).
func EncryptionConfigPath(dataDir string) string {
	return filepath.Join(dataDir, "server", "cred", "encryption-config.json")
}

// encryptionState is the configuration in force and the stores it
// wraps, by resource.
type encryptionState struct {
	mu     sync.Mutex // serializes rotations
	path   string
	cfg    *encryption.Config
	stores map[schema.GroupResource]*encryption.Store
}

// loadEncryption reads the configuration when there is one, making it
// first with --secrets-encryption. Once made it stays in force even
// without the flag: the values it encrypted are unreadable without it.
func (s *Server) loadEncryption() error {
	path := EncryptionConfigPath(s.cfg.DataDir)
	cfg, err := encryption.Load(path)
	switch {
	case errors.Is(err, os.ErrNotExist) && !s.cfg.SecretsEncryption:
		return nil
	case errors.Is(err, os.ErrNotExist):
		if cfg, err = encryption.Generate(); err != nil {
			return err
		}
		if err := cfg.Save(path); err != nil {
			return fmt.Errorf("encryption configuration: %w", err)
		}
		s.log.Info("secrets encryption enabled", "config", path)
	case err != nil:
		return err
	case !s.cfg.SecretsEncryption:
		s.log.Warn("secrets stay encrypted: the encryption configuration is in force without --secrets-encryption", "config", path)
	}
	s.encryption = &encryptionState{path: path, cfg: cfg, stores: map[schema.GroupResource]*encryption.Store{}}
	return nil
}

// storeFor is the store r's storage reads and writes: encrypted when the
// configuration names r.
func (s *Server) storeFor(r *resources.Resource) (store.Store, error) {
	if s.encryption == nil {
		return s.store, nil
	}
	name := r.GroupResource().String() // "secrets", "deployments.apps"
	if s.encryption.cfg.For(name) == nil {
		return s.store, nil
	}
	st, err := encryption.Wrap(s.store, name, s.encryption.cfg)
	if err != nil {
		return nil, err
	}
	s.encryption.stores[r.GroupResource()] = st
	return st, nil
}

// checkEncryptedResources refuses a configuration naming what is not
// served (a typo would leave the real resource in plain text).
func (s *Server) checkEncryptedResources() error {
	if s.encryption == nil {
		return nil
	}
	for _, rc := range s.encryption.cfg.Resources {
		for _, name := range rc.Resources {
			if _, ok := s.encryption.stores[schema.ParseGroupResource(name)]; !ok {
				return fmt.Errorf("encryption configuration %s: %q is not a built-in resource orch serves", s.encryption.path, name)
			}
		}
	}
	return nil
}

// EncryptionStatus is what orch secrets-encrypt status says.
type EncryptionStatus struct {
	Enabled bool `json:"enabled"`
	// Resources says, for each encrypted resource, what writes it and
	// how many stored values each key wrote.
	Resources []ResourceEncryption `json:"resources,omitempty"`
}

// ResourceEncryption is one encrypted resource's state.
type ResourceEncryption struct {
	Resource string         `json:"resource"`
	WriteKey string         `json:"writeKey"`
	Stored   map[string]int `json:"stored"`
	// Rewritten counts what a reencrypt wrote again.
	Rewritten int `json:"rewritten,omitempty"`
}

func (s *Server) encryptionStatus(ctx context.Context) (EncryptionStatus, error) {
	e := s.encryption
	if e == nil {
		return EncryptionStatus{}, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return s.encryptionStatusLocked(ctx)
}

func (s *Server) encryptionStatusLocked(ctx context.Context) (EncryptionStatus, error) {
	e := s.encryption
	out := EncryptionStatus{Enabled: true}
	for _, gr := range e.sorted() {
		name := gr.String()
		usage, err := e.stores[gr].Usage(ctx, registry.Prefix(s.storages[gr].Resource))
		if err != nil {
			return out, err
		}
		out.Resources = append(out.Resources, ResourceEncryption{Resource: name, WriteKey: e.cfg.WriteKey(name), Stored: usage})
	}
	return out, nil
}

func (e *encryptionState) sorted() []schema.GroupResource {
	var out []schema.GroupResource
	for gr := range e.stores {
		out = append(out, gr)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// lockEncryption takes the encryption state for a change, or says it is
// off.
func (s *Server) lockEncryption() (*encryptionState, error) {
	e := s.encryption
	if e == nil {
		return nil, errors.New("secrets encryption is not enabled: start the server with --secrets-encryption")
	}
	e.mu.Lock()
	return e, nil
}

// rotateEncryptionKey puts a new key first for every encrypted resource:
// saved, then in force; values already stored keep their key until
// reencrypted.
func (s *Server) rotateEncryptionKey(ctx context.Context) (EncryptionStatus, error) {
	e, err := s.lockEncryption()
	if err != nil {
		return EncryptionStatus{}, err
	}
	defer e.mu.Unlock()
	next, err := e.cfg.Clone()
	if err != nil {
		return EncryptionStatus{}, err
	}
	for _, gr := range e.sorted() {
		if _, err := next.Rotate(gr.String()); err != nil {
			return EncryptionStatus{}, err
		}
	}
	if err := s.applyEncryption(next); err != nil {
		return EncryptionStatus{}, err
	}
	s.log.Info("encryption key rotated", "config", e.path)
	return s.encryptionStatusLocked(ctx)
}

// reencrypt writes every value not under its resource's writing key again
// with it, then drops the keys no value uses any more.
func (s *Server) reencrypt(ctx context.Context) (EncryptionStatus, error) {
	e, err := s.lockEncryption()
	if err != nil {
		return EncryptionStatus{}, err
	}
	defer e.mu.Unlock()
	rewritten := map[string]int{}
	for _, gr := range e.sorted() {
		name := gr.String()
		n, err := e.stores[gr].Reencrypt(ctx, registry.Prefix(s.storages[gr].Resource), e.cfg.WriteKey(name))
		rewritten[name] = n
		if err != nil {
			return EncryptionStatus{}, err
		}
	}
	status, err := s.encryptionStatusLocked(ctx)
	if err != nil {
		return status, err
	}
	next, err := e.cfg.Clone()
	if err != nil {
		return status, err
	}
	for i, r := range status.Resources {
		next.Prune(r.Resource, r.Stored)
		status.Resources[i].Rewritten = rewritten[r.Resource]
	}
	if err := s.applyEncryption(next); err != nil {
		return status, err
	}
	s.log.Info("secrets reencrypted", "rewritten", rewritten)
	return status, nil
}

// applyEncryption saves cfg and puts it in force.
func (s *Server) applyEncryption(cfg *encryption.Config) error {
	e := s.encryption
	if err := cfg.Save(e.path); err != nil {
		return fmt.Errorf("encryption configuration: %w", err)
	}
	for _, st := range e.stores {
		if err := st.Reload(cfg); err != nil {
			return err
		}
	}
	e.cfg = cfg
	return nil
}

// SecretsEncrypt is `orch secrets-encrypt status|rotate|reencrypt`,
// through the running server.
func SecretsEncrypt(ctx context.Context, dataDir, action string) (EncryptionStatus, error) {
	var out EncryptionStatus
	reached, err := control(ctx, dataDir, "/secrets-encrypt/"+action, nil, &out)
	if !reached {
		return out, fmt.Errorf("no orch server runs on %s (its socket %s does not answer)", dataDir, ControlSocket(dataDir))
	}
	return out, err
}

// String is status as orch secrets-encrypt prints it.
func (st EncryptionStatus) String() string {
	if !st.Enabled {
		return "Encryption Status: Disabled\n"
	}
	var b strings.Builder
	b.WriteString("Encryption Status: Enabled\n")
	for _, r := range st.Resources {
		fmt.Fprintf(&b, "%s: written with %s\n", r.Resource, r.WriteKey)
		var keys []string
		for k := range r.Stored {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "  %d stored under %s\n", r.Stored[k], k)
		}
		if r.Rewritten > 0 {
			fmt.Fprintf(&b, "  %d rewritten\n", r.Rewritten)
		}
	}
	return b.String()
}
