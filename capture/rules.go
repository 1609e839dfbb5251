package capture

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// TableName is the nftables table (family inet) that holds every aether rule in a pod netns; the
// iptables fallback uses chains prefixed ChainPrefix instead. Nothing outside them is touched.
const (
	TableName   = "aether"
	ChainPrefix = "AETHER-"
	// Tag starts every rule's comment ("aether:<rule id>#<digest>").
	Tag = "aether"
)

// Family selects the IP family a rule applies to.
type Family uint8

// The families.
const (
	FamilyAny Family = iota
	FamilyIPv4
	FamilyIPv6
)

// Hook is where a chain is attached.
type Hook string

// The hooks aether uses.
const (
	// HookOutputNAT is the nat output hook (priority dstnat, -100): locally generated packets,
	// first packet of each connection only.
	HookOutputNAT Hook = "output-nat"
	// HookOutputFilter is the filter output hook (priority 0).
	HookOutputFilter Hook = "output-filter"
	// HookInputFilter is the filter input hook (priority 0).
	HookInputFilter Hook = "input-filter"
)

// VerdictKind is what a matching rule does.
type VerdictKind uint8

// The verdicts.
const (
	VerdictAccept VerdictKind = iota
	VerdictReturn
	VerdictDrop
	// VerdictReject answers TCP with a reset.
	VerdictReject
	// VerdictRedirect redirects to Port on the local host (127.0.0.1 or ::1 for locally
	// generated packets), keeping the original destination in conntrack (SO_ORIGINAL_DST).
	VerdictRedirect
	// VerdictDNAT rewrites the destination to Addr:Port.
	VerdictDNAT
)

// Verdict is a rule's action.
type Verdict struct {
	Kind VerdictKind
	Port uint16
	Addr netip.Addr
}

// Rule is one capture rule as plain data: every set match must hold (logical and).
type Rule struct {
	// ID names the rule stably ("out-redirect", "dns-udp-10.96.0.10"); it is part of the
	// rule's comment, so check and repair can tell aether's rules apart and spot drift.
	ID     string
	Family Family
	// OIFLoopback / IIFLoopback match the loopback interface ("lo") as output / input device.
	OIFLoopback bool
	IIFLoopback bool
	// Reply matches packets in conntrack's reply direction (ct direction reply): those of
	// connections the pod opened, never a caller's packets to the pod.
	Reply bool
	// Mark matches the packet mark exactly when non-zero.
	Mark uint32
	// L4 is the transport protocol (6 TCP, 17 UDP); 0 means any.
	L4 uint8
	// Src / Dst match a source / destination prefix when valid.
	Src netip.Prefix
	Dst netip.Prefix
	// DstPorts matches any of these destination ports (requires L4).
	DstPorts []uint16
	Verdict  Verdict
}

// Chain is one base chain of the rule set. Its policy is always accept: aether's chains only ever
// return, redirect, or refuse explicitly.
type Chain struct {
	Name  string
	Hook  Hook
	Rules []Rule
}

// RuleSet is the complete capture configuration of one pod netns.
type RuleSet struct {
	Chains []Chain
	// Config is the configuration Build made the rule set from, with its defaults: what a
	// backend that renders capture otherwise than as rules (bpf/capture.Backend) reads.
	Config Config
}

// Protocol numbers used in rules.
const (
	protoTCP = 6
	protoUDP = 17
)

// familyOf is the Family of an address.
func familyOf(a netip.Addr) Family {
	if a.Is6() {
		return FamilyIPv6
	}
	return FamilyIPv4
}

