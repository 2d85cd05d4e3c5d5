package pods

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/orch-dev/orch/internal/agent/volumes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// volumesDir holds a pod's volumes that live on the node: emptyDir and the
// projections of ConfigMaps, Secrets and the downward API.
func (m *Manager) volumesDir(uid string) string {
	return filepath.Join(m.cfg.DataDir, "pods", uid, "volumes")
}

// tearDownVolumes unmounts the pod's in-memory volumes, shared namespaces
// and /dev/shm, and removes its directory: volumes, logs, hosts files.
// hostPath volumes are not in it.
func (m *Manager) tearDownVolumes(uid string) error {
	m.tokens.forget(types.UID(uid))
	m.podCerts.forget(types.UID(uid))
	if err := m.tearDownSharedNamespaces(uid); err != nil {
		return err
	}
	if err := volumes.TearDown(m.volumesDir(uid)); err != nil {
		return err
	}
	// The views under its image volumes, unmounted now.
	if err := m.ctr.RemoveImageViews(m.ctx(context.Background()), map[string]string{imageVolumeLabel: uid}); err != nil {
		return err
	}
	if err := os.RemoveAll(m.runDir(uid)); err != nil {
		return err
	}
	return os.RemoveAll(filepath.Join(m.cfg.DataDir, "pods", uid))
}

// fromVolumes is a volume the pod cannot have as the pod's wait.
func fromVolumes(err error) error {
	var ve *volumes.Error
	if errors.As(err, &ve) {
		return &configError{reason: ve.Reason, message: ve.Message}
	}
	return err
}

// downwardAPI gives volumes the downward API's values as the
// environment has them.
type downwardAPI struct{ m *Manager }

func (d downwardAPI) PodField(pod *corev1.Pod, path string) (string, error) {
	v, err := d.m.podField(pod, path)
	return v, toVolumes(err)
}

func (d downwardAPI) ResourceField(pod *corev1.Pod, c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	v, err := d.m.resourceField(pod, c, ref)
	return v, toVolumes(err)
}

// toVolumes keeps a configError's reason through volumes.SetUp.
func toVolumes(err error) error {
	var ce *configError
	if errors.As(err, &ce) {
		return &volumes.Error{Reason: ce.reason, Message: ce.message}
	}
	return err
}
