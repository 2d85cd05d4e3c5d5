// Package gatewayapi is what the server and the nodes agree on for the
// Gateway API (gateway.networking.k8s.io): the version orch implements,
// the standard channel's CustomResourceDefinitions of that version
// (standard-crds.yaml.gz, written by scripts/gateway-crds.sh from the
// sigs.k8s.io/gateway-api module), which the server installs, and the
// controller name of the GatewayClasses orch serves.
package gatewayapi

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"fmt"
	"io"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

// Version is the Gateway API release whose standard channel orch installs
// (the definitions of the kinds it serves: GatewayClass, Gateway,
// HTTPRoute, ReferenceGrant).
const Version = "v1.6.3"

// ControllerName is the spec.controllerName of the GatewayClasses orch
// serves; ClassName is the one the server makes.
const (
	ControllerName = "orch.io/gateway"
	ClassName      = "orch"
)

// ConfigNamespace and ConfigName name the ConfigMap of the routing
// configuration every node's proxy serves (key ConfigKey: Config as
// JSON), which the server's loop writes; the node authorizer lets nodes
// read it and the Secrets it names.
const (
	ConfigNamespace = "kube-system"
	ConfigName      = "orch-gateway-routes"
	ConfigKey       = "config.json"
)

// The annotations the Gateway API's CRDs carry: their release and channel.
const (
	BundleVersionAnnotation = "gateway.networking.k8s.io/bundle-version"
	ChannelAnnotation       = "gateway.networking.k8s.io/channel"
)

//go:embed standard-crds.yaml.gz
var standardCRDs []byte

// CRDs are the standard channel's definitions of Version.
func CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	r, err := gzip.NewReader(bytes.NewReader(standardCRDs))
	if err != nil {
		return nil, fmt.Errorf("gateway API CRDs: %w", err)
	}
	all, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("gateway API CRDs: %w", err)
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, doc := range strings.Split(string(all), "\n---\n") {
		if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" {
			continue
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict([]byte(doc), crd); err != nil {
			return nil, fmt.Errorf("gateway API CRDs: %w", err)
		}
		out = append(out, crd)
	}
	return out, nil
}

// Newer reports whether an installed definition is of a later release
// than orch's (or of one that cannot be read), which the server then
// leaves as it is: users may keep a newer standard channel installed.
func Newer(installed *apiextensionsv1.CustomResourceDefinition) bool {
	have, err := version.ParseSemantic(installed.Annotations[BundleVersionAnnotation])
	if err != nil {
		return true
	}
	return have.GreaterThan(version.MustParseSemantic(Version))
}

// GroupVersion is the version of the API orch speaks.
var GroupVersion = schema.GroupVersion{Group: gatewayv1.GroupName, Version: "v1"}
