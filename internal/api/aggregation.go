package api

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/api/pki"
	"github.com/orch-dev/orch/internal/api/registry"
	"github.com/orch-dev/orch/internal/api/resources/apiregistration"
	"github.com/orch-dev/orch/internal/api/rest"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
)

// The front proxy: the client certificate the server presents to the
// aggregated API servers, from a CA of its own that they trust for that
// only (Kubernetes' --requestheader-client-ca-file and
// --proxy-client-cert-file).
const (
	frontProxyDir  = "front-proxy"
	frontProxyName = "front-proxy-client"
)

// loadFrontProxy makes (once) the front proxy's CA, which never changes,
// and (while valid) its client certificate.
func (s *Server) loadFrontProxy(tlsDir string) error {
	ca, err := s.frontProxyAuthority(tlsDir)
	if err != nil {
		return err
	}
	s.frontProxyCA = ca.CertPEM
	return s.renewFrontProxy(ca, tlsDir)
}

func (s *Server) frontProxyAuthority(tlsDir string) (*pki.CA, error) {
	ca, err := pki.LoadOrCreateCA(filepath.Join(tlsDir, frontProxyDir))
	if err != nil {
		return nil, fmt.Errorf("front proxy CA: %w", err)
	}
	return ca, nil
}

// renewFrontProxy reissues the front proxy's client certificate when it
// nears expiry; it is presented from the next connection on.
func (s *Server) renewFrontProxy(ca *pki.CA, tlsDir string) error {
	dir := filepath.Join(tlsDir, frontProxyDir)
	kp, err := ca.LoadOrIssueClient(dir, frontProxyName, frontProxyName, nil)
	if err != nil {
		return fmt.Errorf("front proxy client certificate: %w", err)
	}
	cert, err := kp.TLS()
	if err != nil {
		return fmt.Errorf("front proxy client certificate: %w", err)
	}
	s.frontProxy.Store(&cert)
	return nil
}

// frontProxyCert is the front proxy's client certificate of the moment.
func (s *Server) frontProxyCert() *tls.Certificate { return s.frontProxy.Load() }

// aggregatedGroupVersions is what discovery lists of the aggregated APIs.
func (s *Server) aggregatedGroupVersions() []rest.AggregatedGroupVersion {
	gvs := s.aggregator.GroupVersions()
	out := make([]rest.AggregatedGroupVersion, len(gvs))
	for i, gv := range gvs {
		out[i] = rest.AggregatedGroupVersion{GroupVersion: gv.GroupVersion, Resources: gv.Resources, Available: gv.Available}
	}
	return out
}

// aggregatedOpenAPI are the aggregated group/versions whose OpenAPI
// documents the index lists: the available ones.
func (s *Server) aggregatedOpenAPI() []schema.GroupVersion {
	var out []schema.GroupVersion
	for _, gv := range s.aggregator.GroupVersions() {
		if gv.Available {
			out = append(out, gv.GroupVersion)
		}
	}
	return out
}

