#!/usr/bin/env bash
# Runs the benchmarks and prints their tables: the store against etcd, then
# the API server over HTTPS (and what its request metrics cost), the scheduler and the loops on hollow nodes,
# the CronJob loop on 1,000 idle CronJobs and the autoscaler on 1,000 autoscalers, then pod startup on a real node (root, containerd) and
# orch server idle with 30 pods (memory, CPU, disk writes: BenchmarkServerIdle), and the service
# proxy's sync (iptables-restore in a network namespace, root) and the
# cluster DNS, the ingress proxy against direct requests, its route table and an Ingress to its first 200,
# the NetworkPolicy engine (1,000 policies over 1,000 pods: sync, one change, a pod's admission, memory),
# the RBAC authorizer, the client certificates' check, and three servers
# with their own etcd as processes (failover after a kill, idle use).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
out=$(mktemp)
go test -run '^$' -bench . -benchtime "${BENCHTIME:-1x}" -timeout 60m ./internal/store/storebench/ ./internal/api/apibench/ ./internal/api/ ./internal/loops/scheduler/ ./internal/loops/ ./internal/loops/podautoscaler/ ./internal/loops/cronjob/ ./internal/agent/ ./internal/agent/serverlb/ ./internal/netproxy/ ./internal/netproxy/dns/ ./internal/netproxy/ingress/ ./internal/netproxy/netpolicy/ ./internal/api/auth/rbac/ ./internal/api/pki/ | tee "$out"
tables=$(mktemp)
{
  go run ./scripts/benchtable < "$out"
  echo
  # The binary budget (design.md), for the architecture built here.
  bash scripts/build.sh >/dev/null
  printf 'binary bin/orch: %s bytes stripped (budget %s)\n' "$(stat -c %s bin/orch)" $((70800 * 1000))
} > "$tables"
echo
cat "$tables"
# BENCH_DOC=docs/benchmarks.md writes the tables into that page, with the
# date and the machine they were measured on.
if [ -n "${BENCH_DOC:-}" ]; then
  {
    echo "# Benchmarks"
    echo
    echo "What \`make bench\` printed on $(date -u +%Y-%m-%d), on $(nproc) cores of $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
    echo "with $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) of memory, $(uname -sr), $(go version | cut -d' ' -f3)."
    echo "Written by \`BENCH_DOC=docs/benchmarks.md make bench\`; what each benchmark measures and its"
    echo "target: \`make bench\` in [development.md](development.md). The machine is shared: compare ratios"
    echo "measured in one run (orch against etcd, with and without the watch cache), not"
    echo "absolute numbers across runs."
    echo
    cat "$tables"
  } > "$BENCH_DOC"
  echo "wrote $BENCH_DOC"
fi
