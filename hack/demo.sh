#!/usr/bin/env bash
# demo.sh: `make demo` / `make demo-down` (docs/demo.md).
#
#   hack/demo.sh up     build what is needed, start two local clusters with aether (in the
#                       background), deploy the sample, show requests from cluster alpha to the
#                       service exported from cluster beta, and say how to look further
#   hack/demo.sh down   stop the demo and remove everything it left
#
# Runs as root (network namespaces, nftables). State: $AETHER_DEMO_DIR (default /run/aether-demo).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
state=${AETHER_DEMO_DIR:-/run/aether-demo}

if [ "$(id -u)" != 0 ]; then
  echo "aether demo: run as root (it creates network namespaces): sudo make demo" >&2
  exit 1
fi

running() { [ -f "$state/demo.pid" ] && kill -0 "$(cat "$state/demo.pid")" 2>/dev/null; }

case "${1:-up}" in
  up)
    if running; then
      # Idempotent: a second `make demo` points at the running one instead of failing.
      echo "aether demo: already running (pid $(cat "$state/demo.pid")); its output is in $state/demo.log; make demo-down stops it"
      exit 0
    fi
    echo "==> tools (cached in ${AETHER_TOOLS_DIR:-/var/cache/aether-tools}; the first run builds them)"
    hack/tools.sh
    eval "$(hack/tools.sh --print | sed 's/^/export /')"
    mkdir -p "$state"
    rm -f "$state/ready" "$state/demo.env"
    go build -o "$state/demo" ./e2e/cmd/demo
    # The demo process owns every cluster process (they die with it): run it in its own session.
    # The log exists before the background job opens it, so the loop below can always read it.
    : >"$state/demo.log"
    # shellcheck disable=SC2086 # DEMO_FLAGS is a list of flags
    setsid "$state/demo" -state-dir "$state" ${DEMO_FLAGS:-} >>"$state/demo.log" 2>"$state/demo.err" </dev/null &
    echo $! >"$state/demo.pid"
    printed=0
    while ! [ -f "$state/ready" ]; do
      if ! running; then
        tail -n +"$((printed + 1))" "$state/demo.log"
        echo "aether demo: failed; its log: $state/demo.err" >&2
        tail -n 30 "$state/demo.err" >&2
        exit 1
      fi
      n=$(wc -l <"$state/demo.log")
      if [ "$n" -gt "$printed" ]; then tail -n +"$((printed + 1))" "$state/demo.log" | head -n "$((n - printed))"; printed=$n; fi
      sleep 1
    done
    tail -n +"$((printed + 1))" "$state/demo.log"
    ;;
  down)
    if running; then
      pid=$(cat "$state/demo.pid")
      kill -TERM "$pid"
      for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
    # Whatever a killed demo left (run directories, namespace mounts, processes).
    go run ./e2e/cmd/substrate clean
    if [ -f "$state/dirs" ]; then
      while read -r d; do
        case "$d" in */aesub-*|*/aemesh-*) rm -rf "$d" ;; esac
      done <"$state/dirs"
    fi
    rm -rf "$state"
    echo "aether demo: stopped and cleaned up"
    ;;
  *) echo "usage: hack/demo.sh up|down" >&2; exit 2 ;;
esac
