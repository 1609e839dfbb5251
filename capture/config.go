package capture

import (
	"fmt"
	"net/netip"
	"slices"
)

// Mode is the inbound policy of a captured pod (DESIGN.md, pod attachment contract).
type Mode string

// The inbound modes.
const (
	// ModeStrict (the default) accepts new inbound TCP only on the inbound mTLS port (15008), from
	// the pod's own loopback, from the node (NodeSources) to the probe ports (ProbePorts) and on
	// ExcludeInboundPorts; any other new inbound TCP connection is refused with a TCP reset.
	ModeStrict Mode = "strict"
	// ModePermissive also accepts plaintext TCP from anywhere, for migration, except on
	// Config.StrictPorts.
	ModePermissive Mode = "permissive"
)

// Default ports (DESIGN.md, ports).
const (
	DefaultCapturePort = 15001
	DefaultInboundPort = 15008
	DefaultDNSPort     = 18054
	// DNSPort is the port of the cluster DNS service that is DNAT'ed to the agent's resolver.
	DNSPort = 53
	// DefaultBypassMark is the SO_MARK the node Envoy puts on the upstream sockets it opens
	// inside a pod's netns for the pod's passthrough (xds.Options.BypassMark), and that the
	// pod's outbound capture lets through (Config.BypassMark): 0x4145, "AE". Setting SO_MARK
	// needs CAP_NET_ADMIN, which a pod that has it could use to flush its rules anyway
	// (docs/capture.md, the bypass matrix).
	DefaultBypassMark = 0x4145
)

// MetadataAddrs are the cloud metadata service addresses blocked for meshed pods unless
// Config.AllowCloudMetadata: 169.254.169.254 (AWS, GCP, Azure, OpenStack and most others) and
// fd00:ec2::254 (AWS's IPv6 endpoint).
var MetadataAddrs = []netip.Addr{netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("fd00:ec2::254")}

// Config is everything the capture rules of one pod depend on. It is plain data: the agent fills
// it from its own flags, the CNI request (prevResult, plugin config) and the pod.
type Config struct {
	// PodIPs are the pod's addresses from the prevResult. A pod with no IPv6 address gets its
	// IPv6 traffic dropped (never left open); one with an IPv6 address has it captured like IPv4.
	PodIPs []netip.Addr
	// HostIP is the node's IPv4 address the agent's DNS resolver listens on (HOST_IP). Required
	// when ClusterDNS holds an IPv4 address.
	HostIP netip.Addr
	// HostIPv6 is the node's IPv6 address for the resolver. Required when ClusterDNS holds an
	// IPv6 address.
	HostIPv6 netip.Addr
	// ClusterDNS are the cluster DNS service addresses (kube-dns ClusterIPs). UDP and TCP to
	// port 53 of these is DNAT'ed to HostIP:DNSPort (or HostIPv6:DNSPort).
	ClusterDNS []netip.Addr
	// Mode is the inbound policy; empty means ModeStrict.
	Mode Mode
	// CapturePort is the capture listener's port in the pod netns (0 means 15001).
	CapturePort uint16
	// InboundPort is the inbound mTLS port (0 means 15008).
	InboundPort uint16
	// DNSPort is the agent resolver's port on HostIP (0 means 18054).
	DNSPort uint16
	// ExcludeOutboundPorts are TCP destination ports never redirected.
	ExcludeOutboundPorts []uint16
	// ExcludeInboundPorts are TCP ports accepted in plaintext even in strict mode (for example
	// a metrics port scraped by a non-meshed Prometheus). They come from the node's plugin
	// config and win over StrictPorts: a port in both stays open (Istio's excludeInboundPorts
	// likewise takes a port out of PeerAuthentication's reach).
	ExcludeInboundPorts []uint16
	// StrictPorts are TCP ports refused in plaintext in ModePermissive, as every port is in
	// ModeStrict: new TCP to them from outside the pod gets a reset, except from NodeSources on
	// ProbePorts (on every port with NodeAllPorts), and except ports also in
	// ExcludeInboundPorts. InboundPort, the pod's loopback and established connections are not
	// affected. Ignored in ModeStrict (every port is strict there). The per-port half of an
	// Istio PeerAuthentication's portLevelMtls: STRICT.
	StrictPorts []uint16
	// PermissivePorts are TCP ports accepted in plaintext from anywhere in ModeStrict (the
	// per-port PERMISSIVE of a PeerAuthentication). Ignored in ModePermissive. They are kept
	// apart from ExcludeInboundPorts although strict mode renders both as an accept: those are
	// the node operator's, fixed at ADD and winning over StrictPorts, these are the mesh
	// policy's, changed at run time and refused together with StrictPorts, and each has its own
	// rule (in-exclude-ports, in-permissive-ports), so the rule's comment tells an operator who
	// opened a port.
	PermissivePorts []uint16
	// ExcludeOutboundCIDRs are destination prefixes never redirected.
	ExcludeOutboundCIDRs []netip.Prefix
	// NodeSources are the source prefixes of the node's own connections into the pod: the pod's
	// gateway address(es) on the node side of its link and HostIP. In strict mode they are how
	// the kubelet's probes are told apart from other pods' plaintext: new TCP from them is
	// accepted on ProbePorts only (every port with NodeAllPorts); see docs/capture.md for why
	// not a socket mark.
	NodeSources []netip.Prefix
	// ProbePorts are the TCP ports of the pod's kubelet probes (httpGet, tcpSocket and grpc
	// ports of every liveness, readiness and startup probe), the only ports strict mode opens to
	// NodeSources. The node Envoy never needs more: its inbound leg reaches the application
	// over the pod's loopback, and its passthrough leaves from the pod's netns.
	ProbePorts []uint16
	// NodeAllPorts accepts NodeSources on every TCP port in strict mode, as before ProbePorts
	// existed: only for an attachment recorded without its probe ports (an older agent's record)
	// whose pod cannot be read to learn them.
	NodeAllPorts bool
	// AllowCloudMetadata lets the pod reach the cloud metadata service (MetadataAddrs) as any
	// other destination outside the mesh. By default it is blocked: TCP gets a reset, anything
	// else is dropped, whatever socket mark the pod sets. A cloud's metadata service hands out
	// the node's credentials to whoever asks from the node's network, and meshed workloads have
	// an identity of their own (their SVID); Istio, Cilium and GKE's workload identity keep pods
	// off it the same way.
	AllowCloudMetadata bool
	// BypassMark, when non-zero, exempts sockets carrying this SO_MARK in the pod netns from
	// outbound capture (meta mark == BypassMark return). Envoy sets it (DefaultBypassMark) on
	// the passthrough sockets it opens inside the pod netns, so they never loop back into the
	// capture listener.
	BypassMark uint32
	// UDPRedirects are the routed UDP frontends (model.Mesh.UDPFrontends): UDP to VIP:Port is
	// DNAT'ed to HostIP:LocalPort (HostIPv6 for an IPv6 VIP), where the node Envoy has the UDP
	// listener of that frontend. Empty (no UDPRoute bound in the mesh): no UDP is redirected.
	UDPRedirects []UDPRedirect
}

