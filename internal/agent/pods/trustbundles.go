package pods

import (
	"context"
	"fmt"

	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
)

// ClusterTrustBundle is the named bundle, nil when it does not exist.
func (s *sources) ClusterTrustBundle(ctx context.Context, name string) (*certificatesv1.ClusterTrustBundle, error) {
	b, err := s.m.api.ClusterTrustBundles().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("clustertrustbundle %q: %w", name, err)
	}
	return b, nil
}

// ClusterTrustBundles are the signer's bundles the selector picks.
func (s *sources) ClusterTrustBundles(ctx context.Context, signer string, selector labels.Selector) ([]certificatesv1.ClusterTrustBundle, error) {
	list, err := s.m.api.ClusterTrustBundles().List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.signerName", signer).String(), LabelSelector: selector.String()})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}
