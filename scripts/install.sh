#!/bin/sh
# Installs orch as a systemd service, in k3s's style:
#
#   curl -sfL https://<release>/install.sh | sh -                 # a server
#   curl -sfL ... | ORCH_URL=https://server:6443 ORCH_TOKEN=... sh -   # an agent
#   ORCH_BINARY=./orch sh install.sh                               # offline
#
# It installs the binary, the runtime's packages where missing (containerd,
# runc, the CNI plugins, iptables, nftables), a unit (orch.service, or
# orch-agent.service when ORCH_URL is set) with an env file, and
# orch-killall.sh and orch-uninstall.sh (orch-agent-uninstall.sh) beside
# the binary. Running it again upgrades in place. Arguments after `sh -s -`
# go to orch's command line (`server` or `agent` is implied).
#
# Environment:
#   ORCH_URL, ORCH_TOKEN        join a server as an agent (written to the env file)
#   ORCH_BINARY                 an orch binary already here, instead of a download
#   ORCH_VERSION                the release to download (default: latest)
#   ORCH_DOWNLOAD_URL           where releases live (default: GitHub releases)
#   INSTALL_ORCH_EXEC           more arguments for orch (as the script's arguments)
#   INSTALL_ORCH_BIN_DIR        default /usr/local/bin
#   INSTALL_ORCH_SYSTEMD_DIR    default /etc/systemd/system
#   INSTALL_ORCH_DATA_DIR       orch's --data-dir (default /var/lib/orch)
#   INSTALL_ORCH_RUNTIME_DIR    orch's --runtime-dir, a tmpfs (default /run/orch)
#   INSTALL_ORCH_CONFIG_DIR     default /etc/orch
#   INSTALL_ORCH_SKIP_DEPS      true: install no packages
#   INSTALL_ORCH_SKIP_START     true: do not enable and start the unit
set -eu

info() { echo "[INFO]  $*"; }
fatal() { echo "[ERROR] $*" >&2; exit 1; }

BIN_DIR=${INSTALL_ORCH_BIN_DIR:-/usr/local/bin}
SYSTEMD_DIR=${INSTALL_ORCH_SYSTEMD_DIR:-/etc/systemd/system}
DATA_DIR=${INSTALL_ORCH_DATA_DIR:-/var/lib/orch}
RUNTIME_DIR=${INSTALL_ORCH_RUNTIME_DIR:-/run/orch}
CONFIG_DIR=${INSTALL_ORCH_CONFIG_DIR:-/etc/orch}
DOWNLOAD_URL=${ORCH_DOWNLOAD_URL:-https://github.com/orch-dev/orch/releases}

if [ -n "${ORCH_URL:-}" ]; then
  [ -n "${ORCH_TOKEN:-}" ] || fatal "ORCH_URL is set: an agent needs ORCH_TOKEN too"
  case "$ORCH_URL" in https://*) ;; *) fatal "ORCH_URL must be https://HOST:6443, not $ORCH_URL" ;; esac
  COMMAND=agent
  SERVICE=orch-agent
  UNINSTALL=orch-agent-uninstall.sh
else
  COMMAND=server
  SERVICE=orch
  UNINSTALL=orch-uninstall.sh
fi

[ "$(id -u)" -eq 0 ] || fatal "run as root (sudo sh install.sh)"

arch() {
  case "$(uname -m)" in
    x86_64 | amd64) echo amd64 ;;
    aarch64 | arm64) echo arm64 ;;
    armv7* | armv8l | armhf) echo armhf ;;
    armv6*) echo armv6 ;; # Raspberry Pi Zero and 1
    *) fatal "no orch release for $(uname -m)" ;;
  esac
}

