#!/usr/bin/env bash
# Kubernetes' conformance suite (e2e.test, [Conformance] minus [Serial] and
# [Disruptive]) against a one-node orch, with no registry: the test images
# are built locally into the node's air-gap images dir. Run it from the
# project's root (it uses ./bin/orch), or as `make conformance`; results
# land in $CONF/report. docs/conformance.md has the latest results.
#
# Needs: root, Go >= 1.26 with a Go module proxy, python3, busybox-static
# (/bin/busybox, for the stand-in images), mksh (its static build is
# the agnhost stand-in's shell), gcc and make (upstream busybox for the
# busybox image, from Debian's pool; all installed here), what orch's agent needs
# (containerd, runc, CNI plugins), and orch built (make build). The
# stand-in agnhost image carries nettools/ (curl, nc, dig, getent as the
# specs call them: the host's busybox has no curl or dig, and its nc no -v).
# No registry is needed: the test images are built locally (see images()).
#
#   ../shared/conformance/run.sh                 build (skipped where done), images, start orch,
#                                                count (dry run), run, summarize, stop orch
#   ../shared/conformance/run.sh build           only the build
#   ../shared/conformance/run.sh count           dry run: how many tests the focus selects
#   ../shared/conformance/run.sh start|stop      orch only (stop also kills its shims, unmounts)
#   ../shared/conformance/run.sh run             start, run, summarize, stop
#   ../shared/conformance/run.sh summary         summarize the last report again
#
# Knobs (environment):
#   K8S_VERSION  1.37.2          the k8s.io/kubernetes release (staging modules at v0.X.Y)
#   CONF         /var/tmp/orch-conformance   build dir and results (report/ per run)
#   ORCH         ./bin/orch
#   PORT         6443            orch's API port (host network namespace)
#   PROCS        8               ginkgo parallel processes (e2e.test processes)
#   RUN_TIMEOUT  80m             ginkgo --timeout: a graceful cap on the whole run
#   FOCUS        \[Conformance\]
#   SKIP         \[Serial\]|\[Disruptive\]
#   CRASHERS     a regexp of tests left out because they crash orch (counted
#                as failed, state "crasher"); default: none
#   RESTARTS     3               times the watchdog restarts orch if it dies mid-run
#   AGENTS       0               more nodes: each an orch agent in a network namespace
#                                of its own on a bridge to this host (198.19.0.0/24),
#                                joined with the server's token (the specs that need
#                                two schedulable nodes, NetworkPolicy across nodes)
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}
STAGING_VERSION=v0.${K8S_VERSION#*.}
CONF=${CONF:-/var/tmp/orch-conformance}
ORCH=${ORCH:-$PWD/bin/orch}
PORT=${PORT:-6443}
PROCS=${PROCS:-8}
RUN_TIMEOUT=${RUN_TIMEOUT:-80m}
FOCUS=${FOCUS:-'\[Conformance\]'}
SKIP=${SKIP:-'\[Serial\]|\[Disruptive\]'}
CRASHERS=${CRASHERS-}
RESTARTS=${RESTARTS:-3}
AGENTS=${AGENTS:-0}
AGENT_NET=198.19.0
DATA=$CONF/data
KCFG=$DATA/kubeconfig.yaml
REPORT=$CONF/report
HERE=$(cd "$(dirname "$0")" && pwd)

log() { echo "== $(date -u +%H:%M:%S) $*"; }

# build: a throwaway module requiring k8s.io/kubernetes with every staging
# module replaced by its published v0.X.Y; then e2e.test, kubectl, agnhost,
# ginkgo (for parallel processes) and a pause stand-in. Each skipped if built.
build() {
  mkdir -p "$CONF" && cd "$CONF"
  export GOFLAGS="-p=2 -buildvcs=false"
  if [ ! -f go.sum ] || ! grep -q "k8s.io/kubernetes v$K8S_VERSION" go.mod 2>/dev/null; then
    log "module for k8s.io/kubernetes v$K8S_VERSION"
    local dir
    dir=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
    {
      printf 'module conf\n\n%s\n\n%s\n\nrequire k8s.io/kubernetes v%s\n\nreplace (\n' \
        "$(grep '^go ' "$dir/go.mod")" "$(grep '^godebug' "$dir/go.mod" || true)" "$K8S_VERSION"
      sed -n '/^replace (/,/^)/p' "$dir/go.mod" | awk '/=> \.\/staging/ {print "\t" $1 " => " $1 " '"$STAGING_VERSION"'"}'
      printf ')\n'
    } >go.mod
    cat >tools.go <<'EOF'
//go:build tools

package conf

import (
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
EOF
    rm -f go.sum && go mod tidy
  fi
  [ -x agnhost ] || { log "agnhost"; CGO_ENABLED=0 nice go build -ldflags='-s -w' -o agnhost k8s.io/kubernetes/test/images/agnhost; }
  # e2e.test carries the version too: specs build their pods for the
  # server's Pod Security version from it (GetMinimalValidPod), and fail
  # on the untagged v0.0. A build from before this must be removed to be
  # made again (rm $CONF/e2e.test).
  [ -x e2e.test ] || { log "e2e.test (20-40 min on 2 cores)"; nice go test -c -ldflags "-X k8s.io/component-base/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)" -o e2e.test k8s.io/kubernetes/test/e2e; }
  # kubectl carries its version, as a released one does (`kubectl version`
  # fails on the untagged default, and a conformance spec runs it).
  if ! { [ -x kubectl ] && ./kubectl version --client 2>/dev/null | grep -q "v$K8S_VERSION"; }; then
    log "kubectl"
    local v="-X k8s.io/client-go/pkg/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION"
    v="$v -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) -X k8s.io/client-go/pkg/version.gitTreeState=clean"
    nice go build -ldflags "$v" -o kubectl k8s.io/kubernetes/cmd/kubectl
  fi
  if [ ! -x ginkgo ]; then
    log "ginkgo CLI"
    GOBIN=$CONF GOFLAGS= go install "github.com/onsi/ginkgo/v2/ginkgo@$(go list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2)"
  fi
  if [ ! -x nettools.bin ] || [ "$HERE/nettools/main.go" -nt nettools.bin ]; then
    log "nettools (curl, nc, dig, getent stand-ins)"
    (cd "$HERE/nettools" && CGO_ENABLED=0 GOFLAGS= go build -ldflags='-s -w' -o "$CONF/nettools.bin" .)
  fi
  if [ ! -x nnp.bin ]; then
    # The nonewprivs image's setuid-root program (prints its effective uid):
    # what allowPrivilegeEscalation is tried with.
    log "nonewprivs"
    CGO_ENABLED=0 nice go build -ldflags='-s -w' -o nnp.bin k8s.io/kubernetes/test/images/nonewprivs && chmod 4755 nnp.bin
  fi
  if [ ! -x pause.bin ]; then
    mkdir -p pause && cat >pause/main.go <<'EOF'
// pause: a stand-in for registry.k8s.io/pause: sleeps until SIGINT/SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	<-c
}
EOF
    printf 'module pause\n\ngo 1.26\n' >pause/go.mod
    (cd pause && CGO_ENABLED=0 GOFLAGS= go build -ldflags='-s -w' -o ../pause.bin .)
  fi
  # The Aggregator spec's sample-apiserver and etcd images: the programs at
  # the versions the manifest's tags name, each built in a throwaway module
  # of its own (their dependencies are not k8s.io/kubernetes's).
  local src
  src=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)
  tag_of() { sed -n 's/.*configs\['"$1"'\] = Config{[^,]*, "[^"]*", "\([^"]*\)"}.*/\1/p' "$src/test/utils/image/manifest.go"; }
  standin_bin sample-apiserver.bin k8s.io/sample-apiserver "v0.$(tag_of APIServer | cut -d. -f2-)" k8s.io/sample-apiserver
  standin_bin etcd.bin go.etcd.io/etcd/server/v3 "v$(tag_of Etcd | cut -d- -f1)" go.etcd.io/etcd/server/v3
  # The busybox image's busybox: upstream's, at the image's version, built
  # static from its release tarball (Debian's pool keeps it as the .orig
  # tarball). Debian's own build reverts upstream's passing of variables
  # whose names are not shell identifiers (data-1, which Kubernetes accepts
  # since 1.34) through sh, which the env-var specs' `sh -c env` needs.
  local bbv
  bbv=$(tag_of BusyBox | cut -d- -f1)
  if [ ! -x "busybox-$bbv.bin" ]; then
    log "busybox $bbv (upstream, static)"
    rm -rf "busybox-$bbv" && curl -fsSL "http://deb.debian.org/debian/pool/main/b/busybox/busybox_$bbv.orig.tar.bz2" | tar xj
    (cd "busybox-$bbv" && make defconfig >/dev/null &&
      sed -i 's/^# CONFIG_STATIC is not set/CONFIG_STATIC=y/; s/^CONFIG_TC=y/# CONFIG_TC is not set/' .config &&
      nice make -j2 >build.log 2>&1 && cp busybox "../busybox-$bbv.bin")
  fi
  log "built: $(cd "$CONF" && ls e2e.test kubectl agnhost ginkgo pause.bin nettools.bin sample-apiserver.bin etcd.bin "busybox-$bbv.bin" | tr '\n' ' ')"
}

