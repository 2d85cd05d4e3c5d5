#!/usr/bin/env bash
# Builds bin/orch: static, no cgo, version and commit stamped.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
version=$(git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
CGO_ENABLED=0 go build -tags "$build_tags" -trimpath -ldflags "-s -w -X main.version=$version -X main.commit=$commit" -o bin/orch .
echo "built bin/orch ($version)"
