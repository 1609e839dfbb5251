package capture

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/aethermesh/aether/internal/testenv"
)

// goldenConfigs are the configurations whose rule sets are pinned in testdata/ (nftables and
// iptables renderings). Refresh with REFRESH_GOLDEN=1 and review the diff.
var goldenConfigs = []struct {
	name string
	cfg  Config
}{
	{"strict-ipv4", Config{
		PodIPs: addrs("10.244.1.5"), HostIP: netip.MustParseAddr("192.168.0.10"), ClusterDNS: addrs("10.96.0.10"),
		NodeSources: prefixes("10.244.1.1/32", "192.168.0.10/32"), ProbePorts: []uint16{8081, 8080, 8081},
	}},
	{"strict-node-all-ports", Config{
		PodIPs: addrs("10.244.1.5"), HostIP: netip.MustParseAddr("192.168.0.10"), ClusterDNS: addrs("10.96.0.10"),
		NodeSources: prefixes("10.244.1.1/32", "192.168.0.10/32"), NodeAllPorts: true,
	}},
	{"permissive-ipv4", Config{
		PodIPs: addrs("10.244.1.5"), HostIP: netip.MustParseAddr("192.168.0.10"), ClusterDNS: addrs("10.96.0.10"),
		Mode: ModePermissive,
	}},
	{"strict-exclusions", Config{
		PodIPs: addrs("10.244.1.5"), HostIP: netip.MustParseAddr("192.168.0.10"), ClusterDNS: addrs("10.96.0.10"),
		NodeSources:          prefixes("10.244.1.1/32"),
		ExcludeOutboundPorts: []uint16{5432, 22, 5432}, ExcludeInboundPorts: []uint16{9090},
		ExcludeOutboundCIDRs: prefixes("169.254.169.254/32", "10.0.0.0/8"), BypassMark: 0x1ae,
	}},
	{"dual-stack", Config{
		PodIPs: addrs("10.244.1.5", "fd00:10:244:1::5"), HostIP: netip.MustParseAddr("192.168.0.10"),
		HostIPv6: netip.MustParseAddr("fd00::10"), ClusterDNS: addrs("10.96.0.10", "fd00:96::a"),
		NodeSources: prefixes("10.244.1.1/32", "fd00:10:244:1::1/128"), ProbePorts: []uint16{9000},
		ExcludeOutboundCIDRs: prefixes("fd00:dead::/32"),
	}},
	{"udp-routes", Config{
		PodIPs: addrs("10.244.1.5"), HostIP: netip.MustParseAddr("192.168.0.10"), ClusterDNS: addrs("10.96.0.10"),
		HostIPv6: netip.MustParseAddr("fd00::10"), NodeSources: prefixes("10.244.1.1/32"), ExcludeOutboundCIDRs: prefixes("10.96.0.0/12"),
		UDPRedirects: []UDPRedirect{
			{VIP: netip.MustParseAddr("10.96.0.24"), Port: 53, LocalPort: 16123},
			{VIP: netip.MustParseAddr("10.96.0.20"), Port: 5353, LocalPort: 15177},
			{VIP: netip.MustParseAddr("fd00:96::24"), Port: 53, LocalPort: 15999}, // no IPv6 in this pod: left out
		},
	}},
	{"udp-routes-dual-stack", Config{
		PodIPs: addrs("10.244.1.5", "fd00:10:244:1::5"), HostIP: netip.MustParseAddr("192.168.0.10"), HostIPv6: netip.MustParseAddr("fd00::10"),
		UDPRedirects: []UDPRedirect{
			{VIP: netip.MustParseAddr("fd00:96::24"), Port: 53, LocalPort: 15999},
			{VIP: netip.MustParseAddr("10.96.0.24"), Port: 53, LocalPort: 16123},
		},
	}},
	// Per-port modes (PeerAuthentication's portLevelMtls): a permissive pod with strict ports
	// (9090 is also excluded by the operator: it stays open), and a strict pod with permissive
	// ports next to an operator exclusion.
	{"permissive-strict-ports", Config{
		PodIPs: addrs("10.244.1.5"), HostIP: netip.MustParseAddr("192.168.0.10"), ClusterDNS: addrs("10.96.0.10"),
		NodeSources: prefixes("10.244.1.1/32", "192.168.0.10/32"), ProbePorts: []uint16{8080},
		Mode: ModePermissive, StrictPorts: []uint16{9090, 8443, 8080, 8443}, ExcludeInboundPorts: []uint16{9090},
	}},
	{"permissive-strict-ports-node-all-ports-dual-stack", Config{
		PodIPs: addrs("10.244.1.5", "fd00:10:244:1::5"), HostIP: netip.MustParseAddr("192.168.0.10"),
		HostIPv6: netip.MustParseAddr("fd00::10"), ClusterDNS: addrs("10.96.0.10"),
		NodeSources: prefixes("10.244.1.1/32", "fd00:10:244:1::1/128"), NodeAllPorts: true,
		Mode: ModePermissive, StrictPorts: []uint16{8080},
	}},
	{"strict-permissive-ports", Config{
		PodIPs: addrs("10.244.1.5"), HostIP: netip.MustParseAddr("192.168.0.10"), ClusterDNS: addrs("10.96.0.10"),
		NodeSources: prefixes("10.244.1.1/32"), ProbePorts: []uint16{8081},
		PermissivePorts: []uint16{9000, 8443}, ExcludeInboundPorts: []uint16{9090}, StrictPorts: []uint16{8080},
	}},
	{"no-dns-custom-ports", Config{
		PodIPs: addrs("10.244.1.5"), CapturePort: 16001, InboundPort: 16008, ExcludeOutboundPorts: []uint16{443},
	}},
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, x := range s {
		out = append(out, netip.MustParseAddr(x))
	}
	return out
}

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

