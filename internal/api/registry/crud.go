package registry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/orch-dev/orch/internal/api/admission"
	"github.com/orch-dev/orch/internal/api/resources"
	"github.com/orch-dev/orch/internal/store"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// WriteOptions are the options every write shares.
type WriteOptions struct {
	DryRun bool
	// FieldManager is who writes, for metadata.managedFields; empty for
	// the server's own writes (apply.DefaultManager).
	FieldManager string
}

// generateNameAttempts bounds retries when a generated name is taken, as
// Kubernetes' RetryGenerateName does.
const generateNameAttempts = 8

// nameSuffix is Kubernetes' alphabet for generated names: no vowels, so no
// words, and no look-alike characters.
const nameSuffix = "bcdfghjklmnpqrstvwxz2456789"

func generatedName(base string) string {
	if len(base) > 58 {
		base = base[:58]
	}
	b := make([]byte, 5)
	for i := range b {
		b[i] = nameSuffix[rand.IntN(len(nameSuffix))]
	}
	return base + string(b)
}

// Create stores a new object, returning it as stored.
func (s *Storage) Create(ctx context.Context, obj runtime.Object, opts WriteOptions) (runtime.Object, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	generate := m.GetName() == "" && m.GetGenerateName() != ""
	for attempt := 0; ; attempt++ {
		if generate {
			m.SetName(generatedName(m.GetGenerateName()))
		}
		out, err := s.create(ctx, obj, m, opts, false)
		if generate && apierrors.IsAlreadyExists(err) && attempt < generateNameAttempts {
			continue
		}
		return out, err
	}
}

// create stores obj; applied says its managedFields are already what a
// server-side apply made them.
func (s *Storage) create(ctx context.Context, obj runtime.Object, m metav1.Object, opts WriteOptions, applied bool) (runtime.Object, error) {
	r := s.Resource
	if m.GetName() == "" {
		return nil, s.invalid(m.GetName(), field.ErrorList{field.Required(field.NewPath("metadata", "name"), "name or generateName is required")})
	}
	m.SetUID(types.UID(uuid.NewString()))
	m.SetCreationTimestamp(metav1.Now())
	m.SetResourceVersion("")
	m.SetDeletionTimestamp(nil)
	m.SetDeletionGracePeriodSeconds(nil)
	m.SetGeneration(1)
	m.SetSelfLink("")
	if r.PrepareForCreate != nil {
		r.PrepareForCreate(obj)
	}
	if r.Default != nil {
		r.Default(obj)
	}
	if !applied {
		s.trackUpdate(nil, obj, opts.FieldManager, "")
	}
	validate := func() field.ErrorList {
		errs := resources.ValidateMeta(r, obj)
		if r.Validate != nil {
			errs = append(errs, r.Validate(obj)...)
		}
		if r.Rules != nil && len(errs) == 0 {
			errs = append(errs, r.Rules(obj, nil)...)
		}
		return errs
	}
	invalid := validate()
	if len(invalid) > 0 && !s.externalMutation() {
		return nil, s.invalid(m.GetName(), invalid)
	}
	a := &admission.Attributes{Resource: r, Operation: admission.Create, Namespace: m.GetNamespace(), Name: m.GetName(), Object: obj,
		Options: &metav1.CreateOptions{TypeMeta: optionsMeta("CreateOptions"), DryRun: dryRunAll(opts.DryRun), FieldManager: opts.FieldManager}, DryRun: opts.DryRun}
	if admitted, err := s.admit(ctx, a, validate, len(invalid) > 0); err != nil {
		if admitted {
			s.release(obj)
		}
		return nil, err
	}
	if opts.DryRun {
		s.release(obj)
		return obj, nil
	}
	data, err := s.encodeWrite(obj, applied)
	if err != nil {
		s.release(obj)
		return nil, err
	}
	kv, err := s.store.Create(ctx, s.key(m.GetNamespace(), m.GetName()), data)
	if err != nil {
		s.release(obj)
		return nil, s.storeError(err, m.GetName())
	}
	s.wrote(kv.ModRevision)
	m.SetResourceVersion(fmt.Sprint(kv.ModRevision))
	return obj, nil
}

