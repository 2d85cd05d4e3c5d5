#!/usr/bin/env bash
# Builds orch and runs it: README's first command. Arguments go to orch;
# with none it prints the version (the server arrives with the API issue).
set -euo pipefail
"$(dirname "$0")/build.sh"
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then set -- version; fi
exec bin/orch "$@"
