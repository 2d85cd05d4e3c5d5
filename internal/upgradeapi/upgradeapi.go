// Package upgradeapi is what the server's upgrade loop, the nodes and
// orch's commands agree on to roll a new orch over the cluster: the
// Upgrade kind (upgrades.orch.dev, a custom resource the server installs)
// and the Node annotations through which the loop tells a node which
// release to run and the node answers what it runs.
package upgradeapi

import (
	"encoding/json"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the Upgrade kind's.
var GroupVersion = schema.GroupVersion{Group: "orch.dev", Version: "v1alpha1"}

// What a node says of itself, on its Node.
const (
	// VersionAnnotation is the orch version the node runs.
	VersionAnnotation = "orch.dev/version"
	// PlatformAnnotation is the platform of its binary (linux/arm/v6:
	// finer than the kubernetes.io/arch label).
	PlatformAnnotation = "orch.dev/platform"
	// FailedAnnotation is the last upgrade the node rolled back:
	// "VERSION: reason".
	FailedAnnotation = "upgrade.orch.dev/failed"
	// TrialAnnotation says the node runs VersionAnnotation's binary on
	// trial: it has not yet been Ready on it, and may still go back.
	TrialAnnotation = "upgrade.orch.dev/trial"
)

// What the upgrade loop tells a node, on its Node: run TargetAnnotation's
// version, whose binary has SHA256Annotation's sum, and be Ready on it
// within TimeoutAnnotation's seconds or go back; download it at no more
// than RateAnnotation's bytes a second.
const (
	TargetAnnotation  = "upgrade.orch.dev/target"
	SHA256Annotation  = "upgrade.orch.dev/sha256"
	TimeoutAnnotation = "upgrade.orch.dev/timeout-seconds"
	RateAnnotation    = "upgrade.orch.dev/bytes-per-second"
)

// ControlPlaneLabel marks the Nodes of servers, as k3s marks them: the
// loop upgrades them first.
const ControlPlaneLabel = "node-role.kubernetes.io/control-plane"

// Server is one of the cluster's API servers as the upgrade loop sees it:
// its address, the orch it runs ("" for one too old to say) and its Node
// ("" when it runs no agent: the loop cannot upgrade it, and agents may
// not pass it).
type Server struct {
	Address, Version, Node string
}

// ReleasesPath is where the API serves the releases its server holds:
// ReleasesPath + VERSION/PLATFORM (GET, with Range: a download resumes).
const ReleasesPath = "/orch/releases/"

// Phases of an Upgrade.
const (
	PhasePending   = "Pending"
	PhaseRunning   = "Running"
	PhasePaused    = "Paused"
	PhaseSucceeded = "Succeeded"
	PhaseFailed    = "Failed"
)

// Phases of a node in an Upgrade.
const (
	NodeWaiting    = "Waiting"
	NodeDraining   = "Draining"
	NodeUpgrading  = "Upgrading"
	NodeUpgraded   = "Upgraded"
	NodeSkipped    = "Skipped" // already on the version
	NodeFailed     = "Failed"
	NodeRolledBack = "RolledBack"
)

// Upgrade is a plan to move the nodes it selects to a version of orch.
type Upgrade struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              UpgradeSpec   `json:"spec"`
	Status            UpgradeStatus `json:"status,omitempty"`
}

// UpgradeSpec is what the plan asks.
type UpgradeSpec struct {
	// Version is the orch release to run (staged with orch upgrade
	// stage for every platform the nodes run).
	Version string `json:"version"`
	// NodeSelector picks the nodes; none: every node.
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// Concurrency is how many agents upgrade at once (servers go one at
	// a time); default 1.
	Concurrency int32 `json:"concurrency,omitempty"`
	// Drain is how an agent's pods leave it first.
	Drain DrainSpec `json:"drain,omitempty"`
	// NodeTimeout is how long a node has to be Ready on the new version
	// once told to run it, before it goes back to its previous binary;
	// default 10m.
	NodeTimeout *metav1.Duration `json:"nodeTimeout,omitempty"`
	// DownloadBytesPerSecond caps each node's download of the binary
	// (default 8 MiB/s), so that it leaves the node's link to its pods.
	DownloadBytesPerSecond int64 `json:"downloadBytesPerSecond,omitempty"`
	// Force allows a downgrade, a skipped minor version and replacing a
	// development build.
	Force bool `json:"force,omitempty"`
	// Paused stops the plan from starting nodes (those under way finish).
	Paused bool `json:"paused,omitempty"`
}

// DrainSpec is kubectl drain's options.
type DrainSpec struct {
	// Timeout is how long evictions may wait (for budgets); default 5m.
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// Force evicts pods no controller manages too (they do not come back).
	Force bool `json:"force,omitempty"`
	// DeleteEmptyDirData evicts pods with emptyDir volumes (their data
	// goes).
	DeleteEmptyDirData bool `json:"deleteEmptyDirData,omitempty"`
}

