#!/usr/bin/env bash
# verify-crds.sh: fail when the chart's CRDs (deploy/chart/aether/crds) differ from those of the
# pinned sigs.k8s.io/mcs-api and sigs.k8s.io/gateway-api, from aether's API types
# (controller-gen), or from the pinned SPIRE Controller Manager's (hack/update-crds.sh). deploy/crds/ is
# checked against the chart by verify-manifests.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
hack/update-crds.sh "$tmp"
diff -ru "$tmp" deploy/chart/aether/crds || { echo "verify-crds: deploy/chart/aether/crds is stale; run hack/update-crds.sh, then hack/update-manifests.sh" >&2; exit 1; }