# standin_bin OUT MODULE VERSION PACKAGE: a static build of PACKAGE at
# MODULE@VERSION in a module of its own under $CONF/OUT.mod (skipped if built).
standin_bin() {
  local out=$1 mod=$2 version=$3 pkg=$4
  [ -x "$CONF/$out" ] && return
  log "$pkg $version"
  mkdir -p "$CONF/$out.mod"
  (cd "$CONF/$out.mod" && rm -f go.mod go.sum && printf 'module standin\n\ngo 1.26\n' >go.mod &&
    GOFLAGS= go get "$mod@$version" >get.log 2>&1 && CGO_ENABLED=0 GOFLAGS=-p=2 nice go build -ldflags='-s -w' -o "$CONF/$out" "$pkg")
}

# images: OCI tarballs in orch's air-gap images dir, named exactly as
# test/utils/image/manifest.go names them. agnhost is the real program on
# a busybox userland (the real image is alpine + bind-tools, curl, bash:
# no dig, curl or bash here); busybox is upstream busybox (build());
# nonroot (USER 1234) is the host's static busybox, glibc-dns-testing
# that with agnhost's tools; nginx is busybox httpd on :80;
# sample-apiserver and etcd are the real programs; pause is a
# signal-waiting Go binary.
images() {
  local src i=$DATA/agent/images r=registry.k8s.io/e2e-test-images
  src=$(cd "$CONF" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
  local tag
  tag=$(sed -n 's/.*configs\[Agnhost\] = Config{[^,]*, "agnhost", "\([^"]*\)"}.*/\1/p' "$src/test/utils/image/manifest.go")
  local prev
  prev=$(sed -n 's/.*configs\[AgnhostPrev\] = Config{[^,]*, "agnhost", "\([^"]*\)"}.*/\1/p' "$src/test/utils/image/manifest.go")
  ver() { sed -n 's/.*configs\['"$1"'\] = Config{[^,]*, "[^"]*", "\([^"]*\)"}.*/\1/p' "$src/test/utils/image/manifest.go"; }
  mkdir -p "$i" "$CONF/empty" "$CONF/html"
  echo '<html><body>nginx stand-in (busybox httpd)</body></html>' >"$CONF/html/index.html"
  write_mkimg
  cd "$CONF"
  local p=$src/test/images/agnhost/porter
  local ag='{"Entrypoint":["/agnhost"],"Cmd":["pause"],"ExposedPorts":{"80/tcp":{},"8080/tcp":{},"8081/tcp":{},"9376/tcp":{},"5000/tcp":{}}}'
  # The host's busybox runs its own applets before PATH (nc without -v):
  # the image's shell is a static mksh, which looks commands up in PATH.
  local tools=(nettools.bin:/usr/bin/nettools '/usr/bin/curl=>nettools' '/usr/bin/nc=>nettools' '/usr/bin/dig=>nettools' '/usr/bin/getent=>nettools'
    /usr/lib/klibc/bin/mksh:/bin/mksh '/bin/sh=>mksh')
  for v in "$tag" "$prev"; do
    [ -f "$i/agnhost-$v.tar" ] && [ "$i/agnhost-$v.tar" -nt nettools.bin ] || python3 mkimg.py "$i/agnhost-$v.tar" "$r/agnhost:$v" "$ag" \
      agnhost:/agnhost '/agnhost-2=>agnhost' empty:/uploads "$p/localhost.crt:/localhost.crt" "$p/localhost.key:/localhost.key" "${tools[@]}"
  done
  # The busybox image is upstream busybox at its version (build()).
  [ "$i/busybox.tar" -nt "$HERE/run.sh" ] || BUSYBOX=$CONF/busybox-$(ver BusyBox | cut -d- -f1).bin \
    python3 mkimg.py "$i/busybox.tar" "$r/busybox:$(ver BusyBox)" '{"Cmd":["sh"]}'
  [ -f "$i/nonroot.tar" ] || python3 mkimg.py "$i/nonroot.tar" "$r/nonroot:$(ver NonRoot)" '{"Cmd":["sh"],"User":"1234"}'
  # The DNS specs' second querier runs dig in it, as in agnhost.
  [ -f "$i/glibc-dns-testing.tar" ] && [ "$i/glibc-dns-testing.tar" -nt nettools.bin ] || python3 mkimg.py "$i/glibc-dns-testing.tar" \
    "$r/glibc-dns-testing:$(ver GlibcDnsTesting)" '{"Cmd":["sh"]}' "${tools[@]}"
  for id in Nginx NginxNew; do
    v=$(ver $id)
    [ -f "$i/nginx-$v.tar" ] || python3 mkimg.py "$i/nginx-$v.tar" "$r/nginx:$v" \
      '{"Cmd":["httpd","-f","-p","80","-h","/usr/share/nginx/html"],"ExposedPorts":{"80/tcp":{}}}' html:/usr/share/nginx/html
  done
  # The CLI's Update Demo: agnhost's file server over / with the demo's
  # picture and data.json, as their Dockerfiles build them (on agnhost's
  # Alpine base, whose os-release the ImageVolume spec reads in kitten).
  printf 'NAME="Alpine Linux"\nID=alpine\n' >os-release
  for id in Nautilus Kitten; do
    local name=${id,,}
    [ -f "$i/$name.tar" ] || python3 mkimg.py "$i/$name.tar" "$r/$name:$(ver $id)" '{"Entrypoint":["/agnhost"],"Cmd":["test-webserver"],"ExposedPorts":{"80/tcp":{}}}' \
      agnhost:/agnhost "$src/test/images/$name/html/$name.jpg:/$name.jpg" "$src/test/images/$name/html/data.json:/data.json" os-release:/etc/os-release
  done
  # Setuid root, as its Dockerfile makes it (mkimg keeps the file's mode).
  [ -f "$i/nonewprivs.tar" ] || python3 mkimg.py "$i/nonewprivs.tar" "$r/nonewprivs:$(ver Nonewprivs)" '{"Cmd":["nnp"]}' nnp.bin:/usr/local/bin/nnp
  # The Aggregator spec's pod: sample-apiserver (its Dockerfile's
  # entrypoint) beside etcd (run by path, as /usr/local/bin/etcd).
  [ -f "$i/sample-apiserver.tar" ] || python3 mkimg.py "$i/sample-apiserver.tar" "$r/sample-apiserver:$(ver APIServer)" \
    '{"Entrypoint":["/sample-apiserver"]}' sample-apiserver.bin:/sample-apiserver
  [ -f "$i/etcd.tar" ] || python3 mkimg.py "$i/etcd.tar" "registry.k8s.io/etcd:$(ver Etcd)" '{"Cmd":["/usr/local/bin/etcd"]}' \
    etcd.bin:/usr/local/bin/etcd
  [ -f "$i/pause.tar" ] || python3 mkimg.py "$i/pause.tar" "registry.k8s.io/pause:$(ver Pause)" '{"Entrypoint":["/pause"]}' pause.bin:/pause
  # Other suites' images (gateway.sh's), built into $CONF/extra-images.
  if compgen -G "$CONF/extra-images/*.tar" >/dev/null; then cp "$CONF"/extra-images/*.tar "$i/"; fi
  log "images: $(ls "$i" | tr '\n' ' ')"
}

# write_mkimg: a one-layer OCI tarball builder, with
# every busybox applet, /etc/passwd and /etc/group, any config, any files.
write_mkimg() {
  cat >"$CONF/mkimg.py" <<'EOF'
"""Build a single-layer OCI image tarball:
the host's static busybox (or $BUSYBOX) with every applet linked in /bin,
/etc/passwd and /etc/group, plus files from the host.
usage: mkimg.py OUT.tar NAME:TAG CONFIG_JSON [SRC:DST ...] [DST=>TARGET ...]
CONFIG_JSON: the image config's "config" (Cmd, Entrypoint, User, ...);
SRC:DST adds a host file or directory; DST=>TARGET adds a symlink."""
import hashlib, io, json, os, subprocess, sys, tarfile

out, ref, cfg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
cfg.setdefault("Env", ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
busybox = os.environ.get("BUSYBOX", "/bin/busybox")
applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w") as t:
    def mkdir(d, mode=0o755):
        ti = tarfile.TarInfo(d); ti.type = tarfile.DIRTYPE; ti.mode = mode; t.addfile(ti)
    def link(name, target):
        ti = tarfile.TarInfo(name); ti.type = tarfile.SYMTYPE; ti.linkname = target; t.addfile(ti)
    def data(name, b, mode=0o644):
        ti = tarfile.TarInfo(name); ti.size = len(b); ti.mode = mode; t.addfile(ti, io.BytesIO(b))
    for d in ["bin", "etc", "proc", "sys", "dev", "root", "home", "var", "run", "usr", "usr/bin", "usr/sbin", "sbin"]:
        mkdir(d)
    mkdir("tmp", 0o1777)
    t.add(busybox, arcname="bin/busybox")
    given = {p.split("=>")[0].lstrip("/") if "=>" in p else p.split(":", 1)[1].lstrip("/") for p in sys.argv[4:]}
    for app in applets:
        if app != "busybox" and "bin/" + app not in given:
            link("bin/" + app, "busybox")
    link("usr/bin/env", "/bin/busybox")
    data("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n"
         b"user-defined-in-image:x:1000:1000:Linux User,,,:/home/user-defined-in-image:/bin/sh\n")
    data("etc/group", b"root:x:0:\nnogroup:x:65534:\nuser-defined-in-image:x:1000:\n"
         b"group-defined-in-image:x:50000:user-defined-in-image\n")
    for pair in sys.argv[4:]:
        if "=>" in pair:
            dst, target = pair.split("=>", 1); link(dst.lstrip("/"), target)
        else:
            src, dst = pair.split(":", 1); t.add(src, arcname=dst.lstrip("/"))
layer = buf.getvalue()
ld = "sha256:" + hashlib.sha256(layer).hexdigest()
config = json.dumps({"architecture": "amd64", "os": "linux", "config": cfg,
                     "rootfs": {"type": "layers", "diff_ids": [ld]}}).encode()
cd = "sha256:" + hashlib.sha256(config).hexdigest()
manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": len(config)},
                       "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": ld, "size": len(layer)}]}).encode()
md = "sha256:" + hashlib.sha256(manifest).hexdigest()
index = json.dumps({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": len(manifest),
                    "annotations": {"org.opencontainers.image.ref.name": ref.split(":")[-1], "io.containerd.image.name": ref}}]}).encode()
with tarfile.open(out, "w") as o:
    def add(name, b):
        ti = tarfile.TarInfo(name); ti.size = len(b); o.addfile(ti, io.BytesIO(b))
    add("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
    add("index.json", index)
    for d, b in [(ld, layer), (cd, config), (md, manifest)]:
        add("blobs/sha256/" + d.split(":")[1], b)
EOF
}

orch_pid() { [ -f "$CONF/orch.pid" ] && kill -0 "$(cat "$CONF/orch.pid")" 2>/dev/null && cat "$CONF/orch.pid"; }
kc() { "$CONF/kubectl" --kubeconfig "$KCFG" --request-timeout=30s "$@"; }

# launch: orch server with its own agent on DATA (kept as it is).
launch() {
  log "orch server on :$PORT, data $DATA"
  (setsid "$ORCH" server --data-dir "$DATA" --https-listen-port "$PORT" --write-kubeconfig "$KCFG" \
    --private-registry "$CONF/no-registries.yaml" >>"$CONF/orch.log" 2>&1 &
    echo $! >"$CONF/orch.pid")
}

# watchdog: while the run lasts, restarts orch (at most RESTARTS times) if
# it dies, as systemd would; each death's last lines go to REPORT/crashes.log.
watchdog() {
  local n=0 p
  while sleep 5; do
    orch_pid >/dev/null && continue
    [ -f "$CONF/orch.pid" ] || return 0 # stopped on purpose
    n=$((n + 1))
    { echo "== $(date -u +%H:%M:%S) orch died (restart $n of $RESTARTS):"
      grep -m1 -A12 '^fatal error\|^panic' "$CONF/orch.log" || tail -20 "$CONF/orch.log"; } >>"$REPORT/crashes.log"
    [ "$n" -le "$RESTARTS" ] || return 0
    mv "$CONF/orch.log" "$CONF/orch.log.crash$n"
    # the containerd the dead orch started (not its shims: the new one adopts them)
    for p in $(ps -eo pid=,comm=,args= | awk -v d="$DATA/" '$2 == "containerd" && index($0, d) {print $1}'); do
      kill "$p" 2>/dev/null || true
    done
    sleep 2
    launch >>"$REPORT/crashes.log"
  done
}

# agents: AGENTS more nodes, each orch agent in a network namespace of its
# own (entered with nsenter: ip netns exec remounts /sys and runc then
# finds no cgroups) on a bridge to this host, joining the server at the
# host node's address with its token, the images copied into its air-gap
# dir; waits for every node Ready and its images imported.
agents() {
  [ "$AGENTS" -gt 0 ] || return 0
  local token hostip i ns dir addr want
  token=$(cat "$DATA/server/token")
  hostip=$(kc get nodes -o jsonpath='{.items[0].status.addresses[?(@.type=="InternalIP")].address}')
  ip link add confbr0 type bridge
  ip addr add "$AGENT_NET.1/24" dev confbr0
  ip link set confbr0 up
  for i in $(seq 1 "$AGENTS"); do
    ns=conf-node-$i dir=$CONF/agent-$i addr=$AGENT_NET.$((10 + i))
    ip netns add "$ns"
    ip link add "confh$i" type veth peer name eth0 netns "$ns"
    ip link set "confh$i" master confbr0 up
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" route add default via "$AGENT_NET.1"
    nsenter --net="/run/netns/$ns" sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'
    mkdir -p "$dir/agent/images"
    cp "$DATA"/agent/images/*.tar "$dir/agent/images/"
    log "orch agent $ns at $addr, data $dir"
    (setsid nsenter --net="/run/netns/$ns" "$ORCH" agent --server "https://$hostip:$PORT" --token "$token" --data-dir "$dir" \
      --runtime-dir "$dir/run" --node-name "$ns" --node-ip "$addr" --private-registry "$CONF/no-registries.yaml" >>"$CONF/agent-$i.log" 2>&1 &
      echo $! >"$CONF/agent-$i.pid")
  done
  want=$(ls "$DATA/agent/images" | wc -l)
  for _ in $(seq 1 240); do
    local ready=0
    ready=$(kc get nodes --no-headers 2>/dev/null | grep -c ' Ready' || true)
    local imported=1
    for i in $(seq 1 "$AGENTS"); do
      [ "$(grep -c 'image imported' "$CONF/agent-$i.log")" -ge "$want" ] || imported=0
    done
    if [ "$ready" -ge $((AGENTS + 1)) ] && [ "$imported" = 1 ]; then
      log "$AGENTS more nodes Ready"; kc get nodes -o wide; return
    fi
    sleep 0.5
  done
  log "the agents' nodes not Ready in 120 s: $(tail -3 "$CONF"/agent-*.log)"; exit 1
}

# start: a fresh data dir (the previous one stopped and removed), the
# images, orch server with its own agent (and AGENTS more); waits for a
# Ready node and every image imported.
start() {
  if orch_pid >/dev/null; then log "orch already running (pid $(orch_pid))"; return; fi
  stop
  rm -rf "$DATA" "$CONF"/orch.log* "$CONF"/agent-*
  images
  launch
  local want
  want=$(ls "$DATA/agent/images" | wc -l)
  for _ in $(seq 1 240); do
    if [ -f "$KCFG" ] && kc get nodes --no-headers 2>/dev/null | grep -q ' Ready' &&
      [ "$(grep -c 'image imported' "$CONF/orch.log")" -ge "$want" ]; then
      log "node Ready, $want images imported"; kc get nodes -o wide; agents; return
    fi
    orch_pid >/dev/null || { log "orch exited: $(tail -3 "$CONF/orch.log")"; exit 1; }
    sleep 0.5
  done
  log "no Ready node in 120 s: $(tail -3 "$CONF/orch.log")"; exit 1
}

# stop: orch (SIGTERM, then SIGKILL); then, through the containerd that orch
# started for DATA, every container it left running (killed, deleted);
# then that containerd and its shims (found by DATA in their command line,
# killed by pid); then every mount under DATA.
stop() {
  local pid f
  for f in "$CONF"/agent-*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$f"
  done
  if pid=$(orch_pid); then
    log "stopping orch $pid"
    kill "$pid"
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$CONF/orch.pid"
  local d
  for d in "$DATA" "$CONF"/agent-*/; do
    [ -d "$d" ] && stop_node "${d%/}"
  done
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '/^conf-node-/ {print $1}'); do ip netns del "$ns"; done
  ip link del confbr0 2>/dev/null || true
}

