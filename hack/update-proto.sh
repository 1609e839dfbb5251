#!/usr/bin/env bash
# update-proto.sh: regenerate the Go code of every .proto under api/ (committed beside it).
#
# Uses protoc from Debian's protobuf-compiler and the cached protoc-gen-go pinned in
# hack/versions.env (hack/tools.sh builds it). Output goes next to each .proto
# (paths=source_relative).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
eval "$(hack/tools.sh --print)"
command -v protoc >/dev/null || { echo "update-proto: protoc missing: run hack/tools.sh (protobuf-compiler)" >&2; exit 1; }
[ -x "$AETHER_PROTOC_GEN_GO" ] || { echo "update-proto: $AETHER_PROTOC_GEN_GO missing: run hack/tools.sh" >&2; exit 1; }
out=${1:-api}
mapfile -t protos < <(cd api && find . -name '*.proto' | sed 's|^\./||' | sort)
[ ${#protos[@]} -gt 0 ] || { echo "update-proto: no .proto files under api/" >&2; exit 1; }
protoc --plugin=protoc-gen-go="$AETHER_PROTOC_GEN_GO" -I api \
  --go_out="$out" --go_opt=paths=source_relative "${protos[@]}"
