package capture

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// ErrUnsupported is returned (wrapped) by every entry point where eBPF capture cannot run: off
// Linux, on a big-endian CPU, or when Probe finds a kernel feature missing. A caller that gets
// it falls back to nft capture.
var ErrUnsupported = errors.New("eBPF capture unsupported")

// Sizes of the maps (entries). Each is a kernel limit: an update beyond it fails with E2BIG
// (SetPod returns it), except Handshakes, an LRU map that evicts its oldest entry.
const (
	// MaxPods is the number of captured pods (netns cookies) one node holds.
	MaxPods = 4096
	// MaxCIDRs is the number of LocalAddrs, ExcludeCIDRs and DenyCIDRs entries of all pods.
	MaxCIDRs = 65536
	// MaxPorts is the number of ExcludePorts and PassThrough entries of all pods.
	MaxPorts = 65536
	// MaxDNS is the number of DNS entries of all pods.
	MaxDNS = 16384
	// MaxHandshakes is the number of captured connections between the client's connect and the
	// capture listener's accept (one entry each, removed at accept or at the client's close).
	MaxHandshakes = 65536
)

// DefaultCapturePort is the capture listener's port when PodSettings.CapturePort is 0
// (capture.DefaultCapturePort).
const DefaultCapturePort = 15001

// PodSettings are one pod's outbound capture decisions, the eBPF form of the nft output_nat chain
// (capture.Build), taken in this order for each TCP connect from the pod's netns: to a loopback
// or unspecified address, left alone; to IPv6 while IPv6 is false, or to DenyCIDRs, refused
// with EPERM whatever mark the socket carries (nft refuses those in its filter chain); from a
// socket carrying BypassMark, left alone; to a DNS From, sent to its To; to LocalAddrs,
// ExcludeCIDRs, a PassThrough address and port or ExcludePorts, left alone; anything else is sent
// to the capture listener (127.0.0.1:CapturePort, or [::1]:CapturePort for IPv6) and its
// destination kept for SO_ORIGINAL_DST. UDP is only ever sent to the resolver (DNS).
type PodSettings struct {
	// CapturePort is the capture listener's port in the pod netns; 0 means DefaultCapturePort.
	CapturePort uint16
	// BypassMark is the SO_MARK of the proxy's own sockets in the pod netns (capture.Config's
	// BypassMark): never redirected. 0: none.
	BypassMark uint32
	// IPv6 captures IPv6 TCP; false refuses it (EPERM), as nft drops a pod's IPv6 when the pod
	// has no IPv6 address. IPv4-mapped destinations (::ffff:a.b.c.d) are IPv4 either way.
	IPv6 bool
	// LocalAddrs are the pod's own addresses (its prevResult IPs): traffic to them stays in the
	// netns (nft: oifname "lo" return).
	LocalAddrs []netip.Addr
	// ExcludeCIDRs are destination prefixes never redirected (capture.Config's
	// ExcludeOutboundCIDRs).
	ExcludeCIDRs []netip.Prefix
	// ExcludePorts are destination ports never redirected (ExcludeOutboundPorts).
	ExcludePorts []uint16
	// PassThrough are exact destinations never redirected: the cluster DNS service's port 53
	// while nft DNATs DNS to the agent's resolver.
	PassThrough []netip.AddrPort
	// DenyCIDRs are destination prefixes refused with EPERM: the cloud metadata service
	// (capture.MetadataAddrs) unless the pod may reach it.
	DenyCIDRs []netip.Prefix
	// DNS sends TCP connects and UDP datagrams to each From (a cluster DNS address and port 53)
	// to its To (the agent's resolver, HOST_IP:18054) instead, and gives the answers From back
	// as their source and as the peer (nft: dnat to HOST_IP:18054). The proxy's own sockets
	// (BypassMark) are left alone. From and To are of one family.
	DNS []DNSRedirect
}

// DNSRedirect is one cluster DNS address and port and the resolver that answers in its place.
type DNSRedirect struct {
	From, To netip.AddrPort
}