// UDPRedirect sends a pod's datagrams to VIP:Port to LocalPort on the node (Config.HostIP, or
// Config.HostIPv6 for an IPv6 VIP). A NAT'ed UDP socket cannot read the original destination, so
// each routed frontend has its own local port (docs/capture.md). The listener is in the node's
// netns, out of the pod's reach: a pod cannot bind the port before Envoy does.
type UDPRedirect struct {
	VIP       netip.Addr
	Port      uint16
	LocalPort uint16
}

// withDefaults returns a copy with zero ports and mode set to their defaults and every list
// sorted and de-duplicated, so equal configurations build byte-identical rule sets.
func (c Config) withDefaults() Config {
	if c.Mode == "" {
		c.Mode = ModeStrict
	}
	c = c.withDefaultPorts()
	c.PodIPs = sortedAddrs(c.PodIPs)
	c.ClusterDNS = sortedAddrs(c.ClusterDNS)
	c.ExcludeOutboundPorts = sortedPorts(c.ExcludeOutboundPorts)
	c.ExcludeInboundPorts = sortedPorts(c.ExcludeInboundPorts)
	c.StrictPorts = sortedPorts(c.StrictPorts)
	c.PermissivePorts = sortedPorts(c.PermissivePorts)
	c.ExcludeOutboundCIDRs = sortedPrefixes(c.ExcludeOutboundCIDRs)
	c.NodeSources = sortedPrefixes(c.NodeSources)
	c.ProbePorts = sortedPorts(c.ProbePorts)
	c.UDPRedirects = slices.Clone(c.UDPRedirects)
	for i := range c.UDPRedirects {
		c.UDPRedirects[i].VIP = c.UDPRedirects[i].VIP.Unmap()
	}
	slices.SortFunc(c.UDPRedirects, func(a, b UDPRedirect) int {
		if x := a.VIP.Compare(b.VIP); x != 0 {
			return x
		}
		return int(a.Port) - int(b.Port)
	})
	c.UDPRedirects = slices.CompactFunc(c.UDPRedirects, func(a, b UDPRedirect) bool { return a.VIP == b.VIP && a.Port == b.Port })
	return c
}

