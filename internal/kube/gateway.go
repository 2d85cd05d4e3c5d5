package kube

import (
	"context"
	"fmt"
	"time"

	"github.com/orch-dev/orch/internal/gatewayapi"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/listers"
	corelisters "k8s.io/client-go/listers/core/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// The Gateway API's kinds are custom resources: the server installs their
// definitions (internal/loops/gateway), and these reach them as any client
// does. Their listers are client-go's generic ones.

// GatewayLister lists one Gateway API kind from an informer's cache.
type GatewayLister[T runtime.Object] = listers.ResourceIndexer[T]

// CustomResourceDefinitions is typed access to CustomResourceDefinitions.
func (c *Client) CustomResourceDefinitions() Resource[*apiextensionsv1.CustomResourceDefinition, *apiextensionsv1.CustomResourceDefinitionList] {
	return resource(c, apiextensionsv1.SchemeGroupVersion, "customresourcedefinitions", "",
		func() *apiextensionsv1.CustomResourceDefinition { return &apiextensionsv1.CustomResourceDefinition{} },
		func() *apiextensionsv1.CustomResourceDefinitionList {
			return &apiextensionsv1.CustomResourceDefinitionList{}
		})
}

// GatewayClasses is typed access to GatewayClasses.
func (c *Client) GatewayClasses() Resource[*gatewayv1.GatewayClass, *gatewayv1.GatewayClassList] {
	return resource(c, gatewayapi.GroupVersion, "gatewayclasses", "",
		func() *gatewayv1.GatewayClass { return &gatewayv1.GatewayClass{} }, func() *gatewayv1.GatewayClassList { return &gatewayv1.GatewayClassList{} })
}

// Gateways is typed access to Gateways.
func (c *Client) Gateways(ns string) Resource[*gatewayv1.Gateway, *gatewayv1.GatewayList] {
	return resource(c, gatewayapi.GroupVersion, "gateways", ns,
		func() *gatewayv1.Gateway { return &gatewayv1.Gateway{} }, func() *gatewayv1.GatewayList { return &gatewayv1.GatewayList{} })
}

// HTTPRoutes is typed access to HTTPRoutes.
func (c *Client) HTTPRoutes(ns string) Resource[*gatewayv1.HTTPRoute, *gatewayv1.HTTPRouteList] {
	return resource(c, gatewayapi.GroupVersion, "httproutes", ns,
		func() *gatewayv1.HTTPRoute { return &gatewayv1.HTTPRoute{} }, func() *gatewayv1.HTTPRouteList { return &gatewayv1.HTTPRouteList{} })
}

// ReferenceGrants is typed access to ReferenceGrants.
func (c *Client) ReferenceGrants(ns string) Resource[*gatewayv1.ReferenceGrant, *gatewayv1.ReferenceGrantList] {
	return resource(c, gatewayapi.GroupVersion, "referencegrants", ns,
		func() *gatewayv1.ReferenceGrant { return &gatewayv1.ReferenceGrant{} }, func() *gatewayv1.ReferenceGrantList { return &gatewayv1.ReferenceGrantList{} })
}

// GatewayClasses is the shared GatewayClass informer.
func (f *Informers) GatewayClasses() Shared[GatewayLister[*gatewayv1.GatewayClass]] {
	inf := informerFor(f, "gatewayclasses", f.client.GatewayClasses(), &gatewayv1.GatewayClass{})
	return Shared[GatewayLister[*gatewayv1.GatewayClass]]{inf, listers.New[*gatewayv1.GatewayClass](inf.GetIndexer(), gatewayv1.Resource("gatewayclass"))}
}

// Gateways is the shared Gateway informer.
func (f *Informers) Gateways() Shared[GatewayLister[*gatewayv1.Gateway]] {
	inf := informerFor(f, "gateways", f.client.Gateways(""), &gatewayv1.Gateway{})
	return Shared[GatewayLister[*gatewayv1.Gateway]]{inf, listers.New[*gatewayv1.Gateway](inf.GetIndexer(), gatewayv1.Resource("gateway"))}
}

// HTTPRoutes is the shared HTTPRoute informer.
func (f *Informers) HTTPRoutes() Shared[GatewayLister[*gatewayv1.HTTPRoute]] {
	inf := informerFor(f, "httproutes", f.client.HTTPRoutes(""), &gatewayv1.HTTPRoute{})
	return Shared[GatewayLister[*gatewayv1.HTTPRoute]]{inf, listers.New[*gatewayv1.HTTPRoute](inf.GetIndexer(), gatewayv1.Resource("httproute"))}
}

// ReferenceGrants is the shared ReferenceGrant informer.
func (f *Informers) ReferenceGrants() Shared[GatewayLister[*gatewayv1.ReferenceGrant]] {
	inf := informerFor(f, "referencegrants", f.client.ReferenceGrants(""), &gatewayv1.ReferenceGrant{})
	return Shared[GatewayLister[*gatewayv1.ReferenceGrant]]{inf, listers.New[*gatewayv1.ReferenceGrant](inf.GetIndexer(), gatewayv1.Resource("referencegrant"))}
}

// ConfigMapNamedIn is a shared informer of the one ConfigMap of that name
// in that namespace (the nodes' Gateway routes): a node may read it and
// nothing else of the namespace.
func (f *Informers) ConfigMapNamedIn(namespace, name string) Shared[corelisters.ConfigMapLister] {
	inf := selectingInformer(f, "configmaps/"+namespace+"/"+name, f.client.ConfigMaps(namespace), "metadata.name="+name, &corev1.ConfigMap{})
	return Shared[corelisters.ConfigMapLister]{inf, corelisters.NewConfigMapLister(inf.GetIndexer())}
}

// WaitEstablished waits (30 s at most) until the definition called name
// is established: its kind is served.
func (c *Client) WaitEstablished(ctx context.Context, name string) error {
	defs := c.CustomResourceDefinitions()
	deadline := time.Now().Add(30 * time.Second)
	for {
		crd, err := defs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is not established", name)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
