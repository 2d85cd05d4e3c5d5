#!/usr/bin/env bash
# Checks the architecture mechanically: only internal/api may import the
# store, the store imports no other room, the agent's code imports nothing
# of the API server's (they share internal/joinproto, internal/kube and
# internal/apis) and only main imports the agent, the binary links no test code
# nor client-go's all-groups packages, the API server's auth reads no
# storage and only its root wires the built-in admission, and every
# package says what it is in a doc comment.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
mod=$(go list -m)
fail=0
while read -r pkg imports; do
  for imp in $imports; do
    case "$imp" in
      "$mod"/internal/store|"$mod"/internal/store/*)
        case "$pkg" in
          "$mod"/internal/api|"$mod"/internal/api/*|"$mod"/internal/store|"$mod"/internal/store/*) ;;
          *) echo "$pkg imports $imp: only internal/api may use the store"; fail=1 ;;
        esac ;;
      "$mod"/internal/porttest) ;; # a test helper, not a room
      "$mod"/internal/*)
        case "$pkg" in
          "$mod"/internal/store|"$mod"/internal/store/*)
            echo "$pkg imports $imp: the store imports no other room"; fail=1 ;;
        esac ;;
    esac
  done
done < <(go list -f '{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./...)
# The agent and the server meet only over the API and the join protocol;
# the agent's tests may start a real server, its code may not import one.
while read -r pkg imports; do
  case "$pkg" in "$mod"/internal/agent|"$mod"/internal/agent/*) ;; *) continue ;; esac
  for imp in $imports; do
    case "$imp" in "$mod"/internal/api|"$mod"/internal/api/*)
      echo "$pkg imports $imp: the agent reaches the server over the API only"; fail=1 ;;
    esac
  done
done < <(go list -f '{{.ImportPath}} {{join .Imports " "}}' ./...)
while read -r pkg imports; do
  case "$pkg" in "$mod"|"$mod"/internal/agent|"$mod"/internal/agent/*) continue ;; esac
  for imp in $imports; do
    case "$imp" in "$mod"/internal/agent|"$mod"/internal/agent/*)
      echo "$pkg imports $imp: only main starts the agent"; fail=1 ;;
    esac
  done
done < <(go list -f '{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./...)
if go list -deps . | grep -qx testing; then
  echo "bin/orch links the testing package:"; go list -deps -f '{{.ImportPath}}: {{join .Imports " "}}' . | grep -w testing | grep -v '^testing'
  fail=1
fi
# client-go's clientset, informer factory, discovery and events link all of
# Kubernetes' API groups (bin/orch 60 MB instead of 28); internal/kube
# does their work for the groups orch serves, and internal/api/apply embeds
# the part of applyconfigurations' schema it needs.
for heavy in k8s.io/client-go/kubernetes k8s.io/client-go/kubernetes/scheme k8s.io/client-go/applyconfigurations k8s.io/client-go/informers k8s.io/client-go/discovery k8s.io/client-go/tools/events; do
  if go list -deps . | grep -qx "$heavy"; then
    echo "bin/orch links $heavy (every API group): use internal/kube"; fail=1
  fi
done
# The API server's rooms: authentication and authorization decide from
# what they are given and read no storage; the built-in admission plugins
# are wired by the server's root package only, and the admission the
# cluster configures (webhooks, policies) does not lean on them.
while read -r pkg imports; do
  for imp in $imports; do
    case "$pkg:$imp" in
      "$mod"/internal/api/auth*:"$mod"/internal/api/registry*|"$mod"/internal/api/auth*:"$mod"/internal/store*)
        echo "$pkg imports $imp: auth reads no storage"; fail=1 ;;
      "$mod"/internal/api:*|"$mod"/internal/api/admission/plugins*:*) ;;
      *:"$mod"/internal/api/admission/plugins*)
        echo "$pkg imports $imp: only the server's root package wires the built-in admission"; fail=1 ;;
    esac
  done
done < <(go list -f '{{.ImportPath}} {{join .Imports " "}}' ./...)
while read -r pkg doc; do
  [ -n "$doc" ] || { echo "$pkg has no package doc comment"; fail=1; }
done < <(go list -f '{{.ImportPath}} {{.Doc}}' ./...)
[ $fail -eq 0 ] && echo "import graph and package docs: ok"
exit $fail
