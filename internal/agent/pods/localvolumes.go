package pods

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/orch-dev/orch/internal/atomicfile"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// PersistentVolumeClaim is the named claim of the pod's namespace, nil
// when it does not exist.
func (s *sources) PersistentVolumeClaim(ctx context.Context, name string) (*corev1.PersistentVolumeClaim, error) {
	pvc, err := s.m.api.PersistentVolumeClaims(s.namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("persistentvolumeclaim %q: %w", name, err)
	}
	return pvc, nil
}

// PersistentVolume is the named volume, nil when it does not exist.
func (s *sources) PersistentVolume(ctx context.Context, name string) (*corev1.PersistentVolume, error) {
	pv, err := s.m.api.PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("persistentvolume %q: %w", name, err)
	}
	return pv, nil
}

// KeepLocalVolume records where a local-path volume's data is, before it
// is made: the server asks the node to remove it by the volume's name
// once the volume is deleted.
func (s *sources) KeepLocalVolume(pv *corev1.PersistentVolume) error {
	return s.m.keepLocalVolume(pv.Name, pv.Spec.HostPath.Path)
}

func (m *Manager) localVolumesDir() string { return filepath.Join(m.cfg.DataDir, "local-volumes") }

func (m *Manager) keepLocalVolume(name, path string) error {
	if len(validation.IsDNS1123Subdomain(name)) > 0 {
		return fmt.Errorf("local volume name %q", name)
	}
	record := filepath.Join(m.localVolumesDir(), name)
	if got, err := os.ReadFile(record); err == nil && string(got) == path {
		return nil
	}
	if err := os.MkdirAll(m.localVolumesDir(), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(record, []byte(path), 0o600)
}

// RemoveLocalVolume removes the data of a local-path volume this node
// made, and forgets it; a volume it never made (never mounted here) has
// nothing to remove. Only a path the node recorded itself is removed,
// whatever the caller says.
func (m *Manager) RemoveLocalVolume(name string) error {
	if len(validation.IsDNS1123Subdomain(name)) > 0 || strings.Contains(name, "/") {
		return fmt.Errorf("local volume name %q", name)
	}
	record := filepath.Join(m.localVolumesDir(), name)
	path, err := os.ReadFile(record)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !filepath.IsAbs(string(path)) || filepath.Clean(string(path)) == "/" {
		return fmt.Errorf("local volume %s: recorded path %q", name, path)
	}
	if err := os.RemoveAll(string(path)); err != nil {
		return fmt.Errorf("remove local volume %s: %w", name, err)
	}
	m.log.Info("local volume removed", "volume", name, "path", string(path))
	return os.Remove(record)
}
