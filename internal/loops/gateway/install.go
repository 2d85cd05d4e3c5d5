package gateway

import (
	"context"
	"fmt"
	"k8s.io/utils/ptr"
	"log/slog"
	"time"

	"github.com/orch-dev/orch/internal/gatewayapi"
	"github.com/orch-dev/orch/internal/kube"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Install puts the Gateway API's standard channel of the version orch
// implements in the cluster, before the loops' informers start on it:
// definitions that are missing are created, those of an older release
// updated, and those of a newer release, or of the experimental channel,
// left as the user installed them. With class, it then makes the
// GatewayClass orch (one deleted comes back at the next start, as the
// IngressClass does). It tries until it succeeds or ctx ends.
func Install(ctx context.Context, client *kube.Client, class bool, log *slog.Logger) error {
	crds, err := gatewayapi.CRDs()
	if err != nil {
		return err
	}
	for {
		err := install(ctx, client, crds, class, log)
		if err == nil || ctx.Err() != nil {
			return err
		}
		log.Warn("installing the Gateway API: trying again", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func install(ctx context.Context, client *kube.Client, crds []*apiextensionsv1.CustomResourceDefinition, class bool, log *slog.Logger) error {
	defs := client.CustomResourceDefinitions()
	for _, want := range crds {
		have, err := defs.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			if _, err := defs.Create(ctx, want.DeepCopy(), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("create %s: %w", want.Name, err)
			}
			log.Info("installed a Gateway API definition", "crd", want.Name, "version", gatewayapi.Version)
		case err != nil:
			return fmt.Errorf("read %s: %w", want.Name, err)
		case have.Annotations[gatewayapi.ChannelAnnotation] != want.Annotations[gatewayapi.ChannelAnnotation] || gatewayapi.Newer(have):
			log.Info("leaving a Gateway API definition the user installed", "crd", want.Name,
				"version", have.Annotations[gatewayapi.BundleVersionAnnotation], "channel", have.Annotations[gatewayapi.ChannelAnnotation])
		case have.Annotations[gatewayapi.BundleVersionAnnotation] != gatewayapi.Version:
			next := want.DeepCopy()
			next.ResourceVersion = have.ResourceVersion
			if _, err := defs.Update(ctx, next, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("update %s: %w", want.Name, err)
			}
			log.Info("upgraded a Gateway API definition", "crd", want.Name, "from", have.Annotations[gatewayapi.BundleVersionAnnotation], "to", gatewayapi.Version)
		}
	}
	// The kinds are served once their definitions are established.
	for _, want := range crds {
		if err := client.WaitEstablished(ctx, want.Name); err != nil {
			return err
		}
	}
	if !class {
		return nil
	}
	gc := &gatewayv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: gatewayapi.ClassName},
		Spec: gatewayv1.GatewayClassSpec{ControllerName: gatewayapi.ControllerName,
			Description: ptr.To("every node's proxy serves these Gateways (orch, built in)")}}
	if _, err := client.GatewayClasses().Create(ctx, gc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create GatewayClass %s: %w", gatewayapi.ClassName, err)
	}
	return nil
}
