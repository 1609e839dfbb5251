#!/usr/bin/env bash
# verify-proto.sh: fail when the committed generated Go code under api/ differs from what
# hack/update-proto.sh would produce now.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
hack/update-proto.sh "$tmp"
status=0
while IFS= read -r gen; do
  rel=${gen#"$tmp"/}
  if ! diff -u "api/$rel" "$gen"; then
    echo "verify-proto: api/$rel is stale: run hack/update-proto.sh" >&2
    status=1
  fi
done < <(find "$tmp" -name '*.pb.go' | sort)
while IFS= read -r have; do
  rel=${have#api/}
  [ -f "$tmp/$rel" ] || { echo "verify-proto: $have has no .proto source: delete it" >&2; status=1; }
done < <(find api -name '*.pb.go' | sort)
[ $status = 0 ] && echo "verify-proto: generated code is up to date"
exit $status
