#!/usr/bin/env bash
# run.sh: DNS benchmark of the agent's resolver (dnsd) side by side with CoreDNS.
#
#   bench/dns/run.sh            both servers, mesh names and NXDOMAIN, saturation and low rate
#
# Each server serves the same NAMES (default 1000) names svc-<i>.bench.mesh -> 10.96.x.y: dnsd
# from a mesh model (bench/dns/server), CoreDNS (hack/tools.sh builds it) from its hosts plugin
# for the zone mesh (names it does not hold fall through to the file plugin with a zone of only
# the SOA and NS, which answers NXDOMAIN with the SOA as dnsd does; the hosts plugin alone
# answers them SERVFAIL, and template runs before hosts), "bare" (bench/dns/bare), the smallest miekg/dns map server, as the
# ceiling of any miekg/dns server on this machine, and "floor" (bench/dns/floor, C, built with
# clang), which returns every query with the QR bit set and nothing else: its low-rate latency is
# the kernel's, the loopback path's and the idle core's wake-up, the floor under any user-space
# server here. SERVERS picks some (default all four). The server runs pinned to SERVER_CPU (taskset), dnsperf (Debian) to
# LOAD_CPU. For each server and query set ("mesh": existing names, "nx": NXDOMAIN in the zone,
# and with SETS="mesh nx fwd" "fwd": forwarded names svc-<i>.bench.example, which an upstream
# (a second dnsd server, authoritative for example with TTL 30, unpinned) answers, served by
# dnsd through its cache and by CoreDNS through forward + cache 30 as NodeLocal DNSCache does,
# so that after each name's first query a run is all hits; bare and floor skip it):
#   - saturation: dnsperf with CLIENTS clients and OUTSTANDING queries in flight for DURATION
#     seconds (default 10); "qps" is dnsperf's "Queries per second"; "per CPU second" divides the
#     queries completed by the CPU time (user + system, /proc/<pid>/stat) the server used
#     meanwhile, which stays comparable when other work on a shared machine takes part of the
#     core; "core share" is that CPU time over the wall time (about 100% when nothing else runs
#     on SERVER_CPU);
#   - low rate: dnsperf -Q at RATE queries/s (default: a tenth of CoreDNS's best queries per
#     server CPU second so far for the same query set, which is its saturation rate on an idle
#     machine and stays so on a busy one) for LOW_DURATION seconds (default 30, so p99 rests on
#     thousands of samples), every query's latency recorded (-v); p50/p99/p99.9 per run, and
#     pooled over all rounds in the summary.
# Every line says how busy the machine was: the 1-minute load average at the start and end, and
# "other work", the share of SERVER_CPU and LOAD_CPU's time (/proc/stat, steal included) that
# neither the server nor dnsperf used. Numbers taken with other work above a few percent are
# not the machine's; rerun when it is idle.
# ROUNDS (default 1) repeats everything, alternating the servers, so a load change on a shared
# machine hits both. Server and dnsperf run at nice NICE (default -19, root only) so that other
# work on a shared machine perturbs them less (CFS still gives that work a share; no real-time
# priority). Only loopback is used; ports are random high ports.
# HALT_POLL_NS (default unset: the machine's setting stays) sets the guest's cpuidle halt polling
# (/sys/module/haltpoll/parameters/guest_halt_poll_ns, haltpoll driver only) for the run and puts
# the old value back on exit, as pyperf's "system tune" sets the CPU governor for a benchmark.
# With 0 (what this VM's kernel command line sets) an idle vCPU halts at once, so every low-rate
# query pays two vCPU wake-ups (server, then dnsperf) that no server can avoid; 200000 is the
# kernel's default. It applies to every server alike; the last line prints the value in force.
# PAUSE_DAMON=1 turns every running DAMON context (/sys/kernel/mm/damon/admin/kdamonds/*/state)
# off for the run and back on at exit. This VM runs one (kdamond, page-out of cold memory to
# return it to the host) that wakes every 512 ms and holds a core for up to ~4 ms, so each 30 s
# low-rate run's p99 counts how many of its passes hit the server's core. Like HALT_POLL_NS it
# is the same for every server; the last line prints the kdamonds' states.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
DURATION=${DURATION:-10}
LOW_DURATION=${LOW_DURATION:-30}
RATE=${RATE:-}
NAMES=${NAMES:-1000}
CLIENTS=${CLIENTS:-8}
OUTSTANDING=${OUTSTANDING:-500}
ROUNDS=${ROUNDS:-1}
SERVERS=${SERVERS:-coredns dnsd bare floor}
SETS=${SETS:-mesh nx}
NICE=${NICE:--19}
HALT_POLL_NS=${HALT_POLL_NS:-}
PAUSE_DAMON=${PAUSE_DAMON:-}
haltpoll=/sys/module/haltpoll/parameters/guest_halt_poll_ns

