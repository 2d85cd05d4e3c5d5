#!/usr/bin/env bash
# Builds the release binaries (scripts/release.sh) and runs the ARM ones
# under qemu-user, as a board would run them: `orch version` on arm64,
# armhf and armv6 (on a Pi Zero's CPU), and an arm64 `orch server
# --disable-agent` answering /readyz and a create through stock kubectl
# (built by the tests into .cache/).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
apt_install qemu-user-static
scripts/release.sh
# The ARMv6 build on a Raspberry Pi Zero's CPU (ARM1176), where the ARMv7
# one must not run (it dies of an illegal instruction at once).
for run in "qemu-aarch64-static dist/orch-arm64:linux/arm64" "qemu-arm-static dist/orch-armhf:linux/arm/v7" \
  "qemu-arm-static -cpu arm1176 dist/orch-armv6:linux/arm/v6"; do
  cmd=${run%%:*} want=${run#*:}
  out=$($cmd version)
  echo "$out"
  case "$out" in *"$want)"*) ;; *) echo "release smoke: $cmd version printed $out, want $want" >&2; exit 1 ;; esac
done
if out=$(qemu-arm-static -cpu arm1176 dist/orch-armhf version 2>&1); then
  echo "release smoke: the ARMv7 build ran on an ARM1176: $out" >&2
  exit 1
fi
echo "the ARMv7 build on an ARM1176: $out"
# The store's contract suite on a 32-bit CPU: sizes and limits past int's
# range must not wrap there.
GOARCH=arm GOARM=6 go test -c -o dist/.boltstore-armv6.test ./internal/store/boltstore/
(cd internal/store/boltstore && qemu-arm-static -cpu arm1176 ../../../dist/.boltstore-armv6.test -test.short -test.run '^TestConformance$')
rm -f dist/.boltstore-armv6.test
kubectl=$(ls -t .cache/kubectl-v* 2>/dev/null | head -1 || true)
if [ -z "$kubectl" ]; then
  echo "release smoke: no kubectl under .cache/ (the tests build it)" >&2
  exit 1
fi
dir=$(mktemp -d)
port=$(shuf -i 20000-60000 -n 1)
qemu-aarch64-static dist/orch-arm64 server --disable-agent --data-dir "$dir" --write-kubeconfig "$dir/kc.yaml" \
  --https-listen-port "$port" --bind-address 127.0.0.1 --advertise-address 127.0.0.1 >"$dir/log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$dir"' EXIT
start=$(date +%s)
until "$kubectl" --kubeconfig "$dir/kc.yaml" get --raw /readyz 2>/dev/null | grep -qx ok; do
  if [ $(( $(date +%s) - start )) -gt 180 ]; then
    echo "release smoke: the arm64 server never answered /readyz:" >&2; tail -20 "$dir/log" >&2; exit 1
  fi
  sleep 1
done
echo "arm64 server ready after $(( $(date +%s) - start )) s under qemu"
"$kubectl" --kubeconfig "$dir/kc.yaml" create configmap release-smoke --from-literal=board=arm64
"$kubectl" --kubeconfig "$dir/kc.yaml" get configmap release-smoke -o jsonpath='{.data.board}{"\n"}' | grep -qx arm64
echo "release smoke: ok"
