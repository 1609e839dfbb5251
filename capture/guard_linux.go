//go:build linux

package capture

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// NFTGuard is the NodeGuard of the network namespace at NetnsPath (the node's: the agent runs on
// the host network, so "/proc/self/ns/net"), as table bridge aether:
//
//	table bridge aether {
//	  set node4 { type ipv4_addr; elements = { <gateways, HOST_IP> } }
//	  set node6 { type ipv6_addr; elements = { <gateways, HOST_IPv6> } }
//	  chain prerouting {
//	    type filter hook prerouting priority -200; policy accept;
//	    meta protocol ip ip saddr @node4 counter drop
//	    meta protocol ip6 ip6 saddr @node6 counter drop
//	    meta protocol arp arp saddr ip @node4 counter drop
//	    meta protocol ip6 ip6 nexthdr ipv6-icmp @nh,320,8 136 @nh,384,128 @node6 counter drop
//	  }
//	}
//
// It needs nf_tables for the bridge family (CONFIG_NF_TABLES_BRIDGE) and nothing of
// br_netfilter.
type NFTGuard struct {
	NetnsPath string
}

// The guard's set and chain names.
const (
	guardSet4  = "node4"
	guardSet6  = "node6"
	guardChain = "prerouting"
)

// guardPriority is the bridge family's "filter" priority (-200; nft(8), table of standard
// priority names).
var guardPriority = nftables.ChainPriorityRef(-200)

// EtherType values (IEEE 802 numbers) as meta protocol holds them, in network byte order.
var (
	etherIPv4 = []byte{0x08, 0x00}
	etherIPv6 = []byte{0x86, 0xdd}
	etherARP  = []byte{0x08, 0x06}
)

// guardRule is one rule of the guard chain: its comment id and its expressions.
type guardRule struct {
	id    string
	exprs func(set4, set6 *nftables.Set) []expr.Any
}

// guardRules are the chain's rules in order. Offsets are from the network header: IPv4 source at
// 12, IPv6 source at 8 (RFC 8200 section 3), ARP sender protocol address at 14 for Ethernet and
// IPv4 (RFC 826), and a neighbour advertisement directly after a 40-byte IPv6 header: next header
// at 6, ICMPv6 type at 40, target address at 48 (RFC 4861 section 4.4). An advertisement behind
// IPv6 extension headers is not matched (docs/security.md, open).
var guardRules = []guardRule{
	{"guard-ipv4-source", func(s4, _ *nftables.Set) []expr.Any {
		return guardExprs(etherIPv4, nil, 12, 4, s4)
	}},
	{"guard-ipv6-source", func(_, s6 *nftables.Set) []expr.Any {
		return guardExprs(etherIPv6, nil, 8, 16, s6)
	}},
	{"guard-arp-sender", func(s4, _ *nftables.Set) []expr.Any {
		return guardExprs(etherARP, nil, 14, 4, s4)
	}},
	{"guard-nd-advert-target", func(_, s6 *nftables.Set) []expr.Any {
		pre := []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 6, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 40, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{136}},
		}
		return guardExprs(etherIPv6, pre, 48, 16, s6)
	}},
}

// guardExprs matches meta protocol proto, then pre, then the len bytes at off of the network
// header against set; a match is counted and dropped.
func guardExprs(proto []byte, pre []expr.Any, off, n uint32, set *nftables.Set) []expr.Any {
	e := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: proto},
	}
	e = append(e, pre...)
	return append(e,
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop})
}

func guardComment(id string) string { return Tag + ":" + id }

// Apply implements NodeGuard. When the live table differs in any way it is deleted and added
// back whole in the same transaction, so no frame ever meets a half-built guard.
func (g NFTGuard) Apply(addrs []netip.Addr) (bool, error) {
	v4, v6, err := guardAddrs(addrs)
	if err != nil {
		return false, err
	}
	conn, closeNS, err := nftConn(g.NetnsPath)
	if err != nil {
		return false, fmt.Errorf("apply node source guard: %w", err)
	}
	defer closeNS()
	if checkGuard(conn, v4, v6) == nil {
		return false, nil
	}
	t := &nftables.Table{Family: nftables.TableFamilyBridge, Name: GuardTable}
	if _, err := conn.ListTableOfFamily(GuardTable, nftables.TableFamilyBridge); err == nil {
		conn.DelTable(t)
	}
	conn.AddTable(t)
	set4 := &nftables.Set{Table: t, Name: guardSet4, KeyType: nftables.TypeIPAddr}
	set6 := &nftables.Set{Table: t, Name: guardSet6, KeyType: nftables.TypeIP6Addr}
	for _, s := range []struct {
		set   *nftables.Set
		addrs []netip.Addr
	}{{set4, v4}, {set6, v6}} {
		elems := make([]nftables.SetElement, len(s.addrs))
		for i, a := range s.addrs {
			elems[i] = nftables.SetElement{Key: a.AsSlice()}
		}
		if err := conn.AddSet(s.set, elems); err != nil {
			return false, fmt.Errorf("apply node source guard: set %s: %w", s.set.Name, err)
		}
	}
	policy := nftables.ChainPolicyAccept
	c := conn.AddChain(&nftables.Chain{Name: guardChain, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: guardPriority, Policy: &policy})
	for _, r := range guardRules {
		conn.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: r.exprs(set4, set6),
			UserData: userdata.AppendString(nil, userdata.TypeComment, guardComment(r.id))})
	}
	if err := conn.Flush(); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOENT) {
			return false, fmt.Errorf("apply node source guard in %s: %w (the kernel needs nf_tables for the bridge family, CONFIG_NF_TABLES_BRIDGE)", g.NetnsPath, err)
		}
		return false, fmt.Errorf("apply node source guard in %s: %w", g.NetnsPath, err)
	}
	return true, nil
}

