#!/bin/sh
# entrypoint.sh: the Envoy container's entrypoint (images/envoy/Dockerfile). The agent writes
# Envoy's bootstrap (the file after -c / --config-path) when it starts; this waits until that
# file exists and is not empty, then replaces itself with Envoy and the same arguments, so
# Envoy is PID 1 of its container and gets the kubelet's signals.
#   AETHER_ENVOY_BIN   the Envoy binary (default /usr/local/bin/envoy)
set -eu
envoy=${AETHER_ENVOY_BIN:-/usr/local/bin/envoy}
boot=""
prev=""
for a in "$@"; do
  case "$prev" in
    -c | --config-path) boot=$a ;;
  esac
  case "$a" in
    --config-path=*) boot=${a#--config-path=} ;;
  esac
  prev=$a
done
if [ -n "$boot" ]; then
  waited=0
  until [ -s "$boot" ]; do
    if [ $((waited % 10)) -eq 0 ]; then
      echo "aether-envoy: waiting for the agent to write $boot" >&2
    fi
    waited=$((waited + 1))
    sleep 1
  done
fi
exec "$envoy" "$@"
