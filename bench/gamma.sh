#!/usr/bin/env bash
# The GAMMA routing benchmarks of issue #23 (docs/routing.md, "Performance"), each repeated and
# compared with benchstat:
#
#   sudo bench/gamma.sh latency  xds.BenchmarkGAMMARouteLatency: request p50/p90/p99 and Envoy CPU
#                                through a service with a ten-rule HTTPRoute (path=routed) against
#                                the same kind of service without routes (path=plain), with a
#                                direct pod-to-pod path as the floor, interleaved at 1000
#                                requests/s in each run (goal: no difference beyond 5%)
#   sudo bench/gamma.sh apply    agent.BenchmarkRouteApplyToTraffic: the real agent, Envoy and
#                                kube-apiserver; from a route's API write to the first request
#                                answered by its new backend, with 1000 routes (routes=1000)
#                                against the route alone (routes=1) (goal: p99 under 1 s)
#   bench/gamma.sh build         xds.BenchmarkSnapshotBuildRoutes: the snapshot build at 10k
#                                services with 1000 routes (routes=1000) against none (routes=0):
#                                cold, an endpoint change, a route change (goal: at most 1.5x)
#   sudo bench/gamma.sh all      the three in turn (about 30 minutes on two cores)
#
# AETHER_BENCH_COUNT sets the repetitions (default 6: benchstat gives a confidence interval from
# 6 samples and calls a difference from 4). Each part's raw `go test` output goes to
# $AETHER_BENCH_OUT/<part>.txt (default a new directory under /tmp, printed) and benchstat's
# comparison to <part>.benchstat beside it. The latency part pins Envoy to CPU 0 and the load
# generator with the applications to CPU 1 as bench/latency.sh does (AETHER_BENCH_ENVOY_CPUS,
# AETHER_BENCH_LOAD_CPUS; AETHER_BENCH_SAMPLES per path, default 20000); the apply part makes
# AETHER_BENCH_CHANGES route changes per run (default 60). Extra arguments go to `go test`.
# benchstat comes from the tool cache (hack/tools.sh). Run on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:-latency}
[ $# -gt 0 ] && shift
count=${AETHER_BENCH_COUNT:-6}
eval "$(hack/tools.sh --print | grep '^AETHER_BENCHSTAT=')"
if [ ! -x "$AETHER_BENCHSTAT" ]; then
  echo "gamma.sh: no benchstat at $AETHER_BENCHSTAT: run hack/tools.sh (or make tools) first" >&2
  exit 1
fi
out=${AETHER_BENCH_OUT:-$(mktemp -d /tmp/aether-gamma-bench.XXXXXX)}
mkdir -p "$out"
echo "gamma.sh: raw results and benchstat output in $out (count $count, $(date -u +%FT%TZ), loadavg $(cut -d' ' -f1-3 /proc/loadavg))"

# run NAME PACKAGE BENCHMARK BENCHTIME TIMEOUT: go test -count $count into $out/NAME.txt.
run() {
  local name=$1 pkg=$2 bench=$3 benchtime=$4 timeout=$5
  shift 5
  echo "== $name: go test $pkg -run '^\$' -bench '^$bench\$' -benchtime $benchtime -count $count -v $*"
  go test "$pkg" -run '^$' -bench "^$bench\$" -benchtime "$benchtime" -count "$count" -timeout "$timeout" -v "$@" | tee "$out/$name.txt"
}

# stat NAME ARGS...: benchstat ARGS on $out/NAME.txt, shown and appended to $out/NAME.benchstat.
stat() {
  local name=$1
  shift
  echo "== benchstat $* $name.txt"
  "$AETHER_BENCHSTAT" "$@" "$out/$name.txt" | tee -a "$out/$name.benchstat"
}

latency() {
  AETHER_BENCH_ENVOY_CPUS="${AETHER_BENCH_ENVOY_CPUS-0}" AETHER_BENCH_LOAD_CPUS="${AETHER_BENCH_LOAD_CPUS-1}" \
    run latency ./xds/ BenchmarkGAMMARouteLatency 1x 60m "$@"
  stat latency -col '/path@(plain routed)'
  # What the mesh path adds over the direct floor, for reading the above against it.
  stat latency -col '/path@(direct plain)'
}
apply() {
  run apply ./agent/ BenchmarkRouteApplyToTraffic 1x 120m "$@"
  stat apply -col /routes
}
build() {
  run build ./xds/ BenchmarkSnapshotBuildRoutes 5x 60m "$@"
  stat build -col /routes
}

case $part in
latency | apply | build) "$part" "$@" ;;
all)
  latency "$@"
  build "$@"
  apply "$@"
  ;;
*)
  echo "usage: bench/gamma.sh [latency|apply|build|all] [go test flags]" >&2
  exit 2
  ;;
esac
