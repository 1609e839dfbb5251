#!/usr/bin/env bash
# cni.sh: aether-cni ADD latency (p50/p99, with and without the API lookup) and capture
# rule-apply time as exclusions grow. Needs root (network namespaces) and the cached tools
# (hack/tools.sh). Numbers are only meaningful on an otherwise idle machine.
#
#   bench/cni.sh            200 ADDs per setup, 20 applies per size
#   N=1000 bench/cni.sh     more ADDs
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
n=${N:-200}
echo "== load: $(cut -d' ' -f1-3 /proc/loadavg)"
go test -run '^$' -bench BenchmarkADD -benchtime "${n}x" ./cni/ | grep -E '^(Benchmark|ok|FAIL)'
go test -run '^$' -bench BenchmarkApply -benchtime 20x ./capture/ | grep -E '^(Benchmark|ok|FAIL)'