func TestBuildGolden(t *testing.T) {
	for _, tc := range goldenConfigs {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := Build(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			testenv.Golden(t, tc.name+".nft", []byte(rs.NFTText()))
			testenv.Golden(t, tc.name+".iptables", []byte("# iptables-restore --noflush\n"+rs.IPTablesRestore(FamilyIPv4)+
				"# ip6tables-restore --noflush\n"+rs.IPTablesRestore(FamilyIPv6)))
			again, _ := Build(tc.cfg)
			if again.NFTText() != rs.NFTText() {
				t.Fatal("Build is not deterministic")
			}
		})
	}
}

func TestBuildProperties(t *testing.T) {
	base := goldenConfigs[0].cfg
	v4, _ := Build(base)
	txt := v4.NFTText()
	for _, want := range []string{
		"meta nfproto ipv6 drop", // IPv6 never open for a v4-only pod
		"ip daddr 10.96.0.10 meta l4proto udp udp dport 53 dnat ip to 192.168.0.10:18054", // DNS
		"redirect to :15001",
		"reject with tcp reset",
	} {
		if !strings.Contains(txt, want) {
			t.Errorf("strict ipv4 rule set lacks %q:\n%s", want, txt)
		}
	}
	perm := base
	perm.Mode = ModePermissive
	p, _ := Build(perm)
	if strings.Contains(p.NFTText(), "in-strict-reject") || strings.Contains(p.NFTText(), "aether:in-mtls") {
		t.Errorf("permissive rule set refuses inbound:\n%s", p.NFTText())
	}
	// The metadata service is refused unless allowed, for a dual-stack pod on both addresses.
	var ds Config
	for _, g := range goldenConfigs {
		if g.name == "dual-stack" {
			ds = g.cfg
		}
	}
	for _, allow := range []bool{false, true} {
		ds.AllowCloudMetadata = allow
		rs, err := Build(ds)
		if err != nil {
			t.Fatal(err)
		}
		txt := rs.NFTText()
		for _, want := range []string{
			"ip daddr 169.254.169.254 return", "ip daddr 169.254.169.254 meta l4proto tcp reject with tcp reset", "ip daddr 169.254.169.254 drop",
			"ip6 daddr fd00:ec2::254 return", "ip6 daddr fd00:ec2::254 meta l4proto tcp reject with tcp reset", "ip6 daddr fd00:ec2::254 drop",
		} {
			if strings.Contains(txt, want) == allow {
				t.Errorf("AllowCloudMetadata %v: rule %q present = %v:\n%s", allow, want, !allow, txt)
			}
		}
	}
	for _, r := range allRules(v4) {
		if !strings.HasPrefix(r.Comment(), Tag+":") {
			t.Errorf("rule %s is not tagged: %s", r.ID, r.Comment())
		}
	}
	// Changing any exclusion changes the comment of the rule that carries it (drift detection).
	ex := base
	ex.ExcludeOutboundPorts = []uint16{22, 23}
	a, _ := Build(ex)
	ex.ExcludeOutboundPorts = []uint16{22, 24}
	b, _ := Build(ex)
	if a.NFTText() == b.NFTText() {
		t.Error("different port exclusions render the same rule set")
	}
}

func allRules(rs RuleSet) []Rule {
	var out []Rule
	for _, c := range rs.Chains {
		out = append(out, c.Rules...)
	}
	return out
}

