//go:build (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm) && linux

package capture

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

func TestMounts(t *testing.T) {
	info := `22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
30 22 0:26 / /sys/fs/cgroup ro shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/systemd rw shared:11 - cgroup cgroup rw,xattr,name=systemd
40 22 0:35 / /run/my\040bpf rw shared:20 - bpf bpf rw,mode=700
`
	path := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(path, []byte(info), 0o644); err != nil {
		t.Fatal(err)
	}
	cg, fs := mounts(path)
	if cg != "/sys/fs/cgroup/unified" || fs != "/run/my bpf" {
		t.Errorf("mounts = %q, %q; want /sys/fs/cgroup/unified, /run/my bpf", cg, fs)
	}
	if cg, fs := mounts(filepath.Join(t.TempDir(), "missing")); cg != "" || fs != "" {
		t.Errorf("mounts of a missing file = %q, %q; want nothing", cg, fs)
	}
}

// TestCIDRKey checks the trie key layout against prog.c: the cookie's 64 bits, then the address
// IPv4-mapped, prefixlen counting both; and that cidrPrefix reads it back.
func TestCIDRKey(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		bits   uint32
	}{{"10.0.0.0/8", 64 + 96 + 8}, {"169.254.169.254/32", 64 + 128}, {"fd00::/8", 64 + 8}, {"::/0", 64}} {
		p := netip.MustParsePrefix(tc.prefix)
		k := cidrKey(0x0102030405060708, p)
		if k.Prefixlen != tc.bits {
			t.Errorf("%s: prefixlen %d, want %d", p, k.Prefixlen, tc.bits)
		}
		if got := cidrPrefix(k); got != p {
			t.Errorf("%s: read back as %s", p, got)
		}
	}
}

// TestMapSizes keeps the documented sizes (MaxPods and friends) in step with prog.c.
func TestMapSizes(t *testing.T) {
	spec, err := loadCapture()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]uint32{
		captureMapPods: MaxPods, captureMapCidrs: MaxCIDRs, captureMapPorts: MaxPorts,
		captureMapDns: MaxDNS, captureMapHandshakes: MaxHandshakes,
	} {
		if got := spec.Maps[name].MaxEntries; got != want {
			t.Errorf("map %s holds %d entries in prog.c, %d in the Go constant", name, got, want)
		}
	}
}
