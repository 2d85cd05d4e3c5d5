#!/usr/bin/env bash
# The Gateway API's conformance suite (sigs.k8s.io/gateway-api/conformance,
# the release orch implements) against a one-node orch started by run.sh,
# as any implementation runs it: profile GATEWAY-HTTP, the GatewayClass
# orch, the features its status claims. No registry: its echo server is
# built from the suite's own source into an image in the node's air-gap
# dir (a stand-in pause for the CoreDNS of the UDP tests, which orch does
# not claim). The report (the suite's YAML) goes to $CONF/gateway-report.
#
#   scripts/conformance/gateway.sh          build, start orch, run, stop
#   RUN_TEST=HTTPRouteWeight scripts/conformance/gateway.sh   one test
#   KEEP=1 ...                              leave orch running after
#
# Needs what run.sh needs; run it from the project's root after make build.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CONF=${CONF:-/var/tmp/orch-conformance}
export CONF
VERSION=$(sed -n 's/^const Version = "\(.*\)"$/\1/p' internal/gatewayapi/gatewayapi.go)
GW=$CONF/gateway
REPORT=$CONF/gateway-report
log() { echo "== $(date -u +%H:%M:%S) $*"; }

build() {
  mkdir -p "$GW" "$CONF/extra-images"
  local src
  src=$(go mod download -json "sigs.k8s.io/gateway-api/conformance@$VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  if [ ! -x "$GW/conformance.test" ] || [ ! -x "$GW/echo-basic" ]; then
    rm -rf "$GW/src" && cp -r "$src" "$GW/src" && chmod -R u+w "$GW/src"
    # Its go.mod points at the API's source next to it: the published
    # module of the same release instead.
    (cd "$GW/src" && go mod edit -dropreplace sigs.k8s.io/gateway-api -require "sigs.k8s.io/gateway-api@$VERSION" && GOFLAGS=-mod=mod go mod tidy)
    log "building the Gateway API $VERSION conformance suite"
    (cd "$GW/src" && GOFLAGS=-mod=mod nice go test -c -o "$GW/conformance.test" . &&
      CGO_ENABLED=0 GOFLAGS=-mod=mod nice go build -ldflags='-s -w' -o "$GW/echo-basic" ./echo-basic)
  fi
  "$HERE/run.sh" images >/dev/null # writes $CONF/mkimg.py
  local tag
  for tag in $(grep -rhoE 'registry.k8s.io/gateway-api/echo-basic:[^ "]+' "$GW/src/base" "$GW/src/tests" | sort -u | cut -d: -f2); do
    [ -f "$CONF/extra-images/echo-basic-$tag.tar" ] || (cd "$CONF" && python3 mkimg.py "$CONF/extra-images/echo-basic-$tag.tar" \
      "registry.k8s.io/gateway-api/echo-basic:$tag" '{"Entrypoint":["/echo-basic"],"ExposedPorts":{"3000/tcp":{}}}' "$GW/echo-basic:/echo-basic")
  done
  tag=$(grep -hoE 'registry.k8s.io/coredns/coredns:[^ "]+' "$GW/src/base/manifests.yaml" | head -1 | cut -d: -f2)
  [ -f "$CONF/extra-images/coredns-$tag.tar" ] || (cd "$CONF" && python3 mkimg.py "$CONF/extra-images/coredns-$tag.tar" \
    "registry.k8s.io/coredns/coredns:$tag" '{"Entrypoint":["/pause"]}' pause.bin:/pause)
}

features() {
  kubectl_() { "$CONF/kubectl" --kubeconfig "$CONF/data/kubeconfig.yaml" "$@"; }
  for _ in $(seq 1 60); do
    f=$(kubectl_ get gatewayclass orch -o jsonpath='{.status.supportedFeatures[*].name}' 2>/dev/null || true)
    [ -n "$f" ] && { echo "$f" | tr ' ' ','; return; }
    sleep 1
  done
  echo "the GatewayClass orch has no supportedFeatures" >&2; exit 1
}

run() {
  mkdir -p "$REPORT"
  local feats args=()
  feats=$(features)
  log "features: $feats"
  [ -n "${RUN_TEST:-}" ] && args+=(-run-test "$RUN_TEST")
  # GatewayStaticAddresses: the node's address is one a Gateway can be
  # served at (as a Service's external IP); a loopback one is not.
  local node
  node=$("$CONF/kubectl" --kubeconfig "$CONF/data/kubeconfig.yaml" get nodes -o jsonpath='{.items[0].status.addresses[?(@.type=="InternalIP")].address}')
  args+=(-usable-address "$node" -unusable-address 127.0.0.2)
  (cd "$GW/src" && KUBECONFIG="$CONF/data/kubeconfig.yaml" "$GW/conformance.test" -test.run TestConformance -test.timeout 60m -test.v \
    -gateway-class orch -conformance-profiles GATEWAY-HTTP -supported-features "$feats" \
    -organization orch-dev -project orch -url https://github.com/orch-dev/orch -version "$(git -C "$HERE/../.." describe --always --dirty)" \
    -contact https://github.com/orch-dev/orch/issues -report-output "$REPORT/report.yaml" "${args[@]}" \
    >"$REPORT/run.log" 2>&1) || true
  grep -E '^\s*--- (PASS|FAIL|SKIP)' "$REPORT/run.log" | sed 's/ (.*//' | sort | uniq -c | sort -rn | head -80 >"$REPORT/summary.txt" || true
  log "passed $(grep -c -- '--- PASS' "$REPORT/run.log" || true), failed $(grep -c -- '--- FAIL' "$REPORT/run.log" || true), skipped $(grep -c -- '--- SKIP' "$REPORT/run.log" || true): $REPORT"
}

build
"$HERE/run.sh" start
run
[ -n "${KEEP:-}" ] || "$HERE/run.sh" stop