func TestValidate(t *testing.T) {
	ok := goldenConfigs[0].cfg
	for _, tc := range []struct {
		name  string
		mut   func(*Config)
		field string
	}{
		{"bad mode", func(c *Config) { c.Mode = "open" }, "mode"},
		{"no pod ip", func(c *Config) { c.PodIPs = nil }, "podIPs"},
		{"loopback pod ip", func(c *Config) { c.PodIPs = addrs("127.0.0.1") }, "podIPs"},
		{"host ip v6", func(c *Config) { c.HostIP = netip.MustParseAddr("fd00::1") }, "hostIP"},
		{"v4 dns without host ip", func(c *Config) { c.HostIP = netip.Addr{} }, "clusterDNS"},
		{"v6 dns without host ipv6", func(c *Config) { c.ClusterDNS = addrs("fd00::a") }, "clusterDNS"},
		{"port zero", func(c *Config) { c.ExcludeOutboundPorts = []uint16{0} }, "excludeOutboundPorts"},
		{"inbound port zero", func(c *Config) { c.ExcludeInboundPorts = []uint16{0} }, "excludeInboundPorts"},
		{"probe port zero", func(c *Config) { c.ProbePorts = []uint16{8080, 0} }, "probePorts: port 0"},
		// An IPv4-mapped prefix shorter than /96 has no IPv4 form; unmapped, it matched all IPv4.
		{"mapped exclude cidr shorter than /96", func(c *Config) { c.ExcludeOutboundCIDRs = prefixes("::ffff:10.0.0.0/90") }, "excludeOutboundCIDRs: ::ffff:10.0.0.0/90"},
		{"mapped node source shorter than /96", func(c *Config) { c.NodeSources = prefixes("::ffff:0.0.0.0/80") }, "nodeSources: ::ffff:0.0.0.0/80"},
		{"zoned cluster dns", func(c *Config) {
			c.HostIPv6 = netip.MustParseAddr("fd00::1")
			c.ClusterDNS = addrs("fd00::a%eth0")
		}, "clusterDNS: fd00::a%eth0"},
		// Each port of the node's plan has one role (DESIGN.md, ports); zero means the default.
		{"capture port is the inbound port", func(c *Config) { c.CapturePort, c.InboundPort = 15008, 15008 }, "capturePort and inboundPort are both 15008"},
		{"capture port is the default inbound port", func(c *Config) { c.CapturePort = 15008 }, "capturePort and inboundPort are both 15008"},
		{"inbound port is the default capture port", func(c *Config) { c.InboundPort = 15001 }, "capturePort and inboundPort are both 15001"},
		{"dns port is the capture port", func(c *Config) { c.DNSPort = 15001 }, "capturePort and dnsPort are both 15001"},
		{"inbound port is the default dns port", func(c *Config) { c.InboundPort = 18054 }, "inboundPort and dnsPort are both 18054"},
		{"zoned host ipv6", func(c *Config) { c.HostIPv6 = netip.MustParseAddr("fd00::1%eth0") }, "hostIPv6: fd00::1%eth0"},
		{"udp redirect without VIP", func(c *Config) { c.UDPRedirects = []UDPRedirect{{Port: 53, LocalPort: 15100}} }, "udpRedirects: VIP invalid IP"},
		{"udp redirect to local port 0", func(c *Config) {
			c.UDPRedirects = []UDPRedirect{{VIP: netip.MustParseAddr("10.96.0.24"), Port: 53}}
		}, "udpRedirects: 10.96.0.24 port 53 to local port 0"},
		{"ipv6 udp redirect without host ipv6", func(c *Config) {
			c.UDPRedirects = []UDPRedirect{{VIP: netip.MustParseAddr("fd00:96::24"), Port: 53, LocalPort: 15999}}
		}, "udpRedirects: fd00:96::24 is IPv6 but hostIPv6 is not set"},
		{"ipv4 udp redirect without host ip", func(c *Config) {
			c.HostIP, c.ClusterDNS = netip.Addr{}, nil
			c.UDPRedirects = []UDPRedirect{{VIP: netip.MustParseAddr("10.96.0.24"), Port: 53, LocalPort: 16123}}
		}, "udpRedirects: 10.96.0.24 is IPv4 but hostIP is not set"},
		{"strict port zero", func(c *Config) { c.StrictPorts = []uint16{8080, 0} }, "strictPorts: port 0"},
		{"permissive port zero", func(c *Config) { c.PermissivePorts = []uint16{0} }, "permissivePorts: port 0"},
		{"strict inbound port", func(c *Config) { c.StrictPorts = []uint16{15008} }, "strictPorts: 15008 is the inboundPort"},
		{"strict moved inbound port", func(c *Config) { c.InboundPort, c.StrictPorts = 16008, []uint16{16008} }, "strictPorts: 16008 is the inboundPort"},
		{"permissive inbound port", func(c *Config) { c.PermissivePorts = []uint16{15008} }, "permissivePorts: 15008 is the inboundPort"},
		{"strict capture port", func(c *Config) { c.StrictPorts = []uint16{15001} }, "strictPorts: 15001 is the capturePort"},
		{"permissive capture port", func(c *Config) { c.PermissivePorts = []uint16{15001} }, "permissivePorts: 15001 is the capturePort"},
		{"strict dns port", func(c *Config) { c.StrictPorts = []uint16{18054} }, "strictPorts: 18054 is the dnsPort"},
		{"permissive moved dns port", func(c *Config) { c.DNSPort, c.PermissivePorts = 15053, []uint16{15053} }, "permissivePorts: 15053 is the dnsPort"},
		{"port in both lists", func(c *Config) { c.StrictPorts, c.PermissivePorts = []uint16{8080, 9090}, []uint16{9090} }, "strictPorts and permissivePorts both hold 9090"},
		{"mapped dns, only host ipv6", func(c *Config) {
			c.HostIP, c.HostIPv6 = netip.Addr{}, netip.MustParseAddr("fd00::1")
			c.ClusterDNS = addrs("::ffff:10.96.0.10")
		}, "clusterDNS: ::ffff:10.96.0.10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.mut(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("Validate = %v, want an error naming %s", err, tc.field)
			}
			if _, err := Build(c); err == nil {
				t.Fatal("Build accepted an invalid config")
			}
		})
	}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	moved := ok
	moved.CapturePort, moved.InboundPort, moved.DNSPort = 15006, 15009, 15053
	if err := moved.Validate(); err != nil {
		t.Errorf("Validate(distinct non-default ports) = %v", err)
	}
}