// runAggregation follows the APIServices, checks the aggregated ones,
// and keeps what Kubernetes keeps for them: an APIService per group/version
// served here (Local), and the ConfigMap kube-system/
// extension-apiserver-authentication that tells aggregated servers how to
// trust the front proxy.
func (s *Server) runAggregation(ctx context.Context) {
	st := s.storage(apiregistration.Group, "apiservices")
	go follow(ctx, st, s.aggregator, s.log)
	go s.aggregator.Run(ctx, s.setAPIServiceStatus)
	go func() {
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		for {
			if err := s.publishAuthentication(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("extension-apiserver-authentication not published", "err", err)
			}
			if err := s.publishServingBundle(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("the API server's trust bundle not published", "err", err)
			}
			// Every time, not only when the served kinds change: one a
			// user deleted (their metrics-server's, replacing orch's own
			// metrics.k8s.io) is made again.
			if err := s.registerLocalAPIServices(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("local APIServices not registered", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

// automanagedLabel marks the APIServices the server made for its own
// group/versions, as kube-aggregator's autoregistration marks them.
const automanagedLabel = "kube-aggregator.kubernetes.io/automanaged"

// groupPriorities are Kubernetes' priorities of its groups in discovery
// (kube-apiserver's table); other groups (custom resources) get 1000.
var groupPriorities = map[string]int32{
	"": 18000, "apps": 17800, "events.k8s.io": 17750, "authentication.k8s.io": 17700, "authorization.k8s.io": 17600,
	"autoscaling": 17500, "batch": 17400, "certificates.k8s.io": 17300, "networking.k8s.io": 17200, "policy": 17100,
	"rbac.authorization.k8s.io": 17000, "storage.k8s.io": 16800, "apiextensions.k8s.io": 16700, "admissionregistration.k8s.io": 16700,
	"scheduling.k8s.io": 16600, "coordination.k8s.io": 16500, "node.k8s.io": 16300, "discovery.k8s.io": 16200, "resource.k8s.io": 16200, "storagemigration.k8s.io": 15800,
	"flowcontrol.apiserver.k8s.io": 16100, "apiregistration.k8s.io": 18000, "metrics.k8s.io": 100,
}

// registerLocalAPIServices makes an APIService, Available as Local, for
// each group/version the server serves itself, and removes those it made
// for group/versions no longer served (a custom resource's definition
// deleted). An APIService a user pointed at a Service is left alone:
// metrics-server's v1beta1.metrics.k8s.io replaces orch's own.
func (s *Server) registerLocalAPIServices(ctx context.Context) error {
	st := s.storage(apiregistration.Group, "apiservices")
	want := map[string]schema.GroupVersion{}
	var order []string
	for _, served := range s.catalog.Load().Storages {
		gv := served.Resource.GroupVersion()
		name := gv.Version + "." + gv.Group
		if _, ok := want[name]; !ok {
			want[name] = gv
			order = append(order, name)
		}
	}
	list, err := st.List(ctx, "", &metav1.ListOptions{})
	if err != nil {
		return err
	}
	have := map[string]*apiregistrationv1.APIService{}
	for i := range list.(*apiregistrationv1.APIServiceList).Items {
		svc := &list.(*apiregistrationv1.APIServiceList).Items[i]
		have[svc.Name] = svc
		if _, served := want[svc.Name]; !served && svc.Spec.Service == nil && svc.Labels[automanagedLabel] != "" {
			if _, err := st.Delete(ctx, "", svc.Name, &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &svc.UID}}, registry.WriteOptions{}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return err
			}
		}
	}
	for _, name := range order {
		gv := want[name]
		cur := have[name]
		if cur == nil {
			priority, managed := int32(1000), "true"
			versionPriority := int32(100)
			if p, ok := groupPriorities[gv.Group]; ok {
				priority, managed, versionPriority = p, "onstart", 15
			}
			obj := &apiregistrationv1.APIService{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{automanagedLabel: managed}},
				Spec: apiregistrationv1.APIServiceSpec{Group: gv.Group, Version: gv.Version, GroupPriorityMinimum: priority, VersionPriority: versionPriority}}
			if _, err := st.Create(ctx, obj, registry.WriteOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("APIService %s: %w", name, err)
			}
		} else if cur.Spec.Service != nil || local(cur) {
			continue
		}
		if err := s.setAPIServiceStatus(ctx, name, apiregistrationv1.APIServiceCondition{Type: apiregistrationv1.Available,
			Status: apiregistrationv1.ConditionTrue, Reason: "Local", Message: "Local APIServices are always available", LastTransitionTime: metav1.Now()}); err != nil {
			return err
		}
	}
	return nil
}

// local: the APIService says it is served here and available.
func local(s *apiregistrationv1.APIService) bool {
	for _, c := range s.Status.Conditions {
		if c.Type == apiregistrationv1.Available {
			return c.Status == apiregistrationv1.ConditionTrue && c.Reason == "Local"
		}
	}
	return false
}

// setAPIServiceStatus writes an APIService's Available condition.
func (s *Server) setAPIServiceStatus(ctx context.Context, name string, cond apiregistrationv1.APIServiceCondition) error {
	st := s.storage(apiregistration.Group, "apiservices")
	_, _, err := st.Update(ctx, "", name, func(_ context.Context, cur runtime.Object) (runtime.Object, error) {
		if cur == nil {
			return nil, apierrors.NewNotFound(st.Resource.GroupResource(), name)
		}
		svc := cur.(*apiregistrationv1.APIService).DeepCopy()
		svc.ResourceVersion = ""
		kept := svc.Status.Conditions[:0]
		for _, c := range svc.Status.Conditions {
			if c.Type != cond.Type {
				kept = append(kept, c)
			}
		}
		svc.Status.Conditions = append(kept, cond)
		return svc, nil
	}, registry.UpdateOptions{Subresource: "status"})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Kubernetes' names for what aggregated servers read to trust the front
// proxy.
const (
	authenticationConfigMap  = "extension-apiserver-authentication"
	authenticationReaderRole = "extension-apiserver-authentication-reader"
)

// publishAuthentication keeps kube-system/extension-apiserver-authentication
// as kube-apiserver publishes it — the CA of client certificates, the front
// proxy's CA, its name and headers — and the Role that may read it
// (which an aggregated server's RoleBinding names).
func (s *Server) publishAuthentication(ctx context.Context) error {
	data := map[string]string{
		"client-ca-file":                     string(s.ca().Bundle()),
		"requestheader-client-ca-file":       string(s.frontProxyCA),
		"requestheader-allowed-names":        `["` + frontProxyName + `"]`,
		"requestheader-username-headers":     `["X-Remote-User"]`,
		"requestheader-uid-headers":          `["X-Remote-Uid"]`,
		"requestheader-group-headers":        `["X-Remote-Group"]`,
		"requestheader-extra-headers-prefix": `["X-Remote-Extra-"]`,
	}
	cms := s.storage("", "configmaps")
	cur, err := cms.Get(ctx, metav1.NamespaceSystem, authenticationConfigMap)
	switch {
	case apierrors.IsNotFound(err):
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: authenticationConfigMap, Namespace: metav1.NamespaceSystem}, Data: data}, registry.WriteOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	case err != nil:
		return err
	default:
		cm := cur.(*corev1.ConfigMap)
		if !maps.Equal(cm.Data, data) {
			cm = cm.DeepCopy()
			cm.Data, cm.ResourceVersion = data, ""
			if _, _, err := cms.Update(ctx, cm.Namespace, cm.Name, func(context.Context, runtime.Object) (runtime.Object, error) { return cm, nil }, registry.UpdateOptions{}); err != nil {
				return err
			}
		}
	}
	roles := s.storage(rbacv1.GroupName, "roles")
	if _, err := roles.Get(ctx, metav1.NamespaceSystem, authenticationReaderRole); apierrors.IsNotFound(err) {
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: authenticationReaderRole, Namespace: metav1.NamespaceSystem,
			Annotations: map[string]string{"rbac.authorization.kubernetes.io/autoupdate": "true"}, Labels: map[string]string{"kubernetes.io/bootstrapping": "rbac-defaults"}},
			Rules: []rbacv1.PolicyRule{{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{authenticationConfigMap}}}}
		if _, err := roles.Create(ctx, role, registry.WriteOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	} else if err != nil {
		return err
	}
	return nil
}

