package dns

import (
	"fmt"

	"github.com/orch-dev/orch/internal/kube"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// The informers' indexes the zone looks names and addresses up by.
const (
	byClusterIP  = "dns-cluster-ip"
	byService    = "dns-service"
	byEndpointIP = "dns-endpoint-ip"
)

// informerCluster is the cluster as the node's informers hold it.
type informerCluster struct {
	services, slices toolscache.Indexer
}

// NewCluster reads Services and EndpointSlices from informers (the
// service proxy's, shared), adding the indexes it looks them up by; it
// must be called before they start.
func NewCluster(informers *kube.Informers) (Cluster, error) {
	svcs, eps := informers.Services().Informer(), informers.EndpointSlices().Informer()
	if err := svcs.AddIndexers(toolscache.Indexers{byClusterIP: func(obj any) ([]string, error) {
		svc, ok := obj.(*corev1.Service)
		if !ok || svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
			return nil, nil
		}
		return []string{svc.Spec.ClusterIP}, nil
	}}); err != nil {
		return nil, fmt.Errorf("cluster DNS: %w", err)
	}
	if err := eps.AddIndexers(toolscache.Indexers{
		byService: func(obj any) ([]string, error) {
			s, ok := obj.(*discoveryv1.EndpointSlice)
			if !ok || s.Labels[discoveryv1.LabelServiceName] == "" {
				return nil, nil
			}
			return []string{s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]}, nil
		},
		byEndpointIP: func(obj any) ([]string, error) {
			s, ok := obj.(*discoveryv1.EndpointSlice)
			if !ok {
				return nil, nil
			}
			var ips []string
			for _, e := range s.Endpoints {
				if len(e.Addresses) > 0 {
					ips = append(ips, e.Addresses[0])
				}
			}
			return ips, nil
		},
	}); err != nil {
		return nil, fmt.Errorf("cluster DNS: %w", err)
	}
	return &informerCluster{services: svcs.GetIndexer(), slices: eps.GetIndexer()}, nil
}

func (c *informerCluster) Service(namespace, name string) (*corev1.Service, bool) {
	obj, ok, err := c.services.GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil, false
	}
	svc, ok := obj.(*corev1.Service)
	return svc, ok
}

func (c *informerCluster) Slices(namespace, name string) []*discoveryv1.EndpointSlice {
	return indexed[*discoveryv1.EndpointSlice](c.slices, byService, namespace+"/"+name)
}

func (c *informerCluster) ServicesByIP(ip string) []*corev1.Service {
	return indexed[*corev1.Service](c.services, byClusterIP, ip)
}

func (c *informerCluster) SlicesByIP(ip string) []*discoveryv1.EndpointSlice {
	return indexed[*discoveryv1.EndpointSlice](c.slices, byEndpointIP, ip)
}

func (c *informerCluster) HasNamespace(namespace string) bool {
	keys, err := c.services.IndexKeys(toolscache.NamespaceIndex, namespace)
	return err == nil && len(keys) > 0
}

func indexed[T any](idx toolscache.Indexer, index, key string) []T {
	objs, err := idx.ByIndex(index, key)
	if err != nil {
		return nil
	}
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}