// UpgradeStatus is where the plan stands.
type UpgradeStatus struct {
	Phase   string `json:"phase,omitempty"`
	Message string `json:"message,omitempty"`
	// Progress is "UPGRADED/NODES".
	Progress string        `json:"progress,omitempty"`
	Nodes    []NodeUpgrade `json:"nodes,omitempty"`
}

// NodeUpgrade is one node's part in a plan.
type NodeUpgrade struct {
	Name     string       `json:"name"`
	Role     string       `json:"role"` // server or agent
	From     string       `json:"from,omitempty"`
	Phase    string       `json:"phase"`
	Message  string       `json:"message,omitempty"`
	Started  *metav1.Time `json:"started,omitempty"`
	Finished *metav1.Time `json:"finished,omitempty"`
}

// UpgradeList is a list of Upgrades.
type UpgradeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Upgrade `json:"items"`
}

// DeepCopyObject copies through JSON: an Upgrade is small and rare.
func (u *Upgrade) DeepCopyObject() runtime.Object { return deepCopy(u, &Upgrade{}) }

// DeepCopy is a copy of u.
func (u *Upgrade) DeepCopy() *Upgrade { return deepCopy(u, &Upgrade{}) }

// DeepCopyObject copies through JSON.
func (l *UpgradeList) DeepCopyObject() runtime.Object { return deepCopy(l, &UpgradeList{}) }

func deepCopy[T any](in, out *T) *T {
	if in == nil {
		return nil
	}
	data, err := json.Marshal(in)
	if err != nil {
		panic(err) // only plain fields: cannot fail
	}
	if err := json.Unmarshal(data, out); err != nil {
		panic(err)
	}
	return out
}

// AddToScheme registers the kind.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Upgrade{}, &UpgradeList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// CRD is the Upgrade kind's definition, which the server installs.
func CRD() *apiextensionsv1.CustomResourceDefinition {
	duration := func(desc string) apiextensionsv1.JSONSchemaProps {
		return apiextensionsv1.JSONSchemaProps{Type: "string", Description: desc, Pattern: `^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`}
	}
	boolean := func(desc string) apiextensionsv1.JSONSchemaProps {
		return apiextensionsv1.JSONSchemaProps{Type: "boolean", Description: desc}
	}
	min1, min0 := 1.0, 0.0
	preserve := true
	schema := &apiextensionsv1.JSONSchemaProps{
		Type: "object",
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"apiVersion": {Type: "string"}, "kind": {Type: "string"}, "metadata": {Type: "object"},
			"spec": {
				Type: "object", Required: []string{"version"},
				Properties: map[string]apiextensionsv1.JSONSchemaProps{
					"version": {Type: "string", Description: "the orch release to run (orch upgrade stage it first)",
						Pattern: `^v[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)*$`, MaxLength: ptr64(128)},
					"nodeSelector": {Type: "object", Description: "the nodes to upgrade (a label selector); none: every node",
						XPreserveUnknownFields: &preserve},
					"concurrency": {Type: "integer", Format: "int32", Minimum: &min1, Description: "agents upgraded at once (servers go one at a time); default 1"},
					"drain": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"timeout":            duration("how long evictions may wait for budgets; default 5m"),
						"force":              boolean("evict pods no controller manages too"),
						"deleteEmptyDirData": boolean("evict pods with emptyDir volumes (their data goes)"),
					}},
					"nodeTimeout":            duration("how long a node has to be Ready on the new version before it goes back; default 10m"),
					"downloadBytesPerSecond": {Type: "integer", Format: "int64", Minimum: &min0, Description: "each node's download rate cap; default 8 MiB/s"},
					"force":                  boolean("allow a downgrade, a skipped minor version, replacing a development build"),
					"paused":                 boolean("start no more nodes"),
				},
			},
			"status": {Type: "object", XPreserveUnknownFields: &preserve},
		},
	}
	return &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: "upgrades." + GroupVersion.Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: GroupVersion.Group, Scope: apiextensionsv1.ClusterScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "upgrades", Singular: "upgrade", Kind: "Upgrade", ListKind: "UpgradeList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: GroupVersion.Version, Served: true, Storage: true,
				Schema:       &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: schema},
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
				AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{
					{Name: "Version", Type: "string", JSONPath: ".spec.version"},
					{Name: "Phase", Type: "string", JSONPath: ".status.phase"},
					{Name: "Upgraded", Type: "string", JSONPath: ".status.progress"},
					{Name: "Message", Type: "string", JSONPath: ".status.message"},
					{Name: "Age", Type: "date", JSONPath: ".metadata.creationTimestamp"},
				},
			}},
		},
	}
}

func ptr64(v int64) *int64 { return &v }