// normalized returns a copy with CapturePort defaulted, addresses unmapped (::ffff:a.b.c.d is
// a.b.c.d), prefixes masked, and every list sorted and de-duplicated: the form ListPods returns.
func (s PodSettings) normalized() PodSettings {
	if s.CapturePort == 0 {
		s.CapturePort = DefaultCapturePort
	}
	s.LocalAddrs = slices.Clone(s.LocalAddrs)
	for i, a := range s.LocalAddrs {
		s.LocalAddrs[i] = a.Unmap()
	}
	slices.SortFunc(s.LocalAddrs, netip.Addr.Compare)
	s.LocalAddrs = slices.Compact(s.LocalAddrs)
	s.ExcludeCIDRs = normPrefixes(s.ExcludeCIDRs)
	s.DenyCIDRs = normPrefixes(s.DenyCIDRs)
	s.ExcludePorts = slices.Clone(s.ExcludePorts)
	slices.Sort(s.ExcludePorts)
	s.ExcludePorts = slices.Compact(s.ExcludePorts)
	s.PassThrough = slices.Clone(s.PassThrough)
	for i, ap := range s.PassThrough {
		s.PassThrough[i] = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	slices.SortFunc(s.PassThrough, netip.AddrPort.Compare)
	s.PassThrough = slices.Compact(s.PassThrough)
	s.DNS = slices.Clone(s.DNS)
	for i, r := range s.DNS {
		s.DNS[i] = DNSRedirect{From: unmapAddrPort(r.From), To: unmapAddrPort(r.To)}
	}
	slices.SortFunc(s.DNS, func(a, b DNSRedirect) int { return a.From.Compare(b.From) })
	s.DNS = slices.CompactFunc(s.DNS, func(a, b DNSRedirect) bool { return a.From == b.From })
	return s
}

func unmapAddrPort(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func normPrefixes(in []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(in))
	for _, p := range in {
		bits := p.Bits()
		if p.Addr().Is4In6() && bits >= 96 {
			bits -= 96
		}
		out = append(out, netip.PrefixFrom(p.Addr().Unmap(), bits).Masked())
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	if len(out) == 0 {
		return nil
	}
	return slices.Compact(out)
}

// Validate returns an error naming the field and the value when s cannot be loaded: an invalid
// or zoned address, an IPv4-mapped prefix shorter than /96, port 0 in ExcludePorts or
// PassThrough, or an address both in LocalAddrs or ExcludeCIDRs and in DenyCIDRs (the trie would
// keep only one of the two).
func (s PodSettings) Validate() error {
	for _, a := range s.LocalAddrs {
		if !a.IsValid() || a.Zone() != "" {
			return fmt.Errorf("validate eBPF pod settings: localAddrs: %v is not a usable address", a)
		}
	}
	for _, l := range []struct {
		field string
		ps    []netip.Prefix
	}{{"excludeCIDRs", s.ExcludeCIDRs}, {"denyCIDRs", s.DenyCIDRs}} {
		for _, p := range l.ps {
			if !p.IsValid() || p.Addr().Zone() != "" {
				return fmt.Errorf("validate eBPF pod settings: %s: %v is not a usable prefix", l.field, p)
			}
			if p.Addr().Is4In6() && p.Bits() < 96 {
				return fmt.Errorf("validate eBPF pod settings: %s: %v is IPv4-mapped but shorter than /96", l.field, p)
			}
		}
	}
	for _, p := range s.ExcludePorts {
		if p == 0 {
			return fmt.Errorf("validate eBPF pod settings: excludePorts: port 0")
		}
	}
	for _, ap := range s.PassThrough {
		if !ap.Addr().IsValid() || ap.Addr().Zone() != "" || ap.Port() == 0 {
			return fmt.Errorf("validate eBPF pod settings: passThrough: %v is not a usable address and port", ap)
		}
	}
	for _, r := range s.DNS {
		from, to := unmapAddrPort(r.From), unmapAddrPort(r.To)
		switch {
		case !from.Addr().IsValid() || from.Addr().Zone() != "" || from.Port() == 0:
			return fmt.Errorf("validate eBPF pod settings: dns: from %v is not a usable address and port", r.From)
		case !to.Addr().IsValid() || to.Addr().Zone() != "" || to.Port() == 0:
			return fmt.Errorf("validate eBPF pod settings: dns: %v to %v: not a usable address and port", r.From, r.To)
		case from.Addr().Is4() != to.Addr().Is4():
			return fmt.Errorf("validate eBPF pod settings: dns: %v to %v: the families differ", r.From, r.To)
		}
	}
	n := s.normalized()
	for _, d := range n.DenyCIDRs {
		for _, a := range n.LocalAddrs {
			if d == netip.PrefixFrom(a, a.BitLen()) {
				return fmt.Errorf("validate eBPF pod settings: denyCIDRs: %v is also in localAddrs", d)
			}
		}
		if slices.Contains(n.ExcludeCIDRs, d) {
			return fmt.Errorf("validate eBPF pod settings: denyCIDRs: %v is also in excludeCIDRs", d)
		}
	}
	for _, e := range n.ExcludeCIDRs {
		for _, a := range n.LocalAddrs {
			if e == netip.PrefixFrom(a, a.BitLen()) {
				return fmt.Errorf("validate eBPF pod settings: excludeCIDRs: %v is also in localAddrs", e)
			}
		}
	}
	return nil
}