# stop_node: the containers a node's containerd (under dir) left running,
# that containerd and its shims, and the mounts under dir.
stop_node() {
  local dir=$1 p sock=$1/agent/containerd/containerd.sock
  if [ -S "$sock" ] && ctr -a "$sock" version >/dev/null 2>&1; then
    local ids
    ids=$(ctr -a "$sock" -n orch tasks ls -q 2>/dev/null || true)
    log "removing $(echo "$ids" | grep -c . || true) containers"
    for id in $ids; do ctr -a "$sock" -n orch tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    sleep 1
    for id in $ids; do ctr -a "$sock" -n orch tasks rm -f "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr -a "$sock" -n orch containers ls -q 2>/dev/null); do
      ctr -a "$sock" -n orch containers rm "$id" >/dev/null 2>&1 || true
    done
  fi
  ours() { ps -eo pid=,comm=,args= | awk -v d="$dir/" '$2 ~ /^containerd/ && index($0, d) {print $1}'; }
  for p in $(ours); do kill "$p" 2>/dev/null || true; done
  sleep 1
  for p in $(ours); do kill -9 "$p" 2>/dev/null || true; done
  awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" || true
  done
}

# verify_sa: e2e's --e2e-verify-service-account. Stock (true), every test's
# setup waits 2 min for the namespace's default ServiceAccount and its
# kube-root-ca.crt ConfigMap (kube-controller-manager's root-ca publisher).
# VERIFY_SA=auto (the default) probes a fresh namespace: true when
# kube-root-ca.crt appears within 30 s, else false (the run then measures
# what lies behind that wait, and says so).
verify_sa() {
  case "${VERIFY_SA:-auto}" in
    true | false) echo "$VERIFY_SA"; return ;;
  esac
  local ns=conformance-probe-$$ ok=false
  kc create namespace "$ns" >/dev/null
  for _ in $(seq 1 30); do
    if kc -n "$ns" get configmap kube-root-ca.crt >/dev/null 2>&1; then ok=true; break; fi
    sleep 1
  done
  kc delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
  echo $ok
}

