#!/usr/bin/env bash
# test.sh: what `make test` runs. Installs the tools it needs (hack/tools.sh), then checks
# formatting and that go.mod is tidy, vets, lints and runs every Go test. Privileged tests need
# root; run as root (CI does, with CI=true, where a privileged test that cannot run fails
# instead of skipping).
#
#   hack/test.sh              everything
#   hack/test.sh --lint-only  gofmt, go mod tidy -diff, go vet and staticcheck only
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$(date +%s)
stamp() { printf '== %s (%ds)\n' "$*" "$(($(date +%s) - t0))"; }

stamp "tools"
hack/tools.sh
eval "$(hack/tools.sh --print | sed 's/^/export /')"

stamp "gofmt"
mapfile -t gofiles < <(git ls-files -co --exclude-standard '*.go')
unformatted=$(gofmt -l "${gofiles[@]}")
if [ -n "$unformatted" ]; then
  echo "gofmt would change these files (run gofmt -w):" >&2
  echo "$unformatted" >&2
  exit 1
fi

stamp "go mod tidy"
# go.mod says what is used: direct requirements not marked indirect, no unused module.
if ! tidy=$(go mod tidy -diff 2>&1); then
  echo "go.mod or go.sum is not tidy (run go mod tidy):" >&2
  echo "$tidy" >&2
  exit 1
fi

stamp "shellcheck"
# The kind scripts cannot run here (no Docker engine): shellcheck is what keeps them honest.
shellcheck -x hack/*.sh e2e/kind/*.sh images/*/*.sh

stamp "go vet"
go vet ./...

stamp "generated code is current (hack/verify-*.sh)"
for v in hack/verify-*.sh; do "$v"; done

stamp "staticcheck"
"$AETHER_STATICCHECK" ./...

[ "${1:-}" = "--lint-only" ] && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "note: not root: privileged tests (network namespaces, nftables, Envoy in pod namespaces) will skip" >&2
fi

stamp "go test"
# -p 2 matches the machine's two cores; the race detector covers every package.
go test -race -p 2 -timeout 45m -count=1 ./...

stamp "fuzz (short runs of every fuzz target)"
# Each target's seed corpus already ran above; this explores ${AETHER_FUZZTIME:-20000x} more inputs
# each. A count, not a duration: with a duration Go 1.26's fuzz coordinator can fail a target with
# a bare "context deadline exceeded" (no failing input) when its worker is mid-call at the
# deadline on a busy machine (golang/go#75804, fixed in Go 1.27). A real finding still fails the
# run and writes the input under testdata/fuzz/<target>/.
grep -rl --include='*_test.go' '^func Fuzz' . | grep -v '^./hack/' | while read -r f; do
  pkg="./$(dirname "${f#./}")"
  sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$f" | while read -r target; do
    echo "fuzz $pkg $target"
    go test -run '^$' -fuzz "^$target\$" -fuzztime "${AETHER_FUZZTIME:-20000x}" -parallel 1 "$pkg"
  done
done

stamp "done"
