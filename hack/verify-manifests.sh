#!/usr/bin/env bash
# verify-manifests.sh: fail when the manifests under deploy/ differ from the Helm chart
# deploy/chart/aether rendered with its defaults (hack/update-manifests.sh), or when deploy/ has a
# manifest the chart does not render.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
hack/update-manifests.sh "$tmp"
status=0
while IFS= read -r f; do
  rel=${f#"$tmp"/}
  if ! diff -u "deploy/$rel" "$f"; then
    echo "verify-manifests: deploy/$rel is stale: run hack/update-manifests.sh" >&2
    status=1
  fi
done < <(find "$tmp" -name '*.yaml' | sort)
while IFS= read -r have; do
  rel=${have#deploy/}
  [ -f "$tmp/$rel" ] || { echo "verify-manifests: $have is rendered by no chart template: delete it, or add the template" >&2; status=1; }
done < <(find deploy -name '*.yaml' -not -path 'deploy/chart/*' -not -name kustomization.yaml | sort)
[ $status = 0 ] && echo "verify-manifests: deploy/ is the chart rendered"
exit $status
