package capture

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	nft "github.com/aethermesh/aether/capture"
)

var equateNetip = cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{}, netip.AddrPort{})

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestFromConfig(t *testing.T) {
	metadata := prefixes("169.254.169.254/32", "fd00:ec2::254/128")
	for _, tc := range []struct {
		name string
		cfg  nft.Config
		want PodSettings
	}{{
		name: "IPv4 pod with DNS, exclusions and the bypass mark",
		cfg: nft.Config{
			PodIPs: addrs("10.244.1.5"), HostIP: netip.MustParseAddr("192.168.1.10"),
			ClusterDNS: addrs("10.96.0.10"), BypassMark: nft.DefaultBypassMark,
			ExcludeOutboundPorts: []uint16{9090, 22, 9090},
			// ::ffff:10.0.0.0/104 is 10.0.0.0/8; the metadata /32 is nft's first match anyway.
			ExcludeOutboundCIDRs: prefixes("::ffff:10.0.0.0/104", "169.254.169.254/32", "192.168.0.0/16"),
		},
		want: PodSettings{
			CapturePort: DefaultCapturePort, BypassMark: nft.DefaultBypassMark,
			LocalAddrs: addrs("10.244.1.5"), ExcludeCIDRs: prefixes("10.0.0.0/8", "192.168.0.0/16"),
			ExcludePorts: []uint16{22, 9090},
			DNS:          []DNSRedirect{{From: netip.MustParseAddrPort("10.96.0.10:53"), To: netip.MustParseAddrPort("192.168.1.10:18054")}},
			DenyCIDRs:    metadata,
		},
	}, {
		name: "dual-stack pod reaching the metadata service, own capture port",
		cfg: nft.Config{
			PodIPs: addrs("fd00:10::5", "10.244.1.5"), CapturePort: 15006, AllowCloudMetadata: true,
			ExcludeOutboundCIDRs: prefixes("fd00:10::5/128"),
		},
		want: PodSettings{CapturePort: 15006, IPv6: true, LocalAddrs: addrs("10.244.1.5", "fd00:10::5")},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromConfig(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got, equateNetip); d != "" {
				t.Errorf("FromConfig (-want +got):\n%s", d)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("FromConfig gave settings that do not validate: %v", err)
			}
		})
	}
	if _, err := FromConfig(nft.Config{}); err == nil || !strings.Contains(err.Error(), "podIPs") {
		t.Errorf("FromConfig of an empty config: %v, want the podIPs error", err)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    PodSettings
		want string // substring of the error; "" means valid
	}{
		{"empty", PodSettings{}, ""},
		{"full", PodSettings{LocalAddrs: addrs("10.0.0.2"), ExcludeCIDRs: prefixes("10.0.0.0/8"), DenyCIDRs: prefixes("169.254.169.254/32")}, ""},
		{"invalid local address", PodSettings{LocalAddrs: []netip.Addr{{}}}, "localAddrs: invalid IP"},
		{"zoned local address", PodSettings{LocalAddrs: addrs("fe80::1%eth0")}, "localAddrs: fe80::1%eth0"},
		{"short mapped prefix", PodSettings{ExcludeCIDRs: prefixes("::ffff:0:0/95")}, "excludeCIDRs: ::ffff:0.0.0.0/95 is IPv4-mapped but shorter than /96"},
		{"invalid deny prefix", PodSettings{DenyCIDRs: []netip.Prefix{{}}}, "denyCIDRs: invalid Prefix"},
		{"port 0", PodSettings{ExcludePorts: []uint16{80, 0}}, "excludePorts: port 0"},
		{"pass-through port 0", PodSettings{PassThrough: []netip.AddrPort{netip.MustParseAddrPort("10.96.0.10:0")}}, "passThrough: 10.96.0.10:0"},
		{"deny and local", PodSettings{LocalAddrs: addrs("10.0.0.2"), DenyCIDRs: prefixes("::ffff:10.0.0.2/128")}, "denyCIDRs: 10.0.0.2/32 is also in localAddrs"},
		{"deny and exclude", PodSettings{ExcludeCIDRs: prefixes("10.1.0.0/16"), DenyCIDRs: prefixes("10.1.2.3/16")}, "denyCIDRs: 10.1.0.0/16 is also in excludeCIDRs"},
		{"exclude and local", PodSettings{LocalAddrs: addrs("fd00::2"), ExcludeCIDRs: prefixes("fd00::2/128")}, "excludeCIDRs: fd00::2/128 is also in localAddrs"},
		{"dns families differ", PodSettings{DNS: []DNSRedirect{{From: netip.MustParseAddrPort("10.96.0.10:53"), To: netip.MustParseAddrPort("[fd00::1]:18054")}}}, "dns: 10.96.0.10:53 to [fd00::1]:18054: the families differ"},
		{"dns port 0", PodSettings{DNS: []DNSRedirect{{From: netip.MustParseAddrPort("10.96.0.10:53"), To: netip.MustParseAddrPort("10.0.0.1:0")}}}, "dns: 10.96.0.10:53 to 10.0.0.1:0: not a usable address and port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.s.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
