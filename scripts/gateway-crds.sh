#!/usr/bin/env bash
# Writes internal/gatewayapi/standard-crds.yaml.gz: the Gateway API's
# standard channel CRDs of the release gatewayapi.Version names, as the
# project publishes them in its sigs.k8s.io/gateway-api module, which the
# server installs. Run it after changing that version.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
version=$(sed -n 's/^const Version = "\(.*\)"$/\1/p' internal/gatewayapi/gatewayapi.go)
dir=$(go mod download -json "sigs.k8s.io/gateway-api@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
out=internal/gatewayapi/standard-crds.yaml.gz
{
  # The kinds orch serves: each definition costs the server about a
  # megabyte of memory, so those of kinds it does not serve (GRPCRoute,
  # TLSRoute, TCPRoute, UDPRoute, BackendTLSPolicy, ListenerSet) are left
  # to whoever installs an implementation of them.
  for kind in gatewayclasses gateways httproutes referencegrants; do
    f="$dir/config/crd/standard/gateway.networking.k8s.io_$kind.yaml"
    echo "---"
    cat "$f"
  done
} | gzip -9n > "$out"
echo "wrote $out ($(stat -c %s "$out") bytes) from gateway-api $version"
