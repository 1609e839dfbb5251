#!/usr/bin/env bash
# Benchmark of config projections (docs/projections.md): how fast a producer route change in the
# exporting cluster reaches the importing cluster's callers, side by side with the exporting
# cluster's own callers (the same change applied locally: the reference), on the real-nodes pair
# of the e2e substrate (two clusters, real kubelets, the registry, real Envoys). B's route is a
# ten-rule HTTPRoute; each change flips its catch-all rule's backend and response header, and the
# time from the API write to the first answer with the new header is taken in both clusters. It
# prints p50/p99 of both and the projection record's size in the registry. AETHER_BENCH_CHANGES
# sets the changes (default 100). Needs root; takes about 4 minutes (the mesh comes up first).
#
#   sudo bench/projection.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export AETHER_BENCH_CHANGES="${AETHER_BENCH_CHANGES:-100}"
go test ./e2e/scenarios/ -run 'TestScenarios/real-nodes/config-projections/(producer-route-reaches-importer|convergence)$' \
  -count=1 -v -timeout 30m "$@" | tee /dev/stderr | grep -E 'projection convergence over|^(ok|FAIL|--- FAIL)'