func (s *Storage) release(obj runtime.Object) {
	if s.Released != nil {
		s.Released(obj)
	}
}

func (s *Storage) invalid(name string, errs field.ErrorList) error {
	return apierrors.NewInvalid(s.Resource.GroupKind(), name, errs)
}

// UpdateFunc computes the new object from the current one (nil when the
// object does not exist): the request body for PUT, the patched object for
// PATCH. It may run more than once when a concurrent write intervenes.
type UpdateFunc func(ctx context.Context, current runtime.Object) (runtime.Object, error)

// UpdateOptions choose what an update may change.
type UpdateOptions struct {
	WriteOptions
	// Subresource is "" for the main resource or "status"; status updates
	// take only .status, main updates keep the stored .status.
	Subresource string
}

// Update applies update to the named object with optimistic concurrency.
// A resourceVersion in the new object must match the stored one (409
// otherwise); without one the update retries over concurrent writes. It
// reports whether the object was created.
func (s *Storage) Update(ctx context.Context, namespace, name string, update UpdateFunc, opts UpdateOptions) (runtime.Object, bool, error) {
	return s.update(ctx, namespace, name, update, opts, false)
}

// update is Update; applied says update is a server-side apply, which
// computes managedFields itself and may create the object.
func (s *Storage) update(ctx context.Context, namespace, name string, update UpdateFunc, opts UpdateOptions, applied bool) (runtime.Object, bool, error) {
	key := s.key(namespace, name)
	for {
		var current runtime.Object
		kv, err := s.store.Get(ctx, key)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return nil, false, s.storeError(err, name)
		default:
			if current, err = s.decode(kv); err != nil {
				return nil, false, err
			}
		}
		obj, err := update(ctx, current)
		if err != nil {
			return nil, false, err
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return nil, false, apierrors.NewBadRequest(err.Error())
		}
		if current == nil {
			if !s.Resource.AllowCreateOnUpdate && !applied || opts.Subresource != "" || m.GetResourceVersion() != "" {
				return nil, false, apierrors.NewNotFound(s.groupResource(), name)
			}
			out, err := s.create(ctx, obj, m, opts.WriteOptions, applied)
			return out, err == nil, err
		}
		unconditional := m.GetResourceVersion() == ""
		if !unconditional && m.GetResourceVersion() != fmt.Sprint(kv.ModRevision) {
			return nil, false, apierrors.NewConflict(s.groupResource(), name, errors.New(conflictMessage))
		}
		if obj, err = s.prepareUpdate(ctx, obj, current, opts, applied); err != nil {
			return nil, false, err
		}
		out, committed, retry, err := s.writeUpdate(ctx, key, obj, current, kv, unconditional, opts.DryRun, applied)
		if !committed && s.Abandoned != nil {
			s.Abandoned(obj, current)
		}
		if retry {
			continue
		}
		return out, false, err
	}
}

// writeUpdate stores an admitted update. It reports whether the update
// reached the store and whether a concurrent write calls for another try.
func (s *Storage) writeUpdate(ctx context.Context, key string, obj, current runtime.Object, kv store.KeyValue, unconditional, dryRun, applied bool) (out runtime.Object, committed, retry bool, err error) {
	if dryRun {
		return obj, false, false, nil
	}
	m, _ := meta.Accessor(obj)
	data, err := s.encodeWrite(obj, applied)
	if err != nil {
		return nil, false, false, err
	}
	if bytes.Equal(data, kv.Value) {
		// Kubernetes skips a write that changes nothing: no new resourceVersion.
		return current, false, false, nil
	}
	if s.shouldDeleteDuringUpdate(obj, current) {
		_, rev, err := s.store.Delete(ctx, key, kv.ModRevision)
		if err != nil {
			if errors.Is(err, store.ErrConflict) && unconditional {
				return nil, false, true, nil
			}
			return nil, false, false, s.storeError(err, m.GetName())
		}
		s.wrote(rev)
		s.release(current)
		s.release(obj)
		return obj, true, false, nil
	}
	stored, err := s.store.Update(ctx, key, data, kv.ModRevision)
	if errors.Is(err, store.ErrConflict) && unconditional {
		return nil, false, true, nil
	}
	if err != nil {
		return nil, false, false, s.storeError(err, m.GetName())
	}
	s.wrote(stored.ModRevision)
	m.SetResourceVersion(fmt.Sprint(stored.ModRevision))
	if s.Committed != nil {
		s.Committed(obj, current)
	}
	return obj, true, false, nil
}