// Build returns the capture rule set for cfg (pure; DESIGN.md data flow 2). It returns the error
// of cfg.Validate.
//
// Outbound (nat output): loopback and BypassMark return; UDP to each UDPRedirects VIP and port is
// DNAT'ed to HostIP:LocalPort (HostIPv6 for IPv6); DNS (UDP and TCP port 53) to each
// ClusterDNS address is DNAT'ed to HostIP:DNSPort; ExcludeOutboundCIDRs and
// ExcludeOutboundPorts return; every other TCP connection is redirected to CapturePort. IPv6 is
// handled the same way when the pod has an IPv6 address; otherwise every non-loopback IPv6
// packet is dropped in both directions. Unless AllowCloudMetadata, the cloud metadata addresses
// (MetadataAddrs) are left uncaptured and refused in filter output: TCP with a reset, the rest
// dropped.
//
// Inbound (filter input): the reply direction of the pod's own connections and loopback are
// accepted; every other TCP packet, of a new connection or of one already accepted, is judged by
// the mode, so a connection the current policy refuses is cut at its next packet when a port or
// the pod turns strict (CutRefused also closes the pod's end): in ModeStrict only InboundPort,
// NodeSources on ProbePorts (on every port with NodeAllPorts), ExcludeInboundPorts and
// PermissivePorts accept TCP, any other TCP gets a reset; in ModePermissive TCP is accepted
// except on StrictPorts (less ExcludeInboundPorts), where only NodeSources on ProbePorts (every
// port with NodeAllPorts) are accepted and the rest gets a reset. UDP and ICMP are not meshed and
// pass.
func Build(cfg Config) (RuleSet, error) {
	if err := cfg.Validate(); err != nil {
		return RuleSet{}, fmt.Errorf("build capture rules: %w", err)
	}
	c := cfg.withDefaults()
	v6 := c.hasIPv6()
	capFam := FamilyAny
	if !v6 {
		capFam = FamilyIPv4
	}

	out := Chain{Name: "output_nat", Hook: HookOutputNAT}
	out.Rules = append(out.Rules, Rule{ID: "out-loopback", OIFLoopback: true, Verdict: Verdict{Kind: VerdictReturn}})
	if c.BypassMark != 0 {
		out.Rules = append(out.Rules, Rule{ID: "out-bypass-mark", Mark: c.BypassMark, Verdict: Verdict{Kind: VerdictReturn}})
	}
	// Routed UDP frontends before anything else for UDP: a UDPRoute owns its VIP and port, so
	// no exclusion (one covering the service range, say) leaves its datagrams unrouted.
	for _, r := range c.UDPRedirects {
		host := c.HostIP
		if r.VIP.Is6() {
			if !v6 {
				continue // IPv6 is dropped in this pod
			}
			host = c.HostIPv6
		}
		out.Rules = append(out.Rules, Rule{
			ID: fmt.Sprintf("out-udp-%s", netip.AddrPortFrom(r.VIP, r.Port)), Family: familyOf(r.VIP), L4: protoUDP,
			Dst: netip.PrefixFrom(r.VIP, r.VIP.BitLen()), DstPorts: []uint16{r.Port},
			Verdict: Verdict{Kind: VerdictDNAT, Addr: host, Port: r.LocalPort},
		})
	}
	// The metadata addresses are never captured (a passthrough would reach them) and are
	// refused in the filter output chain below.
	var metadata []netip.Addr
	if !c.AllowCloudMetadata {
		for _, a := range MetadataAddrs {
			if a.Is4() || v6 {
				metadata = append(metadata, a)
			}
		}
	}
	for _, a := range metadata {
		out.Rules = append(out.Rules, Rule{ID: "out-metadata-" + a.String(), Family: familyOf(a), Dst: netip.PrefixFrom(a, a.BitLen()), Verdict: Verdict{Kind: VerdictReturn}})
	}
	for _, d := range c.ClusterDNS {
		fam, host := FamilyIPv4, c.HostIP
		if d.Is6() {
			fam, host = FamilyIPv6, c.HostIPv6
		}
		for _, l4 := range []struct {
			name  string
			proto uint8
		}{{"udp", protoUDP}, {"tcp", protoTCP}} {
			out.Rules = append(out.Rules, Rule{
				ID: "out-dns-" + l4.name + "-" + d.String(), Family: fam, L4: l4.proto,
				Dst: netip.PrefixFrom(d, d.BitLen()), DstPorts: []uint16{DNSPort},
				Verdict: Verdict{Kind: VerdictDNAT, Addr: host, Port: c.DNSPort},
			})
		}
	}
	for _, p := range c.ExcludeOutboundCIDRs {
		out.Rules = append(out.Rules, Rule{ID: "out-exclude-" + p.String(), Family: familyOf(p.Addr()), Dst: p, Verdict: Verdict{Kind: VerdictReturn}})
	}
	if len(c.ExcludeOutboundPorts) > 0 {
		out.Rules = append(out.Rules, Rule{ID: "out-exclude-ports", L4: protoTCP, DstPorts: c.ExcludeOutboundPorts, Verdict: Verdict{Kind: VerdictReturn}})
	}
	out.Rules = append(out.Rules, Rule{ID: "out-redirect", Family: capFam, L4: protoTCP, Verdict: Verdict{Kind: VerdictRedirect, Port: c.CapturePort}})

	rs := RuleSet{Chains: []Chain{out}, Config: c}

	outF := Chain{Name: "output_filter", Hook: HookOutputFilter}
	for _, a := range metadata {
		dst := netip.PrefixFrom(a, a.BitLen())
		outF.Rules = append(outF.Rules,
			Rule{ID: "out-metadata-tcp-" + a.String(), Family: familyOf(a), L4: protoTCP, Dst: dst, Verdict: Verdict{Kind: VerdictReject}},
			Rule{ID: "out-metadata-drop-" + a.String(), Family: familyOf(a), Dst: dst, Verdict: Verdict{Kind: VerdictDrop}})
	}
	if !v6 {
		outF.Rules = append(outF.Rules,
			Rule{ID: "out6-loopback", OIFLoopback: true, Verdict: Verdict{Kind: VerdictAccept}},
			Rule{ID: "out6-drop", Family: FamilyIPv6, Verdict: Verdict{Kind: VerdictDrop}})
	}
	if len(outF.Rules) > 0 {
		rs.Chains = append(rs.Chains, outF)
	}

	in := Chain{Name: "input_filter", Hook: HookInputFilter}
	in.Rules = append(in.Rules,
		Rule{ID: "in-reply", Reply: true, Verdict: Verdict{Kind: VerdictAccept}},
		Rule{ID: "in-loopback", IIFLoopback: true, Verdict: Verdict{Kind: VerdictAccept}},
	)
	if !v6 {
		in.Rules = append(in.Rules, Rule{ID: "in6-drop", Family: FamilyIPv6, Verdict: Verdict{Kind: VerdictDrop}})
	}
	switch strictPorts := c.strictPorts(); {
	case c.Mode == ModeStrict:
		in.Rules = append(in.Rules, Rule{ID: "in-mtls", L4: protoTCP, DstPorts: []uint16{c.InboundPort}, Verdict: Verdict{Kind: VerdictAccept}})
		in.Rules = append(in.Rules, c.nodeRules()...)
		if len(c.ExcludeInboundPorts) > 0 {
			in.Rules = append(in.Rules, Rule{ID: "in-exclude-ports", L4: protoTCP, DstPorts: c.ExcludeInboundPorts, Verdict: Verdict{Kind: VerdictAccept}})
		}
		if len(c.PermissivePorts) > 0 {
			in.Rules = append(in.Rules, Rule{ID: "in-permissive-ports", L4: protoTCP, DstPorts: c.PermissivePorts, Verdict: Verdict{Kind: VerdictAccept}})
		}
		in.Rules = append(in.Rules, Rule{ID: "in-strict-reject", L4: protoTCP, Verdict: Verdict{Kind: VerdictReject}})
	case len(strictPorts) > 0:
		// Permissive with strict ports: the node's probes first, then a reset on those ports
		// only. InboundPort is never among them (ValidInbound), so mTLS needs no accept here.
		in.Rules = append(in.Rules, c.nodeRules()...)
		in.Rules = append(in.Rules, Rule{ID: "in-strict-ports-reject", L4: protoTCP, DstPorts: strictPorts, Verdict: Verdict{Kind: VerdictReject}})
	}
	rs.Chains = append(rs.Chains, in)
	return rs, nil
}

