package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// APIResource is a served resource, from discovery.
type APIResource struct {
	metav1.APIResource
	GroupVersion schema.GroupVersion
}

// GroupVersionResource of the resource.
func (r APIResource) GroupVersionResource() schema.GroupVersionResource {
	return r.GroupVersion.WithResource(r.Name)
}

// Has reports whether the resource serves every one of verbs.
func (r APIResource) Has(verbs ...string) bool {
	for _, v := range verbs {
		found := false
		for _, have := range r.Verbs {
			found = found || have == v
		}
		if !found {
			return false
		}
	}
	return true
}

// ServerResources lists the top-level resources (no subresources) of the
// preferred version of every served group.
func (c *Client) ServerResources(ctx context.Context) ([]APIResource, error) {
	core := c.groups[schema.GroupVersion{Version: "v1"}]
	var groupVersions []string
	var versions metav1.APIVersions
	if err := getJSON(ctx, core, "/api", &versions); err != nil {
		return nil, err
	}
	for _, v := range versions.Versions {
		groupVersions = append(groupVersions, "api/"+v)
	}
	var groups metav1.APIGroupList
	if err := getJSON(ctx, core, "/apis", &groups); err != nil {
		return nil, err
	}
	for _, g := range groups.Groups {
		groupVersions = append(groupVersions, "apis/"+g.PreferredVersion.GroupVersion)
	}
	var out []APIResource
	for _, path := range groupVersions {
		var list metav1.APIResourceList
		if err := getJSON(ctx, core, "/"+path, &list); err != nil {
			return nil, err
		}
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil {
			return nil, fmt.Errorf("discovery of %s: %w", path, err)
		}
		for _, r := range list.APIResources {
			if !strings.Contains(r.Name, "/") {
				out = append(out, APIResource{APIResource: r, GroupVersion: gv})
			}
		}
	}
	return out, nil
}

func getJSON(ctx context.Context, rc *rest.RESTClient, path string, into any) error {
	data, err := rc.Get().AbsPath(path).SetHeader("Accept", "application/json").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("discovery %s: %w", path, err)
	}
	if err := json.Unmarshal(data, into); err != nil {
		return fmt.Errorf("discovery %s: %w", path, err)
	}
	return nil
}

// MetadataInformer watches the metadata of every object of a resource.
func MetadataInformer(client metadata.Interface, gvr schema.GroupVersionResource, resync time.Duration) cache.SharedIndexInformer {
	r := client.Resource(gvr)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) { return r.List(ctx, opts) },
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return r.Watch(ctx, opts)
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &metav1.PartialObjectMetadata{}, resync, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	_ = inf.SetTransform(DropManagedFields) // fails only once started
	return inf
}
