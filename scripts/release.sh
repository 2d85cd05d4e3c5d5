#!/usr/bin/env bash
# `make release`: static orch binaries for the boards orch runs on, named
# as k3s names its release assets (orch for amd64, orch-arm64, orch-armhf
# for ARMv7), with the version and commit stamped and their sha256 sums,
# into dist/. Each must fit the binary budget (design.md: 60 MB on every
# architecture since issue 34 brought webhooks, CEL and etcd).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
version=$(git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
budget=$((60 * 1000 * 1000))
rm -rf dist && mkdir -p dist
for target in amd64:orch arm64:orch-arm64 arm:orch-armhf; do
  arch=${target%%:*} name=${target#*:}
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch GOARM=7 go build -tags "$build_tags" -trimpath \
    -ldflags "-s -w -X main.version=$version -X main.commit=$commit" -o "dist/$name" .
  size=$(stat -c %s "dist/$name")
  printf '%-12s %s bytes\n' "$name" "$size"
  if [ "$size" -gt "$budget" ]; then
    echo "dist/$name is over the binary budget of $budget bytes" >&2
    exit 1
  fi
done
(cd dist && sha256sum orch orch-arm64 orch-armhf > sha256sum.txt)
echo "released $version into dist/ (sha256sum.txt)"