eval "$("$root/hack/tools.sh" --print)"
[ -x "$AETHER_COREDNS" ] || "$root/hack/tools.sh"
command -v dnsperf >/dev/null || { echo "run.sh: dnsperf missing (hack/tools.sh installs it)" >&2; exit 1; }

work=$(mktemp -d)
pid=""
oldpoll=""
paused=() # DAMON state files this run turned off
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  [ -n "$oldpoll" ] && echo "$oldpoll" >"$haltpoll"
  for f in "${paused[@]}"; do echo on >"$f" || echo "run.sh: could not turn $f back on" >&2; done
  rm -rf "$work"
}
trap cleanup EXIT
if [ -n "$HALT_POLL_NS" ]; then
  [[ $HALT_POLL_NS =~ ^[0-9]+$ ]] || { echo "run.sh: HALT_POLL_NS=$HALT_POLL_NS: want nanoseconds, a whole number" >&2; exit 1; }
  [ -w "$haltpoll" ] || { echo "run.sh: HALT_POLL_NS=$HALT_POLL_NS: $haltpoll is not writable (haltpoll cpuidle driver and root needed)" >&2; exit 1; }
  oldpoll=$(cat "$haltpoll")
  echo "$HALT_POLL_NS" >"$haltpoll"
fi
case $PAUSE_DAMON in
  "" | 0) ;;
  1)
    for f in /sys/kernel/mm/damon/admin/kdamonds/*/state; do
      if [ -e "$f" ] && [ "$(cat "$f")" = on ]; then
        [ -w "$f" ] || { echo "run.sh: PAUSE_DAMON=1: $f is not writable (root needed)" >&2; exit 1; }
        paused+=("$f")
        echo off >"$f"
      fi
    done
    ;;
  *) echo "run.sh: PAUSE_DAMON=$PAUSE_DAMON: want 1 (pause DAMON for the run) or 0" >&2; exit 1 ;;
esac

(cd "$root" && go build -o "$work/dnsd-server" ./bench/dns/server && go build -o "$work/bare-server" ./bench/dns/bare)
if [[ " $SERVERS " == *" floor "* ]]; then
  "${CC:-clang}" -O2 -Wall -o "$work/floor-server" "$root/bench/dns/floor/floor.c"
fi
for ((i = 0; i < NAMES; i++)); do
  echo "10.96.$((i / 256)).$((i % 256)) svc-$i.bench.mesh" >>"$work/hosts"
  echo "svc-$i.bench.mesh A" >>"$work/q-mesh"
  echo "nx-$i.bench.mesh A" >>"$work/q-nx"
  echo "svc-$i.bench.example A" >>"$work/q-fwd"
done

# The zone's SOA (and NS), so that CoreDNS's file plugin answers the names hosts does not hold
# NXDOMAIN with the SOA, as dnsd does.
# shellcheck disable=SC2016 # $ORIGIN is a zone file directive
printf '$ORIGIN mesh.\n@ 5 IN SOA ns.dns.mesh. hostmaster.mesh. 1 7200 1800 86400 5\n@ 5 IN NS ns.dns.mesh.\n' >"$work/mesh.zone"

# A random high port free for UDP and TCP, and the next one (the forwarded set's upstream).
while :; do
  port=$((30000 + RANDOM % 20000))
  [ -z "$(ss -Htaun "sport = :$port")" ] && [ -z "$(ss -Htaun "sport = :$((port + 1))")" ] && break
done
# The upstream of the forwarded set.
upport=$((port + 1))
if [[ " $SETS " == *" fwd "* ]]; then
  "$work/dnsd-server" -addr "127.0.0.1:$upport" -names "$NAMES" -mesh-domain example -ttl 30 -cache-size 0 2>"$work/upstream.log" &
  uppid=$!
  trap 'kill $uppid 2>/dev/null; cleanup' EXIT
  for _ in $(seq 100); do
    [ "$(dig +short +time=1 +tries=1 @127.0.0.1 -p "$upport" svc-1.bench.example A 2>/dev/null)" = 10.96.0.1 ] && break
    sleep 0.1
  done
fi
cat >"$work/Corefile" <<EOC
example:$port {
    bind 127.0.0.1
    forward . 127.0.0.1:$upport
    cache 30 {
        success 9984 30
        denial 9984 5
    }
}
mesh:$port {
    bind 127.0.0.1
    hosts $work/hosts mesh {
        ttl 5
        reload 0
        fallthrough
    }
    file $work/mesh.zone mesh {
        reload 0
    }
}
EOC

start() { # server
  case $1 in
    dnsd) nice -n "$NICE" taskset -c "$SERVER_CPU" "$work/dnsd-server" -addr "127.0.0.1:$port" -names "$NAMES" -upstream "127.0.0.1:$upport" 2>"$work/$1.log" & ;;
    bare) nice -n "$NICE" taskset -c "$SERVER_CPU" "$work/bare-server" -addr "127.0.0.1:$port" -names "$NAMES" 2>"$work/$1.log" & ;;
    coredns) nice -n "$NICE" taskset -c "$SERVER_CPU" "$AETHER_COREDNS" -conf "$work/Corefile" >"$work/$1.log" 2>&1 & ;;
    floor) nice -n "$NICE" taskset -c "$SERVER_CPU" "$work/floor-server" 127.0.0.1 "$port" 2>"$work/$1.log" & ;;
  esac
  pid=$!
  for _ in $(seq 100); do
    case $1 in
      floor) dig +time=1 +tries=1 @127.0.0.1 -p "$port" svc-1.bench.mesh A 2>/dev/null | grep -q 'status: NOERROR' && return 0 ;; # no records: the question comes back
      *) [ "$(dig +short +time=1 +tries=1 @127.0.0.1 -p "$port" svc-1.bench.mesh A 2>/dev/null)" = 10.96.0.1 ] && return 0 ;;
    esac
    sleep 0.1
  done
  echo "run.sh: $1 did not answer; log:" >&2
  cat "$work/$1.log" >&2
  exit 1
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""; }

cputicks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
# Busy ticks of SERVER_CPU and LOAD_CPU together (user nice system irq softirq steal).
corebusy() { awk -v a="cpu$SERVER_CPU" -v b="cpu$LOAD_CPU" '$1 == a || $1 == b {s += $2 + $3 + $4 + $7 + $8 + $9} END {print s}' /proc/stat; }
loadavg() { cut -d' ' -f1 /proc/loadavg; }
hz=$(getconf CLK_TCK)
# measure cmd...: runs a dnsperf command line on LOAD_CPU; its output goes to $work/out, and
# $busy describes the machine meanwhile ("load a->b, other work x%"), $sticks the server's CPU
# ticks and $secs the wall seconds.
measure() {
  local la0 t0 c0 w0 w1 dcpu
  la0=$(loadavg) t0=$(cputicks) c0=$(corebusy) w0=$(date +%s.%N)
  nice -n "$NICE" taskset -c "$LOAD_CPU" /usr/bin/time -f '%U %S' -o "$work/time" "$@" >"$work/out" 2>&1
  w1=$(date +%s.%N)
  sticks=$(($(cputicks) - t0))
  secs=$(awk -v a="$w0" -v b="$w1" 'BEGIN {print b - a}')
  dcpu=$(awk '{print $1 + $2}' "$work/time")
  busy=$(awk -v la0="$la0" -v la1="$(loadavg)" -v c=$(($(corebusy) - c0)) -v s="$sticks" -v d="$dcpu" -v hz="$hz" -v w="$secs" \
    'BEGIN {o = (c - s - d * hz) / (2 * w * hz) * 100; if (o < 0) o = 0; printf "load %s->%s, other work %.0f%%", la0, la1, o}')
}
saturate() { # queryfile -> "qps queries-per-cpu-second core-share"; sets $busy (call it outside $(...))
  measure dnsperf -s 127.0.0.1 -p "$port" -d "$1" -l "$DURATION" -c "$CLIENTS" -q "$OUTSTANDING"
  # Core share over DURATION: dnsperf's wait for the last answers adds wall time, not load.
  awk -v ticks="$sticks" -v hz="$hz" -v w="$DURATION" '
    /Queries completed/ {done = $3}
    /Queries per second/ {qps = $4}
    END {printf "%.0f %.0f %.0f\n", qps, done / (ticks / hz), ticks / hz / w * 100}' "$work/out"
}
lowrate() { # queryfile rate latencyfile -> "p50_ms p99_ms p99.9_ms lost"; appends latencies (s) to latencyfile; sets $busy (call it outside $(...))
  measure dnsperf -s 127.0.0.1 -p "$port" -d "$1" -l "$LOW_DURATION" -Q "$2" -v
  awk '/^> / {print $NF}' "$work/out" | tee -a "$3" | sort -g | pct
  awk '/Queries lost/ {printf " %s\n", $3}' "$work/out"
}
pct() { # sorted latencies (s) on stdin -> "p50_ms p99_ms p99.9_ms"
  awk 'function at(p, i) {i = int(NR * p); if (i < 1) i = 1; return v[i] * 1000}
    {v[NR] = $1}
    END {if (NR == 0) print "- - -"; else printf "%.3f %.3f %.3f", at(0.50), at(0.99), at(0.999)}'
}

# warm set: for the forwarded set, asks every name once, a few at a time, so that the runs
# measure the cache and not a cold start's burst of misses (thousands of queries in flight for
# names nobody has asked yet, each sent upstream; a lost one holds a dnsperf slot for 5 s).
warm() {
  [ "$1" = fwd ] || return 0
  taskset -c "$LOAD_CPU" dnsperf -s 127.0.0.1 -p "$port" -d "$work/q-fwd" -n 1 -c 1 -q 10 >/dev/null 2>&1 || true
}
# sets server: the query sets server serves (bare and floor hold no forwarded names).
sets() {
  case $1 in
    bare | floor) for s in $SETS; do [ "$s" = fwd ] || printf '%s ' "$s"; done ;;
    *) echo "$SETS" ;;
  esac
}

declare -A qps cpu share p50 p99 lowrates
for ((r = 1; r <= ROUNDS; r++)); do
  for server in $SERVERS; do
    start "$server"
    for set in $(sets "$server"); do
      warm "$set"
      saturate "$work/q-$set" >"$work/res"
      read -r q eff sh <"$work/res"
      qps[$server.$set]="${qps[$server.$set]:-} $q"
      cpu[$server.$set]="${cpu[$server.$set]:-} $eff"
      share[$server.$set]="${share[$server.$set]:-} $sh%"
      echo "round $r $server $set saturation: $q qps, $eff queries per server CPU second, core share $sh% ($busy)"
    done
    stop
  done
  for server in $SERVERS; do
    start "$server"
    for set in $(sets "$server"); do
      warm "$set"
      rate=$RATE
      if [ -z "$rate" ]; then
        # A tenth of CoreDNS's best rate per server CPU second for this query set so far: its
        # saturation rate with its core to itself, even when other work took part of the core.
        best=$(tr ' ' '\n' <<<"${cpu[coredns.$set]:-${cpu[$server.$set]}}" | sort -n | tail -1)
        rate=$((best / 10))
      fi
      if [ "$server" = "${SERVERS%% *}" ]; then
        lowrates[$set]="${lowrates[$set]:-} $rate"
      fi
      lowrate "$work/q-$set" "$rate" "$work/lat.$server.$set" >"$work/res"
      read -r a b c lost <"$work/res"
      p50[$server.$set]="${p50[$server.$set]:-} $a"
      p99[$server.$set]="${p99[$server.$set]:-} $b"
      echo "round $r $server $set at $rate qps: p50/p99/p99.9 ms $a $b $c, $lost lost ($busy)"
    done
    stop
  done
done
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{v[NR] = $1} END {m = int((NR + 1) / 2); print NR % 2 ? v[m] : (v[m] + v[m + 1]) / 2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2fx", a / b; else print "-"}'; }
echo "summary over $ROUNDS round(s): per round values; median"
for server in $SERVERS; do
  for set in $(sets "$server"); do
    echo "  $server $set: qps${qps[$server.$set]} (median $(median "${qps[$server.$set]}")); per CPU second${cpu[$server.$set]} (median $(median "${cpu[$server.$set]}")); core share${share[$server.$set]}"
    echo "  $server $set low rate: p50 ms${p50[$server.$set]}; p99 ms${p99[$server.$set]}; pooled p50/p99/p99.9 ms $(sort -g "$work/lat.$server.$set" | pct)"
  done
done
if [[ " $SERVERS " == *" coredns "* ]]; then
  echo "ratios to CoreDNS (medians; p99 pooled over rounds):"
  printf '  %-8s %-5s %10s %8s %12s %8s %9s %9s %8s\n' server set qps ratio "per CPU s" ratio "p50 ms" "p99 ms" "p99 ratio"
  for server in $SERVERS; do
    for set in $(sets "$server"); do
      q=$(median "${qps[$server.$set]}") cq=$(median "${qps[coredns.$set]}")
      e=$(median "${cpu[$server.$set]}") ce=$(median "${cpu[coredns.$set]}")
      read -r l50 l99 _ <<<"$(sort -g "$work/lat.$server.$set" | pct)"
      read -r _ c99 _ <<<"$(sort -g "$work/lat.coredns.$set" | pct)"
      printf '  %-8s %-5s %10s %8s %12s %8s %9s %9s %8s\n' "$server" "$set" "$q" "$(ratio "$q" "$cq")" "$e" "$(ratio "$e" "$ce")" "$l50" "$l99" "$(ratio "$l99" "$c99")"
    done
  done
  echo "  low rates per round (qps):$(for set in $SETS; do printf ' %s%s' "$set" "${lowrates[$set]:-}"; done)"
fi
echo "machine: $(nproc) CPUs ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), load average now $(cut -d' ' -f1-3 /proc/loadavg)"
# What sets the low-rate latency of every server here: how an idle core waits (cpuidle driver;
# with haltpoll, guest_halt_poll_ns 0 means no polling before HLT, so each query wakes a halted
# vCPU), the timer rate, and DAMON (kdamond) running beside the servers.
idle=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none)
[ -r "$haltpoll" ] && idle="$idle, guest_halt_poll_ns $(cat "$haltpoll")${oldpoll:+ for this run (HALT_POLL_NS; $oldpoll before and after)}"
damon=$(cat /sys/kernel/mm/damon/admin/kdamonds/*/state 2>/dev/null | sort | uniq -c | awk '{printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2}')
echo "kernel: $(uname -r), cpuidle $idle, HZ $( (zcat /proc/config.gz 2>/dev/null || cat "/boot/config-$(uname -r)" 2>/dev/null) | awk -F= '$1 == "CONFIG_HZ" {print $2}'), kdamonds: ${damon:-none}${paused[*]:+ for this run (PAUSE_DAMON; ${#paused[@]} on before and after)}"
