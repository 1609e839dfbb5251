//go:build (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm) && linux

package capture

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
)

// Probe reports what this kernel and host allow for eBPF capture, without changing anything
// that outlives the call: it reads /proc/self/mountinfo for the cgroup v2 and bpffs mounts, asks
// the kernel for each program type, map type and helper the programs use (cilium/ebpf's
// features package loads and drops a minimal program or map for each), and finally loads the
// capture programs themselves and closes them (the verifier's last word; nothing is attached or
// pinned). Attaching to a cgroup is not probed: Attach reports its own error. Needs the
// privileges of Load; without them every feature shows as missing.
func Probe() ProbeResult {
	var r ProbeResult
	r.CgroupV2, r.BPFFS = mounts("/proc/self/mountinfo")
	for _, pt := range []ebpf.ProgramType{ebpf.CGroupSockAddr, ebpf.SockOps, ebpf.CGroupSockopt} {
		if err := features.HaveProgramType(pt); err != nil {
			r.Missing = append(r.Missing, fmt.Sprintf("program type %s: %v", pt, err))
		}
	}
	for _, mt := range []ebpf.MapType{ebpf.Hash, ebpf.LPMTrie, ebpf.LRUHash, ebpf.SkStorage, ebpf.PerCPUArray} {
		if err := features.HaveMapType(mt); err != nil {
			r.Missing = append(r.Missing, fmt.Sprintf("map type %s: %v", mt, err))
		}
	}
	for _, h := range []struct {
		pt ebpf.ProgramType
		fn asm.BuiltinFunc
	}{
		{ebpf.CGroupSockAddr, asm.FnGetNetnsCookie},
		{ebpf.CGroupSockAddr, asm.FnSkStorageGet},
		{ebpf.CGroupSockAddr, asm.FnSkStorageDelete},
		{ebpf.SockOps, asm.FnGetNetnsCookie},
		{ebpf.SockOps, asm.FnSkStorageGet},
		{ebpf.SockOps, asm.FnSkStorageDelete},
		{ebpf.SockOps, asm.FnSockOpsCbFlagsSet},
		{ebpf.CGroupSockopt, asm.FnSkStorageGet},
	} {
		if err := features.HaveProgramHelper(h.pt, h.fn); err != nil {
			r.Missing = append(r.Missing, fmt.Sprintf("helper %s in %s: %v", h.fn, h.pt, err))
		}
	}
	if len(r.Missing) == 0 {
		c, err := Load()
		if err != nil {
			r.Missing = append(r.Missing, err.Error())
		} else {
			_ = c.Close()
		}
	}
	return r
}

// mounts returns the first cgroup2 and bpf mount points listed in the mountinfo file at path
// (proc(5): field 5 is the mount point, the field after " - " the filesystem type).
func mounts(path string) (cgroup2, bpffs string) {
	f, err := os.Open(path)
	if err != nil {
		return "", ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, typ := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(typ) == 0 {
			continue
		}
		switch {
		case typ[0] == "cgroup2" && cgroup2 == "":
			cgroup2 = unescape(fields[4])
		case typ[0] == "bpf" && bpffs == "":
			bpffs = unescape(fields[4])
		}
	}
	return cgroup2, bpffs
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
