package daemonset

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/orch-dev/orch/internal/loops/controller"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// history finds or makes the ControllerRevision of the set's template
// now (cur) and returns the set's others (old), as Kubernetes' controller
// keeps them for `kubectl rollout history` and `undo`: a template back to
// an older revision's takes that revision, renumbered as the newest, so
// its pods (labeled with its hash) stay; revisions a client added with
// the same template are merged into the newest.
func (c *Controller) history(ctx context.Context, ds *appsv1.DaemonSet, pods []*corev1.Pod) (cur *appsv1.ControllerRevision, old []*appsv1.ControllerRevision, err error) {
	patch, err := controller.TemplatePatch(&ds.Spec.Template)
	if err != nil {
		return nil, nil, err
	}
	all, err := c.revisions.ControllerRevisions(ds.Namespace).List(labels.Everything())
	if err != nil {
		return nil, nil, err
	}
	var same []*appsv1.ControllerRevision
	for _, r := range all {
		if !metav1.IsControlledBy(r, ds) {
			continue
		}
		if _, ok := r.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]; !ok {
			// A revision without the hash label (written by a client):
			// its name stands in for the hash, as in Kubernetes.
			r = r.DeepCopy()
			if r.Labels == nil {
				r.Labels = map[string]string{}
			}
			r.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] = r.Name
			if r, err = c.client.ControllerRevisions(ds.Namespace).Update(ctx, r, metav1.UpdateOptions{}); err != nil {
				return nil, nil, fmt.Errorf("label revision: %w", err)
			}
		}
		if controller.SamePatch(r.Data.Raw, patch) {
			same = append(same, r)
		} else {
			old = append(old, r)
		}
	}
	next := int64(1)
	for _, r := range old {
		next = max(next, r.Revision+1)
	}
	if len(same) == 0 {
		cur, err = c.snapshot(ctx, ds, patch, next)
		return cur, old, err
	}
	if cur, err = c.mergeDuplicates(ctx, ds, same, pods); err != nil {
		return nil, nil, err
	}
	if cur.Revision < next {
		renumbered := cur.DeepCopy()
		renumbered.Revision = next
		if cur, err = c.client.ControllerRevisions(ds.Namespace).Update(ctx, renumbered, metav1.UpdateOptions{}); err != nil {
			return nil, nil, fmt.Errorf("renumber revision %s: %w", renumbered.Name, err)
		}
	}
	return cur, old, nil
}

// mergeDuplicates keeps the newest of revisions with the same template:
// pods labeled with another's hash are relabeled (not restarted), then
// the others are deleted.
func (c *Controller) mergeDuplicates(ctx context.Context, ds *appsv1.DaemonSet, same []*appsv1.ControllerRevision, pods []*corev1.Pod) (*appsv1.ControllerRevision, error) {
	keep := slices.MaxFunc(same, byRevision)
	if len(same) == 1 {
		return keep, nil
	}
	hash := keep.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]
	merged := map[string]bool{}
	for _, r := range same {
		merged[r.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]] = true
	}
	relabel, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{appsv1.DefaultDaemonSetUniqueLabelKey: hash}}})
	for _, p := range pods {
		// Only the duplicates' pods: Kubernetes relabels every pod, which
		// would count an outdated one as updated and never replace it.
		if h := p.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]; h == hash || !merged[h] {
			continue
		}
		if _, err := c.client.Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, relabel, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("relabel pod %s: %w", p.Name, err)
		}
	}
	for _, r := range same {
		if r.Name == keep.Name {
			continue
		}
		if err := c.client.ControllerRevisions(ds.Namespace).Delete(ctx, r.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("delete duplicate revision %s: %w", r.Name, err)
		}
	}
	return keep, nil
}

// snapshot stores the template as revision n, named by its hash. A name
// another template took bumps the set's collision count (its next sync
// tries the next name), as Kubernetes does.
func (c *Controller) snapshot(ctx context.Context, ds *appsv1.DaemonSet, patch []byte, n int64) (*appsv1.ControllerRevision, error) {
	// Without collisions, the hash orch gave daemon pods before it kept
	// revisions: an upgrade restarts none.
	hash := controller.TemplateHash(&ds.Spec.Template, ds.Status.CollisionCount)
	revLabels := map[string]string{appsv1.DefaultDaemonSetUniqueLabelKey: hash}
	for k, v := range ds.Spec.Template.Labels {
		revLabels[k] = v
	}
	rev := &appsv1.ControllerRevision{
		ObjectMeta: metav1.ObjectMeta{Name: ds.Name + "-" + hash, Namespace: ds.Namespace, Labels: revLabels, Annotations: ds.Annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))}},
		Data: runtime.RawExtension{Raw: patch}, Revision: n,
	}
	made, err := c.client.ControllerRevisions(ds.Namespace).Create(ctx, rev, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		if err != nil {
			return nil, fmt.Errorf("create revision: %w", err)
		}
		return made, nil
	}
	existing, err := c.client.ControllerRevisions(ds.Namespace).Get(ctx, rev.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("revision %s: %w", rev.Name, err)
	}
	if metav1.IsControlledBy(existing, ds) && controller.SamePatch(existing.Data.Raw, patch) {
		return existing, nil // made by an earlier sync the cache had not seen
	}
	// The informer's copy carries the resourceVersion: a stale collision
	// count conflicts instead of being bumped twice.
	bumped := ds.DeepCopy()
	bumped.Status.CollisionCount = ptr.To(ptr.Deref(ds.Status.CollisionCount, 0) + 1)
	if _, err := c.client.DaemonSets(ds.Namespace).UpdateStatus(ctx, bumped, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("count a revision name collision: %w", err)
	}
	return nil, fmt.Errorf("revision name %s is another template's: collision count now %d", rev.Name, *bumped.Status.CollisionCount)
}

// cleanupHistory deletes the oldest revisions beyond the history limit
// (10 unless set), never one a pod of the set still carries.
func (c *Controller) cleanupHistory(ctx context.Context, ds *appsv1.DaemonSet, old []*appsv1.ControllerRevision, live map[string]bool) error {
	excess := len(old) - int(ptr.Deref(ds.Spec.RevisionHistoryLimit, 10))
	if excess <= 0 {
		return nil
	}
	slices.SortFunc(old, byRevision)
	for _, r := range old {
		if excess <= 0 {
			break
		}
		if live[r.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]] {
			continue
		}
		if err := c.client.ControllerRevisions(ds.Namespace).Delete(ctx, r.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete revision %s: %w", r.Name, err)
		}
		excess--
	}
	return nil
}

func byRevision(a, b *appsv1.ControllerRevision) int { return cmp.Compare(a.Revision, b.Revision) }
