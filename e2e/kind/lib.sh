#!/usr/bin/env bash
# lib.sh: settings and helpers shared by the kind scripts; sourced, never run. Every setting can
# be overridden from the environment:
#   AETHER_KIND_PREFIX      cluster and container name prefix (default aether: aether-a, aether-b)
#   AETHER_KIND_WORK        kubeconfigs, CA, downloads (default e2e/kind/.work)
#   AETHER_KIND_POD_CIDR_A, AETHER_KIND_POD_CIDR_B
#                           pod CIDRs; identical by default (Flannel's 10.244.0.0/16), which only
#                           the waypoint path can cross
#   AETHER_KIND_NODE_IMAGE  kindest/node image (default: kind's own for KIND_VERSION)
#   AETHER_KIND_WORKERS     worker nodes per cluster (default 2)
# shellcheck disable=SC2034 # the variables are used by the scripts that source this file
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=hack/versions.env
. "$ROOT/hack/versions.env"

PREFIX=${AETHER_KIND_PREFIX:-aether}
CLUSTERS=("$PREFIX-a" "$PREFIX-b")
WORK=${AETHER_KIND_WORK:-$ROOT/e2e/kind/.work}
POD_CIDR_A=${AETHER_KIND_POD_CIDR_A:-10.244.0.0/16}
POD_CIDR_B=${AETHER_KIND_POD_CIDR_B:-10.244.0.0/16}
SERVICE_CIDR_A=10.96.0.0/16
SERVICE_CIDR_B=10.112.0.0/16
WORKERS=${AETHER_KIND_WORKERS:-2}
REGISTRY=$PREFIX-registry
# The Docker network kind puts every node on: node IPs route between the clusters, pod CIDRs
# do not (each cluster's Flannel routes only its own).
KIND_NETWORK=kind

# Images: tag and Dockerfile (built from the repository root), as deploy/ names them, and the
# test workloads the scenario suite deploys (e2e/scenarios/kind.go names that image).
IMAGES=(
  "aether-agent:dev images/agent/Dockerfile"
  "aether-envoy:dev images/envoy/Dockerfile"
  "aether-registrar:dev images/registrar/Dockerfile"
  "aether-e2e-workloads:dev e2e/kind/workloads.Dockerfile"
)

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'e2e/kind: %s\n' "$*" >&2; exit 1; }

need() {
  local c
  for c in "$@"; do
    command -v "$c" >/dev/null 2>&1 || die "$c is missing: $(hint "$c")"
  done
}

hint() {
  case "$1" in
    kind) echo "go install sigs.k8s.io/kind@$KIND_VERSION" ;;
    helm) echo "go install helm.sh/helm/v4/cmd/helm@$HELM_VERSION (or hack/tools.sh, then put \$AETHER_HELM on the PATH)" ;;
    docker) echo "these scripts need a Docker engine (the local substrate does not: make e2e)" ;;
    *) echo "install $1" ;;
  esac
}

# kubeconfig CLUSTER: the kubeconfig file of a cluster.
kubeconfig() { echo "$WORK/kubeconfig-$1"; }

# kc CLUSTER ARGS...: kubectl against a cluster.
kc() {
  local c=$1
  shift
  kubectl --kubeconfig "$(kubeconfig "$c")" "$@"
}

# pod_cidr CLUSTER / service_cidr CLUSTER
pod_cidr() { if [ "$1" = "${CLUSTERS[0]}" ]; then echo "$POD_CIDR_A"; else echo "$POD_CIDR_B"; fi; }
service_cidr() { if [ "$1" = "${CLUSTERS[0]}" ]; then echo "$SERVICE_CIDR_A"; else echo "$SERVICE_CIDR_B"; fi; }

# registry_endpoint: the shared registry's client URL, reachable from every node.
registry_endpoint() {
  local ip
  ip=$(docker inspect -f "{{(index .NetworkSettings.Networks \"$KIND_NETWORK\").IPAddress}}" "$REGISTRY")
  [ -n "$ip" ] || die "registry container $REGISTRY has no address on network $KIND_NETWORK"
  echo "http://$ip:2379"
}