// servingSigner is the signer whose ClusterTrustBundle holds what
// verifies the API server's serving certificate, as Kubernetes' publisher
// names it.
const servingSigner = "kubernetes.io/kube-apiserver-serving"

// publishServingBundle keeps one ClusterTrustBundle of the signer
// kubernetes.io/kube-apiserver-serving holding the cluster CA bundle (a
// rotated CA and its endorsement too), named
// kubernetes.io:kube-apiserver-serving:<hash>, as Kubernetes' publisher
// does: a new CA makes a new bundle, the old ones are removed.
func (s *Server) publishServingBundle(ctx context.Context) error {
	st := s.storage(certificatesv1.GroupName, "clustertrustbundles")
	bundle := s.ca().Bundle()
	sum := sha256.Sum256(bundle)
	name := fmt.Sprintf("%s:%x", strings.ReplaceAll(servingSigner, "/", ":"), sum[:12])
	list, err := st.List(ctx, "", &metav1.ListOptions{FieldSelector: "spec.signerName=" + servingSigner})
	if err != nil {
		return err
	}
	found := false
	for _, b := range list.(*certificatesv1.ClusterTrustBundleList).Items {
		if b.Name == name {
			found = true
			continue
		}
		if _, err := st.Delete(ctx, "", b.Name, &metav1.DeleteOptions{}, registry.WriteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	if found {
		return nil
	}
	_, err = st.Create(ctx, &certificatesv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: servingSigner, TrustBundle: string(bundle)}}, registry.WriteOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
