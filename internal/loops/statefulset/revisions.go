package statefulset

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"

	"github.com/orch-dev/orch/internal/loops/controller"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
)

// revisionHash names a revision's data (and the collision count, which
// moves a name already taken by other data).
func revisionHash(data []byte, collisions *int32) string {
	h := fnv.New32a()
	_, _ = h.Write(data) // a hash never fails to write
	if collisions != nil {
		_, _ = fmt.Fprintf(h, "%d", *collisions)
	}
	return rand.SafeEncodeString(strconv.FormatUint(uint64(h.Sum32()), 10))
}

// newRevision is the set's current template as a revision numbered n.
func newRevision(set *appsv1.StatefulSet, n int64, collisions *int32) (*appsv1.ControllerRevision, error) {
	data, err := controller.TemplatePatch(&set.Spec.Template)
	if err != nil {
		return nil, err
	}
	hash := revisionHash(data, collisions)
	labels := map[string]string{appsv1.ControllerRevisionHashLabelKey: hash}
	for k, v := range set.Spec.Template.Labels {
		labels[k] = v
	}
	return &appsv1.ControllerRevision{
		ObjectMeta: metav1.ObjectMeta{Name: set.Name + "-" + hash, Namespace: set.Namespace, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(set, appsv1.SchemeGroupVersion.WithKind("StatefulSet"))}},
		Data: runtime.RawExtension{Raw: data}, Revision: n,
	}, nil
}

// currentAndUpdate finds (or makes) the set's current and update revisions, as
// Kubernetes' controller does: the update revision is the template now;
// one equal to an older revision (a rollback) takes that revision back,
// renumbered as the newest.
func (c *Controller) currentAndUpdate(ctx context.Context, set *appsv1.StatefulSet, owned []*appsv1.ControllerRevision) (current, update *appsv1.ControllerRevision, all []*appsv1.ControllerRevision, err error) {
	slices.SortFunc(owned, func(a, b *appsv1.ControllerRevision) int { return int(a.Revision - b.Revision) })
	next := int64(1)
	if len(owned) > 0 {
		next = owned[len(owned)-1].Revision + 1
	}
	want, err := newRevision(set, next, set.Status.CollisionCount)
	if err != nil {
		return nil, nil, nil, err
	}
	var equal []*appsv1.ControllerRevision
	for _, r := range owned {
		if controller.SamePatch(r.Data.Raw, want.Data.Raw) {
			equal = append(equal, r)
		}
	}
	switch {
	case len(equal) > 0 && equal[len(equal)-1].Revision == next-1:
		update = equal[len(equal)-1] // the newest already
	case len(equal) > 0:
		// Back to an older template: that revision becomes the newest.
		r := equal[len(equal)-1].DeepCopy()
		r.Revision = next
		if update, err = c.client.ControllerRevisions(set.Namespace).Update(ctx, r, metav1.UpdateOptions{}); err != nil {
			return nil, nil, nil, fmt.Errorf("renumber revision %s: %w", r.Name, err)
		}
		owned = slices.DeleteFunc(owned, func(o *appsv1.ControllerRevision) bool { return o.Name == r.Name })
		owned = append(owned, update)
	default:
		if update, err = c.createRevision(ctx, set, want, next); err != nil {
			return nil, nil, nil, err
		}
		owned = append(owned, update)
	}
	current = update
	for _, r := range owned {
		if r.Name == set.Status.CurrentRevision {
			current = r
		}
	}
	return current, update, owned, nil
}

// createRevision stores the revision; a name taken by other data bumps
// the set's collision count and tries the next name, as Kubernetes does.
func (c *Controller) createRevision(ctx context.Context, set *appsv1.StatefulSet, want *appsv1.ControllerRevision, n int64) (*appsv1.ControllerRevision, error) {
	collisions := set.Status.CollisionCount
	for range 10 {
		made, err := c.client.ControllerRevisions(set.Namespace).Create(ctx, want, metav1.CreateOptions{})
		if err == nil {
			set.Status.CollisionCount = collisions
			return made, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create revision: %w", err)
		}
		existing, gerr := c.client.ControllerRevisions(set.Namespace).Get(ctx, want.Name, metav1.GetOptions{})
		if gerr != nil {
			return nil, gerr
		}
		if metav1.IsControlledBy(existing, set) && controller.SamePatch(existing.Data.Raw, want.Data.Raw) {
			return existing, nil
		}
		collisions = ptr.To(ptr.Deref(collisions, 0) + 1)
		if want, err = newRevision(set, n, collisions); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("revision names of %s keep colliding", set.Name)
}

// truncateHistory deletes the oldest revisions beyond the history limit,
// never the current or update one nor one a pod still runs.
func (c *Controller) truncateHistory(ctx context.Context, set *appsv1.StatefulSet, all []*appsv1.ControllerRevision, inUse map[string]bool) error {
	limit := int(ptr.Deref(set.Spec.RevisionHistoryLimit, 10))
	var old []*appsv1.ControllerRevision
	for _, r := range all {
		if !inUse[r.Name] && r.Name != set.Status.CurrentRevision && r.Name != set.Status.UpdateRevision {
			old = append(old, r)
		}
	}
	if len(old) <= limit {
		return nil
	}
	slices.SortFunc(old, func(a, b *appsv1.ControllerRevision) int { return int(a.Revision - b.Revision) })
	for _, r := range old[:len(old)-limit] {
		if err := c.client.ControllerRevisions(set.Namespace).Delete(ctx, r.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete revision %s: %w", r.Name, err)
		}
	}
	return nil
}
