#!/usr/bin/env bash
# verify-codegen.sh: fail when the committed deepcopy code of aether's Kubernetes API types differs
# from what hack/update-codegen.sh would produce now.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
hack/update-codegen.sh "$tmp"
status=0
while IFS= read -r gen; do
  rel=${gen#"$tmp"/}
  if ! diff -u "$rel" "$gen"; then
    echo "verify-codegen: $rel is stale: run hack/update-codegen.sh" >&2
    status=1
  fi
done < <(find "$tmp" -name 'zz_generated.*.go' | sort)
[ $status = 0 ] && echo "verify-codegen: generated code is up to date"
exit $status
