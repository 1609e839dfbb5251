#!/usr/bin/env bash
# update-crds.sh: copy the MCS API CRDs (ServiceExport, ServiceImport) of the sigs.k8s.io/mcs-api
# version pinned in go.mod into deploy/crds/. verify-crds.sh fails when they differ.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-deploy/crds}
dir=$(go list -m -f '{{.Dir}}' sigs.k8s.io/mcs-api)
[ -n "$dir" ] || { echo "update-crds: sigs.k8s.io/mcs-api not in the module graph (go mod download)" >&2; exit 1; }
mkdir -p "$out"
for f in multicluster.x-k8s.io_serviceexports.yaml multicluster.x-k8s.io_serviceimports.yaml; do
  install -m 0644 "$dir/config/crd/$f" "$out/$f"
done
