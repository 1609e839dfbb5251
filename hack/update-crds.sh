#!/usr/bin/env bash
# update-crds.sh: copy the CRDs aether ships into the Helm chart's crds/ directory
# (deploy/chart/aether/crds; hack/update-manifests.sh copies them on to deploy/crds/ for
# kubectl apply -k): the MCS API CRDs (ServiceExport, ServiceImport) of the sigs.k8s.io/mcs-api
# version pinned in go.mod, and the Gateway API CRDs of the experimental channel (a superset of
# standard: retries, GEP-1731, are experimental, and the standard CRDs would prune them) of the
# sigs.k8s.io/gateway-api version pinned in go.mod. verify-crds.sh fails when they differ.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-deploy/chart/aether/crds}
moddir() {
  local d
  d=$(go list -m -f '{{.Dir}}' "$1")
  [ -n "$d" ] || { echo "update-crds: $1 not in the module graph (go mod download)" >&2; exit 1; }
  echo "$d"
}
mkdir -p "$out"
mcs=$(moddir sigs.k8s.io/mcs-api)
for f in multicluster.x-k8s.io_serviceexports.yaml multicluster.x-k8s.io_serviceimports.yaml; do
  install -m 0644 "$mcs/config/crd/$f" "$out/$f"
done
gw=$(moddir sigs.k8s.io/gateway-api)
for r in gatewayclasses gateways httproutes grpcroutes referencegrants tcproutes tlsroutes udproutes backendtlspolicies listenersets; do
  install -m 0644 "$gw/config/crd/experimental/gateway.networking.k8s.io_$r.yaml" "$out/gateway.networking.k8s.io_$r.yaml"
done
