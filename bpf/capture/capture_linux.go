//go:build (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm) && linux

package capture

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Actions of a cidrs or ports entry (prog.c ACTION_*).
const (
	actionLocal   = 1
	actionExclude = 2
	actionDeny    = 3
)

// podIPv6 is pod_settings.flags' POD_IPV6 (prog.c).
const podIPv6 = 1

// The programs and the cgroup attach type of each (their SEC names in prog.c).
var attachments = []struct {
	name   string // the link's pin name
	prog   string // the program's name in the object
	attach ebpf.AttachType
}{
	{"connect4", captureProgAetherConnect4, ebpf.AttachCGroupInet4Connect},
	{"connect6", captureProgAetherConnect6, ebpf.AttachCGroupInet6Connect},
	{"sockops", captureProgAetherSockops, ebpf.AttachCGroupSockOps},
	{"getsockopt", captureProgAetherGetsockopt, ebpf.AttachCGroupGetsockopt},
	{"getpeername4", captureProgAetherGetpeername4, ebpf.AttachCgroupInet4GetPeername},
	{"getpeername6", captureProgAetherGetpeername6, ebpf.AttachCgroupInet6GetPeername},
	{"sendmsg4", captureProgAetherSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
	{"sendmsg6", captureProgAetherSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
	{"recvmsg4", captureProgAetherRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
	{"recvmsg6", captureProgAetherRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
}

// mapNames are the maps a Capture holds, by their names in prog.c (and pin names).
var mapNames = []string{captureMapPods, captureMapCidrs, captureMapPorts, captureMapSockDst, captureMapHandshakes, captureMapStats, captureMapDns}

// Capture is the loaded (or adopted) capture programs and maps, with the cgroup links it
// attached or adopted. It is safe for use by one goroutine at a time.
type Capture struct {
	progs map[string]*ebpf.Program // by program name; empty when adopted from pins
	maps  map[string]*ebpf.Map     // by map name
	links map[string]link.Link     // by attachment name
}

// Load loads the capture programs and maps into the kernel, attached nowhere yet. The error
// names what the kernel refused: a program the verifier rejected (with the verifier's log
// ending), a map type it does not know; ErrUnsupported is wrapped when the refusal is a missing
// feature. Needs CAP_BPF and CAP_NET_ADMIN (or root). Close releases everything not pinned.
func Load() (*Capture, error) {
	c, err := load(nil)
	if err != nil {
		return nil, fmt.Errorf("load eBPF capture: %w", err)
	}
	return c, nil
}

// load loads the collection, using the maps in replace (by name) instead of new ones.
func load(replace map[string]*ebpf.Map) (*Capture, error) {
	spec, err := loadCapture()
	if err != nil {
		return nil, err
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: replace})
	if err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("kernel verifier refused: %w", err)
		}
		if errors.Is(err, ebpf.ErrNotSupported) {
			return nil, fmt.Errorf("%w: %w", ErrUnsupported, err)
		}
		return nil, err
	}
	c := &Capture{progs: coll.Programs, maps: coll.Maps, links: map[string]link.Link{}}
	coll.Programs, coll.Maps = nil, nil
	return c, nil
}

// Attach attaches the ten programs (cgroup/connect4, cgroup/connect6, sockops,
// cgroup/getsockopt, cgroup/getpeername4 and 6, cgroup/sendmsg4 and 6, cgroup/recvmsg4 and 6)
// to the cgroup v2 directory
// cgroupPath with bpf links (multi-attach: other programs there stay). A socket belongs to the
// cgroup of the process that made it, at the time it made it (an accepted socket to its
// listener's), and only sockets in cgroupPath or below meet the programs; of those, only
// sockets in a netns given to SetPod are changed. So both the pods' processes and the capture
// listener's process (Envoy) must have made their sockets under cgroupPath: Envoy's listeners
// made elsewhere accept connections whose SO_ORIGINAL_DST fails (ENOENT without conntrack).
// Attaching twice is an error naming the attachment; on any error nothing stays attached.
func (c *Capture) Attach(cgroupPath string) error {
	if len(c.progs) == 0 {
		return fmt.Errorf("attach eBPF capture to %s: no programs (adopted from pins: already attached)", cgroupPath)
	}
	made := map[string]link.Link{}
	for _, a := range attachments {
		if c.links[a.name] != nil {
			closeLinks(made)
			return fmt.Errorf("attach eBPF capture to %s: %s is already attached", cgroupPath, a.name)
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: a.attach, Program: c.progs[a.prog]})
		if err != nil {
			closeLinks(made)
			return fmt.Errorf("attach eBPF capture program %s to cgroup %s: %w", a.prog, cgroupPath, err)
		}
		made[a.name] = l
	}
	for k, l := range made {
		c.links[k] = l
	}
	return nil
}

