package rbac

import (
	"strings"

	"github.com/orch-dev/orch/internal/api/auth"
	"github.com/orch-dev/orch/internal/joinproto"
	certificatesv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The bootstrap policy is the one Kubernetes ships (its bootstrappolicy
// package), for what orch serves: the roles users bind (cluster-admin,
// admin, edit, view, the last three filled by aggregation), what every
// user may do (discovery, the self reviews, public information) and the
// nodes' service proxy's role. The server reconciles it at each start:
// what is missing is added, nothing a user added is removed, and an
// object annotated rbac.authorization.kubernetes.io/autoupdate=false is
// left alone.

// LoopsRole is the ClusterRole of the server's control loops.
const LoopsRole = "system:orch-loops"

// AutoUpdateAnnotation opts a bootstrap object out of reconciliation.
const AutoUpdateAnnotation = "rbac.authorization.kubernetes.io/autoupdate"

// Aggregation labels: a ClusterRole carrying one adds its rules to the
// role of that name.
const (
	AggregateToAdmin = "rbac.authorization.k8s.io/aggregate-to-admin"
	AggregateToEdit  = "rbac.authorization.k8s.io/aggregate-to-edit"
	AggregateToView  = "rbac.authorization.k8s.io/aggregate-to-view"
)

var (
	read      = []string{"get", "list", "watch"}
	write     = []string{"create", "delete", "deletecollection", "patch", "update"}
	readWrite = []string{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
)

// Everything is cluster-admin's rules: every verb on every resource and
// every URL.
var Everything = []rbacv1.PolicyRule{rule([]string{"*"}, "*", "*"), urls([]string{"*"}, "*")}

func rule(verbs []string, group string, resources ...string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{Verbs: verbs, APIGroups: []string{group}, Resources: resources}
}

func urls(verbs []string, paths ...string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{Verbs: verbs, NonResourceURLs: paths}
}

func bootstrapMeta(name string, labels map[string]string) metav1.ObjectMeta {
	l := map[string]string{"kubernetes.io/bootstrapping": "rbac-defaults"}
	for k, v := range labels {
		l[k] = v
	}
	return metav1.ObjectMeta{Name: name, Labels: l, Annotations: map[string]string{AutoUpdateAnnotation: "true"}}
}

func aggregated(name, label string, labels map[string]string) rbacv1.ClusterRole {
	return rbacv1.ClusterRole{ObjectMeta: bootstrapMeta(name, labels), AggregationRule: &rbacv1.AggregationRule{
		ClusterRoleSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{label: "true"}}}}}
}

// ClusterRoles is Kubernetes' bootstrap ClusterRoles, as orch serves them.
func ClusterRoles() []rbacv1.ClusterRole {
	return []rbacv1.ClusterRole{
		{ObjectMeta: bootstrapMeta("cluster-admin", nil), Rules: Everything},
		{ObjectMeta: bootstrapMeta("system:discovery", nil), Rules: []rbacv1.PolicyRule{
			urls([]string{"get"}, "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz", "/version", "/version/")}},
		{ObjectMeta: bootstrapMeta("system:basic-user", nil), Rules: []rbacv1.PolicyRule{
			rule([]string{"create"}, "authorization.k8s.io", "selfsubjectaccessreviews", "selfsubjectrulesreviews"),
			rule([]string{"create"}, "authentication.k8s.io", "selfsubjectreviews")}},
		{ObjectMeta: bootstrapMeta("system:public-info-viewer", nil), Rules: []rbacv1.PolicyRule{
			urls([]string{"get"}, "/healthz", "/livez", "/readyz", "/version", "/version/")}},
		// The user-facing roles: rules come from the system:aggregate-to-*
		// roles and anything else labelled for them.
		aggregated("admin", AggregateToAdmin, nil),
		aggregated("edit", AggregateToEdit, map[string]string{AggregateToAdmin: "true"}),
		aggregated("view", AggregateToView, map[string]string{AggregateToEdit: "true"}),
		{ObjectMeta: bootstrapMeta("system:aggregate-to-admin", map[string]string{AggregateToAdmin: "true"}), Rules: []rbacv1.PolicyRule{
			rule([]string{"create"}, "authorization.k8s.io", "localsubjectaccessreviews"),
			rule(readWrite, rbacv1.GroupName, "rolebindings", "roles"),
		}},
		{ObjectMeta: bootstrapMeta("system:aggregate-to-edit", map[string]string{AggregateToEdit: "true"}), Rules: []rbacv1.PolicyRule{
			rule([]string{"impersonate"}, "", "serviceaccounts"),
			rule(write, "", "pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"),
			rule([]string{"create"}, "", "pods/eviction"),
			rule(write, "", "configmaps", "events", "persistentvolumeclaims", "replicationcontrollers", "replicationcontrollers/scale",
				"secrets", "serviceaccounts", "services", "services/proxy"),
			rule([]string{"create"}, "", "serviceaccounts/token"),
			rule(write, "apps", "daemonsets", "deployments", "deployments/rollback", "deployments/scale", "replicasets",
				"replicasets/scale", "statefulsets", "statefulsets/scale"),
			rule(write, "autoscaling", "horizontalpodautoscalers"),
			rule(write, "batch", "cronjobs", "jobs"),
			rule(write, "policy", "poddisruptionbudgets"),
			rule(write, "networking.k8s.io", "ingresses", "networkpolicies"),
			rule(write, "resource.k8s.io", "resourceclaims", "resourceclaimtemplates"),
			rule(read, "", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets", "services/proxy"),
		}},
		{ObjectMeta: bootstrapMeta("system:aggregate-to-view", map[string]string{AggregateToView: "true"}), Rules: []rbacv1.PolicyRule{
			rule(read, "", "configmaps", "endpoints", "persistentvolumeclaims", "persistentvolumeclaims/status", "pods",
				"replicationcontrollers", "replicationcontrollers/scale", "serviceaccounts", "services", "services/status"),
			rule(read, "", "bindings", "events", "limitranges", "namespaces/status", "pods/log", "pods/status",
				"replicationcontrollers/status", "resourcequotas", "resourcequotas/status"),
			rule(read, "", "namespaces"),
			rule(read, "discovery.k8s.io", "endpointslices"),
			rule(read, "apps", "controllerrevisions", "daemonsets", "daemonsets/status", "deployments", "deployments/scale",
				"deployments/status", "replicasets", "replicasets/scale", "replicasets/status", "statefulsets",
				"statefulsets/scale", "statefulsets/status"),
			rule(read, "autoscaling", "horizontalpodautoscalers", "horizontalpodautoscalers/status"),
			rule(read, "batch", "cronjobs", "cronjobs/status", "jobs", "jobs/status"),
			rule(read, "policy", "poddisruptionbudgets", "poddisruptionbudgets/status"),
			rule(read, "networking.k8s.io", "ingresses", "ingresses/status", "networkpolicies"),
			rule(read, "resource.k8s.io", "resourceclaims", "resourceclaims/status", "resourceclaimtemplates"),
		}},
		// What metrics-server's manifest adds (k3s ships it): reading
		// metrics.k8s.io, aggregated into view, edit and admin, so whoever
		// may read pods may `kubectl top` them.
		{ObjectMeta: bootstrapMeta("system:aggregated-metrics-reader", map[string]string{AggregateToView: "true", AggregateToEdit: "true", AggregateToAdmin: "true"}),
			Rules: []rbacv1.PolicyRule{rule(read, "metrics.k8s.io", "nodes", "pods")}},
		// Who may scrape the API server's own metrics and health (bound
		// to the group system:monitoring).
		{ObjectMeta: bootstrapMeta("system:monitoring", nil), Rules: []rbacv1.PolicyRule{
			urls([]string{"get"}, "/healthz", "/healthz/*", "/livez", "/livez/*", "/metrics", "/metrics/slis", "/readyz", "/readyz/*")}},
		// Who may verify the cluster's tokens and ask about others' access
		// (what a webhook-authenticating server such as metrics-server
		// is bound to), and where the tokens' keys are published.
		{ObjectMeta: bootstrapMeta("system:auth-delegator", nil), Rules: []rbacv1.PolicyRule{
			rule([]string{"create"}, "authentication.k8s.io", "tokenreviews"),
			rule([]string{"create"}, "authorization.k8s.io", "subjectaccessreviews"),
		}},
		{ObjectMeta: bootstrapMeta("system:service-account-issuer-discovery", nil), Rules: []rbacv1.PolicyRule{
			urls([]string{"get"}, "/.well-known/openid-configuration", "/.well-known/openid-configuration/", "/openid/v1/jwks", "/openid/v1/jwks/"),
		}},
		// The server's control loops, under their own identity: what
		// Kubernetes' controllers hold between them (the garbage collector
		// and the namespace controller read, change and delete every
		// kind), creation of only what the loops make, and escalate on
		// ClusterRoles for aggregation. Not theirs: impersonation, tokens,
		// new Secrets, bindings or roles.
		{ObjectMeta: bootstrapMeta(LoopsRole, nil), Rules: []rbacv1.PolicyRule{
			rule([]string{"delete", "deletecollection", "get", "list", "patch", "update", "watch"}, "*", "*"),
			rule([]string{"create"}, "", "configmaps", "endpoints", "events", "persistentvolumeclaims", "persistentvolumes", "pods", "pods/binding", "pods/eviction", "serviceaccounts"),
			rule([]string{"create"}, "batch", "jobs"),
			rule([]string{"create"}, "apps", "controllerrevisions", "replicasets"),
			rule([]string{"create"}, "discovery.k8s.io", "endpointslices"),
			rule([]string{"create"}, "events.k8s.io", "events"),
			// Servers sharing a datastore elect the one that runs the
			// loops with a Lease, as kube-controller-manager's role allows.
			rule([]string{"create"}, "coordination.k8s.io", "leases"),
			// The Gateway API: its definitions, the class orch, and each
			// Gateway's Service.
			rule([]string{"create"}, "apiextensions.k8s.io", "customresourcedefinitions"),
			rule([]string{"create"}, "gateway.networking.k8s.io", "gatewayclasses"),
			rule([]string{"create"}, "", "services"),
			rule([]string{"escalate"}, rbacv1.GroupName, "clusterroles"),
			// The certificate loops: the approver asks who may have a
			// node's certificate and approves only those; the signer
			// signs for the built-in signers but the legacy one.
			rule([]string{"create"}, "authorization.k8s.io", "subjectaccessreviews"),
			{Verbs: []string{"approve"}, APIGroups: []string{certificatesv1.GroupName}, Resources: []string{"signers"},
				ResourceNames: []string{certificatesv1.KubeAPIServerClientKubeletSignerName}},
			{Verbs: []string{"sign"}, APIGroups: []string{certificatesv1.GroupName}, Resources: []string{"signers"},
				ResourceNames: []string{certificatesv1.KubeAPIServerClientSignerName, certificatesv1.KubeAPIServerClientKubeletSignerName, certificatesv1.KubeletServingSignerName}},
		}},
		// Who may approve requests for each built-in signer, and what
		// the certificate approver loop checks before approving a node's
		// request for a client certificate (nodeclient: any node's, as a
		// bootstrap identity asks; selfnodeclient: the asker's own), as
		// Kubernetes bootstraps them.
		signerApprover(certificatesv1.KubeAPIServerClientSignerName),
		signerApprover(certificatesv1.KubeAPIServerClientKubeletSignerName),
		signerApprover(certificatesv1.KubeletServingSignerName),
		signerApprover("kubernetes.io/legacy-unknown"),
		{ObjectMeta: bootstrapMeta(NodeClientRole, nil), Rules: []rbacv1.PolicyRule{
			rule([]string{"create"}, certificatesv1.GroupName, "certificatesigningrequests/nodeclient")}},
		{ObjectMeta: bootstrapMeta(SelfNodeClientRole, nil), Rules: []rbacv1.PolicyRule{
			rule([]string{"create"}, certificatesv1.GroupName, "certificatesigningrequests/selfnodeclient")}},
		// kube-proxy's role: here the agents' service proxy, pod network
		// and cluster DNS, which share its identity.
		{ObjectMeta: bootstrapMeta("system:node-proxier", nil), Rules: []rbacv1.PolicyRule{
			rule(read, "", "endpoints", "services"),
			rule(read, "", "nodes"),
			rule([]string{"create", "patch", "update"}, "", "events"),
			rule([]string{"create", "patch", "update"}, "events.k8s.io", "events"),
			rule(read, "discovery.k8s.io", "endpointslices"),
		}},
		// The agents' NetworkPolicy engine, which shares the proxy's
		// identity: a policy's peers are any pod of any namespace, so it
		// reads them all, as kube-router's role in k3s does.
		{ObjectMeta: bootstrapMeta(NetworkPolicyRole, nil), Rules: []rbacv1.PolicyRule{
			rule(read, "", "pods", "namespaces"),
			rule(read, "networking.k8s.io", "networkpolicies"),
		}},
	}
}

// NetworkPolicyRole is the ClusterRole of the nodes' NetworkPolicy
// engines.
const NetworkPolicyRole = "system:orch:network-policy"

// The ClusterRoles the certificate approver checks a node's request
// for a client certificate against (by a SubjectAccessReview of its
// requester on certificatesigningrequests/<that subresource>).
const (
	NodeClientRole     = "system:certificates.k8s.io:certificatesigningrequests:nodeclient"
	SelfNodeClientRole = "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient"
)

// signerApprover is Kubernetes' role that may approve requests for one
// signer: system:certificates.k8s.io:<signer's path>-approver.
func signerApprover(signer string) rbacv1.ClusterRole {
	_, path, _ := strings.Cut(signer, "/")
	return rbacv1.ClusterRole{ObjectMeta: bootstrapMeta("system:certificates.k8s.io:"+path+"-approver", nil), Rules: []rbacv1.PolicyRule{
		{Verbs: []string{"approve"}, APIGroups: []string{certificatesv1.GroupName}, Resources: []string{"signers"}, ResourceNames: []string{signer}}}}
}

func crb(name, role string, subjects ...rbacv1.Subject) rbacv1.ClusterRoleBinding {
	return rbacv1.ClusterRoleBinding{ObjectMeta: bootstrapMeta(name, nil),
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role}, Subjects: subjects}
}

func group(name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: name}
}

