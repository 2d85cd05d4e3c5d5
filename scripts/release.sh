#!/usr/bin/env bash
# `make release`: static orch binaries for the boards orch runs on, named
# as k3s names its release assets (orch for amd64, orch-arm64, orch-armhf
# for ARMv7), and orch-armv6 for the Raspberry Pi Zero and 1 (GOARM=6:
# their ARM1176 has no VFPv3, which an ARMv7 build's runtime asks for),
# with the version and commit stamped and their sha256 sums, into dist/.
# Each must fit the binary budget: design.md's 60 MB on every architecture
# (since issue 34 brought webhooks, CEL and etcd), overrun by 0.1 MB since
# the server serves its profiles (/debug/pprof: runtime/pprof's profile
# writer, 180 KB) and by 2 MB more since servers keep the cluster in an
# external etcd (etcd's client v3, its gRPC API and zap: 1.9 MB), and by
# 6.4 MB more since servers run their own etcd (--cluster-init: etcd's
# server, raft, bbolt's etcd backend and the OpenTelemetry its embed package
# imports; amd64 62,083,234 -> 68,411,554 bytes), and by 0.2 MB more
# since nodes run ephemeral containers (kubectl debug), in-place resizes
# and image volumes and the API serves them and logs over websockets
# (amd64 68,513,954 -> 68,645,026 bytes), and by 1.7 MB more since the
# API serves dynamic resource allocation's kinds with Kubernetes' generated
# validation (resource.k8s.io/v1: 1.3 MB, most of it their protobuf and
# validation code) and StorageVersionMigrations with their loop (0.4 MB;
# amd64 68,645,026 -> 70,426,786 bytes), and by 0.1 MB more since servers
# roll new releases over their nodes (orch upgrade: the Upgrade kind and
# its loop, release staging and serving, the nodes' resumable download,
# swap and guard; amd64 70,185,122 -> 70,520,994 bytes, after reading
# build information without debug/buildinfo, which alone linked 0.8 MB of
# executable-format readers), and by 0.15 MB more since the service proxy
# writes kube-proxy's nftables mode (sigs.k8s.io/knftables v0.0.21, the
# last without google/nftables' netlink lister, which alone added 0.6 MB;
# amd64 70,520,994 -> 70,672,546 bytes), as design.md lets a feature users
# (and Kubernetes' conformance suite) need overrun it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
version=$(git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
budget=$((70800 * 1000))
rm -rf dist && mkdir -p dist
for target in amd64:7:orch arm64:7:orch-arm64 arm:7:orch-armhf arm:6:orch-armv6; do
  arch=${target%%:*} name=${target##*:} goarm=${target#*:} goarm=${goarm%%:*}
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch GOARM=$goarm go build -tags "$build_tags" -trimpath \
    -ldflags "-s -w -X main.version=$version -X main.commit=$commit" -o "dist/$name" .
  size=$(stat -c %s "dist/$name")
  printf '%-12s %s bytes\n' "$name" "$size"
  if [ "$size" -gt "$budget" ]; then
    echo "dist/$name is over the binary budget of $budget bytes" >&2
    exit 1
  fi
done
(cd dist && sha256sum orch orch-arm64 orch-armhf orch-armv6 > sha256sum.txt)
echo "released $version into dist/ (sha256sum.txt)"
