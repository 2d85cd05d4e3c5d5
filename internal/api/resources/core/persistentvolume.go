package core

import (
	"path"
	"strings"

	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The storage-object-in-use protection finalizers Kubernetes' admission
// puts on every new claim and volume: a claim a pod uses, and a volume
// bound to a claim, are not removed under it.
const (
	PVCProtectionFinalizer = "kubernetes.io/pvc-protection"
	PVProtectionFinalizer  = "kubernetes.io/pv-protection"
)

func persistentVolumes() *resources.Resource {
	return resources.Described[corev1.PersistentVolume, corev1.PersistentVolumeList](&resources.Resource{
		StatusMetadata: resources.StatusMetadataAll, GroupVersionKind: resources.GVK("", "PersistentVolume"), Plural: "persistentvolumes", Singular: "persistentvolume",
		ShortNames: []string{"pv"}, Subresources: []resources.Subresource{resources.Status()}, StorageKey: "persistentvolumes",
		HasSpec: true, Default: resources.Typed(defaultPersistentVolume), Validate: resources.TypedValidate(validatePersistentVolume),
		ValidateUpdate: resources.TypedValidateUpdate(func(pv, old *corev1.PersistentVolume) field.ErrorList {
			var errs field.ErrorList
			if !apiequality.Semantic.DeepEqual(pv.Spec.PersistentVolumeSource, old.Spec.PersistentVolumeSource) {
				errs = append(errs, field.Forbidden(resources.SpecPath.Child("persistentvolumesource"), "spec.persistentvolumesource is forbidden to be changed"))
			}
			errs = append(errs, resources.Immutable(pv.Spec.VolumeMode, old.Spec.VolumeMode, resources.SpecPath.Child("volumeMode"))...)
			if old.Spec.NodeAffinity != nil {
				errs = append(errs, resources.Immutable(pv.Spec.NodeAffinity, old.Spec.NodeAffinity, resources.SpecPath.Child("nodeAffinity"))...)
			}
			return errs
		}),
		PrepareForCreate: resources.Typed(func(pv *corev1.PersistentVolume) {
			pv.Status = corev1.PersistentVolumeStatus{Phase: corev1.VolumePending}
			addFinalizer(&pv.ObjectMeta, PVProtectionFinalizer)
		}),
		Columns: persistentVolumeColumns, Row: resources.TypedRow(persistentVolumeRow),
	})
}

func addFinalizer(m *metav1.ObjectMeta, f string) {
	for _, have := range m.Finalizers {
		if have == f {
			return
		}
	}
	m.Finalizers = append(m.Finalizers, f)
}

func defaultPersistentVolume(pv *corev1.PersistentVolume) {
	if pv.Spec.PersistentVolumeReclaimPolicy == "" {
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	}
	if pv.Spec.VolumeMode == nil {
		mode := corev1.PersistentVolumeFilesystem
		pv.Spec.VolumeMode = &mode
	}
	if hp := pv.Spec.HostPath; hp != nil && hp.Type == nil {
		t := corev1.HostPathUnset
		hp.Type = &t
	}
}

var accessModes = []string{string(corev1.ReadWriteOnce), string(corev1.ReadOnlyMany), string(corev1.ReadWriteMany), string(corev1.ReadWriteOncePod)}

func validateAccessModes(modes []corev1.PersistentVolumeAccessMode, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(modes) == 0 {
		return field.ErrorList{field.Required(p, "at least 1 access mode is required")}
	}
	for _, m := range modes {
		if !strings.Contains(" "+strings.Join(accessModes, " ")+" ", " "+string(m)+" ") {
			errs = append(errs, field.NotSupported(p, m, accessModes))
		}
		if m == corev1.ReadWriteOncePod && len(modes) > 1 {
			errs = append(errs, field.Forbidden(p, "may not use ReadWriteOncePod with other access modes"))
		}
	}
	return errs
}

func validateVolumeMode(mode *corev1.PersistentVolumeMode, p *field.Path) field.ErrorList {
	if mode != nil && *mode != corev1.PersistentVolumeFilesystem && *mode != corev1.PersistentVolumeBlock {
		return field.ErrorList{field.NotSupported(p, *mode, []string{string(corev1.PersistentVolumeBlock), string(corev1.PersistentVolumeFilesystem)})}
	}
	return nil
}

func validateStorageClassName(name string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if name != "" {
		for _, msg := range validation.IsDNS1123Subdomain(name) {
			errs = append(errs, field.Invalid(p, name, msg))
		}
	}
	return errs
}

func validatePositiveStorage(q resource.Quantity, p *field.Path) field.ErrorList {
	if q.Sign() <= 0 {
		return field.ErrorList{field.Invalid(p, q.String(), "must be greater than zero")}
	}
	return nil
}

func validatePersistentVolume(pv *corev1.PersistentVolume) field.ErrorList {
	spec, p := &pv.Spec, resources.SpecPath
	errs := validateAccessModes(spec.AccessModes, p.Child("accessModes"))
	if len(spec.Capacity) == 0 {
		errs = append(errs, field.Required(p.Child("capacity"), ""))
	} else if q, ok := spec.Capacity[corev1.ResourceStorage]; !ok || len(spec.Capacity) > 1 {
		errs = append(errs, field.NotSupported(p.Child("capacity"), spec.Capacity, []string{string(corev1.ResourceStorage)}))
	} else {
		errs = append(errs, validatePositiveStorage(q, p.Child("capacity").Key(string(corev1.ResourceStorage)))...)
	}
	switch spec.PersistentVolumeReclaimPolicy {
	case corev1.PersistentVolumeReclaimDelete, corev1.PersistentVolumeReclaimRetain, corev1.PersistentVolumeReclaimRecycle:
	default:
		errs = append(errs, field.NotSupported(p.Child("persistentVolumeReclaimPolicy"), spec.PersistentVolumeReclaimPolicy,
			[]string{string(corev1.PersistentVolumeReclaimDelete), string(corev1.PersistentVolumeReclaimRecycle), string(corev1.PersistentVolumeReclaimRetain)}))
	}
	errs = append(errs, validateStorageClassName(spec.StorageClassName, p.Child("storageClassName"))...)
	errs = append(errs, validateVolumeMode(spec.VolumeMode, p.Child("volumeMode"))...)
	errs = append(errs, validateVolumeSource(spec, p)...)
	if spec.NodeAffinity != nil {
		if spec.NodeAffinity.Required == nil {
			errs = append(errs, field.Required(p.Child("nodeAffinity", "required"), ""))
		} else if len(spec.NodeAffinity.Required.NodeSelectorTerms) == 0 {
			errs = append(errs, field.Required(p.Child("nodeAffinity", "required", "nodeSelectorTerms"), "must have at least one node selector term"))
		}
	}
	if ref := spec.ClaimRef; ref != nil && ref.Name == "" {
		errs = append(errs, field.Required(p.Child("claimRef", "name"), ""))
	}
	return errs
}

// validateVolumeSource: exactly one source; the two a node serves from
// its own disk (hostPath, local) checked as Kubernetes does.
func validateVolumeSource(spec *corev1.PersistentVolumeSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	src := &spec.PersistentVolumeSource
	set := 0
	for _, present := range []bool{src.GCEPersistentDisk != nil, src.AWSElasticBlockStore != nil, src.HostPath != nil, src.Glusterfs != nil,
		src.NFS != nil, src.RBD != nil, src.ISCSI != nil, src.Cinder != nil, src.CephFS != nil, src.FC != nil, src.Flocker != nil,
		src.FlexVolume != nil, src.AzureFile != nil, src.VsphereVolume != nil, src.Quobyte != nil, src.AzureDisk != nil,
		src.PhotonPersistentDisk != nil, src.PortworxVolume != nil, src.ScaleIO != nil, src.Local != nil, src.StorageOS != nil, src.CSI != nil} {
		if present {
			set++
		}
	}
	switch {
	case set == 0:
		return field.ErrorList{field.Required(p, "must specify a volume type")}
	case set > 1:
		return field.ErrorList{field.Forbidden(p, "may not specify more than 1 volume type")}
	}
	if hp := src.HostPath; hp != nil {
		if hp.Path == "" {
			errs = append(errs, field.Required(p.Child("hostPath", "path"), ""))
		} else if strings.Contains("/"+hp.Path+"/", "/../") {
			errs = append(errs, field.Invalid(p.Child("hostPath", "path"), hp.Path, "must not contain '..'"))
		}
		if hp.Type != nil && !validHostPathType(*hp.Type) {
			errs = append(errs, field.NotSupported(p.Child("hostPath", "type"), *hp.Type, hostPathTypes))
		}
	}
	if l := src.Local; l != nil {
		switch {
		case l.Path == "":
			errs = append(errs, field.Required(p.Child("local", "path"), ""))
		case !path.IsAbs(l.Path):
			errs = append(errs, field.Invalid(p.Child("local", "path"), l.Path, "must be an absolute path"))
		case strings.Contains(l.Path+"/", "/../"):
			errs = append(errs, field.Invalid(p.Child("local", "path"), l.Path, "must not contain '..'"))
		}
		if spec.NodeAffinity == nil {
			errs = append(errs, field.Required(p.Child("nodeAffinity"), "Local volume requires node affinity"))
		}
	}
	if n := src.NFS; n != nil {
		if n.Server == "" {
			errs = append(errs, field.Required(p.Child("nfs", "server"), ""))
		}
		if !path.IsAbs(n.Path) {
			errs = append(errs, field.Invalid(p.Child("nfs", "path"), n.Path, "must be an absolute path"))
		}
	}
	return errs
}

var hostPathTypes = []string{"", string(corev1.HostPathDirectoryOrCreate), string(corev1.HostPathDirectory), string(corev1.HostPathFileOrCreate),
	string(corev1.HostPathFile), string(corev1.HostPathSocket), string(corev1.HostPathCharDev), string(corev1.HostPathBlockDev)}

func validHostPathType(t corev1.HostPathType) bool {
	for _, v := range hostPathTypes {
		if string(t) == v {
			return true
		}
	}
	return false
}

// AccessModesString is how kubectl prints access modes: RWO,ROX,RWX,RWOP,
// in that order.
func AccessModesString(modes []corev1.PersistentVolumeAccessMode) string {
	var out []string
	for _, m := range []struct {
		mode  corev1.PersistentVolumeAccessMode
		short string
	}{{corev1.ReadWriteOnce, "RWO"}, {corev1.ReadOnlyMany, "ROX"}, {corev1.ReadWriteMany, "RWX"}, {corev1.ReadWriteOncePod, "RWOP"}} {
		for _, have := range modes {
			if have == m.mode {
				out = append(out, m.short)
				break
			}
		}
	}
	return strings.Join(out, ",")
}

var persistentVolumeColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Capacity", "string", 0, corev1.PersistentVolumeSpec{}.SwaggerDoc()["capacity"]),
	resources.Col("Access Modes", "string", 0, corev1.PersistentVolumeSpec{}.SwaggerDoc()["accessModes"]),
	resources.Col("Reclaim Policy", "string", 0, corev1.PersistentVolumeSpec{}.SwaggerDoc()["persistentVolumeReclaimPolicy"]),
	resources.Col("Status", "string", 0, corev1.PersistentVolumeStatus{}.SwaggerDoc()["phase"]),
	resources.Col("Claim", "string", 0, corev1.PersistentVolumeSpec{}.SwaggerDoc()["claimRef"]),
	resources.Col("StorageClass", "string", 0, "StorageClass of the pv"),
	resources.Col("VolumeAttributesClass", "string", 0, "VolumeAttributesClass of the pv"),
	resources.Col("Reason", "string", 0, corev1.PersistentVolumeStatus{}.SwaggerDoc()["reason"]),
	resources.AgeCol,
	resources.Col("VolumeMode", "string", 1, corev1.PersistentVolumeSpec{}.SwaggerDoc()["volumeMode"]),
}

func persistentVolumeRow(pv *corev1.PersistentVolume) []any {
	claim := ""
	if ref := pv.Spec.ClaimRef; ref != nil {
		claim = ref.Namespace + "/" + ref.Name
	}
	capacity := ""
	if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
		capacity = q.String()
	}
	phase := string(pv.Status.Phase)
	if pv.DeletionTimestamp != nil {
		phase = "Terminating"
	}
	mode := "<unset>"
	if pv.Spec.VolumeMode != nil {
		mode = string(*pv.Spec.VolumeMode)
	}
	vac := "<unset>"
	if pv.Spec.VolumeAttributesClassName != nil {
		vac = *pv.Spec.VolumeAttributesClassName
	}
	return []any{pv.Name, capacity, AccessModesString(pv.Spec.AccessModes), string(pv.Spec.PersistentVolumeReclaimPolicy), phase,
		claim, pv.Spec.StorageClassName, vac, pv.Status.Reason, resources.Age(pv.CreationTimestamp), mode}
}