func closeLinks(ls map[string]link.Link) {
	for _, l := range ls {
		_ = l.Close()
	}
}

// Pin pins every map and every link under dir (a directory in a bpffs mount, created when
// missing), as <dir>/map_<name> and <dir>/link_<name>, so the programs stay attached and the
// maps filled when the process exits; OpenPinned adopts them. Pinning an object already pinned
// at that path is a no-op.
func (c *Capture) Pin(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pin eBPF capture: %w", err)
	}
	for _, name := range mapNames {
		if err := c.maps[name].Pin(filepath.Join(dir, "map_"+name)); err != nil {
			return fmt.Errorf("pin eBPF capture map %s in %s: %w", name, dir, err)
		}
	}
	for _, a := range attachments {
		l := c.links[a.name]
		if l == nil {
			continue
		}
		if err := l.Pin(filepath.Join(dir, "link_"+a.name)); err != nil {
			return fmt.Errorf("pin eBPF capture link %s in %s: %w", a.name, dir, err)
		}
	}
	return nil
}

// OpenPinned adopts what Pin left under dir: the maps (required) and the links present (a
// missing link is not an error: Attached reports which are there). The programs themselves stay
// as they were loaded: a newer program needs a fresh Load, Attach and Pin (not done here).
func OpenPinned(dir string) (*Capture, error) {
	c := &Capture{maps: map[string]*ebpf.Map{}, links: map[string]link.Link{}}
	for _, name := range mapNames {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, "map_"+name), nil)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("open pinned eBPF capture map %s in %s: %w", name, dir, err)
		}
		c.maps[name] = m
	}
	for _, a := range attachments {
		l, err := link.LoadPinnedLink(filepath.Join(dir, "link_"+a.name), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("open pinned eBPF capture link %s in %s: %w", a.name, dir, err)
		}
		c.links[a.name] = l
	}
	return c, nil
}

// Ensure leaves the capture programs attached to cgroupPath and pinned under dir (a directory in
// a bpffs mount), running the programs of this build, and returns them: what a starting agent
// calls. Pins left by an earlier process are adopted: its maps keep their contents (the pods
// stay captured throughout) and each pinned link is switched to this build's program in place
// (BPF_LINK_UPDATE, atomic); a missing link is attached and pinned. Without pins it is Load,
// Attach and Pin. An incomplete set of map pins (a crash while pinning) is removed, links first,
// and started afresh.
//
// A pinned map this build cannot use (its type, key or value size, size or flags changed) is an
// error naming the map; the caller removes the pins (RemovePins) and calls Ensure again, which
// loses the pods' settings until it sets them again (ListPods before, if they matter).
func Ensure(dir, cgroupPath string) (*Capture, error) {
	old, err := OpenPinned(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := RemovePins(dir); err != nil {
			return nil, err
		}
		old = &Capture{maps: map[string]*ebpf.Map{}, links: map[string]link.Link{}}
	case err != nil:
		return nil, fmt.Errorf("ensure eBPF capture: %w", err)
	}
	c, err := load(old.maps)
	if err != nil {
		old.Close()
		return nil, fmt.Errorf("ensure eBPF capture with the pins in %s: %w", dir, err)
	}
	if len(old.maps) > 0 {
		// Keep the pinned maps themselves (the collection holds clones, which are not pinned).
		for name, m := range old.maps {
			c.maps[name].Close()
			c.maps[name] = m
		}
	}
	fail := func(err error) (*Capture, error) {
		for name, l := range old.links {
			if c.links[name] == nil {
				l.Close()
			}
		}
		c.Close()
		return nil, fmt.Errorf("ensure eBPF capture in %s: %w", dir, err)
	}
	for _, a := range attachments {
		if l := old.links[a.name]; l != nil {
			c.links[a.name] = l
			if err := l.Update(c.progs[a.prog]); err != nil {
				return fail(fmt.Errorf("update pinned link %s to this build's %s: %w", a.name, a.prog, err))
			}
			continue
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: a.attach, Program: c.progs[a.prog]})
		if err != nil {
			return fail(fmt.Errorf("attach %s to cgroup %s: %w", a.prog, cgroupPath, err))
		}
		c.links[a.name] = l
	}
	if err := c.Pin(dir); err != nil {
		return fail(err)
	}
	return c, nil
}

