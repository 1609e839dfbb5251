#!/usr/bin/env bash
# update-bpf.sh: regenerate the bpf2go output (the Go loader types and the compiled, stripped
# little-endian .o, both committed) of every eBPF program under bpf/ (one directory per program,
# its //go:generate line beside its loader).
#
#   hack/update-bpf.sh          regenerate in this clone
#   hack/update-bpf.sh ROOT     regenerate in a copy of the repository at ROOT (verify-bpf.sh)
#
# Compiles with Debian bookworm's clang 14 (clang-14) and strips DWARF with llvm-strip-14, both
# named on the //go:generate lines; <bpf/bpf_helpers.h> comes from libbpf-dev and the UAPI headers
# from linux-libc-dev (hack/tools.sh installs them). bpf2go is the tool pinned in go.mod.
set -euo pipefail
root=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$root"
fail() { echo "update-bpf: $*" >&2; exit 1; }
for tool in clang-14 llvm-strip-14; do
  command -v "$tool" >/dev/null || fail "$tool missing: run hack/tools.sh (Debian packages clang-14, llvm-14)"
done
[ -f /usr/include/bpf/bpf_helpers.h ] || fail "/usr/include/bpf/bpf_helpers.h missing: run hack/tools.sh (Debian package libbpf-dev)"
# <linux/types.h> includes <asm/types.h>, which Debian keeps under the host's multiarch directory;
# clang -target bpf does not search it by itself.
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch 2>/dev/null || true)
if [ -z "$multiarch" ] || [ ! -d "/usr/include/$multiarch/asm" ]; then
  fail "/usr/include/${multiarch:-<multiarch>}/asm missing: install the Debian package linux-libc-dev"
fi
export BPF2GO_CFLAGS="-I/usr/include/$multiarch"
go generate ./bpf/...
