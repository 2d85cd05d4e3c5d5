#!/usr/bin/env bash
# The whole test suite: README's second command, and what CI runs.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
go mod download
scripts/check-imports.sh
go vet ./...
go test -race -count=1 -timeout 20m ./...