// Validate reports the first invalid field as an error naming it and its value. Two of
// CapturePort, InboundPort and DNSPort with one number (zero counting as its default) is an
// error naming both fields and the number; so are the errors of ValidInbound.
func (c Config) Validate() error {
	if err := c.validPorts(); err != nil {
		return err
	}
	if err := c.ValidInbound(); err != nil {
		return err
	}
	if len(c.PodIPs) == 0 {
		return fmt.Errorf("validate capture config: podIPs: empty (prevResult carried no address)")
	}
	for _, a := range c.PodIPs {
		if !a.IsValid() || a.IsUnspecified() || a.IsLoopback() {
			return fmt.Errorf("validate capture config: podIPs: %v is not a usable pod address", a)
		}
	}
	if c.HostIP.IsValid() && !c.HostIP.Is4() {
		return fmt.Errorf("validate capture config: hostIP: %v is not IPv4", c.HostIP)
	}
	if c.HostIPv6.IsValid() && !c.HostIPv6.Is6() {
		return fmt.Errorf("validate capture config: hostIPv6: %v is not IPv6", c.HostIPv6)
	}
	if c.HostIPv6.Zone() != "" {
		return fmt.Errorf("validate capture config: hostIPv6: %v has a zone", c.HostIPv6)
	}
	for _, d := range c.ClusterDNS {
		// Build unmaps ::ffff:a.b.c.d to a.b.c.d, which is DNAT'ed to hostIP.
		switch u := d.Unmap(); {
		case !d.IsValid():
			return fmt.Errorf("validate capture config: clusterDNS: invalid address")
		case d.Zone() != "":
			return fmt.Errorf("validate capture config: clusterDNS: %v has a zone", d)
		case u.Is4() && !c.HostIP.IsValid():
			return fmt.Errorf("validate capture config: clusterDNS: %v is IPv4 but hostIP is not set", d)
		case u.Is6() && !c.HostIPv6.IsValid():
			return fmt.Errorf("validate capture config: clusterDNS: %v is IPv6 but hostIPv6 is not set", d)
		}
	}
	if err := validPrefixes("excludeOutboundCIDRs", c.ExcludeOutboundCIDRs); err != nil {
		return err
	}
	if err := validPrefixes("nodeSources", c.NodeSources); err != nil {
		return err
	}
	for _, p := range c.ExcludeOutboundPorts {
		if p == 0 {
			return fmt.Errorf("validate capture config: excludeOutboundPorts: port 0")
		}
	}
	for _, p := range c.ExcludeInboundPorts {
		if p == 0 {
			return fmt.Errorf("validate capture config: excludeInboundPorts: port 0")
		}
	}
	for _, p := range c.ProbePorts {
		if p == 0 {
			return fmt.Errorf("validate capture config: probePorts: port 0")
		}
	}
	return ValidUDPRedirects(c.UDPRedirects, c.HostIP, c.HostIPv6)
}

// ValidInbound validates the inbound policy fields alone: Mode, StrictPorts and
// PermissivePorts, against the port plan of c (CapturePort, InboundPort, DNSPort; zero counting
// as the default). It is what Validate reports for them, for callers that hold a policy before
// they hold a pod (cni.Server.SetInboundPolicies). The errors name the field and the value: a
// mode other than strict, permissive or empty; port 0; a port that is the inbound mTLS port (a
// strict 15008 would refuse mTLS itself), the capture port or the DNS port; a port in both
// lists (strictPorts and permissivePorts both hold 8080).
func (c Config) ValidInbound() error {
	switch c.Mode {
	case "", ModeStrict, ModePermissive:
	default:
		return fmt.Errorf("validate capture config: mode %q: want %q or %q", c.Mode, ModeStrict, ModePermissive)
	}
	d := c.withDefaultPorts()
	for _, l := range []struct {
		field string
		ports []uint16
	}{{"strictPorts", c.StrictPorts}, {"permissivePorts", c.PermissivePorts}} {
		for _, p := range l.ports {
			switch p {
			case 0:
				return fmt.Errorf("validate capture config: %s: port 0", l.field)
			case d.InboundPort:
				return fmt.Errorf("validate capture config: %s: %d is the inboundPort (inbound mTLS is always accepted)", l.field, p)
			case d.CapturePort:
				return fmt.Errorf("validate capture config: %s: %d is the capturePort", l.field, p)
			case d.DNSPort:
				return fmt.Errorf("validate capture config: %s: %d is the dnsPort", l.field, p)
			}
		}
	}
	for _, p := range c.StrictPorts {
		if slices.Contains(c.PermissivePorts, p) {
			return fmt.Errorf("validate capture config: strictPorts and permissivePorts both hold %d", p)
		}
	}
	return nil
}

