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
  for f in "$dir"/config/crd/standard/gateway.networking.k8s.io_*.yaml; do
    case "$f" in *_vap_*) continue ;; esac # the upgrade policy: orch checks versions itself
    echo "---"
    cat "$f"
  done
} | gzip -9n > "$out"
echo "wrote $out ($(stat -c %s "$out") bytes) from gateway-api $version"
