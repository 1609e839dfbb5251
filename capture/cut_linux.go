//go:build linux

package capture

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
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
// neither end waits on a connection the policy no longer allows. Callers' connections are told
// from the pod's own by conntrack (original destination one of the netns's addresses, not
// loopback), sockets of both families are looked at (an IPv6 listener's IPv4 callers have
// v4-mapped sockets), and each destroy names the socket's cookie from the dump, so a connection
// closed meanwhile is never mistaken for another socket of the same addresses (a listener). It
// returns how many sockets it closed. A missing netns is no error; a kernel without
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
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return 0, fmt.Errorf("cut refused connections in %s: addresses: %w", netnsPath, err)
	}
	local := map[netip.Addr]bool{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.Unmap().IsLoopback() {
			local[ip.Unmap()] = true
		}
	}
	// The callers' connections: conntrack saw the caller's packet first.
	type tuple struct {
		local, remote netip.AddrPort
	}
	callers := map[tuple]bool{}
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		flows, err := h.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			return 0, fmt.Errorf("cut refused connections in %s: conntrack: %w", netnsPath, err)
		}
		for _, f := range flows {
			src, ok1 := netip.AddrFromSlice(f.Forward.SrcIP)
			dst, ok2 := netip.AddrFromSlice(f.Forward.DstIP)
			src, dst = src.Unmap(), dst.Unmap()
			if f.Forward.Protocol != unix.IPPROTO_TCP || !ok1 || !ok2 || !local[dst] || local[src] || src.IsLoopback() {
				continue
			}
			callers[tuple{netip.AddrPortFrom(dst, f.Forward.DstPort), netip.AddrPortFrom(src, f.Forward.SrcPort)}] = true
		}
	}
	if len(callers) == 0 {
		return 0, nil
	}
	sock, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_INET_DIAG)
	if err != nil {
		return 0, fmt.Errorf("cut refused connections in %s: %w", netnsPath, err)
	}
	defer sock.Close()
	n := 0
	var errs []error
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err := h.SocketDiagTCP(fam)
		if err != nil {
			return n, fmt.Errorf("cut refused connections in %s: sockets: %w", netnsPath, err)
		}
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
			err := destroySocket(sock, sk)
			switch {
			case err == nil:
				n++
			case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ESTALE), errors.Is(err, unix.EINVAL):
				// Closed since the dump (the cookie no longer names a socket).
			case errors.Is(err, unix.EOPNOTSUPP):
				return n, fmt.Errorf("cut refused connections in %s: the kernel cannot destroy sockets (CONFIG_INET_DIAG_DESTROY): %w", netnsPath, err)
			default:
				errs = append(errs, fmt.Errorf("close %s -> %s: %w", tu.remote, tu.local, err))
			}
		}
	}
	if len(errs) > 0 {
		return n, fmt.Errorf("cut refused connections in %s: %w", netnsPath, errors.Join(errs...))
	}
	return n, nil
}

// destroyRequest is an inet_diag_req_v2 (include/uapi/linux/inet_diag.h) naming one TCP socket
// by its addresses and its cookie, for SOCK_DESTROY.
type destroyRequest struct {
	family           uint8
	sport, dport     uint16
	src, dst         [16]byte
	ifindex          uint32
	cookie0, cookie1 uint32
}

func (r *destroyRequest) Len() int { return 56 }

func (r *destroyRequest) Serialize() []byte {
	b := make([]byte, 56)
	b[0], b[1] = r.family, unix.IPPROTO_TCP
	// b[2] ext, b[3] pad; b[4:8] states: all
	binary.NativeEndian.PutUint32(b[4:8], 0xffffffff)
	binary.BigEndian.PutUint16(b[8:10], r.sport)
	binary.BigEndian.PutUint16(b[10:12], r.dport)
	copy(b[12:28], r.src[:])
	copy(b[28:44], r.dst[:])
	binary.NativeEndian.PutUint32(b[44:48], r.ifindex)
	binary.NativeEndian.PutUint32(b[48:52], r.cookie0)
	binary.NativeEndian.PutUint32(b[52:56], r.cookie1)
	return b
}

// destroySocket sends SOCK_DESTROY for sk (as the dump gave it: family, addresses, cookie) on
// sock, a NETLINK_INET_DIAG socket in sk's network namespace.
func destroySocket(sock *nl.NetlinkSocket, sk *netlink.Socket) error {
	r := &destroyRequest{family: sk.Family, sport: sk.ID.SourcePort, dport: sk.ID.DestinationPort,
		ifindex: sk.ID.Interface, cookie0: sk.ID.Cookie[0], cookie1: sk.ID.Cookie[1]}
	if sk.Family == unix.AF_INET {
		copy(r.src[:4], sk.ID.Source.To4())
		copy(r.dst[:4], sk.ID.Destination.To4())
	} else {
		copy(r.src[:], sk.ID.Source.To16())
		copy(r.dst[:], sk.ID.Destination.To16())
	}
	req := nl.NewNetlinkRequest(nl.SOCK_DESTROY, unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_INET_DIAG: {Socket: sock}}
	req.AddData(r)
	_, err := req.Execute(unix.NETLINK_INET_DIAG, 0)
	return err
}
