#!/usr/bin/env bash
# The whole test suite: README's second command, and what CI runs. Three
# tiers: unit tests (no root; `go test -short ./...` alone runs them), the
# root tier (real containerd, runc, CNI plugins and iptables: the agent's
# and internal/iptables' tests skip themselves without root), and the
# end-to-end tests (e2e/, build tag e2e: orch built and run as processes);
# then the release binaries, the ARM ones run under qemu-user.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
# The agent's tests run real containerd and runc on a busybox test image;
# the install test checks its units with systemd-analyze (package systemd);
# graceful node shutdown is tested on a bus of its own (package dbus-daemon);
# the Gateway e2e test asks from inside a node with curl.
if [ "$(id -u)" = 0 ]; then
  apt_install containerd runc busybox-static containernetworking-plugins iptables nftables iproute2 procps util-linux systemd dbus-daemon curl openssl
fi
go mod download
scripts/check-imports.sh
go vet ./...
# kubectl and Helm, built once into .cache/ before the packages that drive
# them start (in parallel, each would build them on its tests' clock).
go test -count=1 -run '^TestBuildTools$' ./internal/api/apitest/
go test -race -count=1 -timeout 30m ./...
scripts/e2e.sh
scripts/release-smoke.sh