# install_binary puts orch in BIN_DIR, from ORCH_BINARY or a release
# checked against its sha256 sums.
install_binary() {
  mkdir -p "$BIN_DIR"
  tmp=$(mktemp "$BIN_DIR/.orch.XXXXXX")
  if [ -n "${ORCH_BINARY:-}" ]; then
    [ -f "$ORCH_BINARY" ] || fatal "ORCH_BINARY $ORCH_BINARY is no file"
    cp "$ORCH_BINARY" "$tmp"
  else
    command -v curl >/dev/null || fatal "curl is needed to download orch (or set ORCH_BINARY)"
    version=${ORCH_VERSION:-latest}
    if [ "$version" = latest ]; then base="$DOWNLOAD_URL/latest/download"; else base="$DOWNLOAD_URL/download/$version"; fi
    name=orch
    [ "$(arch)" = amd64 ] || name="orch-$(arch)"
    info "downloading $base/$name"
    curl -sfL -o "$tmp" "$base/$name" || { rm -f "$tmp"; fatal "download of $base/$name failed"; }
    sums=$(curl -sfL "$base/sha256sum.txt") || { rm -f "$tmp"; fatal "download of $base/sha256sum.txt failed"; }
    want=$(echo "$sums" | awk -v n="$name" '$2 == n || $2 == "*"n {print $1}')
    got=$(sha256sum "$tmp" | awk '{print $1}')
    [ -n "$want" ] && [ "$want" = "$got" ] || { rm -f "$tmp"; fatal "$name's sha256 $got is not the release's ($want)"; }
  fi
  chmod 0755 "$tmp"
  "$tmp" version >/dev/null 2>&1 || { rm -f "$tmp"; fatal "the orch binary does not run on this machine"; }
  mv -f "$tmp" "$BIN_DIR/orch"
  info "installed $("$BIN_DIR/orch" version)"
}

# install_deps installs the container runtime's packages that are missing,
# from the distribution.
install_deps() {
  [ "${INSTALL_ORCH_SKIP_DEPS:-false}" = true ] && return
  missing=""
  command -v containerd >/dev/null || missing="$missing containerd"
  command -v runc >/dev/null || missing="$missing runc"
  [ -x /usr/lib/cni/bridge ] || [ -x /opt/cni/bin/bridge ] || missing="$missing containernetworking-plugins"
  command -v iptables >/dev/null || missing="$missing iptables"
  # The service proxy's nftables mode (iptables mode without it).
  command -v nft >/dev/null || missing="$missing nftables"
  [ -z "$missing" ] && return
  if command -v apt-get >/dev/null; then
    info "installing$missing"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing >/dev/null
  elif command -v dnf >/dev/null; then
    dnf install -y $missing >/dev/null
  else
    fatal "install$missing with this system's package manager, then run this again"
  fi
}

write_unit() {
  mkdir -p "$SYSTEMD_DIR"
  env_file="$SYSTEMD_DIR/$SERVICE.service.env"
  umask 077
  : > "$env_file.tmp"
  if [ "$COMMAND" = agent ]; then
    printf 'ORCH_URL=%s\nORCH_TOKEN=%s\n' "$ORCH_URL" "$ORCH_TOKEN" > "$env_file.tmp"
  fi
  mv -f "$env_file.tmp" "$env_file"
  umask 022
  args="$COMMAND --data-dir $DATA_DIR --runtime-dir $RUNTIME_DIR"
  [ "$COMMAND" = server ] && args="$args --write-kubeconfig $CONFIG_DIR/orch.yaml"
  for a in ${INSTALL_ORCH_EXEC:-} "$@"; do args="$args \"$a\""; done
  cat > "$SYSTEMD_DIR/$SERVICE.service.tmp" <<EOF
[Unit]
Description=orch, a small Kubernetes-compatible cluster ($COMMAND)
Documentation=https://github.com/orch-dev/orch
Wants=network-online.target
After=network-online.target

[Service]
Type=exec
EnvironmentFile=-/etc/default/%N
EnvironmentFile=-$env_file
# Pods outlive a restart of orch: it adopts them again.
KillMode=process
Delegate=yes
LimitNOFILE=1048576
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
TimeoutStartSec=0
Restart=always
RestartSec=5s
ExecStartPre=-/sbin/modprobe br_netfilter
ExecStartPre=-/sbin/modprobe overlay
ExecStart=$BIN_DIR/orch $args

[Install]
WantedBy=multi-user.target
EOF
  mv -f "$SYSTEMD_DIR/$SERVICE.service.tmp" "$SYSTEMD_DIR/$SERVICE.service"
  info "wrote $SYSTEMD_DIR/$SERVICE.service"
}

