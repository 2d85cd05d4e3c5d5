package upgrade

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/upgradeapi"
)

// Install puts the Upgrade kind's definition in the cluster (or brings it
// to this orch's), before the loop's informer starts on it; it tries
// until it succeeds or ctx ends.
func Install(ctx context.Context, client *kube.Client, log *slog.Logger) error {
	for {
		err := install(ctx, client, upgradeapi.CRD(), log)
		if err == nil || ctx.Err() != nil {
			return err
		}
		log.Warn("installing the Upgrade kind: trying again", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func install(ctx context.Context, client *kube.Client, want *apiextensionsv1.CustomResourceDefinition, log *slog.Logger) error {
	defs := client.CustomResourceDefinitions()
	have, err := defs.Get(ctx, want.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := defs.Create(ctx, want, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %s: %w", want.Name, err)
		}
		log.Info("installed the Upgrade kind", "crd", want.Name)
	case err != nil:
		return fmt.Errorf("read %s: %w", want.Name, err)
	case !equality.Semantic.DeepEqual(have.Spec.Versions, want.Spec.Versions):
		next := have.DeepCopy()
		next.Spec = want.Spec
		if _, err := defs.Update(ctx, next, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update %s: %w", want.Name, err)
		}
		log.Info("updated the Upgrade kind", "crd", want.Name)
	}
	return client.WaitEstablished(ctx, want.Name)
}
