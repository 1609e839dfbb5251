//go:build linux

package capture

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// openState holds the TCP socket states (include/net/tcp_states.h) of a connection that is
// still open at the pod's end: ESTABLISHED, SYN_RECV, FIN_WAIT1, FIN_WAIT2, CLOSE_WAIT,
// LAST_ACK, CLOSING; not SYN_SENT (the pod's own), TIME_WAIT, CLOSE or LISTEN.
var openState = map[uint8]bool{1: true, 3: true, 4: true, 5: true, 8: true, 9: true, 11: true}

// CutRefused closes, in the network namespace at netnsPath, the pod's end of every TCP
// connection a caller opened that the input rules of rs refuse (RuleSet.RefusesTCP): a
// plaintext connection accepted while its port was permissive, once the port or the pod turned
// strict. The rules alone already refuse the caller's next packet with a reset; this tells the
// application too (SOCK_DESTROY, as `ss -K` does; the kernel sends the caller a reset), so
// neither end waits on a connection the policy no longer allows. Callers' connections are
// told from the pod's own by conntrack (original destination one of the netns's addresses, not
// loopback). It returns how many sockets it closed. A missing netns is no error; IPv6 sockets
// are left to the rules (netlink's SOCK_DESTROY here takes IPv4 only), and a kernel without
// CONFIG_INET_DIAG_DESTROY is an error naming it.
func CutRefused(netnsPath string, rs RuleSet) (int, error) {
	ns, err := netns.GetFromPath(netnsPath)
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("cut refused connections in %s: %w", netnsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE, unix.NETLINK_NETFILTER, unix.NETLINK_INET_DIAG)
	if err != nil {
		return 0, fmt.Errorf("cut refused connections in %s: %w", netnsPath, err)
	}
	defer h.Close()
	addrs, err := h.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return 0, fmt.Errorf("cut refused connections in %s: addresses: %w", netnsPath, err)
	}
	local := map[netip.Addr]bool{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.Unmap().IsLoopback() {
			local[ip.Unmap()] = true
		}
	}
	flows, err := h.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		return 0, fmt.Errorf("cut refused connections in %s: conntrack: %w", netnsPath, err)
	}
	// The callers' connections: conntrack saw the caller's packet first.
	type tuple struct {
		local, remote netip.AddrPort
	}
	callers := map[tuple]bool{}
	for _, f := range flows {
		src, ok1 := netip.AddrFromSlice(f.Forward.SrcIP)
		dst, ok2 := netip.AddrFromSlice(f.Forward.DstIP)
		src, dst = src.Unmap(), dst.Unmap()
		if f.Forward.Protocol != unix.IPPROTO_TCP || !ok1 || !ok2 || !local[dst] || local[src] || src.IsLoopback() {
			continue
		}
		callers[tuple{netip.AddrPortFrom(dst, f.Forward.DstPort), netip.AddrPortFrom(src, f.Forward.SrcPort)}] = true
	}
	socks, err := h.SocketDiagTCP(unix.AF_INET)
	if err != nil {
		return 0, fmt.Errorf("cut refused connections in %s: sockets: %w", netnsPath, err)
	}
	n := 0
	var errs []error
	for _, sk := range socks {
		if !openState[sk.State] {
			continue
		}
		l, ok1 := netip.AddrFromSlice(sk.ID.Source)
		r, ok2 := netip.AddrFromSlice(sk.ID.Destination)
		tu := tuple{netip.AddrPortFrom(l.Unmap(), sk.ID.SourcePort), netip.AddrPortFrom(r.Unmap(), sk.ID.DestinationPort)}
		if !ok1 || !ok2 || !callers[tu] || !rs.RefusesTCP(tu.remote.Addr(), tu.local.Addr(), tu.local.Port()) {
			continue
		}
		err := h.SocketDestroy(net.TCPAddrFromAddrPort(tu.local), net.TCPAddrFromAddrPort(tu.remote))
		switch {
		case err == nil:
			n++
		case errors.Is(err, unix.ENOENT):
			// Closed since the dump.
		case errors.Is(err, unix.EOPNOTSUPP):
			return n, fmt.Errorf("cut refused connections in %s: the kernel cannot destroy sockets (CONFIG_INET_DIAG_DESTROY): %w", netnsPath, err)
		default:
			errs = append(errs, fmt.Errorf("close %s -> %s: %w", tu.remote, tu.local, err))
		}
	}
	if len(errs) > 0 {
		return n, fmt.Errorf("cut refused connections in %s: %w", netnsPath, errors.Join(errs...))
	}
	return n, nil
}
