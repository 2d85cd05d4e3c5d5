// Package dra describes the kinds of the resource.k8s.io API group,
// dynamic resource allocation: the DeviceClasses, ResourceSlices and
// DeviceTaintRules drivers and admins publish, and the ResourceClaims
// (and their templates) workloads ask for devices with. They are served
// as Kubernetes serves them, with its declarative validation (generated
// into k8s.io/api) and the checks its strategies add by hand; orch ships
// no DRA driver and allocates no devices (see the scheduler).
package dra

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/orch-dev/orch/internal/api/resources"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/operation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/utils/ptr"
)

// Resources describes the resource.k8s.io group's kinds.
func Resources() []*resources.Resource {
	return []*resources.Resource{deviceClasses(), resourceClaims(), resourceClaimTemplates(), resourceSlices(), deviceTaintRules()}
}

// validationOptions are the options Kubernetes' generated validation
// asks about: feature gates of features orch does not serve are off.
var validationOptions = map[string]bool{"DRAPartitionableDevicesType": false}

func createOp() operation.Operation {
	return operation.Operation{Type: operation.Create, Options: validationOptions}
}

func updateOp() operation.Operation {
	return operation.Operation{Type: operation.Update, Options: validationOptions}
}

func deviceClasses() *resources.Resource {
	return resources.Described[resourcev1.DeviceClass, resourcev1.DeviceClassList](&resources.Resource{
		GroupVersionKind: resources.GVK(resourcev1.GroupName, "DeviceClass"), Plural: "deviceclasses", Singular: "deviceclass",
		StorageKey: "deviceclasses", HasSpec: true,
		Validate: resources.TypedValidate(func(c *resourcev1.DeviceClass) field.ErrorList {
			errs := resourcev1.Validate_DeviceClassSpec(context.Background(), createOp(), resources.SpecPath, &c.Spec, nil)
			return append(errs, validateClassSpec(&c.Spec, nil)...)
		}),
		ValidateUpdate: resources.TypedValidateUpdate(func(c, old *resourcev1.DeviceClass) field.ErrorList {
			errs := resourcev1.Validate_DeviceClassSpec(context.Background(), updateOp(), resources.SpecPath, &c.Spec, &old.Spec)
			return append(errs, validateClassSpec(&c.Spec, &old.Spec)...)
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol, resources.AgeCol},
		Row: resources.TypedRow(func(c *resourcev1.DeviceClass) []any {
			return []any{c.Name, resources.Age(c.CreationTimestamp)}
		}),
	})
}

// validateClassSpec: selectors that compile, opaque configuration for a
// named driver. Expressions already stored are not checked again.
func validateClassSpec(spec, old *resourcev1.DeviceClassSpec) field.ErrorList {
	var stored sets.Set[string]
	if old != nil {
		stored = storedExpressions(old.Selectors)
	}
	errs := validateSelectors(spec.Selectors, resources.SpecPath.Child("selectors"), stored)
	for i, c := range spec.Config {
		errs = append(errs, validateOpaque(c.Opaque, resources.SpecPath.Child("config").Index(i))...)
	}
	return errs
}

func resourceClaims() *resources.Resource {
	return resources.Described[resourcev1.ResourceClaim, resourcev1.ResourceClaimList](&resources.Resource{
		GroupVersionKind: resources.GVK(resourcev1.GroupName, "ResourceClaim"), Plural: "resourceclaims", Singular: "resourceclaim",
		Namespaced: true, StorageKey: "resourceclaims", Subresources: []resources.Subresource{resources.Status()},
		PrepareForCreate: resources.Typed(func(c *resourcev1.ResourceClaim) { c.Status = resourcev1.ResourceClaimStatus{} }),
		Default: resources.Typed(func(c *resourcev1.ResourceClaim) {
			defaultClaimSpec(&c.Spec)
			if a := c.Status.Allocation; a != nil {
				for i := range a.Devices.Results {
					defaultTolerations(a.Devices.Results[i].Tolerations)
				}
			}
		}),
		Validate: resources.TypedValidate(func(c *resourcev1.ResourceClaim) field.ErrorList {
			errs := resourcev1.Validate_ResourceClaimSpec(context.Background(), createOp(), resources.SpecPath, &c.Spec, nil)
			return append(errs, validateClaimSpec(&c.Spec, resources.SpecPath)...)
		}),
		// The spec is immutable; the status is checked where it changes
		// (a write of the main resource keeps the stored status).
		ValidateUpdate: resources.TypedValidateUpdate(func(c, old *resourcev1.ResourceClaim) field.ErrorList {
			errs := resources.Immutable(c.Spec, old.Spec, resources.SpecPath)
			errs = append(errs, resourcev1.Validate_ResourceClaimStatus(context.Background(), updateOp(), field.NewPath("status"), &c.Status, &old.Status)...)
			return append(errs, validateClaimStatus(c, old)...)
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("State", "string", 0, "A summary of the claim's state: pending, allocated, reserved, deleted."), resources.AgeCol},
		Row: resources.TypedRow(func(c *resourcev1.ResourceClaim) []any {
			return []any{c.Name, claimState(c), resources.Age(c.CreationTimestamp)}
		}),
	})
}

// claimState is the State column as kubectl shows it for Kubernetes.
func claimState(c *resourcev1.ResourceClaim) string {
	var states []string
	if c.DeletionTimestamp != nil {
		states = append(states, "deleted")
	}
	if c.Status.Allocation == nil {
		if c.DeletionTimestamp == nil {
			states = append(states, "pending")
		}
	} else {
		states = append(states, "allocated")
		if len(c.Status.ReservedFor) > 0 {
			states = append(states, "reserved")
		}
	}
	out := ""
	for i, s := range states {
		if i > 0 {
			out += ","
		}
		out += s
	}
	return out
}

// validateClaimStatus: the invariants Kubernetes' status strategy keeps
// by hand: a claim is reserved only once allocated; a deleted claim gains
// no consumers; an allocation is not changed, only removed; consumers
// name what they are.
func validateClaimStatus(c, old *resourcev1.ResourceClaim) field.ErrorList {
	var errs field.ErrorList
	status := field.NewPath("status")
	for i, ref := range c.Status.ReservedFor {
		p := status.Child("reservedFor").Index(i)
		for name, v := range map[string]string{"resource": ref.Resource, "name": ref.Name, "uid": string(ref.UID)} {
			if v == "" {
				errs = append(errs, field.Required(p.Child(name), ""))
			}
		}
	}
	if len(c.Status.ReservedFor) > 0 {
		if c.Status.Allocation == nil {
			errs = append(errs, field.Forbidden(status.Child("reservedFor"), "may not be specified when `allocated` is not set"))
		} else if c.DeletionTimestamp != nil {
			had := sets.New[string]()
			for _, ref := range old.Status.ReservedFor {
				had.Insert(string(ref.UID))
			}
			for _, ref := range c.Status.ReservedFor {
				if !had.Has(string(ref.UID)) {
					errs = append(errs, field.Forbidden(status.Child("reservedFor"), "new entries may not be added while `deallocationRequested` or `deletionTimestamp` are set"))
					break
				}
			}
		}
	}
	switch a := c.Status.Allocation; {
	case a != nil && old.Status.Allocation != nil:
		errs = append(errs, resources.Immutable(a, old.Status.Allocation, status.Child("allocation"))...)
	case a != nil:
		names := requestNames(&c.Spec.Devices)
		for i, r := range a.Devices.Results {
			p := status.Child("allocation", "devices", "results").Index(i)
			errs = append(errs, validateRequestRef(r.Request, p.Child("request"), names)...)
			errs = append(errs, validateDriver(r.Driver, p.Child("driver"))...)
			if r.Device == "" {
				errs = append(errs, field.Required(p.Child("device"), ""))
			} else {
				errs = append(errs, dnsLabel(r.Device, p.Child("device"))...)
			}
		}
		if sel := a.NodeSelector; sel != nil {
			if _, err := nodeaffinity.NewNodeSelector(sel); err != nil {
				errs = append(errs, field.Invalid(status.Child("allocation", "nodeSelector"), sel, err.Error()))
			}
		}
	}
	return errs
}

func resourceClaimTemplates() *resources.Resource {
	return resources.Described[resourcev1.ResourceClaimTemplate, resourcev1.ResourceClaimTemplateList](&resources.Resource{
		GroupVersionKind: resources.GVK(resourcev1.GroupName, "ResourceClaimTemplate"), Plural: "resourceclaimtemplates", Singular: "resourceclaimtemplate",
		Namespaced: true, StorageKey: "resourceclaimtemplates",
		Default: resources.Typed(func(t *resourcev1.ResourceClaimTemplate) { defaultClaimSpec(&t.Spec.Spec) }),
		Validate: resources.TypedValidate(func(t *resourcev1.ResourceClaimTemplate) field.ErrorList {
			errs := resourcev1.Validate_ResourceClaimTemplateSpec(context.Background(), createOp(), resources.SpecPath, &t.Spec, nil)
			return append(errs, validateClaimSpec(&t.Spec.Spec, resources.SpecPath.Child("spec"))...)
		}),
		ValidateUpdate: resources.TypedValidateUpdate(func(t, old *resourcev1.ResourceClaimTemplate) field.ErrorList {
			return resources.Immutable(t.Spec, old.Spec, resources.SpecPath)
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol, resources.AgeCol},
		Row: resources.TypedRow(func(t *resourcev1.ResourceClaimTemplate) []any {
			return []any{t.Name, resources.Age(t.CreationTimestamp)}
		}),
	})
}

// defaultClaimSpec: Kubernetes' defaults of a claim's requests: exactly
// one device unless All are asked for; tolerations compare with Equal.
func defaultClaimSpec(spec *resourcev1.ResourceClaimSpec) {
	for i := range spec.Devices.Requests {
		r := &spec.Devices.Requests[i]
		if e := r.Exactly; e != nil {
			defaultAllocation(&e.AllocationMode, &e.Count)
			defaultTolerations(e.Tolerations)
		}
		for j := range r.FirstAvailable {
			s := &r.FirstAvailable[j]
			defaultAllocation(&s.AllocationMode, &s.Count)
			defaultTolerations(s.Tolerations)
		}
	}
}

func defaultAllocation(mode *resourcev1.DeviceAllocationMode, count *int64) {
	if *mode == "" {
		*mode = resourcev1.DeviceAllocationModeExactCount
	}
	if *mode == resourcev1.DeviceAllocationModeExactCount && *count == 0 {
		*count = 1
	}
}

func defaultTolerations(ts []resourcev1.DeviceToleration) {
	for i := range ts {
		if ts[i].Operator == "" {
			ts[i].Operator = resourcev1.DeviceTolerationOpEqual
		}
	}
}

// validateClaimSpec is what Kubernetes checks of a claim's requests by
// hand: names, exactly one way to ask, a class, counts that fit the mode,
// selectors that compile, and constraints and configuration that name
// requests there are.
func validateClaimSpec(spec *resourcev1.ResourceClaimSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	devices := path.Child("devices")
	for i, r := range spec.Devices.Requests {
		p := devices.Child("requests").Index(i)
		errs = append(errs, requiredLabel(r.Name, p.Child("name"))...)
		switch {
		case r.Exactly != nil && len(r.FirstAvailable) > 0:
			errs = append(errs, field.Invalid(p, nil, "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set"))
		case r.Exactly != nil:
			e := r.Exactly
			errs = append(errs, validateClass(e.DeviceClassName, p.Child("exactly", "deviceClassName"))...)
			errs = append(errs, validateCount(e.AllocationMode, e.Count, p.Child("exactly"))...)
			errs = append(errs, validateSelectors(e.Selectors, p.Child("exactly", "selectors"), nil)...)
		case len(r.FirstAvailable) > 0:
			for j, s := range r.FirstAvailable {
				sp := p.Child("firstAvailable").Index(j)
				errs = append(errs, requiredLabel(s.Name, sp.Child("name"))...)
				errs = append(errs, validateClass(s.DeviceClassName, sp.Child("deviceClassName"))...)
				errs = append(errs, validateCount(s.AllocationMode, s.Count, sp)...)
				errs = append(errs, validateSelectors(s.Selectors, sp.Child("selectors"), nil)...)
			}
		default:
			errs = append(errs, field.Required(p, "exactly one of `exactly` or `firstAvailable` is required"))
		}
	}
	names := requestNames(&spec.Devices)
	for i, c := range spec.Devices.Constraints {
		for j, r := range c.Requests {
			errs = append(errs, validateRequestRef(r, devices.Child("constraints").Index(i).Child("requests").Index(j), names)...)
		}
		if c.MatchAttribute == nil && c.DistinctAttribute == nil {
			errs = append(errs, field.Required(devices.Child("constraints").Index(i), "exactly one of `matchAttribute` or `distinctAttribute` is required"))
		}
	}
	for i, c := range spec.Devices.Config {
		p := devices.Child("config").Index(i)
		for j, r := range c.Requests {
			errs = append(errs, validateRequestRef(r, p.Child("requests").Index(j), names)...)
		}
		errs = append(errs, validateOpaque(c.Opaque, p)...)
	}
	return errs
}

func validateCount(mode resourcev1.DeviceAllocationMode, count int64, p *field.Path) field.ErrorList {
	switch mode {
	case resourcev1.DeviceAllocationModeAll:
		if count != 0 {
			return field.ErrorList{field.Invalid(p.Child("count"), count, fmt.Sprintf("must not be specified when allocationMode is '%s'", mode))}
		}
	case resourcev1.DeviceAllocationModeExactCount:
		if count <= 0 {
			return field.ErrorList{field.Invalid(p.Child("count"), count, "must be greater than zero")}
		}
	default:
		return field.ErrorList{field.NotSupported(p.Child("allocationMode"), mode, []string{string(resourcev1.DeviceAllocationModeAll), string(resourcev1.DeviceAllocationModeExactCount)})}
	}
	return nil
}

// requestNames are the names a constraint or configuration may refer to:
// each request, and each request/subrequest.
func requestNames(claim *resourcev1.DeviceClaim) sets.Set[string] {
	names := sets.New[string]()
	for _, r := range claim.Requests {
		names.Insert(r.Name)
		for _, s := range r.FirstAvailable {
			names.Insert(r.Name + "/" + s.Name)
		}
	}
	return names
}

func validateRequestRef(name string, p *field.Path, names sets.Set[string]) field.ErrorList {
	if !names.Has(name) {
		return field.ErrorList{field.Invalid(p, name, "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'")}
	}
	return nil
}

func validateOpaque(c *resourcev1.OpaqueDeviceConfiguration, p *field.Path) field.ErrorList {
	if c == nil {
		return field.ErrorList{field.Required(p.Child("opaque"), "")}
	}
	return validateDriver(c.Driver, p.Child("opaque", "driver"))
}

func resourceSlices() *resources.Resource {
	return resources.Described[resourcev1.ResourceSlice, resourcev1.ResourceSliceList](&resources.Resource{
		GroupVersionKind: resources.GVK(resourcev1.GroupName, "ResourceSlice"), Plural: "resourceslices", Singular: "resourceslice",
		StorageKey: "resourceslices", HasSpec: true,
		Default: resources.Typed(func(s *resourcev1.ResourceSlice) {
			for i := range s.Spec.Devices {
				for j := range s.Spec.Devices[i].Taints {
					defaultTaint(&s.Spec.Devices[i].Taints[j])
				}
			}
		}),
		Validate: resources.TypedValidate(func(s *resourcev1.ResourceSlice) field.ErrorList {
			errs := resourcev1.Validate_ResourceSliceSpec(context.Background(), createOp(), resources.SpecPath, &s.Spec, nil)
			return append(errs, validateSliceSpec(&s.Spec)...)
		}),
		ValidateUpdate: resources.TypedValidateUpdate(func(s, old *resourcev1.ResourceSlice) field.ErrorList {
			errs := resourcev1.Validate_ResourceSliceSpec(context.Background(), updateOp(), resources.SpecPath, &s.Spec, &old.Spec)
			errs = append(errs, resources.Immutable(s.Spec.Driver, old.Spec.Driver, resources.SpecPath.Child("driver"))...)
			errs = append(errs, resources.Immutable(s.Spec.Pool.Name, old.Spec.Pool.Name, resources.SpecPath.Child("pool", "name"))...)
			return append(errs, resources.Immutable(s.Spec.NodeName, old.Spec.NodeName, resources.SpecPath.Child("nodeName"))...)
		}),
		// What a node's kubelet and drivers select their slices by.
		Fields: resources.TypedFields(func(s *resourcev1.ResourceSlice) fields.Set {
			return fields.Set{resourcev1.ResourceSliceSelectorNodeName: ptr.Deref(s.Spec.NodeName, ""),
				resourcev1.ResourceSliceSelectorDriver: s.Spec.Driver, resourcev1.ResourceSliceSelectorPoolName: s.Spec.Pool.Name}
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("Node", "string", 0, resourcev1.ResourceSliceSpec{}.SwaggerDoc()["nodeName"]),
			resources.Col("Driver", "string", 0, resourcev1.ResourceSliceSpec{}.SwaggerDoc()["driver"]),
			resources.Col("Pool", "string", 0, resourcev1.ResourcePool{}.SwaggerDoc()["name"]), resources.AgeCol},
		Row: resources.TypedRow(func(s *resourcev1.ResourceSlice) []any {
			return []any{s.Name, resources.OrNone(ptr.Deref(s.Spec.NodeName, "")), s.Spec.Driver, s.Spec.Pool.Name, resources.Age(s.CreationTimestamp)}
		}),
	})
}

// validateSliceSpec is what Kubernetes checks of a slice by hand: its
// driver, its pool, where its devices are (exactly one way), and devices
// named uniquely with qualified attribute names.
func validateSliceSpec(spec *resourcev1.ResourceSliceSpec) field.ErrorList {
	p := resources.SpecPath
	errs := validateDriver(spec.Driver, p.Child("driver"))
	if spec.Pool.Name == "" {
		errs = append(errs, field.Required(p.Child("pool", "name"), ""))
	}
	if spec.Pool.Generation < 0 {
		errs = append(errs, field.Invalid(p.Child("pool", "generation"), spec.Pool.Generation, "must be greater than or equal to 0"))
	}
	if spec.Pool.ResourceSliceCount <= 0 {
		errs = append(errs, field.Invalid(p.Child("pool", "resourceSliceCount"), spec.Pool.ResourceSliceCount, "must be greater than 0"))
	}
	set := 0
	if spec.NodeName != nil {
		set++
		if *spec.NodeName == "" {
			errs = append(errs, field.Invalid(p.Child("nodeName"), "", "must be a node name"))
		}
	}
	if spec.NodeSelector != nil {
		set++
		if _, err := nodeaffinity.NewNodeSelector(spec.NodeSelector); err != nil {
			errs = append(errs, field.Invalid(p.Child("nodeSelector"), spec.NodeSelector, err.Error()))
		}
	}
	if ptr.Deref(spec.AllNodes, false) {
		set++
	}
	if ptr.Deref(spec.PerDeviceNodeSelection, false) {
		set++
	}
	if set != 1 {
		errs = append(errs, field.Invalid(p, nil, "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"))
	}
	seen := sets.New[string]()
	for i, d := range spec.Devices {
		dp := p.Child("devices").Index(i)
		errs = append(errs, requiredLabel(d.Name, dp.Child("name"))...)
		if seen.Has(d.Name) {
			errs = append(errs, field.Duplicate(dp.Child("name"), d.Name))
		}
		seen.Insert(d.Name)
		if n := len(d.Attributes) + len(d.Capacity); n > resourcev1.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
			errs = append(errs, field.Invalid(dp, n, fmt.Sprintf("the total number of attributes and capacities must not exceed %d", resourcev1.ResourceSliceMaxAttributesAndCapacitiesPerDevice)))
		}
		for name := range d.Attributes {
			errs = append(errs, validateQualifiedName(string(name), dp.Child("attributes").Key(string(name)))...)
		}
		for name := range d.Capacity {
			errs = append(errs, validateQualifiedName(string(name), dp.Child("capacity").Key(string(name)))...)
		}
		for j, t := range d.Taints {
			errs = append(errs, validateTaint(t, dp.Child("taints").Index(j))...)
		}
	}
	return errs
}

func deviceTaintRules() *resources.Resource {
	return resources.Described[resourcev1.DeviceTaintRule, resourcev1.DeviceTaintRuleList](&resources.Resource{
		GroupVersionKind: resources.GVK(resourcev1.GroupName, "DeviceTaintRule"), Plural: "devicetaintrules", Singular: "devicetaintrule",
		StorageKey: "devicetaintrules", HasSpec: true, Subresources: []resources.Subresource{resources.Status()},
		PrepareForCreate: resources.Typed(func(r *resourcev1.DeviceTaintRule) { r.Status = resourcev1.DeviceTaintRuleStatus{} }),
		// TimeAdded follows the effect: a new effect is a new taint for the
		// tolerations' durations, unless the client set the time itself.
		PrepareForUpdate: resources.TypedUpdate(func(r, old *resourcev1.DeviceTaintRule) {
			if r.Spec.Taint.Effect != old.Spec.Taint.Effect && r.Spec.Taint.TimeAdded.Equal(old.Spec.Taint.TimeAdded) {
				r.Spec.Taint.TimeAdded = &metav1.Time{Time: time.Now().Truncate(time.Second)}
			}
		}),
		Default: resources.Typed(func(r *resourcev1.DeviceTaintRule) { defaultTaint(&r.Spec.Taint) }),
		Validate: resources.TypedValidate(func(r *resourcev1.DeviceTaintRule) field.ErrorList {
			errs := resourcev1.Validate_DeviceTaintRuleSpec(context.Background(), createOp(), resources.SpecPath, &r.Spec, nil)
			return append(errs, validateTaintRule(&r.Spec)...)
		}),
		ValidateUpdate: resources.TypedValidateUpdate(func(r, old *resourcev1.DeviceTaintRule) field.ErrorList {
			errs := resourcev1.Validate_DeviceTaintRuleSpec(context.Background(), updateOp(), resources.SpecPath, &r.Spec, &old.Spec)
			errs = append(errs, resourcev1.Validate_DeviceTaintRuleStatus(context.Background(), updateOp(), field.NewPath("status"), &r.Status, &old.Status)...)
			return append(errs, validateTaintRule(&r.Spec)...)
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("Effect", "string", 0, resourcev1.DeviceTaint{}.SwaggerDoc()["effect"]), resources.AgeCol},
		Row: resources.TypedRow(func(r *resourcev1.DeviceTaintRule) []any {
			return []any{r.Name, string(r.Spec.Taint.Effect), resources.Age(r.CreationTimestamp)}
		}),
	})
}

// defaultTaint: a taint's TimeAdded is when the server first saw it (in
// seconds, what survives encoding).
func defaultTaint(t *resourcev1.DeviceTaint) {
	if t.TimeAdded == nil {
		t.TimeAdded = &metav1.Time{Time: time.Now().Truncate(time.Second)}
	}
}

func validateTaintRule(spec *resourcev1.DeviceTaintRuleSpec) field.ErrorList {
	errs := validateTaint(spec.Taint, resources.SpecPath.Child("taint"))
	if sel := spec.DeviceSelector; sel != nil {
		p := resources.SpecPath.Child("deviceSelector")
		if sel.Driver != nil {
			errs = append(errs, validateDriver(*sel.Driver, p.Child("driver"))...)
		}
		if sel.Device != nil {
			errs = append(errs, dnsLabel(*sel.Device, p.Child("device"))...)
		}
	}
	return errs
}

// validateTaint: a qualified key and a label value, as node taints have.
func validateTaint(t resourcev1.DeviceTaint, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if t.Key == "" {
		errs = append(errs, field.Required(p.Child("key"), ""))
	}
	for _, msg := range validation.IsQualifiedName(t.Key) {
		errs = append(errs, field.Invalid(p.Child("key"), t.Key, msg))
	}
	for _, msg := range validation.IsValidLabelValue(t.Value) {
		errs = append(errs, field.Invalid(p.Child("value"), t.Value, msg))
	}
	return errs
}

// validateDriver: a driver's name is a DNS subdomain of at most 63
// characters (a CSI driver's rule).
func validateDriver(name string, p *field.Path) field.ErrorList {
	errs := validateClass(name, p)
	if len(name) > 63 {
		errs = append(errs, field.TooLong(p, name, 63))
	}
	return errs
}

// validateClass: a required DNS subdomain (a device class's name).
func validateClass(name string, p *field.Path) field.ErrorList {
	if name == "" {
		return field.ErrorList{field.Required(p, "")}
	}
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Subdomain(name) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	return errs
}

func requiredLabel(name string, p *field.Path) field.ErrorList {
	if name == "" {
		return field.ErrorList{field.Required(p, "")}
	}
	return dnsLabel(name, p)
}

func dnsLabel(name string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(name) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	return errs
}

// validateQualifiedName: an attribute or capacity name is a C identifier,
// optionally after a driver-like DNS subdomain and a slash.
func validateQualifiedName(name string, p *field.Path) field.ErrorList {
	domain, id := "", name
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '/' {
			domain, id = name[:i], name[i+1:]
			break
		}
	}
	var errs field.ErrorList
	if id == "" {
		errs = append(errs, field.Required(p, "the name after the domain"))
	}
	for _, msg := range validation.IsCIdentifier(id) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	if len(id) > resourcev1.DeviceMaxIDLength {
		errs = append(errs, field.TooLong(p, name, resourcev1.DeviceMaxIDLength))
	}
	if domain != "" || id != name {
		errs = append(errs, validateDriver(domain, p)...)
	}
	return errs
}

// selectorEnv is Kubernetes' CEL environment with the device a selector
// looks at: its driver, attributes and capacity by domain.
var selectorEnv = sync.OnceValues(func() (*cel.Env, error) {
	env, err := environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()).Extend(environment.VersionedOptions{
		IntroducedVersion: environment.DefaultCompatibilityVersion(),
		EnvOptions:        []cel.EnvOption{cel.Variable("device", cel.MapType(cel.StringType, cel.DynType))},
	})
	if err != nil {
		return nil, err
	}
	return env.Env(environment.NewExpressions)
})

func storedExpressions(selectors []resourcev1.DeviceSelector) sets.Set[string] {
	out := sets.New[string]()
	for _, s := range selectors {
		if s.CEL != nil {
			out.Insert(s.CEL.Expression)
		}
	}
	return out
}

// validateSelectors: each selector is a CEL expression that compiles and
// gives a bool, as Kubernetes checks it (stored ones are not re-checked).
func validateSelectors(selectors []resourcev1.DeviceSelector, p *field.Path, stored sets.Set[string]) field.ErrorList {
	var errs field.ErrorList
	for i, s := range selectors {
		sp := p.Index(i).Child("cel")
		if s.CEL == nil {
			errs = append(errs, field.Required(sp, ""))
			continue
		}
		expr := s.CEL.Expression
		ep := sp.Child("expression")
		switch {
		case expr == "":
			errs = append(errs, field.Required(ep, ""))
		case len(expr) > resourcev1.CELSelectorExpressionMaxLength:
			errs = append(errs, field.TooLong(ep, "", resourcev1.CELSelectorExpressionMaxLength))
		case stored.Has(expr):
		default:
			errs = append(errs, compileSelector(expr, ep)...)
		}
	}
	return errs
}

func compileSelector(expr string, p *field.Path) field.ErrorList {
	env, err := selectorEnv()
	if err != nil {
		return field.ErrorList{field.InternalError(p, fmt.Errorf("the CEL environment: %w", err))}
	}
	ast, issues := env.Compile(expr)
	if issues != nil && issues.Err() != nil {
		return field.ErrorList{field.Invalid(p, expr, "compilation failed: "+issues.Err().Error())}
	}
	if t := ast.OutputType(); t != cel.BoolType && t != cel.DynType {
		return field.ErrorList{field.Invalid(p, expr, fmt.Sprintf("must evaluate to bool or the unknown type, not %s", t))}
	}
	return nil
}
