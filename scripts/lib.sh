# Shared by the scripts: find or install the Go toolchain go.mod pins.
# Sourced, not run.

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# Build tags of the orch binary: leave out what it never uses and would
# otherwise link (the binary budget, design.md): urfave/cli's man-page and
# Markdown generators (with a Markdown parser), and gRPC's request tracing
# pages (golang.org/x/net/trace, with html/template). 0.6 MB on amd64.
build_tags=urfave_cli_no_docs,grpcnotrace

go_wanted=$(sed -n 's/^toolchain go//p' go.mod)
[ -n "$go_wanted" ] || go_wanted=$(sed -n 's/^go //p' go.mod)

have_go() {
  command -v go >/dev/null 2>&1 || return 1
  local v
  v=$(go env GOVERSION 2>/dev/null) || return 1
  v=${v#go}
  # GOTOOLCHAIN=auto lets a Go 1.21+ fetch the pinned toolchain itself.
  [ "$(printf '%s\n%s\n' "1.21" "$v" | sort -V | head -1)" = "1.21" ]
}

apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# ensure_go puts a Go that can build this module on PATH. A fresh Debian
# has at most Go 1.19, which cannot switch toolchains, so it is used only
# to download the pinned toolchain from the Go module proxy.
ensure_go() {
  export PATH="$PATH:/usr/local/go/bin:$HOME/go/bin"
  have_go && return 0
  local cached
  cached=$(ls -d "$HOME"/go/pkg/mod/golang.org/toolchain@v0.0.1-go"$go_wanted".linux-* 2>/dev/null | head -1)
  if [ -z "$cached" ]; then
    apt_install golang-go ca-certificates git
    local arch
    arch=$(dpkg --print-architecture)
    (cd "$(mktemp -d)" && /usr/bin/go mod init bootstrap >/dev/null 2>&1 &&
      GOFLAGS=-modcacherw /usr/bin/go mod download "golang.org/toolchain@v0.0.1-go$go_wanted.linux-$arch")
    cached=$(ls -d "$HOME"/go/pkg/mod/golang.org/toolchain@v0.0.1-go"$go_wanted".linux-* | head -1)
  fi
  export PATH="$cached/bin:$PATH"
  have_go || { echo "could not install Go $go_wanted" >&2; return 1; }
}

ensure_go
export GOTOOLCHAIN=auto GOFLAGS=-buildvcs=false