// prepareUpdate carries over what a client cannot change, applies
// defaults, admission and validation.
func (s *Storage) prepareUpdate(ctx context.Context, obj, current runtime.Object, opts UpdateOptions, applied bool) (runtime.Object, error) {
	r := s.Resource
	subresource := opts.Subresource
	// A scale writes the main resource's spec.replicas: it is that
	// resource's update, recorded under its own name in managedFields.
	mainResource := subresource == "" || subresource == "scale"
	// A subresource served as status (status itself, a CSR's approval, a
	// pod's ephemeral containers) takes only what it writes from what was
	// sent, then its own strategy, if it has one, narrows that further.
	var statusLike *resources.Subresource
	if sub := r.Subresource(subresource); sub != nil && sub.Serve == resources.ServeStatus {
		statusLike = sub
	}
	var err error
	switch {
	case statusLike != nil:
		applies, _ := meta.Accessor(obj)
		managed := applies.GetManagedFields()
		sent := applies
		writes := statusLike.Writes()
		if obj, err = copyField(current, obj, writes...); err != nil {
			return nil, err
		}
		keep, _ := meta.Accessor(obj)
		metadata := r.StatusMetadata
		if writes[0] != "status" {
			metadata = nil
		}
		for _, f := range metadata {
			switch f {
			case "labels":
				keep.SetLabels(sent.GetLabels())
			case "annotations":
				keep.SetAnnotations(sent.GetAnnotations())
			case "finalizers":
				keep.SetFinalizers(sent.GetFinalizers())
			case "ownerReferences":
				keep.SetOwnerReferences(sent.GetOwnerReferences())
			}
		}
		if applied {
			// What the apply of status owns now, kept with the status.
			keep, _ := meta.Accessor(obj)
			keep.SetManagedFields(managed)
		}
	case mainResource && r.HasSubresource("status"):
		if obj, err = copyField(obj, current, "status"); err != nil {
			return nil, err
		}
	}
	m, _ := meta.Accessor(obj)
	old, _ := meta.Accessor(current)
	m.SetCreationTimestamp(old.GetCreationTimestamp())
	m.SetDeletionTimestamp(old.GetDeletionTimestamp())
	m.SetDeletionGracePeriodSeconds(old.GetDeletionGracePeriodSeconds())
	m.SetGeneration(old.GetGeneration())
	m.SetSelfLink("")
	if m.GetUID() == "" {
		m.SetUID(old.GetUID())
	}
	if m.GetResourceVersion() == "" {
		// An unconditional update applies to the version just read.
		m.SetResourceVersion(old.GetResourceVersion())
	}
	if r.PrepareForUpdate != nil && mainResource {
		r.PrepareForUpdate(obj, current)
	}
	validateUpdate := r.ValidateUpdate
	if statusLike != nil && statusLike.PrepareForUpdate != nil {
		statusLike.PrepareForUpdate(obj, current)
	}
	if statusLike != nil && statusLike.ValidateUpdate != nil {
		validateUpdate = statusLike.ValidateUpdate
	}
	if r.Default != nil && mainResource {
		r.Default(obj)
	}
	if r.Generational != nil && mainResource {
		if r.Generational(obj, current) {
			m.SetGeneration(old.GetGeneration() + 1)
		}
	} else if r.HasSpec && (mainResource || statusLike != nil && statusLike.Writes()[0] == "spec") {
		if changed, err := fieldChanged(obj, current, "spec"); err != nil {
			return nil, err
		} else if changed {
			m.SetGeneration(old.GetGeneration() + 1)
		}
	}
	if !applied {
		s.trackUpdate(current, obj, opts.FieldManager, subresource)
	}
	validate := func() field.ErrorList {
		errs := apivalidation.ValidateObjectMetaAccessorUpdate(m, old, field.NewPath("metadata"))
		errs = append(errs, resources.ValidateMeta(r, obj)...)
		if r.Validate != nil {
			errs = append(errs, r.Validate(obj)...)
		}
		// A binding is the one write allowed to set a pod's node; the
		// binding handler checks it.
		if validateUpdate != nil && subresource != "binding" {
			errs = append(errs, validateUpdate(obj, current)...)
		}
		if r.Rules != nil && len(errs) == 0 {
			errs = append(errs, r.Rules(obj, current)...)
		}
		return errs
	}
	invalid := validate()
	if len(invalid) > 0 && !s.externalMutation() {
		return nil, s.invalid(m.GetName(), invalid)
	}
	a := &admission.Attributes{Resource: r, Operation: admission.Update, Subresource: subresource, Namespace: m.GetNamespace(), Name: m.GetName(),
		Object: obj, OldObject: current, DryRun: opts.DryRun,
		Options: &metav1.UpdateOptions{TypeMeta: optionsMeta("UpdateOptions"), DryRun: dryRunAll(opts.DryRun), FieldManager: opts.FieldManager}}
	// What admission changed is validated again, as Kubernetes validates
	// after mutating admission.
	admitted, err := s.admit(ctx, a, validate, len(invalid) > 0)
	if err != nil {
		if admitted && s.Abandoned != nil {
			s.Abandoned(obj, current)
		}
		return nil, err
	}
	return obj, nil
}