// RemovePins removes every pin Pin makes under dir (links first, which detaches their programs
// unless a process still holds them; then maps). Missing pins are not an error.
func RemovePins(dir string) error {
	var errs []error
	for _, a := range attachments {
		if err := os.Remove(filepath.Join(dir, "link_"+a.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove eBPF capture pin: %w", err))
		}
	}
	for _, name := range mapNames {
		if err := os.Remove(filepath.Join(dir, "map_"+name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove eBPF capture pin: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Attached returns the names of the attachments this Capture holds ("connect4", "connect6",
// "sockops", "getsockopt", "getpeername4", "getpeername6", "sendmsg4", "sendmsg6", "recvmsg4",
// "recvmsg6"), in that order.
func (c *Capture) Attached() []string {
	var out []string
	for _, a := range attachments {
		if c.links[a.name] != nil {
			out = append(out, a.name)
		}
	}
	return out
}

// Unpin removes the pins of every map and link this Capture holds (after Pin or OpenPinned), so
// Close detaches the programs and frees the maps; objects not pinned are skipped.
func (c *Capture) Unpin() error {
	var errs []error
	for _, name := range mapNames {
		if err := c.maps[name].Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin eBPF capture map %s: %w", name, err))
		}
	}
	for _, a := range attachments {
		if l := c.links[a.name]; l != nil {
			if err := l.Unpin(); err != nil {
				errs = append(errs, fmt.Errorf("unpin eBPF capture link %s: %w", a.name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Close releases this process's handles. Links and maps that are pinned stay in the kernel;
// those that are not are detached and freed.
func (c *Capture) Close() error {
	var errs []error
	for _, l := range c.links {
		errs = append(errs, l.Close())
	}
	for _, p := range c.progs {
		errs = append(errs, p.Close())
	}
	for _, m := range c.maps {
		errs = append(errs, m.Close())
	}
	return errors.Join(errs...)
}

// SetPod makes the pod whose netns has cookie netnsCookie (NetnsCookie) captured with settings
// s, replacing whatever the maps held for it: new entries are written first and the pod's
// settings last, stale entries removed after, so a connect never sees the pod captured without
// its exclusions. It returns the error of s.Validate, or a map update's error naming the map
// and the entry (E2BIG when a map is full: see MaxPods and friends).
func (c *Capture) SetPod(netnsCookie uint64, s PodSettings) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("set eBPF capture of netns cookie %d: %w", netnsCookie, err)
	}
	s = s.normalized()
	wantCIDRs := map[captureCidrKey]uint8{}
	for _, a := range s.LocalAddrs {
		wantCIDRs[cidrKey(netnsCookie, netip.PrefixFrom(a, a.BitLen()))] = actionLocal
	}
	for _, p := range s.ExcludeCIDRs {
		wantCIDRs[cidrKey(netnsCookie, p)] = actionExclude
	}
	for _, p := range s.DenyCIDRs {
		wantCIDRs[cidrKey(netnsCookie, p)] = actionDeny
	}
	wantPorts := map[capturePortKey]uint8{}
	for _, p := range s.ExcludePorts {
		wantPorts[capturePortKey{Netns: netnsCookie, Port: p}] = actionExclude
	}
	for _, ap := range s.PassThrough {
		wantPorts[capturePortKey{Netns: netnsCookie, Addr: addr16(ap.Addr()), Port: ap.Port()}] = actionExclude
	}
	wantDNS := map[capturePortKey]captureDnsTarget{}
	for _, r := range s.DNS {
		wantDNS[capturePortKey{Netns: netnsCookie, Addr: addr16(r.From.Addr()), Port: r.From.Port()}] =
			captureDnsTarget{Addr: addr16(r.To.Addr()), Port: r.To.Port()}
	}
	have, err := c.podEntries(netnsCookie)
	if err != nil {
		return fmt.Errorf("set eBPF capture of netns cookie %d: %w", netnsCookie, err)
	}
	for k, v := range wantCIDRs {
		if err := c.maps[captureMapCidrs].Put(k, v); err != nil {
			return fmt.Errorf("set eBPF capture of netns cookie %d: cidrs entry %v: %w", netnsCookie, cidrPrefix(k), err)
		}
	}
	for k, v := range wantPorts {
		if err := c.maps[captureMapPorts].Put(k, v); err != nil {
			return fmt.Errorf("set eBPF capture of netns cookie %d: ports entry %v port %d: %w", netnsCookie, netip.AddrFrom16(k.Addr).Unmap(), k.Port, err)
		}
	}
	for k, v := range wantDNS {
		if err := c.maps[captureMapDns].Put(k, v); err != nil {
			return fmt.Errorf("set eBPF capture of netns cookie %d: dns entry %v: %w", netnsCookie, portKeyAddrPort(k), err)
		}
	}
	ps := capturePodSettings{BypassMark: s.BypassMark, CapturePort: s.CapturePort}
	if s.IPv6 {
		ps.Flags |= podIPv6
	}
	if err := c.maps[captureMapPods].Put(netnsCookie, ps); err != nil {
		return fmt.Errorf("set eBPF capture of netns cookie %d: pods entry: %w", netnsCookie, err)
	}
	for k := range have.cidrs {
		if _, ok := wantCIDRs[k]; !ok {
			if err := deleteEntry(c.maps[captureMapCidrs], k); err != nil {
				return fmt.Errorf("set eBPF capture of netns cookie %d: remove cidrs entry %v: %w", netnsCookie, cidrPrefix(k), err)
			}
		}
	}
	for k := range have.ports {
		if _, ok := wantPorts[k]; !ok {
			if err := deleteEntry(c.maps[captureMapPorts], k); err != nil {
				return fmt.Errorf("set eBPF capture of netns cookie %d: remove ports entry port %d: %w", netnsCookie, k.Port, err)
			}
		}
	}
	for k := range have.dns {
		if _, ok := wantDNS[k]; !ok {
			if err := deleteEntry(c.maps[captureMapDns], k); err != nil {
				return fmt.Errorf("set eBPF capture of netns cookie %d: remove dns entry %v: %w", netnsCookie, portKeyAddrPort(k), err)
			}
		}
	}
	return nil
}

// portKeyAddrPort is the address and port of a ports or dns key (IPv4 unmapped).
func portKeyAddrPort(k capturePortKey) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom16(k.Addr).Unmap(), k.Port)
}

// DeletePod stops capturing the netns with cookie netnsCookie: its settings go first (from then
// on its connects are left alone), then its cidrs, ports and dns entries. Deleting a pod that is not
// there succeeds. Connections already redirected keep their original destination.
func (c *Capture) DeletePod(netnsCookie uint64) error {
	if err := deleteEntry(c.maps[captureMapPods], netnsCookie); err != nil {
		return fmt.Errorf("delete eBPF capture of netns cookie %d: pods entry: %w", netnsCookie, err)
	}
	have, err := c.podEntries(netnsCookie)
	if err != nil {
		return fmt.Errorf("delete eBPF capture of netns cookie %d: %w", netnsCookie, err)
	}
	for k := range have.cidrs {
		if err := deleteEntry(c.maps[captureMapCidrs], k); err != nil {
			return fmt.Errorf("delete eBPF capture of netns cookie %d: cidrs entry %v: %w", netnsCookie, cidrPrefix(k), err)
		}
	}
	for k := range have.ports {
		if err := deleteEntry(c.maps[captureMapPorts], k); err != nil {
			return fmt.Errorf("delete eBPF capture of netns cookie %d: ports entry port %d: %w", netnsCookie, k.Port, err)
		}
	}
	for k := range have.dns {
		if err := deleteEntry(c.maps[captureMapDns], k); err != nil {
			return fmt.Errorf("delete eBPF capture of netns cookie %d: dns entry %v: %w", netnsCookie, portKeyAddrPort(k), err)
		}
	}
	return nil
}

func deleteEntry(m *ebpf.Map, k any) error {
	if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

// ListPods returns the settings of every captured pod by netns cookie, read back from the maps in
// normalized form (CapturePort defaulted, lists sorted, addresses unmapped), so a reconciler
// compares them with what it wants and calls SetPod or DeletePod. cidrs, ports and dns entries
// of a cookie without settings (a SetPod cut short) are returned too, with a zero CapturePort.
func (c *Capture) ListPods() (map[uint64]PodSettings, error) {
	out := map[uint64]PodSettings{}
	var cookie uint64
	var ps capturePodSettings
	it := c.maps[captureMapPods].Iterate()
	for it.Next(&cookie, &ps) {
		out[cookie] = PodSettings{CapturePort: ps.CapturePort, BypassMark: ps.BypassMark, IPv6: ps.Flags&podIPv6 != 0}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list eBPF captured pods: pods: %w", err)
	}
	var ck captureCidrKey
	var action uint8
	it = c.maps[captureMapCidrs].Iterate()
	for it.Next(&ck, &action) {
		n := binary.NativeEndian.Uint64(ck.Netns[:])
		s := out[n]
		p := cidrPrefix(ck)
		switch action {
		case actionLocal:
			s.LocalAddrs = append(s.LocalAddrs, p.Addr())
		case actionDeny:
			s.DenyCIDRs = append(s.DenyCIDRs, p)
		default:
			s.ExcludeCIDRs = append(s.ExcludeCIDRs, p)
		}
		out[n] = s
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list eBPF captured pods: cidrs: %w", err)
	}
	var pk capturePortKey
	it = c.maps[captureMapPorts].Iterate()
	for it.Next(&pk, &action) {
		s := out[pk.Netns]
		if pk.Addr == ([16]byte{}) {
			s.ExcludePorts = append(s.ExcludePorts, pk.Port)
		} else {
			s.PassThrough = append(s.PassThrough, netip.AddrPortFrom(netip.AddrFrom16(pk.Addr).Unmap(), pk.Port))
		}
		out[pk.Netns] = s
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list eBPF captured pods: ports: %w", err)
	}
	var to captureDnsTarget
	it = c.maps[captureMapDns].Iterate()
	for it.Next(&pk, &to) {
		s := out[pk.Netns]
		s.DNS = append(s.DNS, DNSRedirect{From: portKeyAddrPort(pk), To: netip.AddrPortFrom(netip.AddrFrom16(to.Addr).Unmap(), to.Port)})
		out[pk.Netns] = s
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list eBPF captured pods: dns: %w", err)
	}
	for k, s := range out {
		port := s.CapturePort
		s = s.normalized()
		s.CapturePort = port
		out[k] = s
	}
	return out, nil
}

// podKeys are the keys one netns cookie has in the cidrs, ports and dns maps.
type podKeys struct {
	cidrs      map[captureCidrKey]bool
	ports, dns map[capturePortKey]bool
}

// podEntries returns the keys of one netns cookie.
func (c *Capture) podEntries(netnsCookie uint64) (podKeys, error) {
	keys := podKeys{cidrs: map[captureCidrKey]bool{}, ports: map[capturePortKey]bool{}, dns: map[capturePortKey]bool{}}
	var ck captureCidrKey
	var action uint8
	it := c.maps[captureMapCidrs].Iterate()
	for it.Next(&ck, &action) {
		if binary.NativeEndian.Uint64(ck.Netns[:]) == netnsCookie {
			keys.cidrs[ck] = true
		}
	}
	if err := it.Err(); err != nil {
		return podKeys{}, fmt.Errorf("read cidrs: %w", err)
	}
	var pk capturePortKey
	it = c.maps[captureMapPorts].Iterate()
	for it.Next(&pk, &action) {
		if pk.Netns == netnsCookie {
			keys.ports[pk] = true
		}
	}
	if err := it.Err(); err != nil {
		return podKeys{}, fmt.Errorf("read ports: %w", err)
	}
	var to captureDnsTarget
	it = c.maps[captureMapDns].Iterate()
	for it.Next(&pk, &to) {
		if pk.Netns == netnsCookie {
			keys.dns[pk] = true
		}
	}
	if err := it.Err(); err != nil {
		return podKeys{}, fmt.Errorf("read dns: %w", err)
	}
	return keys, nil
}

// Handshakes returns the number of entries in the handshakes map: captured connections whose
// capture listener has not accepted them yet (0 when every captured connection was accepted or
// closed). For tests and metrics.
func (c *Capture) Handshakes() (int, error) {
	var k captureTupleKey
	var v captureOrigDst
	n := 0
	it := c.maps[captureMapHandshakes].Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("count eBPF capture handshakes: %w", err)
	}
	return n, nil
}

// addr16 is a's 16-byte form, IPv4 as IPv4-mapped (the programs' form).
func addr16(a netip.Addr) [16]byte {
	return a.As16()
}

// cidrKey is the trie key of prefix p of one netns: the cookie's 64 bits, then p in its
// IPv4-mapped form for IPv4.
func cidrKey(netnsCookie uint64, p netip.Prefix) captureCidrKey {
	k := captureCidrKey{Addr: addr16(p.Addr())}
	binary.NativeEndian.PutUint64(k.Netns[:], netnsCookie)
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	k.Prefixlen = uint32(64 + bits)
	return k
}

// cidrPrefix is the prefix of a trie key (IPv4 unmapped).
func cidrPrefix(k captureCidrKey) netip.Prefix {
	a := netip.AddrFrom16(k.Addr)
	bits := int(k.Prefixlen) - 64
	if a.Is4In6() && bits >= 96 {
		return netip.PrefixFrom(a.Unmap(), bits-96)
	}
	return netip.PrefixFrom(a, bits)
}

// NetnsCookie returns the cookie of the network namespace at netnsPath (a /var/run/netns file or
// /proc/<pid>/ns/net): the value bpf_get_netns_cookie gives the programs for that netns's
// sockets, read with getsockopt(SO_NETNS_COOKIE) (Linux 5.14) on a socket made inside it. The
// calling goroutine's thread never changes namespace: the work runs on a fresh locked thread that
// is discarded afterwards.
func NetnsCookie(netnsPath string) (uint64, error) {
	f, err := os.Open(netnsPath)
	if err != nil {
		return 0, fmt.Errorf("read netns cookie of %s: %w", netnsPath, err)
	}
	defer f.Close()
	type result struct {
		cookie uint64
		err    error
	}
	ch := make(chan result, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine, whatever namespace it holds.
		runtime.LockOSThread()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("enter netns: %w", err)}
			return
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			ch <- result{err: fmt.Errorf("socket: %w", err)}
			return
		}
		defer unix.Close(fd)
		c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		if err != nil {
			err = fmt.Errorf("getsockopt SO_NETNS_COOKIE: %w", err)
		}
		ch <- result{c, err}
	}()
	r := <-ch
	if r.err != nil {
		return 0, fmt.Errorf("read netns cookie of %s: %w", netnsPath, r.err)
	}
	return r.cookie, nil
}

// Stats are the programs' counters since Load, summed over CPUs, for captured pods' TCP
// connects only (a netns not in SetPod is not counted).
type Stats struct {
	// Redirected connects went to the capture listener.
	Redirected uint64
	// Passed connects went where they were sent (loopback, local addresses, exclusions, bypass
	// mark).
	Passed uint64
	// Refused connects failed with EPERM (DenyCIDRs, IPv6 of a pod without IPv6).
	Refused uint64
	// OriginalDst counts SO_ORIGINAL_DST answers given to the capture listener.
	OriginalDst uint64
	// NoStorage counts connects left alone because the kernel gave no socket storage for
	// their destination (memory pressure): each is a connection that escaped capture.
	NoStorage uint64
	// DNS counts TCP connects and UDP datagrams sent to the resolver instead of the cluster
	// DNS service.
	DNS uint64
}

// Stats reads the counters (the per-CPU array "stats"; index order of prog.c's enum stat).
func (c *Capture) Stats() (Stats, error) {
	var out Stats
	fields := []*uint64{&out.Redirected, &out.Passed, &out.Refused, &out.OriginalDst, &out.NoStorage, &out.DNS}
	for i, f := range fields {
		var perCPU []uint64
		if err := c.maps[captureMapStats].Lookup(uint32(i), &perCPU); err != nil {
			return Stats{}, fmt.Errorf("read eBPF capture stats %d: %w", i, err)
		}
		for _, v := range perCPU {
			*f += v
		}
	}
	return out, nil
}
