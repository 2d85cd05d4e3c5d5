#!/usr/bin/env bash
# gofmt, go vet, golangci-lint (pinned, installed from the module proxy
# into .cache/bin) and the import-graph check.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
golangci_version=v2.15.0
bin="$root/.cache/bin"
if ! "$bin/golangci-lint" version 2>/dev/null | grep -q "${golangci_version#v}"; then
  echo "installing golangci-lint $golangci_version"
  GOBIN="$bin" go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$golangci_version"
fi
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt would change:"; echo "$unformatted"; exit 1; fi
go vet ./...
"$bin/golangci-lint" run ./...
scripts/check-imports.sh
echo "lint: ok"