// TestBuildUnmapsIPv4MappedInput: IPv4-mapped addresses and prefixes (::ffff:a.b.c.d) in the
// config are IPv4 in the rules, DNS ones DNAT'ed to HostIP.
func TestBuildUnmapsIPv4MappedInput(t *testing.T) {
	c := goldenConfigs[0].cfg
	c.ClusterDNS = addrs("::ffff:10.96.0.10")
	c.ExcludeOutboundCIDRs = prefixes("::ffff:10.0.0.0/104")
	c.NodeSources = prefixes("::ffff:10.244.1.1/128")
	rs, err := Build(c)
	if err != nil {
		t.Fatal(err)
	}
	txt := rs.NFTText()
	for _, want := range []string{
		"ip daddr 10.96.0.10 meta l4proto udp udp dport 53 dnat ip to 192.168.0.10:18054",
		"ip daddr 10.0.0.0/8 return",
		"ip saddr 10.244.1.1 meta l4proto tcp tcp dport { 8080, 8081 } accept",
	} {
		if !strings.Contains(txt, want) {
			t.Errorf("rule set lacks %q:\n%s", want, txt)
		}
	}
}

// TestBuildPerPortModes: what the per-port overrides do to the inbound chain, by mode.
func TestBuildPerPortModes(t *testing.T) {
	base := goldenConfigs[0].cfg // strict IPv4, probe ports 8080 and 8081 from the node
	input := func(t *testing.T, c Config) string {
		t.Helper()
		rs, err := Build(c)
		if err != nil {
			t.Fatal(err)
		}
		ch := rs.Chains[len(rs.Chains)-1]
		if ch.Hook != HookInputFilter {
			t.Fatalf("last chain is %s, want the input chain", ch.Name)
		}
		var ids []string
		for _, r := range ch.Rules {
			ids = append(ids, r.ID+" "+r.nftMatch()+" "+r.nftVerdict())
		}
		return strings.Join(ids, "\n")
	}
	for _, tc := range []struct {
		name          string
		mut           func(*Config)
		want, notWant []string
		sameAs        func(*Config) // the chain equals this configuration's
	}{
		{name: "strict ports ignored in strict mode",
			mut:    func(c *Config) { c.StrictPorts = []uint16{8080} },
			sameAs: func(c *Config) {}},
		{name: "permissive ports ignored in permissive mode",
			mut:    func(c *Config) { c.Mode, c.PermissivePorts = ModePermissive, []uint16{9000} },
			sameAs: func(c *Config) { c.Mode = ModePermissive }},
		{name: "permissive with strict ports refuses only them, probes from the node first",
			mut: func(c *Config) { c.Mode, c.StrictPorts = ModePermissive, []uint16{9443, 8080} },
			want: []string{
				"in-probe-10.244.1.1/32 meta nfproto ipv4 ip saddr 10.244.1.1 meta l4proto tcp tcp dport { 8080, 8081 } accept",
				"in-strict-ports-reject meta l4proto tcp tcp dport { 8080, 9443 } reject with tcp reset",
			},
			notWant: []string{"in-mtls", "in-strict-reject"}},
		{name: "an operator exclusion wins over a strict port",
			mut: func(c *Config) {
				c.Mode, c.StrictPorts, c.ExcludeInboundPorts = ModePermissive, []uint16{9090, 8443}, []uint16{9090}
			},
			want:    []string{"in-strict-ports-reject meta l4proto tcp tcp dport 8443 reject with tcp reset"},
			notWant: []string{"9090"}},
		{name: "strict ports all excluded: plain permissive",
			mut: func(c *Config) {
				c.Mode, c.StrictPorts, c.ExcludeInboundPorts = ModePermissive, []uint16{9090}, []uint16{9090}
			},
			sameAs: func(c *Config) { c.Mode = ModePermissive }},
		{name: "strict with permissive ports accepts them before the reject",
			mut: func(c *Config) { c.PermissivePorts, c.ExcludeInboundPorts = []uint16{9000}, []uint16{9100} },
			want: []string{
				"in-exclude-ports meta l4proto tcp tcp dport 9100 accept\nin-permissive-ports meta l4proto tcp tcp dport 9000 accept\nin-strict-reject",
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.mut(&c)
			got := input(t, c)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("input chain lacks %q:\n%s", w, got)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(got, w) {
					t.Errorf("input chain has %q:\n%s", w, got)
				}
			}
			if tc.sameAs != nil {
				o := base
				tc.sameAs(&o)
				if want := input(t, o); got != want {
					t.Errorf("input chain:\n%s\nwant:\n%s", got, want)
				}
			}
		})
	}
	// A changed strict port changes its rule's comment (drift detection by comments).
	a, b := base, base
	a.Mode, a.StrictPorts = ModePermissive, []uint16{8080}
	b.Mode, b.StrictPorts = ModePermissive, []uint16{8443}
	if input(t, a) == input(t, b) {
		t.Error("different strict ports render the same input chain")
	}
}

