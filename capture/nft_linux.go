//go:build linux

package capture

import (
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NFTables applies rule sets through nf_tables netlink messages (github.com/google/nftables): no
// process is started per pod, and the whole table is replaced in one netlink batch, which the
// kernel commits as one transaction (all of it or nothing).
type NFTables struct{}

// Apply makes the pod netns at netnsPath hold exactly rs in table inet aether. It first checks
// the live table and writes nothing when it already matches (so applying twice is a no-op).
// Otherwise it writes one netlink batch, which the kernel commits as one transaction:
//
//   - no table yet: add the table, its chains and rules;
//   - the table has exactly the wanted chains: flush each chain and add its rules again (base
//     chains stay registered, so no hook is unregistered and no RCU grace period is waited for);
//   - anything else: delete the table and add it back whole.
//
// It reports whether it changed anything.
func (NFTables) Apply(netnsPath string, rs RuleSet) (changed bool, err error) {
	conn, closeNS, err := nftConn(netnsPath)
	if err != nil {
		return false, fmt.Errorf("apply capture rules: %w", err)
	}
	defer closeNS()
	if checkNFT(conn, rs) == nil {
		return false, nil
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	keep := false
	if _, err := conn.ListTableOfFamily(TableName, nftables.TableFamilyINet); err == nil {
		keep = sameChains(conn, rs)
		if !keep {
			conn.DelTable(t)
		}
	}
	if !keep {
		conn.AddTable(t)
	}
	for _, ch := range rs.Chains {
		typ, hook, prio := ch.Hook.nftables()
		policy := nftables.ChainPolicyAccept
		c := &nftables.Chain{Name: ch.Name, Table: t, Type: typ, Hooknum: hook, Priority: prio, Policy: &policy}
		if keep {
			conn.FlushChain(c)
		} else {
			conn.AddChain(c)
		}
		for _, r := range ch.Rules {
			exprs, err := r.nftExprs(conn, t)
			if err != nil {
				return false, fmt.Errorf("apply capture rules: rule %s: %w", r.ID, err)
			}
			conn.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: exprs,
				UserData: userdata.AppendString(nil, userdata.TypeComment, r.Comment())})
		}
	}
	if err := conn.Flush(); err != nil {
		return false, fmt.Errorf("apply capture rules in %s: %w", netnsPath, err)
	}
	return true, nil
}

// sameChains reports whether table inet aether holds exactly rs's chains (names, hooks,
// priorities and policy accept), whatever their rules.
func sameChains(conn *nftables.Conn, rs RuleSet) bool {
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return false
	}
	n := 0
	for _, c := range chains {
		if c.Table.Name != TableName {
			continue
		}
		n++
		i := slices.IndexFunc(rs.Chains, func(ch Chain) bool { return ch.Name == c.Name })
		if i < 0 {
			return false
		}
		if !sameHook(c, rs.Chains[i]) {
			return false
		}
	}
	return n == len(rs.Chains)
}

// Check compares the live table inet aether in the pod netns with rs: the same chains (name,
// hook, priority, policy accept) holding the same rules in the same order, compared by their aether comments (which carry
// a digest of each rule). It returns a *DriftError describing the first difference, or another
// error when the netns cannot be read.
func (NFTables) Check(netnsPath string, rs RuleSet) error {
	conn, closeNS, err := nftConn(netnsPath)
	if err != nil {
		return fmt.Errorf("check capture rules: %w", err)
	}
	defer closeNS()
	return checkNFT(conn, rs)
}

// Teardown deletes table inet aether from the pod netns. A missing table or a netns that no
// longer exists is success (idempotent, CNI DEL semantics).
func (NFTables) Teardown(netnsPath string) error {
	conn, closeNS, err := nftConn(netnsPath)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("remove capture rules: %w", err)
	}
	defer closeNS()
	if _, err := conn.ListTableOfFamily(TableName, nftables.TableFamilyINet); err != nil {
		return nil // no table: nothing to remove
	}
	conn.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName})
	if err := conn.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove capture rules in %s: %w", netnsPath, err)
	}
	return nil
}

