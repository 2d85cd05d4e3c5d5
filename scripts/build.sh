#!/usr/bin/env bash
# Builds bin/orch: static, no cgo.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
version=$(git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$version" -o bin/orch .
echo "built bin/orch ($version)"
