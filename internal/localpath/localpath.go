// Package localpath names orch's built-in local volume provisioner, which
// k3s ships as rancher's local-path provisioner in a pod and orch runs in
// its own processes: the server's volume loop makes a hostPath volume in
// a directory of the node a claim's pod is scheduled to, and that node's
// agent makes and removes the directory. What both sides must agree on
// lives here.
package localpath

import (
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
)

const (
	// Provisioner is the StorageClass provisioner the volume loop serves.
	Provisioner = "orch.dev/local-path"
	// ClassName is the default StorageClass orch makes, named as k3s's.
	ClassName = "local-path"
	// ProvisionedByAnnotation is Kubernetes' mark of who made a volume.
	ProvisionedByAnnotation = "pv.kubernetes.io/provisioned-by"
	// SelectedNodeAnnotation is where the scheduler puts the node a
	// WaitForFirstConsumer claim's first pod goes to.
	SelectedNodeAnnotation = "volume.kubernetes.io/selected-node"
)

// Dir is where a volume's data lives on its node: one directory per
// volume under the storage path, named as rancher's provisioner names it.
func Dir(storagePath, pvName string, claim *corev1.PersistentVolumeClaim) string {
	return filepath.Join(storagePath, pvName+"_"+claim.Namespace+"_"+claim.Name)
}

// Provisioned says whether the volume is one of orch's local-path ones.
func Provisioned(pv *corev1.PersistentVolume) bool {
	return pv.Annotations[ProvisionedByAnnotation] == Provisioner && pv.Spec.HostPath != nil
}