// ClusterRoleBindings is Kubernetes' bootstrap ClusterRoleBindings.
func ClusterRoleBindings() []rbacv1.ClusterRoleBinding {
	return []rbacv1.ClusterRoleBinding{
		crb("cluster-admin", "cluster-admin", group(auth.GroupMasters)),
		crb("system:discovery", "system:discovery", group(auth.GroupAuthenticated)),
		crb("system:basic-user", "system:basic-user", group(auth.GroupAuthenticated)),
		crb("system:public-info-viewer", "system:public-info-viewer", group(auth.GroupAuthenticated), group(auth.GroupUnauthenticated)),
		crb("system:monitoring", "system:monitoring", group("system:monitoring")),
		crb("system:service-account-issuer-discovery", "system:service-account-issuer-discovery", group(auth.GroupServiceAccounts)),
		crb(LoopsRole, LoopsRole, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: auth.LoopsUser}),
		crb("system:node-proxier", "system:node-proxier", rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: joinproto.ProxyUser}),
		crb(NetworkPolicyRole, NetworkPolicyRole, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: joinproto.ProxyUser}),
		// Nodes renew their own client certificates without a person
		// approving (kubeadm binds the same, as
		// kubeadm:node-autoapprove-certificate-rotation).
		crb("system:orch:node-autoapprove-certificate-rotation", SelfNodeClientRole, group(auth.GroupNodes)),
	}
}
