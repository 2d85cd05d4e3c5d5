#!/usr/bin/env bash
# Writes internal/gatewayapi/standard-crds.yaml.gz: the Gateway API's
# standard channel CRDs of the sigs.k8s.io/gateway-api version go.mod
# names, as the project publishes them, which the server installs. Run it
# after changing that version (and bump gatewayapi.Version).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
dir=$(go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)
version=$(go list -m -f '{{.Version}}' sigs.k8s.io/gateway-api)
out=internal/gatewayapi/standard-crds.yaml.gz
{
  for f in "$dir"/config/crd/standard/gateway.networking.k8s.io_*.yaml; do
    case "$f" in *_vap_*) continue ;; esac # the upgrade policy: orch checks versions itself
    echo "---"
    cat "$f"
  done
} | gzip -9n > "$out"
echo "wrote $out ($(stat -c %s "$out") bytes) from gateway-api $version"
