#!/usr/bin/env bash
# run.sh: DNS benchmark of the agent's resolver (dnsd) side by side with CoreDNS.
#
#   bench/dns/run.sh            both servers, mesh names and NXDOMAIN, saturation and low rate
#
# Each server serves the same NAMES (default 1000) names svc-<i>.bench.mesh -> 10.96.x.y: dnsd
# from a mesh model (bench/dns/server), CoreDNS (hack/tools.sh builds it) from its hosts plugin
# for the zone mesh (names it does not hold fall through to the file plugin with a zone of only
# the SOA and NS, which answers NXDOMAIN with the SOA as dnsd does; the hosts plugin alone
# answers them SERVFAIL, and template runs before hosts), and "bare" (bench/dns/bare), the smallest miekg/dns map server, as the
# ceiling of any miekg/dns server on this machine. SERVERS picks some (default all three). The server runs pinned to SERVER_CPU (taskset), dnsperf (Debian) to
# LOAD_CPU. For each server and query set ("mesh": existing names, "nx": NXDOMAIN in the zone):
#   - saturation: dnsperf with CLIENTS clients and OUTSTANDING queries in flight for DURATION
#     seconds; "qps" is dnsperf's "Queries per second"; "per CPU second" divides the queries
#     completed by the CPU time (user + system, /proc/<pid>/stat) the server used meanwhile,
#     which stays comparable when other work on a shared machine takes part of the core;
#   - low rate: dnsperf -Q at a tenth of CoreDNS's saturation rate for the same query set, every
#     query's latency recorded (-v); p50/p99 from those.
# ROUNDS (default 1) repeats everything, alternating the servers, so a load change on a shared
# machine hits both. Server and dnsperf run at nice NICE (default -19, root only) so that other
# work on a shared machine perturbs them less (CFS still gives that work a share; no real-time
# priority). Only loopback is used; ports are random high ports.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
DURATION=${DURATION:-10}
NAMES=${NAMES:-1000}
CLIENTS=${CLIENTS:-8}
OUTSTANDING=${OUTSTANDING:-500}
ROUNDS=${ROUNDS:-1}
SERVERS=${SERVERS:-coredns dnsd bare}
NICE=${NICE:--19}

eval "$("$root/hack/tools.sh" --print)"
[ -x "$AETHER_COREDNS" ] || "$root/hack/tools.sh"
command -v dnsperf >/dev/null || { echo "run.sh: dnsperf missing (hack/tools.sh installs it)" >&2; exit 1; }

work=$(mktemp -d)
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

(cd "$root" && go build -o "$work/dnsd-server" ./bench/dns/server && go build -o "$work/bare-server" ./bench/dns/bare)
for ((i = 0; i < NAMES; i++)); do
  echo "10.96.$((i / 256)).$((i % 256)) svc-$i.bench.mesh" >>"$work/hosts"
  echo "svc-$i.bench.mesh A" >>"$work/q-mesh"
  echo "nx-$i.bench.mesh A" >>"$work/q-nx"
done

# The zone's SOA (and NS), so that CoreDNS's file plugin answers the names hosts does not hold
# NXDOMAIN with the SOA, as dnsd does.
# shellcheck disable=SC2016 # $ORIGIN is a zone file directive
printf '$ORIGIN mesh.\n@ 5 IN SOA ns.dns.mesh. hostmaster.mesh. 1 7200 1800 86400 5\n@ 5 IN NS ns.dns.mesh.\n' >"$work/mesh.zone"

# A random high port free for UDP and TCP.
while :; do
  port=$((30000 + RANDOM % 20000))
  [ -z "$(ss -Htaun "sport = :$port")" ] && break
done
cat >"$work/Corefile" <<EOC
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
    dnsd) nice -n "$NICE" taskset -c "$SERVER_CPU" "$work/dnsd-server" -addr "127.0.0.1:$port" -names "$NAMES" 2>"$work/$1.log" & ;;
    bare) nice -n "$NICE" taskset -c "$SERVER_CPU" "$work/bare-server" -addr "127.0.0.1:$port" -names "$NAMES" 2>"$work/$1.log" & ;;
    coredns) nice -n "$NICE" taskset -c "$SERVER_CPU" "$AETHER_COREDNS" -conf "$work/Corefile" >"$work/$1.log" 2>&1 & ;;
  esac
  pid=$!
  for _ in $(seq 100); do
    [ "$(dig +short +time=1 +tries=1 @127.0.0.1 -p "$port" svc-1.bench.mesh A 2>/dev/null)" = 10.96.0.1 ] && return 0
    sleep 0.1
  done
  echo "run.sh: $1 did not answer; log:" >&2
  cat "$work/$1.log" >&2
  exit 1
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""; }

cputicks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
saturate() { # queryfile -> "qps queries-per-cpu-second"
  local t0 t1 out
  t0=$(cputicks)
  out=$(nice -n "$NICE" taskset -c "$LOAD_CPU" dnsperf -s 127.0.0.1 -p "$port" -d "$1" -l "$DURATION" -c "$CLIENTS" -q "$OUTSTANDING" 2>&1)
  t1=$(cputicks)
  awk -v ticks=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" '
    /Queries completed/ {done = $3}
    /Queries per second/ {qps = $4}
    END {printf "%.0f %.0f", qps, done / (ticks / hz)}' <<<"$out"
}
lowrate() { # queryfile rate -> "p50_ms p99_ms"
  nice -n "$NICE" taskset -c "$LOAD_CPU" dnsperf -s 127.0.0.1 -p "$port" -d "$1" -l "$DURATION" -Q "$2" -v 2>/dev/null |
    awk '/^> / {print $NF}' | sort -g |
    awk '{v[NR] = $1} END {printf "%.3f %.3f", v[int(NR * 0.50)] * 1000, v[int(NR * 0.99)] * 1000}'
}

declare -A qps cpu
for ((r = 1; r <= ROUNDS; r++)); do
  for server in $SERVERS; do
    start "$server"
    for set in mesh nx; do
      read -r q eff <<<"$(saturate "$work/q-$set")"
      qps[$server.$set]="${qps[$server.$set]:-} $q"
      cpu[$server.$set]="${cpu[$server.$set]:-} $eff"
      echo "round $r $server $set saturation: $q qps, $eff queries per server CPU second (load average $(cut -d' ' -f1 /proc/loadavg))"
    done
    stop
  done
  for server in $SERVERS; do
    start "$server"
    for set in mesh nx; do
      # A tenth of CoreDNS's best saturation rate for this query set so far.
      best=$(tr ' ' '\n' <<<"${qps[coredns.$set]:-${qps[$server.$set]}}" | sort -n | tail -1)
      rate=$((best / 10))
      echo "round $r $server $set at $rate qps: p50/p99 ms $(lowrate "$work/q-$set" "$rate") (load average $(cut -d' ' -f1 /proc/loadavg))"
    done
    stop
  done
done
median() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
echo "summary (per round; median):"
for server in $SERVERS; do
  for set in mesh nx; do
    echo "  $server $set qps:${qps[$server.$set]} (median $(median "${qps[$server.$set]}"))," \
      "queries per CPU second:${cpu[$server.$set]} (median $(median "${cpu[$server.$set]}"))"
  done
done
