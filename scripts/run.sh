#!/usr/bin/env bash
# Builds orch and runs it: README's first command. Arguments go to orch;
# with none it runs the control plane (`orch server --disable-agent` until
# the agent lands), writing the admin kubeconfig to /etc/orch/orch.yaml.
set -euo pipefail
"$(dirname "$0")/build.sh"
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then set -- server --disable-agent; fi
exec bin/orch "$@"
