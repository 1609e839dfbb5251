#!/usr/bin/env bash
# Benchmark of the east-west waypoint (docs/waypoint.md): the waypoint path against the direct
# mesh path between the same two pods' namespaces, side by side in one run (three real Envoys in
# node namespaces). Needs root. Extra arguments go to `go test` (e.g. -count 3).
#
#   sudo bench/waypoint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec go test ./xds/ -run '^$' -bench '^BenchmarkWaypoint$' -benchtime 1x "$@"
