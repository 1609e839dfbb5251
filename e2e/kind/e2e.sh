#!/usr/bin/env bash
# e2e.sh: up.sh, then run.sh, then down.sh (kept with AETHER_KIND_KEEP=1 for a look after a
# failure). Arguments go to run.sh. Exit status: the suite's.
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
cleanup() { [ "${AETHER_KIND_KEEP:-}" = 1 ] || "$here/down.sh"; }
trap cleanup EXIT
"$here/up.sh"
"$here/run.sh" "$@"