// admit runs admission in Kubernetes' order: the server's built-in
// admission, the cluster's mutating admission, validation again (of what
// they changed), the cluster's validating admission, and quota last, to
// charge what all of them let through as they made it. admitted reports
// that the built-in admission took what it takes for the object (cluster
// IPs), to be given back when a later step refuses.
//
// invalid says the object failed validation as sent. Kubernetes validates
// only after mutating admission, so a webhook may fill in what the object
// lacks (a required field); orch's built-in admission wants a valid
// object, so the cluster's mutating admission runs first then, and what it
// leaves must be valid before the built-in admission sees it.
func (s *Storage) admit(ctx context.Context, a *admission.Attributes, validate func() field.ErrorList, invalid bool) (admitted bool, err error) {
	ctx = admission.WithAttributes(withDryRun(ctx, a.DryRun), a)
	external := s.externalMutation()
	if invalid {
		if err := s.mutate(ctx, a); err != nil {
			return false, err
		}
		if errs := validate(); len(errs) > 0 {
			return false, s.invalid(a.Name, errs)
		}
	}
	if s.Admit != nil {
		if err := s.Admit(WithCachedReads(ctx), a.Object, a.OldObject); err != nil {
			return false, err
		}
	}
	if external && !invalid {
		if err := s.mutate(ctx, a); err != nil {
			return true, err
		}
	}
	// What the built-in admission sets on a create (a LimitRange's
	// defaults) is validated again; an update is validated again only
	// after the cluster's admission, which may change anything (the
	// built-in admission of updates only checks or allocates).
	if external && !invalid || s.Admit != nil && a.Operation == admission.Create {
		if errs := validate(); len(errs) > 0 {
			return true, s.invalid(a.Name, errs)
		}
	}
	if external {
		if err := s.External.Validate(ctx, a); err != nil {
			return true, err
		}
	}
	if s.Quota != nil {
		if err := s.Quota(ctx, a.Object, a.OldObject); err != nil {
			return true, err
		}
	}
	return true, nil
}

