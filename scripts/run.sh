#!/usr/bin/env bash
# Builds orch and runs it: README's first command. Arguments go to orch;
# with none it runs `orch server`, a one-node cluster (control plane and
# this machine as its node, with its own containerd), writing the admin
# kubeconfig to /etc/orch/orch.yaml.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
"$(dirname "$0")/build.sh"
if [ $# -eq 0 ]; then
  # The node's runtime: containerd, runc, the CNI plugins, iptables.
  if [ "$(id -u)" = 0 ]; then apt_install containerd runc containernetworking-plugins iptables nftables iproute2; fi
  set -- server
fi
exec bin/orch "$@"
