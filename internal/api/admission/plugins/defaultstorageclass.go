package plugins

import (
	"context"

	"github.com/orch-dev/orch/internal/api/resources/storage"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// admitDefaultStorageClass is Kubernetes' DefaultStorageClass admission:
// a new claim that names no class gets the default one (the newest, when
// several are marked); one that names "" asks for none and keeps it.
func (p *Plugins) admitDefaultStorageClass(ctx context.Context, obj, old runtime.Object) error {
	pvc := obj.(*corev1.PersistentVolumeClaim)
	if old != nil || pvc.Spec.StorageClassName != nil {
		return nil
	}
	list, err := p.storage(storagev1.GroupName, "storageclasses").List(ctx, "", &metav1.ListOptions{})
	if err != nil {
		return err
	}
	var chosen *storagev1.StorageClass
	for i := range list.(*storagev1.StorageClassList).Items {
		sc := &list.(*storagev1.StorageClassList).Items[i]
		if !storage.IsDefaultClass(sc) {
			continue
		}
		if chosen == nil || sc.CreationTimestamp.After(chosen.CreationTimestamp.Time) ||
			sc.CreationTimestamp.Equal(&chosen.CreationTimestamp) && sc.Name < chosen.Name {
			chosen = sc
		}
	}
	if chosen != nil {
		pvc.Spec.StorageClassName = ptr.To(chosen.Name)
	}
	return nil
}
