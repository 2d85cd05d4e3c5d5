package storage

import (
	"github.com/orch-dev/orch/internal/api/resources"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// The CSI kinds are served as Kubernetes serves them, for CSI drivers a
// user installs: orch ships none itself (its local-path volumes are its
// own), so nothing here acts on them but the drivers' own controllers.

func csiDrivers() *resources.Resource {
	return resources.Described[storagev1.CSIDriver, storagev1.CSIDriverList](&resources.Resource{
		GroupVersionKind: resources.GVK(storagev1.GroupName, "CSIDriver"), Plural: "csidrivers", Singular: "csidriver",
		StorageKey: "csidrivers", HasSpec: true, Default: resources.Typed(defaultCSIDriver), NameRule: csiDriverName,
		Validate: resources.TypedValidate(func(d *storagev1.CSIDriver) field.ErrorList {
			var errs field.ErrorList
			modes := resources.SpecPath.Child("volumeLifecycleModes")
			for i, m := range d.Spec.VolumeLifecycleModes {
				if m != storagev1.VolumeLifecyclePersistent && m != storagev1.VolumeLifecycleEphemeral {
					errs = append(errs, field.NotSupported(modes.Index(i), m, []string{string(storagev1.VolumeLifecyclePersistent), string(storagev1.VolumeLifecycleEphemeral)}))
				}
			}
			if p := d.Spec.FSGroupPolicy; p != nil && *p != storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy && *p != storagev1.FileFSGroupPolicy && *p != storagev1.NoneFSGroupPolicy {
				errs = append(errs, field.NotSupported(resources.SpecPath.Child("fsGroupPolicy"), *p,
					[]string{string(storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy), string(storagev1.FileFSGroupPolicy), string(storagev1.NoneFSGroupPolicy)}))
			}
			return errs
		}),
		ValidateUpdate: resources.TypedValidateUpdate(func(d, old *storagev1.CSIDriver) field.ErrorList {
			errs := resources.Immutable(d.Spec.AttachRequired, old.Spec.AttachRequired, resources.SpecPath.Child("attachRequired"))
			errs = append(errs, resources.Immutable(d.Spec.FSGroupPolicy, old.Spec.FSGroupPolicy, resources.SpecPath.Child("fsGroupPolicy"))...)
			return append(errs, resources.Immutable(d.Spec.VolumeLifecycleModes, old.Spec.VolumeLifecycleModes, resources.SpecPath.Child("volumeLifecycleModes"))...)
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("AttachRequired", "boolean", 0, storagev1.CSIDriverSpec{}.SwaggerDoc()["attachRequired"]),
			resources.Col("PodInfoOnMount", "boolean", 0, storagev1.CSIDriverSpec{}.SwaggerDoc()["podInfoOnMount"]),
			resources.Col("StorageCapacity", "boolean", 0, storagev1.CSIDriverSpec{}.SwaggerDoc()["storageCapacity"]),
			resources.Col("Modes", "string", 0, storagev1.CSIDriverSpec{}.SwaggerDoc()["volumeLifecycleModes"]),
			resources.AgeCol},
		Row: resources.TypedRow(func(d *storagev1.CSIDriver) []any {
			modes := ""
			for i, m := range d.Spec.VolumeLifecycleModes {
				if i > 0 {
					modes += ","
				}
				modes += string(m)
			}
			return []any{d.Name, ptr.Deref(d.Spec.AttachRequired, true), ptr.Deref(d.Spec.PodInfoOnMount, false),
				ptr.Deref(d.Spec.StorageCapacity, false), resources.OrNone(modes), resources.Age(d.CreationTimestamp)}
		}),
	})
}

// defaultCSIDriver sets what Kubernetes defaults a CSIDriver's spec to.
func defaultCSIDriver(d *storagev1.CSIDriver) {
	s := &d.Spec
	if s.AttachRequired == nil {
		s.AttachRequired = ptr.To(true)
	}
	if s.PodInfoOnMount == nil {
		s.PodInfoOnMount = ptr.To(false)
	}
	if s.StorageCapacity == nil {
		s.StorageCapacity = ptr.To(false)
	}
	if s.FSGroupPolicy == nil {
		s.FSGroupPolicy = ptr.To(storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy)
	}
	if len(s.VolumeLifecycleModes) == 0 {
		s.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}
	}
	if s.RequiresRepublish == nil {
		s.RequiresRepublish = ptr.To(false)
	}
	if s.SELinuxMount == nil {
		s.SELinuxMount = ptr.To(false)
	}
}

// csiDriverName: a CSI driver's name is a DNS subdomain of at most 63
// characters, as the CSI spec has it.
func csiDriverName(name string, prefix bool) []string {
	msgs := validation.IsDNS1123Subdomain(name)
	if !prefix && len(name) > 63 {
		msgs = append(msgs, validation.MaxLenError(63))
	}
	return msgs
}

func csiNodes() *resources.Resource {
	return resources.Described[storagev1.CSINode, storagev1.CSINodeList](&resources.Resource{
		GroupVersionKind: resources.GVK(storagev1.GroupName, "CSINode"), Plural: "csinodes", Singular: "csinode",
		StorageKey: "csinodes", HasSpec: true,
		Validate: resources.TypedValidate(func(n *storagev1.CSINode) field.ErrorList {
			var errs field.ErrorList
			seen := map[string]bool{}
			for i, d := range n.Spec.Drivers {
				p := resources.SpecPath.Child("drivers").Index(i)
				switch {
				case d.Name == "":
					errs = append(errs, field.Required(p.Child("name"), ""))
				case seen[d.Name]:
					errs = append(errs, field.Duplicate(p.Child("name"), d.Name))
				}
				seen[d.Name] = true
				if d.NodeID == "" {
					errs = append(errs, field.Required(p.Child("nodeID"), ""))
				}
				if a := d.Allocatable; a != nil && a.Count != nil && *a.Count < 0 {
					errs = append(errs, field.Invalid(p.Child("allocatable", "count"), *a.Count, "must be greater than or equal to 0"))
				}
			}
			return errs
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("Drivers", "integer", 0, storagev1.CSINodeSpec{}.SwaggerDoc()["drivers"]), resources.AgeCol},
		Row: resources.TypedRow(func(n *storagev1.CSINode) []any {
			return []any{n.Name, int64(len(n.Spec.Drivers)), resources.Age(n.CreationTimestamp)}
		}),
	})
}

func csiStorageCapacities() *resources.Resource {
	return resources.Described[storagev1.CSIStorageCapacity, storagev1.CSIStorageCapacityList](&resources.Resource{
		GroupVersionKind: resources.GVK(storagev1.GroupName, "CSIStorageCapacity"), Plural: "csistoragecapacities", Singular: "csistoragecapacity",
		Namespaced: true, StorageKey: "csistoragecapacities",
		Validate: resources.TypedValidate(func(c *storagev1.CSIStorageCapacity) field.ErrorList {
			var errs field.ErrorList
			for _, msg := range validation.IsDNS1123Subdomain(c.StorageClassName) {
				errs = append(errs, field.Invalid(field.NewPath("storageClassName"), c.StorageClassName, msg))
			}
			for name, q := range map[string]*resource.Quantity{"capacity": c.Capacity, "maximumVolumeSize": c.MaximumVolumeSize} {
				if q != nil && q.Sign() < 0 {
					errs = append(errs, field.Invalid(field.NewPath(name), q.String(), "must be greater than or equal to 0"))
				}
			}
			return errs
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("StorageClassName", "string", 0, storagev1.CSIStorageCapacity{}.SwaggerDoc()["storageClassName"]),
			resources.Col("Capacity", "string", 0, storagev1.CSIStorageCapacity{}.SwaggerDoc()["capacity"]), resources.AgeCol},
		Row: resources.TypedRow(func(c *storagev1.CSIStorageCapacity) []any {
			capacity := ""
			if c.Capacity != nil {
				capacity = c.Capacity.String()
			}
			return []any{c.Name, c.StorageClassName, capacity, resources.Age(c.CreationTimestamp)}
		}),
	})
}

func volumeAttachments() *resources.Resource {
	return resources.Described[storagev1.VolumeAttachment, storagev1.VolumeAttachmentList](&resources.Resource{
		GroupVersionKind: resources.GVK(storagev1.GroupName, "VolumeAttachment"), Plural: "volumeattachments", Singular: "volumeattachment",
		StorageKey: "volumeattachments", HasSpec: true, Subresources: []resources.Subresource{resources.Status()},
		PrepareForCreate: resources.Typed(func(va *storagev1.VolumeAttachment) { va.Status = storagev1.VolumeAttachmentStatus{} }),
		Validate: resources.TypedValidate(func(va *storagev1.VolumeAttachment) field.ErrorList {
			var errs field.ErrorList
			if va.Spec.Attacher == "" {
				errs = append(errs, field.Required(resources.SpecPath.Child("attacher"), ""))
			}
			if va.Spec.NodeName == "" {
				errs = append(errs, field.Required(resources.SpecPath.Child("nodeName"), ""))
			}
			src := va.Spec.Source
			if (src.PersistentVolumeName == nil) == (src.InlineVolumeSpec == nil) {
				errs = append(errs, field.Required(resources.SpecPath.Child("source"), "must specify exactly one of inlineVolumeSpec and persistentVolumeName"))
			}
			return errs
		}),
		ValidateUpdate: resources.TypedValidateUpdate(func(va, old *storagev1.VolumeAttachment) field.ErrorList {
			return resources.Immutable(va.Spec, old.Spec, resources.SpecPath)
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("Attacher", "string", 0, storagev1.VolumeAttachmentSpec{}.SwaggerDoc()["attacher"]),
			resources.Col("PV", "string", 0, storagev1.VolumeAttachmentSource{}.SwaggerDoc()["persistentVolumeName"]),
			resources.Col("Node", "string", 0, storagev1.VolumeAttachmentSpec{}.SwaggerDoc()["nodeName"]),
			resources.Col("Attached", "boolean", 0, storagev1.VolumeAttachmentStatus{}.SwaggerDoc()["attached"]), resources.AgeCol},
		Row: resources.TypedRow(func(va *storagev1.VolumeAttachment) []any {
			return []any{va.Name, va.Spec.Attacher, ptr.Deref(va.Spec.Source.PersistentVolumeName, ""), va.Spec.NodeName, va.Status.Attached, resources.Age(va.CreationTimestamp)}
		}),
	})
}

func volumeAttributesClasses() *resources.Resource {
	return resources.Described[storagev1.VolumeAttributesClass, storagev1.VolumeAttributesClassList](&resources.Resource{
		GroupVersionKind: resources.GVK(storagev1.GroupName, "VolumeAttributesClass"), Plural: "volumeattributesclasses", Singular: "volumeattributesclass",
		ShortNames: []string{"vac"}, StorageKey: "volumeattributesclasses",
		Validate: resources.TypedValidate(func(c *storagev1.VolumeAttributesClass) field.ErrorList {
			var errs field.ErrorList
			if c.DriverName == "" {
				errs = append(errs, field.Required(field.NewPath("driverName"), ""))
			}
			if len(c.Parameters) == 0 {
				errs = append(errs, field.Required(field.NewPath("parameters"), "must contain at least one key/value pair"))
			}
			return errs
		}),
		ValidateUpdate: resources.TypedValidateUpdate(func(c, old *storagev1.VolumeAttributesClass) field.ErrorList {
			errs := resources.Immutable(c.DriverName, old.DriverName, field.NewPath("driverName"))
			return append(errs, resources.Immutable(c.Parameters, old.Parameters, field.NewPath("parameters"))...)
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("DriverName", "string", 0, storagev1.VolumeAttributesClass{}.SwaggerDoc()["driverName"]), resources.AgeCol},
		Row: resources.TypedRow(func(c *storagev1.VolumeAttributesClass) []any {
			return []any{c.Name, c.DriverName, resources.Age(c.CreationTimestamp)}
		}),
	})
}