// nodeRules are the accepts of the node's own connections (NodeSources) that come before a
// strict reject: to ProbePorts, or to every port with NodeAllPorts. c has its defaults.
func (c Config) nodeRules() []Rule {
	var rules []Rule
	for _, p := range c.NodeSources {
		fam := familyOf(p.Addr())
		switch {
		case c.NodeAllPorts:
			rules = append(rules, Rule{ID: "in-node-" + p.String(), Family: fam, L4: protoTCP, Src: p, Verdict: Verdict{Kind: VerdictAccept}})
		case len(c.ProbePorts) > 0:
			rules = append(rules, Rule{ID: "in-probe-" + p.String(), Family: fam, L4: protoTCP, Src: p, DstPorts: c.ProbePorts, Verdict: Verdict{Kind: VerdictAccept}})
		}
	}
	return rules
}

// strictPorts returns the ports a permissive pod refuses in plaintext: StrictPorts less
// ExcludeInboundPorts (the node operator's exclusion wins). c has its defaults (sorted lists).
func (c Config) strictPorts() []uint16 {
	var out []uint16
	for _, p := range c.StrictPorts {
		if !slices.Contains(c.ExcludeInboundPorts, p) {
			out = append(out, p)
		}
	}
	return out
}

// Comment returns the rule's tag, "aether:<id>#<digest>", where digest is the first 8 hex digits
// of the SHA-256 of the rule's nftables rendering: a changed rule gets a new comment, so Check
// spots drift by comments alone.
func (r Rule) Comment() string {
	sum := sha256.Sum256([]byte(r.nftMatch() + " " + r.nftVerdict()))
	return Tag + ":" + r.ID + "#" + hex.EncodeToString(sum[:4])
}