// Check implements NodeGuard.
func (g NFTGuard) Check(addrs []netip.Addr) error {
	v4, v6, err := guardAddrs(addrs)
	if err != nil {
		return err
	}
	conn, closeNS, err := nftConn(g.NetnsPath)
	if err != nil {
		return fmt.Errorf("check node source guard: %w", err)
	}
	defer closeNS()
	return checkGuard(conn, v4, v6)
}

// Teardown implements NodeGuard.
func (g NFTGuard) Teardown() error {
	conn, closeNS, err := nftConn(g.NetnsPath)
	if err != nil {
		return fmt.Errorf("remove node source guard: %w", err)
	}
	defer closeNS()
	if _, err := conn.ListTableOfFamily(GuardTable, nftables.TableFamilyBridge); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // no table: nothing to remove
		}
		return fmt.Errorf("remove node source guard in %s: %w", g.NetnsPath, err)
	}
	conn.DelTable(&nftables.Table{Family: nftables.TableFamilyBridge, Name: GuardTable})
	if err := conn.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove node source guard in %s: %w", g.NetnsPath, err)
	}
	return nil
}

// checkGuard compares the live table bridge aether with the guard of v4 and v6: the chain's hook,
// priority and policy, its rules by comment, and both sets' elements.
func checkGuard(conn *nftables.Conn, v4, v6 []netip.Addr) error {
	t, err := conn.ListTableOfFamily(GuardTable, nftables.TableFamilyBridge)
	if err != nil {
		return &DriftError{What: "table bridge " + GuardTable + " is missing"}
	}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyBridge)
	if err != nil {
		return fmt.Errorf("check node source guard: list chains: %w", err)
	}
	var live []*nftables.Chain
	for _, c := range chains {
		if c.Table.Name == GuardTable {
			live = append(live, c)
		}
	}
	if len(live) != 1 || live[0].Name != guardChain {
		return &DriftError{What: fmt.Sprintf("table bridge %s has %d chains, want only %s", GuardTable, len(live), guardChain)}
	}
	c := live[0]
	if c.Hooknum == nil || *c.Hooknum != *nftables.ChainHookPrerouting || c.Priority == nil ||
		*c.Priority != *guardPriority || (c.Policy != nil && *c.Policy != nftables.ChainPolicyAccept) {
		return &DriftError{What: "chain " + guardChain + " has another hook, priority or policy"}
	}
	rules, err := conn.GetRules(t, c)
	if err != nil {
		return fmt.Errorf("check node source guard: list rules: %w", err)
	}
	if len(rules) != len(guardRules) {
		return &DriftError{What: fmt.Sprintf("chain %s has %d rules, want %d", guardChain, len(rules), len(guardRules))}
	}
	for i, r := range guardRules {
		if got, _ := userdata.GetString(rules[i].UserData, userdata.TypeComment); got != guardComment(r.id) {
			return &DriftError{What: fmt.Sprintf("chain %s rule %d is %q, want %q", guardChain, i, got, guardComment(r.id))}
		}
	}
	sets, err := conn.GetSets(t)
	if err != nil {
		return fmt.Errorf("check node source guard: list sets: %w", err)
	}
	if len(sets) != 2 {
		return &DriftError{What: fmt.Sprintf("table bridge %s has %d sets, want 2", GuardTable, len(sets))}
	}
	for _, want := range []struct {
		name  string
		addrs []netip.Addr
	}{{guardSet4, v4}, {guardSet6, v6}} {
		i := slices.IndexFunc(sets, func(s *nftables.Set) bool { return s.Name == want.name })
		if i < 0 {
			return &DriftError{What: "set " + want.name + " is missing"}
		}
		elems, err := conn.GetSetElements(sets[i])
		if err != nil {
			return fmt.Errorf("check node source guard: list set %s: %w", want.name, err)
		}
		var got []netip.Addr
		for _, e := range elems {
			if a, ok := netip.AddrFromSlice(e.Key); ok {
				got = append(got, a)
			}
		}
		slices.SortFunc(got, netip.Addr.Compare)
		if !slices.Equal(got, want.addrs) {
			return &DriftError{What: fmt.Sprintf("set %s holds %v, want %v", want.name, got, want.addrs)}
		}
	}
	return nil
}