// TestRefusesTCP reads the input chains Build writes for a caller's TCP packet (new or of a
// connection already accepted): what CutRefused closes is what the live rules refuse.
func TestRefusesTCP(t *testing.T) {
	pod := netip.MustParseAddr("10.244.1.5")
	node, caller := netip.MustParseAddr("10.244.1.1"), netip.MustParseAddr("10.244.2.7")
	strict := Config{
		PodIPs: []netip.Addr{pod}, HostIP: netip.MustParseAddr("192.168.0.10"), NodeSources: prefixes("10.244.1.1/32"),
		ProbePorts: []uint16{8081}, ExcludeInboundPorts: []uint16{9090}, PermissivePorts: []uint16{9443},
	}
	permissive := strict.withMode(ModePermissive)
	permissive.PermissivePorts, permissive.StrictPorts = nil, []uint16{8080, 8081, 9090}
	for _, tc := range []struct {
		name string
		cfg  Config
		src  netip.Addr
		port uint16
		want bool
	}{
		{"strict: a caller on an app port", strict, caller, 8080, true},
		{"strict: the mTLS port", strict, caller, 15008, false},
		{"strict: the node on its probe port", strict, node, 8081, false},
		{"strict: a caller on the probe port", strict, caller, 8081, true},
		{"strict: an excluded port", strict, caller, 9090, false},
		{"strict: a permissive port", strict, caller, 9443, false},
		{"permissive: a strict port", permissive, caller, 8080, true},
		{"permissive: another port", permissive, caller, 7070, false},
		{"permissive: the node on the probe port", permissive, node, 8081, false},
		{"permissive: a strict port the operator excluded", permissive, caller, 9090, false},
		{"permissive, no strict port", strict.withMode(ModePermissive), caller, 8080, false},
	} {
		rs, err := Build(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := rs.RefusesTCP(tc.src, pod, tc.port); got != tc.want {
			t.Errorf("%s: RefusesTCP(%s -> :%d) = %v, want %v", tc.name, tc.src, tc.port, got, tc.want)
		}
	}
}