// NFTText renders the rule set in `nft -f` syntax (as `nft list table inet aether` would show
// it). It is what golden files hold and what an operator compares with the live table.
func (rs RuleSet) NFTText() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", TableName)
	for i, ch := range rs.Chains {
		if i > 0 {
			b.WriteString("\n")
		}
		typ, hook, prio := ch.Hook.nft()
		fmt.Fprintf(&b, "\tchain %s {\n\t\ttype %s hook %s priority %d; policy accept;\n", ch.Name, typ, hook, prio)
		for _, r := range ch.Rules {
			fmt.Fprintf(&b, "\t\t%s %s comment %q\n", r.nftMatch(), r.nftVerdict(), r.Comment())
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// nft returns the chain type, hook name and priority.
func (h Hook) nft() (typ, hook string, prio int) {
	switch h {
	case HookOutputNAT:
		return "nat", "output", -100
	case HookOutputFilter:
		return "filter", "output", 0
	default:
		return "filter", "input", 0
	}
}

func (r Rule) nftMatch() string {
	var m []string
	switch r.Family {
	case FamilyIPv4:
		m = append(m, "meta nfproto ipv4")
	case FamilyIPv6:
		m = append(m, "meta nfproto ipv6")
	}
	if r.OIFLoopback {
		m = append(m, `oifname "lo"`)
	}
	if r.IIFLoopback {
		m = append(m, `iifname "lo"`)
	}
	if r.Reply {
		m = append(m, "ct direction reply")
	}
	if r.Mark != 0 {
		m = append(m, fmt.Sprintf("meta mark 0x%08x", r.Mark))
	}
	ipk := "ip"
	if r.Family == FamilyIPv6 {
		ipk = "ip6"
	}
	if r.Src.IsValid() {
		m = append(m, ipk+" saddr "+prefixText(r.Src))
	}
	if r.Dst.IsValid() {
		m = append(m, ipk+" daddr "+prefixText(r.Dst))
	}
	if r.L4 != 0 {
		m = append(m, "meta l4proto "+protoName(r.L4))
	}
	if len(r.DstPorts) > 0 {
		m = append(m, protoName(r.L4)+" dport "+portsText(r.DstPorts, "{ ", ", ", " }"))
	}
	return strings.Join(m, " ")
}

func (r Rule) nftVerdict() string {
	switch r.Verdict.Kind {
	case VerdictAccept:
		return "accept"
	case VerdictReturn:
		return "return"
	case VerdictDrop:
		return "drop"
	case VerdictReject:
		return "reject with tcp reset"
	case VerdictRedirect:
		return fmt.Sprintf("redirect to :%d", r.Verdict.Port)
	default:
		if r.Verdict.Addr.Is6() {
			return fmt.Sprintf("dnat ip6 to [%s]:%d", r.Verdict.Addr, r.Verdict.Port)
		}
		return fmt.Sprintf("dnat ip to %s:%d", r.Verdict.Addr, r.Verdict.Port)
	}
}

func prefixText(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

func protoName(p uint8) string {
	switch p {
	case protoTCP:
		return "tcp"
	case protoUDP:
		return "udp"
	}
	return strconv.Itoa(int(p))
}

func portsText(ps []uint16, open, sep, closing string) string {
	if len(ps) == 1 {
		return strconv.Itoa(int(ps[0]))
	}
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(int(p))
	}
	return open + strings.Join(s, sep) + closing
}

// IPTablesRestore renders the rule set as iptables-restore input for one family (FamilyIPv4 for
// iptables-restore, FamilyIPv6 for ip6tables-restore), to be fed with --noflush. Each hook gets
// its own chain (AETHER-OUTPUT-NAT, AETHER-OUTPUT, AETHER-INPUT); declaring a chain in
// iptables-restore input flushes it, so applying twice gives the same rules. The jumps from the
// built-in chains are managed separately (IPTablesJumps), so they are never duplicated.
func (rs RuleSet) IPTablesRestore(fam Family) string {
	tables := map[string][]string{}
	var order []string
	for _, ch := range rs.Chains {
		table, _ := ch.Hook.iptables()
		name := ch.Hook.iptablesChain()
		if _, ok := tables[table]; !ok {
			order = append(order, table)
		}
		tables[table] = append(tables[table], ":"+name+" - [0:0]")
		for _, r := range ch.Rules {
			if r.Family != FamilyAny && r.Family != fam {
				continue
			}
			tables[table] = append(tables[table], "-A "+name+" "+r.iptables(fam))
		}
	}
	var b strings.Builder
	for _, t := range order {
		fmt.Fprintf(&b, "*%s\n", t)
		// Chain declarations first, then rules (iptables-restore needs chains declared before use).
		var decl, rules []string
		for _, l := range tables[t] {
			if strings.HasPrefix(l, ":") {
				decl = append(decl, l)
			} else {
				rules = append(rules, l)
			}
		}
		for _, l := range append(decl, rules...) {
			b.WriteString(l + "\n")
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

// IPTablesJump is the rule in a built-in chain that sends packets to one of aether's chains.
type IPTablesJump struct {
	Table, Chain string
	// Rule is the rule specification (iptables -A <Chain> <Rule...>).
	Rule []string
}

// IPTablesJumps returns the jump rules from the built-in chains into aether's chains, each tagged
// with the aether comment.
func (rs RuleSet) IPTablesJumps() []IPTablesJump {
	var js []IPTablesJump
	for _, ch := range rs.Chains {
		table, builtin := ch.Hook.iptables()
		js = append(js, IPTablesJump{Table: table, Chain: builtin,
			Rule: []string{"-m", "comment", "--comment", Tag + ":jump", "-j", ch.Hook.iptablesChain()}})
	}
	return js
}

func (h Hook) iptables() (table, builtin string) {
	switch h {
	case HookOutputNAT:
		return "nat", "OUTPUT"
	case HookOutputFilter:
		return "filter", "OUTPUT"
	default:
		return "filter", "INPUT"
	}
}

func (h Hook) iptablesChain() string {
	switch h {
	case HookOutputNAT:
		return ChainPrefix + "OUTPUT-NAT"
	case HookOutputFilter:
		return ChainPrefix + "OUTPUT"
	default:
		return ChainPrefix + "INPUT"
	}
}

func (r Rule) iptables(fam Family) string {
	var m []string
	if r.OIFLoopback {
		m = append(m, "-o lo")
	}
	if r.IIFLoopback {
		m = append(m, "-i lo")
	}
	if r.Src.IsValid() {
		m = append(m, "-s "+r.Src.String())
	}
	if r.Dst.IsValid() {
		m = append(m, "-d "+r.Dst.String())
	}
	if r.L4 != 0 {
		m = append(m, "-p "+protoName(r.L4))
	}
	if r.Reply {
		m = append(m, "-m conntrack --ctdir REPLY")
	}
	if r.Mark != 0 {
		m = append(m, fmt.Sprintf("-m mark --mark 0x%x", r.Mark))
	}
	if len(r.DstPorts) == 1 {
		m = append(m, fmt.Sprintf("-m %s --dport %d", protoName(r.L4), r.DstPorts[0]))
	} else if len(r.DstPorts) > 1 {
		m = append(m, "-m multiport --dports "+portsText(r.DstPorts, "", ",", ""))
	}
	m = append(m, fmt.Sprintf("-m comment --comment %q", r.Comment()))
	switch r.Verdict.Kind {
	case VerdictAccept:
		m = append(m, "-j ACCEPT")
	case VerdictReturn:
		m = append(m, "-j RETURN")
	case VerdictDrop:
		m = append(m, "-j DROP")
	case VerdictReject:
		m = append(m, "-j REJECT --reject-with tcp-reset")
	case VerdictRedirect:
		m = append(m, fmt.Sprintf("-j REDIRECT --to-ports %d", r.Verdict.Port))
	case VerdictDNAT:
		if fam == FamilyIPv6 {
			m = append(m, fmt.Sprintf("-j DNAT --to-destination [%s]:%d", r.Verdict.Addr, r.Verdict.Port))
		} else {
			m = append(m, fmt.Sprintf("-j DNAT --to-destination %s:%d", r.Verdict.Addr, r.Verdict.Port))
		}
	}
	return strings.Join(m, " ")
}
