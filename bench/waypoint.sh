#!/usr/bin/env bash
# Benchmark of the east-west waypoint (docs/waypoint.md): the waypoint path against the direct
# mesh path between the same two pods' namespaces, side by side in one run (three real Envoys in
# node namespaces): throughput, connection rate, and added latency at 1000 requests/s (the paths
# interleaved, 20000 samples per path; docs/latency-benchmarks.md). For the latency part the
# Envoys are pinned to CPU 0 and the load generator with the applications to CPU 1 (override with
# AETHER_BENCH_ENVOY_CPUS / AETHER_BENCH_LOAD_CPUS; the samples with AETHER_BENCH_SAMPLES;
# AETHER_BENCH_NICE=1 adds nice -20). Needs root. Extra arguments go to `go test`
# (e.g. -count 3).
#
#   sudo bench/waypoint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export AETHER_BENCH_ENVOY_CPUS="${AETHER_BENCH_ENVOY_CPUS-0}" AETHER_BENCH_LOAD_CPUS="${AETHER_BENCH_LOAD_CPUS-1}"
exec go test ./xds/ -run '^$' -bench '^BenchmarkWaypoint$' -benchtime 1x -timeout 30m "$@"
