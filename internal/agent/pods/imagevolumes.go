package pods

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// imageVolumeLabel marks the image views of a pod's image volumes with
// its UID, so that they go with it.
const imageVolumeLabel = "orch.dev/image-volume-of"

// ImageVolume mounts an image volume: the image, pulled as its pull
// policy says (the kubelet's rules and events, as for a container's), a
// read-only view of its filesystem at dir, kept until the pod's volumes
// are torn down.
func (s *sources) ImageVolume(ctx context.Context, pod *corev1.Pod, name string, v *corev1.ImageVolumeSource, dir string) error {
	m := s.m
	// The image is pulled as a container's would be; events name the
	// volume where the kubelet names a container.
	img, _, err := m.image(ctx, pod, corev1.Container{Name: name, Image: v.Reference, ImagePullPolicy: v.PullPolicy})
	if err != nil {
		return toVolumes(err)
	}
	key := fmt.Sprintf("image-volume-%s-%s", pod.UID, name)
	if err := m.ctr.ViewImage(m.ctx(ctx), img, key, dir, map[string]string{imageVolumeLabel: string(pod.UID)}); err != nil {
		return fmt.Errorf("image volume %q: %w", name, err)
	}
	return nil
}

// imageVolumeRefs are the images the node's pods mount as volumes: in
// use, whatever the containers use.
func (m *Manager) imageVolumeRefs() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var refs []string
	for _, st := range m.running {
		if st.pod == nil {
			continue
		}
		for _, v := range st.pod.Spec.Volumes {
			if v.Image != nil {
				if ref, err := imageRef(v.Image.Reference); err == nil {
					refs = append(refs, ref)
				}
			}
		}
	}
	return refs
}