func nftConn(netnsPath string) (*nftables.Conn, func(), error) {
	h, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return nil, nil, fmt.Errorf("open netns %s: %w", netnsPath, err)
	}
	// One lasting netlink socket for the whole operation (check, then write) instead of one per
	// request: each new socket in another netns costs a setns round trip.
	conn, err := nftables.New(nftables.WithNetNSFd(int(h)), nftables.WithSockOptions(bigSendBuffer), nftables.AsLasting())
	if err != nil {
		h.Close()
		return nil, nil, fmt.Errorf("open nftables in %s: %w", netnsPath, err)
	}
	return conn, func() { _ = conn.CloseLasting(); h.Close() }, nil
}

// sendBufferBytes bounds one transaction: netlink_sendmsg refuses a batch larger than the
// socket's send buffer (EMSGSIZE), and the default (net.core.wmem_default, about 208 KiB) holds
// only a few hundred rules. 16 MiB fits tens of thousands of exclusions.
const sendBufferBytes = 16 << 20

// bigSendBuffer raises the netlink socket's send and receive buffers with SO_SNDBUFFORCE and
// SO_RCVBUFFORCE (CAP_NET_ADMIN, which the agent has; they ignore net.core.wmem_max/rmem_max):
// the kernel acknowledges every message of the batch, and those acks must fit too (ENOBUFS).
func bigSendBuffer(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("raise netlink send buffer: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sendBufferBytes)
		if serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, sendBufferBytes)
		}
	}); err != nil {
		return fmt.Errorf("raise netlink send buffer: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("raise netlink send buffer: %w", serr)
	}
	return nil
}

func checkNFT(conn *nftables.Conn, rs RuleSet) error {
	t, err := conn.ListTableOfFamily(TableName, nftables.TableFamilyINet)
	if err != nil {
		return &DriftError{What: "table inet " + TableName + " is missing"}
	}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("check capture rules: list chains: %w", err)
	}
	var live []*nftables.Chain
	for _, c := range chains {
		if c.Table.Name == TableName {
			live = append(live, c)
		}
	}
	if len(live) != len(rs.Chains) {
		return &DriftError{What: fmt.Sprintf("table has %d chains, want %d", len(live), len(rs.Chains))}
	}
	for _, ch := range rs.Chains {
		i := slices.IndexFunc(live, func(c *nftables.Chain) bool { return c.Name == ch.Name })
		if i < 0 {
			return &DriftError{What: "chain " + ch.Name + " is missing"}
		}
		if !sameHook(live[i], ch) {
			return &DriftError{What: "chain " + ch.Name + " has another hook, priority or policy"}
		}
		rules, err := conn.GetRules(t, live[i])
		if err != nil {
			return fmt.Errorf("check capture rules: list rules of %s: %w", ch.Name, err)
		}
		if len(rules) != len(ch.Rules) {
			return &DriftError{What: fmt.Sprintf("chain %s has %d rules, want %d", ch.Name, len(rules), len(ch.Rules))}
		}
		for j, r := range ch.Rules {
			got, _ := userdata.GetString(rules[j].UserData, userdata.TypeComment)
			if got != r.Comment() {
				return &DriftError{What: fmt.Sprintf("chain %s rule %d is %q, want %q", ch.Name, j, got, r.Comment())}
			}
		}
	}
	return nil
}

// sameHook reports whether live chain c has ch's hook and priority and policy accept (a chain
// whose policy someone set to drop would drop every packet no rule accepts).
func sameHook(c *nftables.Chain, ch Chain) bool {
	_, hook, prio := ch.Hook.nftables()
	return c.Hooknum != nil && *c.Hooknum == *hook && c.Priority != nil && *c.Priority == *prio &&
		(c.Policy == nil || *c.Policy == nftables.ChainPolicyAccept)
}

