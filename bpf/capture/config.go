package capture

import (
	"fmt"
	"net/netip"
	"slices"

	nft "github.com/aethermesh/aether/capture"
)

// FromConfig returns the eBPF settings that make a pod's outbound TCP decisions those of the nft
// output_nat chain nft.Build renders for cfg (pure). It returns the error of cfg.Validate.
//
// What it keeps: loopback (in the programs), the bypass mark, the pod's own addresses (nft's
// oifname "lo"), ExcludeOutboundCIDRs, ExcludeOutboundPorts and CapturePort; the cloud metadata
// addresses are refused with EPERM unless AllowCloudMetadata (nft refuses them with a reset in
// its filter output chain); IPv6 TCP is captured when the pod has an IPv6 address and refused
// otherwise (nft drops it). TCP and UDP to each ClusterDNS address on port 53 go to the agent's
// resolver (HostIP or HostIPv6, DNSPort), answers coming back from the ClusterDNS address;
// UDPRedirects and all other UDP are not the programs' business. An ExcludeOutboundCIDRs
// entry equal to a metadata or pod address is dropped: nft matches those first too.
func FromConfig(cfg nft.Config) (PodSettings, error) {
	if err := cfg.Validate(); err != nil {
		return PodSettings{}, fmt.Errorf("eBPF settings from capture config: %w", err)
	}
	s := PodSettings{
		CapturePort:  cfg.CapturePort,
		BypassMark:   cfg.BypassMark,
		ExcludePorts: cfg.ExcludeOutboundPorts,
	}
	for _, a := range cfg.PodIPs {
		a = a.Unmap()
		s.LocalAddrs = append(s.LocalAddrs, a)
		if a.Is6() {
			s.IPv6 = true
		}
	}
	if !cfg.AllowCloudMetadata {
		for _, a := range nft.MetadataAddrs {
			s.DenyCIDRs = append(s.DenyCIDRs, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	dnsPort := cfg.DNSPort
	if dnsPort == 0 {
		dnsPort = nft.DefaultDNSPort
	}
	for _, d := range cfg.ClusterDNS {
		host := cfg.HostIP
		if d.Unmap().Is6() {
			host = cfg.HostIPv6
		}
		s.DNS = append(s.DNS, DNSRedirect{From: netip.AddrPortFrom(d.Unmap(), nft.DNSPort), To: netip.AddrPortFrom(host, dnsPort)})
	}
	s = s.normalized()
	for _, p := range normPrefixes(cfg.ExcludeOutboundCIDRs) {
		single := p.IsSingleIP()
		if single && (slices.Contains(s.DenyCIDRs, p) || slices.Contains(s.LocalAddrs, p.Addr())) {
			continue
		}
		s.ExcludeCIDRs = append(s.ExcludeCIDRs, p)
	}
	return s, nil
}
