#!/usr/bin/env bash
# verify-bpf.sh: fail when the committed bpf2go output under bpf/ (*_bpfel.go, *_bpfel.o) differs
# from what hack/update-bpf.sh produces now from the C sources, naming each stale file.
#
# It regenerates into a scratch copy (go.mod, go.sum, bpf/ without its generated files, and
# update-bpf.sh) and compares both ways: a changed file, a missing one and one without a source
# all fail. It checks the repository it sits in, so a copy of the repository checks the copy.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
generated() { (cd "$1" && find bpf -type f \( -name '*_bpfel.go' -o -name '*_bpfel.o' \) | sort); }
mkdir -p "$tmp/hack"
cp "$root/go.mod" "$root/go.sum" "$tmp/"
cp "$root/hack/update-bpf.sh" "$tmp/hack/"
cp -R "$root/bpf" "$tmp/bpf"
generated "$tmp" | while IFS= read -r f; do rm -f "$tmp/$f"; done
"$tmp/hack/update-bpf.sh" "$tmp"
status=0
while IFS= read -r f; do
  if [ ! -f "$root/$f" ]; then
    echo "verify-bpf: $f is missing: run hack/update-bpf.sh" >&2
    status=1
  elif ! cmp -s "$root/$f" "$tmp/$f"; then
    if [[ $f == *.go ]]; then diff -u "$root/$f" "$tmp/$f" >&2 || true; fi
    echo "verify-bpf: $f is stale: run hack/update-bpf.sh" >&2
    status=1
  fi
done < <(generated "$tmp")
while IFS= read -r f; do
  [ -f "$tmp/$f" ] || { echo "verify-bpf: $f has no C source: delete it" >&2; status=1; }
done < <(generated "$root")
[ $status = 0 ] && echo "verify-bpf: generated eBPF code is up to date"
exit $status