// ValidUDPRedirects returns the error Config.Validate gives for UDPRedirects rs with host
// addresses hostIP and hostIPv6 (Config.HostIP, Config.HostIPv6): an unusable VIP, a port 0,
// or a VIP of a family without its host address.
func ValidUDPRedirects(rs []UDPRedirect, hostIP, hostIPv6 netip.Addr) error {
	for _, r := range rs {
		switch {
		case !r.VIP.IsValid() || r.VIP.IsUnspecified() || r.VIP.Zone() != "":
			return fmt.Errorf("validate capture config: udpRedirects: VIP %v is not a usable address", r.VIP)
		case r.Port == 0 || r.LocalPort == 0:
			return fmt.Errorf("validate capture config: udpRedirects: %v port %d to local port %d: port 0", r.VIP, r.Port, r.LocalPort)
		case r.VIP.Unmap().Is4() && !hostIP.IsValid():
			return fmt.Errorf("validate capture config: udpRedirects: %v is IPv4 but hostIP is not set", r.VIP)
		case r.VIP.Unmap().Is6() && !hostIPv6.IsValid():
			return fmt.Errorf("validate capture config: udpRedirects: %v is IPv6 but hostIPv6 is not set", r.VIP)
		}
	}
	return nil
}

// validPorts refuses two of CapturePort, InboundPort and DNSPort (after their defaults) sharing a
// number: each is one role of the node's port plan (DESIGN.md, ports), and a shared one sends
// traffic to the wrong listener (a capture redirect to 15008 reaches nothing on 127.0.0.1, the
// inbound listener being on the pod IP).
func (c Config) validPorts() error {
	d := c.withDefaultPorts()
	ports := []struct {
		field string
		port  uint16
	}{{"capturePort", d.CapturePort}, {"inboundPort", d.InboundPort}, {"dnsPort", d.DNSPort}}
	for i, a := range ports {
		for _, b := range ports[i+1:] {
			if a.port == b.port {
				return fmt.Errorf("validate capture config: %s and %s are both %d: each needs its own port", a.field, b.field, a.port)
			}
		}
	}
	return nil
}

// validPrefixes returns an error naming field and the prefix when one is invalid, or is
// IPv4-mapped (::ffff:0:0/96) but shorter than /96: sortedPrefixes turns ::ffff:a.b.c.d/n into
// a.b.c.d/(n-96), and a shorter one has no IPv4 form (left as it was, it would match every IPv4
// address).
func validPrefixes(field string, ps []netip.Prefix) error {
	for _, p := range ps {
		switch {
		case !p.IsValid():
			return fmt.Errorf("validate capture config: %s: invalid prefix %v", field, p)
		case p.Addr().Is4In6() && p.Bits() < 96:
			return fmt.Errorf("validate capture config: %s: %v: an IPv4-mapped prefix needs at least /96", field, p)
		}
	}
	return nil
}

// withDefaultPorts returns a copy with zero ports set to their defaults.
func (c Config) withDefaultPorts() Config {
	if c.CapturePort == 0 {
		c.CapturePort = DefaultCapturePort
	}
	if c.InboundPort == 0 {
		c.InboundPort = DefaultInboundPort
	}
	if c.DNSPort == 0 {
		c.DNSPort = DefaultDNSPort
	}
	return c
}

// hasIPv6 reports whether the pod has an IPv6 address (and so gets IPv6 captured, not dropped).
func (c Config) hasIPv6() bool {
	return slices.ContainsFunc(c.PodIPs, func(a netip.Addr) bool { return a.Is6() && !a.Is4In6() })
}

func sortedAddrs(in []netip.Addr) []netip.Addr {
	out := slices.Clone(in)
	for i, a := range out {
		out[i] = a.Unmap()
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(out)
}

func sortedPorts(in []uint16) []uint16 {
	out := slices.Clone(in)
	slices.Sort(out)
	return slices.Compact(out)
}

func sortedPrefixes(in []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(in))
	for _, p := range in {
		out = append(out, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p)).Masked())
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out)
}

// unmapBits is 96 for an IPv4-mapped IPv6 prefix (::ffff:a.b.c.d/n), so it becomes a.b.c.d/(n-96).
func unmapBits(p netip.Prefix) int {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return 96
	}
	return 0
}
