#!/usr/bin/env bash
# update-codegen.sh: regenerate the deepcopy code of aether's Kubernetes API types (every package
# under api/ with a +kubebuilder:object:generate marker: api/aether/security/v1alpha1) with the
# cached controller-gen pinned in hack/versions.env (hack/tools.sh builds it). The CRDs generated
# from the same types are hack/update-crds.sh's. verify-codegen.sh fails when the committed code
# differs.
#
#   hack/update-codegen.sh [outdir]   (default: next to the types; with outdir: outdir/<package dir>/)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cg=${AETHER_CONTROLLER_GEN:-$(hack/tools.sh --print | sed -n 's/^AETHER_CONTROLLER_GEN=//p')}
[ -x "$cg" ] || { echo "update-codegen: no controller-gen at '$cg': run hack/tools.sh" >&2; exit 1; }
# Each package gets its own run so that an outdir keeps the package's path.
pkgs=(api/aether/security/v1alpha1)
for pkg in "${pkgs[@]}"; do
  if [ -n "${1:-}" ]; then
    mkdir -p "$1/$pkg"
    "$cg" object paths="./$pkg" output:object:dir="$1/$pkg"
  else
    "$cg" object paths="./$pkg"
  fi
done
