#!/usr/bin/env bash
# Added latency of the mesh path against a direct connection (xds.BenchmarkMeshLatency, see
# docs/node-proxy.md and docs/latency-benchmarks.md): 1 KB HTTP requests and TCP echoes at
# 1000/s, the two paths interleaved, 20000 samples per path. Envoy is pinned to CPU 0 and the
# load generator with the applications to CPU 1 (override with AETHER_BENCH_ENVOY_CPUS /
# AETHER_BENCH_LOAD_CPUS; the samples with AETHER_BENCH_SAMPLES; AETHER_BENCH_NICE=1 adds
# nice -20). Needs root. Extra arguments go to `go test` (e.g. -count 3).
#
#   sudo bench/latency.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export AETHER_BENCH_ENVOY_CPUS="${AETHER_BENCH_ENVOY_CPUS-0}" AETHER_BENCH_LOAD_CPUS="${AETHER_BENCH_LOAD_CPUS-1}"
# `bench/latency.sh passthrough` runs xds.BenchmarkPassthroughLatency instead: new connections to a
# host outside the mesh, the passthrough from the node's netns (before) and from the pod's (after)
# against a direct path, in one run (docs/security.md).
bench=BenchmarkMeshLatency
if [ "${1:-}" = passthrough ]; then
  bench=BenchmarkPassthroughLatency
  shift
fi
exec go test ./xds/ -run '^$' -bench "^$bench\$" -benchtime 1x -timeout 30m "$@"