e2e_flags() {
  echo "--kubeconfig=$KCFG --provider=skeleton --kubectl-path=$CONF/kubectl --report-dir=$REPORT --e2e-verify-service-account=$1"
}

# count: the dry run; how many tests the focus selects, per SIG.
count() {
  cd "$CONF"
  log "dry run: focus '$FOCUS' skip '$SKIP'"
  mkdir -p "$CONF/dry"
  ./e2e.test --provider=skeleton -ginkgo.dry-run -ginkgo.no-color -ginkgo.focus="$FOCUS" -ginkgo.skip="$SKIP" \
    -ginkgo.json-report="$CONF/dry/report.json" >"$CONF/dry/out.log" 2>&1 || true
  python3 summarize.py "$CONF/dry/report.json" "$CONF/dry" "$FOCUS" "$SKIP" | tee "$CONF/dry/summary.txt"
}

# run_suite: the suite in PROCS parallel processes, gracefully stopped at
# RUN_TIMEOUT (what did not run is counted as not-run), hard-stopped 10
# minutes later.
run_suite() {
  cd "$CONF"
  rm -rf "$REPORT" && mkdir -p "$REPORT"
  local vsa start=$SECONDS rc=0
  vsa=$(verify_sa)
  [ "$vsa" = true ] || log "WARNING: no kube-root-ca.crt in new namespaces: running with --e2e-verify-service-account=false (stock e2e fails every test's setup)"
  echo "$vsa" >"$REPORT/verify-service-account"
  local skip=$SKIP wd
  [ -z "$CRASHERS" ] || skip="$SKIP|$CRASHERS"
  log "run: $PROCS processes, cap $RUN_TIMEOUT, --e2e-verify-service-account=$vsa, left out: ${CRASHERS:-none}"
  watchdog &
  wd=$!
  # shellcheck disable=SC2046
  timeout -k 60 "$(( ${RUN_TIMEOUT%m} + 10 ))m" ./ginkgo run --procs="$PROCS" --timeout="$RUN_TIMEOUT" \
    --focus="$FOCUS" --skip="$skip" --no-color --output-dir="$REPORT" --json-report=report.json \
    --junit-report=junit.xml --poll-progress-after=10m \
    ./e2e.test -- $(e2e_flags "$vsa") >"$REPORT/run.log" 2>&1 || rc=$?
  kill "$wd" 2>/dev/null || true
  log "run finished rc=$rc in $(( (SECONDS - start) / 60 )) min; orch deaths: $(grep -c 'orch died' "$REPORT/crashes.log" 2>/dev/null || echo 0)"
  summary
}

