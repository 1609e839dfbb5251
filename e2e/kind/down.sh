#!/usr/bin/env bash
# down.sh: delete the two kind clusters, the registry container and the work directory.
set -euo pipefail
# shellcheck source=e2e/kind/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

need docker kind
for c in "${CLUSTERS[@]}"; do
  kind delete cluster --name "$c"
done
docker rm -f "$REGISTRY" >/dev/null 2>&1 || true
rm -rf "$WORK"
