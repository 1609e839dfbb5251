package capture

// The flags (-cc, -strip, -target) pin what hack/update-bpf.sh checks for; run that script, not
// go generate alone (it adds the UAPI include directory of the host's multiarch).
//go:generate go tool bpf2go -cc clang-14 -strip llvm-strip-14 -target bpfel -tags linux -go-package capture -output-stem prog -type pod_settings -type cidr_key -type port_key -type orig_dst -type tuple_key capture prog.c -- -Wall -Werror