// externalMutation reports whether the cluster's admission (webhooks,
// policies) takes part in writes now.
func (s *Storage) externalMutation() bool { return s.External != nil && s.External.Active() }

// mutate runs the cluster's mutating admission, which may not move the
// object to another name or namespace.
func (s *Storage) mutate(ctx context.Context, a *admission.Attributes) error {
	if err := s.External.Mutate(ctx, a); err != nil {
		return err
	}
	// The request's authorization was for this name and namespace.
	if m, err := meta.Accessor(a.Object); err == nil && (m.GetName() != a.Name || m.GetNamespace() != a.Namespace) {
		return s.invalid(a.Name, field.ErrorList{field.Forbidden(field.NewPath("metadata", "name"),
			fmt.Sprintf("mutating admission may not change the object's name or namespace (to %s/%s)", m.GetNamespace(), m.GetName()))})
	}
	return nil
}

func optionsMeta(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: kind}
}

func dryRunAll(dry bool) []string {
	if dry {
		return []string{metav1.DryRunAll}
	}
	return nil
}

// propagate sets the garbage collector's finalizer for the delete's
// propagation policy, as Kubernetes does: "foregroundDeletion" keeps the
// object until its dependents are gone, "orphan" until they no longer
// point at it; background deletion needs neither. It reports whether the
// finalizers changed.
func (s *Storage) propagate(m metav1.Object, opts *metav1.DeleteOptions) bool {
	policy := metav1.DeletePropagationBackground
	switch {
	case opts.PropagationPolicy != nil:
		policy = *opts.PropagationPolicy
	case opts.OrphanDependents != nil && *opts.OrphanDependents: //nolint:staticcheck // old clients still send it; Kubernetes honours it
		policy = metav1.DeletePropagationOrphan
	case opts.OrphanDependents == nil && s.Resource.OrphanByDefault: //nolint:staticcheck // as above
		policy = metav1.DeletePropagationOrphan
	}
	before := m.GetFinalizers()
	var after []string
	for _, f := range before {
		if f != metav1.FinalizerOrphanDependents && f != metav1.FinalizerDeleteDependents {
			after = append(after, f)
		}
	}
	switch policy {
	case metav1.DeletePropagationOrphan:
		after = append(after, metav1.FinalizerOrphanDependents)
	case metav1.DeletePropagationForeground:
		after = append(after, metav1.FinalizerDeleteDependents)
	}
	if slices.Equal(before, after) {
		return false
	}
	m.SetFinalizers(after)
	return true
}

// shouldDeleteDuringUpdate is Kubernetes' rule: an object whose deletion
// waits only on finalizers goes once an update leaves none.
func (s *Storage) shouldDeleteDuringUpdate(obj, current runtime.Object) bool {
	m, _ := meta.Accessor(obj)
	old, _ := meta.Accessor(current)
	grace := old.GetDeletionGracePeriodSeconds()
	if old.GetDeletionTimestamp() == nil || len(m.GetFinalizers()) > 0 || grace == nil || *grace != 0 {
		return false
	}
	return s.Resource.BeginDelete == nil || !s.Resource.BeginDelete(obj)
}

