package capture

import (
	"fmt"
	"strings"
)

// ProbeResult is what the kernel and the host allow for eBPF capture (Probe).
type ProbeResult struct {
	// CgroupV2 is a mount point of the cgroup v2 hierarchy ("" when none is mounted): where
	// Attach's cgroup paths live. On a hybrid host (cgroup v1 controllers plus cgroup2 at
	// /sys/fs/cgroup/unified) it is that directory.
	CgroupV2 string
	// BPFFS is a mount point of bpffs ("" when none is mounted): where Pin can pin.
	BPFFS string
	// Missing names each kernel feature the programs need that the kernel refused: a program
	// type ("program type CGroupSockAddr"), a map type, a helper in a program type
	// ("helper FnGetNetnsCookie in SockOps"), or the load of the programs themselves (with the
	// verifier's or the kernel's words). Empty when every probe passed.
	Missing []string
}

// Err returns nil when eBPF capture can run here (every feature present, cgroup v2 mounted),
// else an error wrapping ErrUnsupported that lists what is missing. A missing bpffs is not an
// error: the caller mounts one where it pins (the programs work unpinned, but do not outlive the
// process).
func (r ProbeResult) Err() error {
	var why []string
	if r.CgroupV2 == "" {
		why = append(why, "no cgroup v2 mount")
	}
	why = append(why, r.Missing...)
	if len(why) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrUnsupported, strings.Join(why, "; "))
}
