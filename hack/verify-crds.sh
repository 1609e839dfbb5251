#!/usr/bin/env bash
# verify-crds.sh: fail when deploy/crds/ differs from the CRDs of the pinned sigs.k8s.io/mcs-api and
# sigs.k8s.io/gateway-api (hack/update-crds.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
hack/update-crds.sh "$tmp"
diff -ru "$tmp" deploy/crds || { echo "verify-crds: deploy/crds is stale; run hack/update-crds.sh" >&2; exit 1; }