write_killall() {
  cat > "$BIN_DIR/orch-killall.sh" <<EOF
#!/bin/sh
# Stops orch and everything it runs: its unit, its containerd, the pods'
# shims and containers; unmounts what it mounted and removes the network
# rules, routes and devices it made. The data stays.
set -u
[ "\$(id -u)" -eq 0 ] || { echo "run as root" >&2; exit 1; }
DATA_DIR=$DATA_DIR
RUNTIME_DIR=$RUNTIME_DIR
for unit in orch orch-agent; do
  command -v systemctl >/dev/null && systemctl stop "\$unit" 2>/dev/null
done
# descendants PID: every process under PID, deepest first.
descendants() {
  for child in \$(ps -e -o pid= -o ppid= | awk -v p="\$1" '\$2 == p {print \$1}'); do
    descendants "\$child"
    echo "\$child"
  done
}
for pid in \$(ps -e -o pid= -o args= | awk -v d="\$DATA_DIR" 'index(\$0, d) && (/containerd-shim/ || /containerd/ || /orch (server|agent)/) {print \$1}'); do
  for p in \$(descendants "\$pid") "\$pid"; do kill -9 "\$p" 2>/dev/null; done
done
sleep 1
for dir in "\$DATA_DIR" "\$RUNTIME_DIR"; do
  awk -v d="\$dir/" 'index(\$5, d) == 1 {print \$5}' /proc/self/mountinfo | sort -r | while read -r m; do umount -l "\$m" 2>/dev/null; done
done
"$BIN_DIR/orch" agent --cleanup >/dev/null 2>&1 || true
exit 0
EOF
  chmod 0755 "$BIN_DIR/orch-killall.sh"
}

write_uninstall() {
  cat > "$BIN_DIR/$UNINSTALL" <<EOF
#!/bin/sh
# Removes orch: stops it and all it runs (orch-killall.sh), then its unit,
# env file, binary, data, configuration and these scripts.
set -u
[ "\$(id -u)" -eq 0 ] || { echo "run as root" >&2; exit 1; }
"$BIN_DIR/orch-killall.sh"
if command -v systemctl >/dev/null; then
  systemctl disable $SERVICE >/dev/null 2>&1
  systemctl reset-failed $SERVICE >/dev/null 2>&1
fi
rm -f "$SYSTEMD_DIR/$SERVICE.service" "$SYSTEMD_DIR/$SERVICE.service.env"
command -v systemctl >/dev/null && systemctl daemon-reload >/dev/null 2>&1
rm -rf "$DATA_DIR" "$CONFIG_DIR" "$RUNTIME_DIR"
rm -f "$BIN_DIR/orch" "$BIN_DIR/orch-killall.sh" "$BIN_DIR/$UNINSTALL"
echo "orch is uninstalled"
EOF
  chmod 0755 "$BIN_DIR/$UNINSTALL"
}

start() {
  [ "${INSTALL_ORCH_SKIP_START:-false}" = true ] && { info "not starting $SERVICE (INSTALL_ORCH_SKIP_START)"; return; }
  command -v systemctl >/dev/null || fatal "no systemctl: start $BIN_DIR/orch $COMMAND yourself"
  systemctl daemon-reload
  systemctl enable "$SERVICE" >/dev/null 2>&1
  info "starting $SERVICE"
  systemctl restart "$SERVICE"
}

install_deps
install_binary
write_unit "$@"
write_killall
write_uninstall
start
if [ "$COMMAND" = server ]; then
  info "kubectl: export KUBECONFIG=$CONFIG_DIR/orch.yaml; agents join with ORCH_URL=https://<this host>:6443 ORCH_TOKEN=\$(cat $DATA_DIR/server/token)"
fi