func (h Hook) nftables() (nftables.ChainType, *nftables.ChainHook, *nftables.ChainPriority) {
	switch h {
	case HookOutputNAT:
		return nftables.ChainTypeNAT, nftables.ChainHookOutput, nftables.ChainPriorityNATDest
	case HookOutputFilter:
		return nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter
	default:
		return nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter
	}
}

// ifname pads a device name to IFNAMSIZ, as nft compares meta iifname/oifname.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func (r Rule) nftExprs(conn *nftables.Conn, t *nftables.Table) ([]expr.Any, error) {
	var e []expr.Any
	switch r.Family {
	case FamilyIPv4:
		e = append(e, &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}})
	case FamilyIPv6:
		e = append(e, &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV6}})
	}
	if r.OIFLoopback {
		e = append(e, &expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("lo")})
	}
	if r.IIFLoopback {
		e = append(e, &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("lo")})
	}
	if r.Reply {
		e = append(e, &expr.Ct{Register: 1, Key: expr.CtKeyDIRECTION},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1}}) // IP_CT_DIR_REPLY
	}
	if r.Mark != 0 {
		e = append(e, &expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(r.Mark)})
	}
	if r.Src.IsValid() {
		e = append(e, prefixExprs(r.Src.Masked().Addr().AsSlice(), r.Src.Bits(), true)...)
	}
	if r.Dst.IsValid() {
		e = append(e, prefixExprs(r.Dst.Masked().Addr().AsSlice(), r.Dst.Bits(), false)...)
	}
	if r.L4 != 0 {
		e = append(e, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{r.L4}})
	}
	switch len(r.DstPorts) {
	case 0:
	case 1:
		e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(r.DstPorts[0])})
	default:
		set := &nftables.Set{Table: t, Anonymous: true, Constant: true, KeyType: nftables.TypeInetService}
		elems := make([]nftables.SetElement, len(r.DstPorts))
		for i, p := range r.DstPorts {
			elems[i] = nftables.SetElement{Key: binaryutil.BigEndian.PutUint16(p)}
		}
		if err := conn.AddSet(set, elems); err != nil {
			return nil, fmt.Errorf("add port set: %w", err)
		}
		e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID})
	}
	switch r.Verdict.Kind {
	case VerdictAccept:
		e = append(e, &expr.Verdict{Kind: expr.VerdictAccept})
	case VerdictReturn:
		e = append(e, &expr.Verdict{Kind: expr.VerdictReturn})
	case VerdictDrop:
		e = append(e, &expr.Verdict{Kind: expr.VerdictDrop})
	case VerdictReject:
		e = append(e, &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
	case VerdictRedirect:
		e = append(e, &expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(r.Verdict.Port)},
			&expr.Redir{RegisterProtoMin: 1})
	case VerdictDNAT:
		fam := uint32(unix.NFPROTO_IPV4)
		if r.Verdict.Addr.Is6() {
			fam = unix.NFPROTO_IPV6
		}
		e = append(e, &expr.Immediate{Register: 1, Data: r.Verdict.Addr.AsSlice()},
			&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(r.Verdict.Port)},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: 1, RegProtoMin: 2, Specified: true})
	}
	return e, nil
}

// prefixExprs matches the source or destination address against addr/bits. The caller has
// matched the family first (meta nfproto), as nft does in an inet table.
func prefixExprs(addr []byte, bits int, src bool) []expr.Any {
	var off uint32
	switch {
	case len(addr) == 4 && src:
		off = 12
	case len(addr) == 4:
		off = 16
	case src:
		off = 8
	default:
		off = 24
	}
	e := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(len(addr))}}
	if bits < len(addr)*8 {
		mask := make([]byte, len(addr))
		for i := 0; i < bits; i++ {
			mask[i/8] |= 0x80 >> (i % 8)
		}
		e = append(e, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(len(addr)), Mask: mask, Xor: make([]byte, len(addr))})
	}
	return append(e, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr})
}