// Delete removes the named object, or marks it deleted when a grace period
// or finalizers make it wait. It returns the object's last state.
func (s *Storage) Delete(ctx context.Context, namespace, name string, opts *metav1.DeleteOptions, wopts WriteOptions) (runtime.Object, error) {
	key := s.key(namespace, name)
	gr := s.groupResource()
	for {
		kv, err := s.store.Get(ctx, key)
		if err != nil {
			return nil, s.storeError(err, name)
		}
		obj, err := s.decode(kv)
		if err != nil {
			return nil, err
		}
		m, _ := meta.Accessor(obj)
		if pre := opts.Preconditions; pre != nil {
			if pre.UID != nil && *pre.UID != m.GetUID() {
				return nil, apierrors.NewConflict(gr, name, fmt.Errorf("Precondition failed: UID in precondition: %v, UID in object meta: %v", *pre.UID, m.GetUID())) //nolint:staticcheck // Kubernetes' own wording, which clients match
			}
			if pre.ResourceVersion != nil && *pre.ResourceVersion != m.GetResourceVersion() {
				return nil, apierrors.NewConflict(gr, name, fmt.Errorf("Precondition failed: ResourceVersion in precondition: %v, ResourceVersion in object meta: %v", *pre.ResourceVersion, m.GetResourceVersion())) //nolint:staticcheck // Kubernetes' own wording
			}
		}
		if s.AdmitDelete != nil {
			if err := s.AdmitDelete(ctx, obj); err != nil {
				return nil, err
			}
		}
		if s.External != nil && s.External.Active() {
			a := &admission.Attributes{Resource: s.Resource, Operation: admission.Delete, Namespace: namespace, Name: name, OldObject: obj, DryRun: wopts.DryRun}
			o := opts.DeepCopy()
			o.TypeMeta = optionsMeta("DeleteOptions")
			a.Options = o
			actx := withDryRun(ctx, wopts.DryRun)
			if err := s.External.Mutate(actx, a); err != nil {
				return nil, err
			}
			if err := s.External.Validate(actx, a); err != nil {
				return nil, err
			}
		}
		var grace int64
		if s.Resource.GracePeriod != nil {
			grace = s.Resource.GracePeriod(obj, opts.GracePeriodSeconds)
		}
		blocked := false
		if s.Resource.BeginDelete != nil {
			blocked = s.Resource.BeginDelete(obj)
		}
		propagationChanged := s.propagate(m, opts)
		wait := grace > 0 || len(m.GetFinalizers()) > 0 || blocked
		if wait {
			if dt := m.GetDeletionTimestamp(); dt != nil && !propagationChanged {
				// Already being deleted: only a shorter grace period changes anything.
				if old := m.GetDeletionGracePeriodSeconds(); old == nil || grace >= *old {
					return obj, nil
				}
			}
			if m.GetDeletionTimestamp() == nil && m.GetGeneration() > 0 {
				// Those acting on the object change course once it is being
				// deleted: a new generation says so, as on Kubernetes.
				m.SetGeneration(m.GetGeneration() + 1)
			}
			if dt := m.GetDeletionTimestamp(); dt == nil || grace < ptr.Deref(m.GetDeletionGracePeriodSeconds(), grace+1) {
				m.SetDeletionTimestamp(&metav1.Time{Time: time.Now().Add(time.Duration(grace) * time.Second).Truncate(time.Second)})
				m.SetDeletionGracePeriodSeconds(&grace)
			}
			if wopts.DryRun {
				return obj, nil
			}
			data, err := s.encode(obj)
			if err != nil {
				return nil, err
			}
			out, err := s.store.Update(ctx, key, data, kv.ModRevision)
			if errors.Is(err, store.ErrConflict) {
				continue
			}
			if err != nil {
				return nil, s.storeError(err, name)
			}
			s.wrote(out.ModRevision)
			m.SetResourceVersion(fmt.Sprint(out.ModRevision))
			return obj, nil
		}
		if wopts.DryRun {
			return obj, nil
		}
		_, rev, err := s.store.Delete(ctx, key, kv.ModRevision)
		if err != nil {
			if errors.Is(err, store.ErrConflict) {
				continue
			}
			return nil, s.storeError(err, name)
		}
		s.wrote(rev)
		s.release(obj)
		return obj, nil
	}
}

// dryRunKey marks the context of a dry-run write's admission.
type dryRunKey struct{}

func withDryRun(ctx context.Context, dryRun bool) context.Context {
	if !dryRun {
		return ctx
	}
	return context.WithValue(ctx, dryRunKey{}, true)
}

// DryRun reports whether admission is for a dry-run write, which must
// change nothing (quota admission charges nothing for it).
func DryRun(ctx context.Context) bool {
	v, _ := ctx.Value(dryRunKey{}).(bool)
	return v
}
