package kube

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
)

// Rewrite writes an object of r back unchanged, as Kubernetes' storage
// version migrator does: a merge patch of nothing but its kind and
// resourceVersion (a precondition), which the server stores again only
// if what it would store now differs from what it holds (a custom
// resource kept at an older storage version, a value under an older
// encryption key). A conflict or a missing object means it was written
// (or deleted) since: nothing left to do, and reported as such.
func (c *Client) Rewrite(ctx context.Context, r APIResource, namespace, name, resourceVersion string) error {
	rc, ok := c.groups[r.GroupVersion]
	if !ok {
		var err error
		if rc, err = restClient(c.config, r.GroupVersion); err != nil {
			return err
		}
	}
	apiVersion, kind := r.GroupVersion.WithKind(r.Kind).ToAPIVersionAndKind()
	patch, err := json.Marshal(map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": map[string]any{"resourceVersion": resourceVersion}})
	if err != nil {
		return fmt.Errorf("rewrite patch: %w", err)
	}
	req := rc.Patch(types.MergePatchType).Resource(r.Name).Name(name).Param("fieldManager", "storage-version-migrator-controller").Body(patch)
	if r.Namespaced {
		req = req.Namespace(namespace)
	}
	return req.Do(ctx).Error()
}
