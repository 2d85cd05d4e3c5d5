#!/usr/bin/env bash
# The end-to-end tests (e2e/, build tag e2e): orch built and run as
# processes, real containers. They need root; scripts/test.sh installs
# what they run on.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
go test -tags e2e -race -count=1 -timeout 30m ./e2e/
