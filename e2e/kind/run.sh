#!/usr/bin/env bash
# run.sh: the scenario suite (e2e/scenarios) against the two kind clusters up.sh made. Extra
# arguments go to `go test` before -args (for example -run 'TestScenarios/cross' or -v).
set -euo pipefail
# shellcheck source=e2e/kind/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

need go docker
for c in "${CLUSTERS[@]}"; do
  [ -s "$(kubeconfig "$c")" ] || die "no kubeconfig for $c: run e2e/kind/up.sh first"
done
cd "$ROOT"
go test ./e2e/scenarios/ -run TestScenarios -count=1 -timeout "${AETHER_KIND_TIMEOUT:-60m}" "$@" \
  -args -pair=kind -kubeconfig-a="$(kubeconfig "${CLUSTERS[0]}")" -kubeconfig-b="$(kubeconfig "${CLUSTERS[1]}")"