summary() {
  [ -f "$CONF/summarize.py" ] || write_summarize
  python3 "$CONF/summarize.py" "$REPORT/report.json" "$REPORT" "$FOCUS" "$SKIP" "$CRASHERS" | tee "$REPORT/summary.txt"
  log "failed tests: $REPORT/failed.txt; messages: $REPORT/failures.tsv"
}

# write_summarize: counts per SIG and state from ginkgo's JSON report;
# failed.txt (names, crashers included), failures.tsv (sig, state, time, name, message).
write_summarize() {
  cat >"$CONF/summarize.py" <<'EOF'
"""Summarize a ginkgo JSON report of e2e.test: counts per SIG and state of
the specs FOCUS selects and SKIP does not (the others are filtered out);
failed.txt (names, crashers included), failures.tsv (sig, state, seconds, name, message),
results.tsv (every selected spec). usage: summarize.py REPORT.json OUTDIR FOCUS SKIP"""
import collections, json, re, sys

rep, outdir, focus, skip = sys.argv[1:5]
crashers = sys.argv[5] if len(sys.argv) > 5 else ""
rows = []
for s in json.load(open(rep)):
    for r in s.get("SpecReports") or []:
        if r.get("LeafNodeType") != "It":
            continue
        name = " ".join(t for t in (r.get("ContainerHierarchyTexts") or []) + [r.get("LeafNodeText", "")] if t)
        if not re.search(focus, name) or (skip and re.search(skip, name)):
            continue
        m = re.search(r"\[sig-[a-z-]+\]", name)
        sig = m.group(0)[1:-1] if m else "none"
        msg = " ".join(((r.get("Failure") or {}).get("Message") or "").split())
        state = r.get("State")
        if state == "skipped" and "interrupt" in msg.lower():
            state = "not-run"
        if crashers and re.search(crashers, name):
            state, msg = "crasher", "left out of the run: crashes orch"
        rows.append((sig, name, state, msg, r.get("RunTime", 0) / 1e9))
by = collections.defaultdict(collections.Counter)
for sig, _, state, _, _ in rows:
    by[sig][state] += 1
states = sorted({st for c in by.values() for st in c})
print("%-20s %6s " % ("SIG", "total") + " ".join("%8s" % st for st in states))
tot = collections.Counter()
for sig in sorted(by):
    c = by[sig]; tot.update(c)
    print("%-20s %6d " % (sig, sum(c.values())) + " ".join("%8d" % c[st] for st in states))
print("%-20s %6d " % ("ALL", sum(tot.values())) + " ".join("%8d" % tot[st] for st in states))
bad = sorted(r for r in rows if r[2] not in ("passed", "skipped", "pending", "not-run"))  # crashers count as failed
with open(outdir + "/failed.txt", "w") as f:
    f.writelines(name + "\n" for _, name, _, _, _ in bad)
with open(outdir + "/failures.tsv", "w") as f:
    f.writelines(f"{sig}\t{state}\t{rt:.0f}\t{name}\t{msg[:1000]}\n" for sig, name, state, msg, rt in bad)
with open(outdir + "/results.tsv", "w") as f:
    f.writelines(f"{sig}\t{state}\t{rt:.0f}\t{name}\n" for sig, name, state, _, rt in sorted(rows))
EOF
}

main() {
  [ -x /bin/busybox ] && [ -x /usr/lib/klibc/bin/mksh ] && command -v gcc make bzip2 curl >/dev/null ||
    apt-get install -y busybox-static mksh gcc make libc6-dev bzip2 curl >/dev/null
  mkdir -p "$CONF"
  write_summarize
  case "${1:-all}" in
    build) build ;;
    images) build && images ;;
    count) build && count ;;
    start) build && start ;;
    stop) stop ;;
    run) build && start && { run_suite || true; } && stop ;;
    summary) summary ;;
    all) build && count && start && { run_suite || true; } && stop ;;
    *) sed -n '2,28p' "$0"; exit 2 ;;
  esac
}
main "$@"
