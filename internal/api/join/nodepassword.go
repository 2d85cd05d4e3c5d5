package join

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"log/slog"

	"github.com/orch-dev/orch/internal/api/registry"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// nodePasswordType marks the Secrets that bind node names to machines.
const nodePasswordType corev1.SecretType = "orch.io/node-password"

// nodePasswordSecret is the Secret in kube-system holding the hash of the
// password of the machine that joined as node, as k3s keeps
// <node>.node-password.k3s.
func nodePasswordSecret(node string) string { return node + ".node-password.orch" }

// NodePasswords binds node names to machines through those Secrets.
type NodePasswords struct{ Secrets *registry.Storage }

func passwordHash(password string) []byte {
	sum := sha256.Sum256([]byte(password)) // the password is 32 random bytes: no dictionary to resist
	return []byte(hex.EncodeToString(sum[:]))
}

// Verify binds node to the first machine that joins as it, and refuses
// another machine's password for it until the Node is deleted.
func (p NodePasswords) Verify(ctx context.Context, node, password string) error {
	hash := passwordHash(password)
	for range 3 {
		obj, err := p.Secrets.Get(ctx, metav1.NamespaceSystem, nodePasswordSecret(node))
		if apierrors.IsNotFound(err) {
			secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: nodePasswordSecret(node), Namespace: metav1.NamespaceSystem},
				Type: nodePasswordType, Data: map[string][]byte{"hash": hash}}
			if _, err := p.Secrets.Create(ctx, secret, registry.WriteOptions{}); apierrors.IsAlreadyExists(err) {
				continue // a concurrent join took it first: compare with its
			} else if err != nil {
				return fmt.Errorf("keep the node password: %w", err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("read the node password: %w", err)
		}
		if subtle.ConstantTimeCompare(obj.(*corev1.Secret).Data["hash"], hash) != 1 {
			return ErrWrongPassword
		}
		return nil
	}
	return fmt.Errorf("node password for %s: conflicting joins", node)
}

// ForgetNodePassword frees a deleted Node's name for another machine.
func ForgetNodePassword(secrets *registry.Storage, log *slog.Logger) func(runtime.Object) {
	return func(obj runtime.Object) {
		node, ok := obj.(*corev1.Node)
		if !ok {
			return
		}
		go func() {
			_, err := secrets.Delete(context.Background(), metav1.NamespaceSystem, nodePasswordSecret(node.Name), &metav1.DeleteOptions{}, registry.WriteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				log.Warn("forgetting a deleted node's password", "node", node.Name, "err", err)
			}
		}()
	}
}
