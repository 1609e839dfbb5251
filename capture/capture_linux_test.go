//go:build linux

package capture

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// testBackend is a backend plus the by-hand operations tests need: deleting aether's outbound
// rules as an operator would, and listing what aether left in a netns.
type testBackend struct {
	name   string
	b      Backend
	vandal []string // command that deletes the outbound capture rules
	list   []string // command whose output names every aether chain or table
	marker string   // what list prints while aether rules exist
}

func testBackends() []testBackend {
	return []testBackend{
		{"nftables", NFTables{}, []string{"nft", "flush", "chain", "inet", TableName, "output_nat"}, []string{"nft", "list", "ruleset"}, "table inet " + TableName},
		{"iptables-nft", IPTables{Mode: IPTablesNFT}, []string{"iptables-nft", "-t", "nat", "-F", "AETHER-OUTPUT-NAT"}, []string{"iptables-nft-save"}, ChainPrefix},
		{"iptables-legacy", IPTables{Mode: IPTablesLegacy}, []string{"iptables-legacy", "-t", "nat", "-F", "AETHER-OUTPUT-NAT"}, []string{"iptables-legacy-save"}, ChainPrefix},
	}
}

// TestPrivilegedApplyIdempotent applies every golden configuration twice to a fresh netns with
// each backend: the first apply writes, the second finds the rules equal and writes nothing;
// Check passes; rules deleted by hand are reported as drift and restored by Apply; Teardown
// twice leaves nothing of aether's.
func TestPrivilegedApplyIdempotent(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tb := range testBackends() {
		for _, tc := range goldenConfigs {
			t.Run(tb.name+"/"+tc.name, func(t *testing.T) {
				ns := testenv.NewNetns(t)
				rs, err := Build(tc.cfg)
				if err != nil {
					t.Fatal(err)
				}
				b := tb.b
				if err := b.Check(ns.Path, rs); !isDrift(err) {
					t.Fatalf("Check before apply = %v, want drift", err)
				}
				for i, want := range []bool{true, false} {
					changed, err := b.Apply(ns.Path, rs)
					if err != nil {
						t.Fatalf("apply %d: %v", i+1, err)
					}
					if changed != want {
						t.Fatalf("apply %d changed = %v, want %v", i+1, changed, want)
					}
					if err := b.Check(ns.Path, rs); err != nil {
						t.Fatalf("check after apply %d: %v", i+1, err)
					}
				}
				// The live rules, as the tool prints them, carry every rule's aether comment.
				out, err := ns.Command(tb.list[0], tb.list[1:]...).CombinedOutput()
				if err != nil {
					t.Fatalf("%v: %v\n%s", tb.list, err, out)
				}
				if tb.name == "nftables" {
					for _, r := range allRules(rs) {
						if !strings.Contains(string(out), r.Comment()) {
							t.Errorf("live table lacks %s:\n%s", r.Comment(), out)
						}
					}
				}
				if out, err := ns.Command(tb.vandal[0], tb.vandal[1:]...).CombinedOutput(); err != nil {
					t.Fatalf("%v: %v\n%s", tb.vandal, err, out)
				}
				if err := b.Check(ns.Path, rs); !isDrift(err) {
					t.Fatalf("Check after deleting rules by hand = %v, want drift", err)
				}
				if changed, err := b.Apply(ns.Path, rs); err != nil || !changed {
					t.Fatalf("repair apply = %v, %v; want changed", changed, err)
				}
				if err := b.Check(ns.Path, rs); err != nil {
					t.Fatal(err)
				}
				for i := 0; i < 2; i++ {
					if err := b.Teardown(ns.Path); err != nil {
						t.Fatalf("teardown %d: %v", i+1, err)
					}
				}
				out, _ = ns.Command(tb.list[0], tb.list[1:]...).CombinedOutput()
				if strings.Contains(string(out), tb.marker) {
					t.Fatalf("aether rules left after teardown:\n%s", out)
				}
			})
		}
	}
	// Teardown of a netns that is gone is success (DEL after the runtime removed the netns).
	for _, tb := range testBackends() {
		if err := tb.b.Teardown("/var/run/netns/aether-does-not-exist"); err != nil {
			t.Fatalf("%s: teardown of a missing netns: %v", tb.name, err)
		}
	}
}

func isDrift(err error) bool {
	var d *DriftError
	return errors.As(err, &d)
}

// topo is a pod netns joined to a "node" netns by a veth pair: pod 10.99.0.2/24 (default route via
// 10.99.0.1), node 10.99.0.1/24 plus 10.99.0.3/24 (a stand-in for another pod's source address)
// and HOST_IP 198.18.0.1/32 on the node's loopback (this kernel has no dummy driver).
type topo struct {
	pod, node *testenv.Netns
}

const (
	topoPodIP   = "10.99.0.2"
	topoGateway = "10.99.0.1"
	topoOther   = "10.99.0.3"
	topoHostIP  = "198.18.0.1"
	// topoExcludedCIDR is an excluded outbound CIDR; topoInCIDR is inside it and topoOutCIDR
	// just outside (same /24), both on the node's loopback in captureTraffic.
	topoExcludedCIDR = "192.0.2.0/25"
	topoInCIDR       = "192.0.2.1"
	topoOutCIDR      = "192.0.2.129"
)

func newTopo(t *testing.T) *topo {
	t.Helper()
	tp := &topo{pod: testenv.NewNetns(t), node: testenv.NewNetns(t)}
	hn, err := tp.node.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer hn.Close()
	podNS, err := netns.GetFromPath(tp.pod.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer podNS.Close()
	if err := hn.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vnode"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(podNS))}); err != nil {
		t.Fatal(err)
	}
	hp, err := tp.pod.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer hp.Close()
	setup := []struct {
		h     *netlink.Handle
		link  string
		addrs []string
	}{
		{hn, "vnode", []string{topoGateway + "/24", topoOther + "/24"}},
		{hn, "lo", []string{topoHostIP + "/32"}},
		{hp, "eth0", []string{topoPodIP + "/24"}},
	}
	for _, s := range setup {
		l, err := s.h.LinkByName(s.link)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range s.addrs {
			na, _ := netlink.ParseAddr(a)
			if err := s.h.AddrAdd(l, na); err != nil {
				t.Fatalf("address %s %s: %v", s.link, a, err)
			}
		}
		if err := s.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	eth0, _ := hp.LinkByName("eth0")
	if err := hp.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.ParseIP(topoGateway)}); err != nil {
		t.Fatalf("default route in pod: %v", err)
	}
	return tp
}

// acceptOne listens on addr inside ns and returns the listener; accepted connections are sent on
// the channel.
func acceptOn(t *testing.T, ns *testenv.Netns, addr string) (net.Listener, chan net.Conn) {
	t.Helper()
	var l net.Listener
	if err := ns.Do(func() (err error) { l, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ch := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			ch <- c
		}
	}()
	return l, ch
}

// dialFrom dials addr from ns, optionally from a local source address, and writes one byte.
func dialFrom(ns *testenv.Netns, src, addr string) error {
	return dialTimeout(ns, src, addr, 10*time.Second)
}

// dialTimeout is dialFrom with a dial timeout, for connections expected to be dropped.
func dialTimeout(ns *testenv.Netns, src, addr string, timeout time.Duration) error {
	return ns.Do(func() error {
		d := net.Dialer{Timeout: timeout}
		if src != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
		}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte{1})
		return err
	})
}

// isTimeout reports whether a dial ended because nothing answered (the SYN was dropped), as
// opposed to a refusal or an unreachable route.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// expectConn waits for a connection on want and returns it (the caller closes it). A connection
// on wrong first (nil: none expected there) or none within 10 s fails the test, naming what.
func expectConn(t *testing.T, what string, want, wrong <-chan net.Conn) net.Conn {
	t.Helper()
	select {
	case c := <-want:
		return c
	case c := <-wrong:
		c.Close()
		t.Fatalf("%s: the connection reached the wrong listener %v", what, c.LocalAddr())
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no connection", what)
	}
	return nil
}

// expectCaptured waits for a connection on the capture listener (none on direct, the real
// destination's listener) and checks that its original destination is dst ("ip:port" or
// "[ip6]:port").
func expectCaptured(t *testing.T, captured, direct <-chan net.Conn, dst string) {
	t.Helper()
	c := expectConn(t, "capture of "+dst, captured, direct)
	defer c.Close()
	if od, err := originalDst(c); err != nil || od.String() != dst {
		t.Fatalf("original destination = %v, %v; want %s", od, err, dst)
	}
}

// queryUDP sends "q" from ns to addr and waits up to timeout for the answer
// ServeUDPEcho(..., "answer:") gives.
func queryUDP(ns *testenv.Netns, addr string, timeout time.Duration) error {
	got, err := ns.AskUDP(addr, "q", timeout)
	if err != nil {
		return err
	}
	if got != "answer:q" {
		return fmt.Errorf("reply %q", got)
	}
	return nil
}

// originalDst returns SO_ORIGINAL_DST of an accepted TCP connection (IP6T_SO_ORIGINAL_DST for
// IPv6, see originalDst6): the destination the client dialled before the redirect.
func originalDst(c net.Conn) (netip.AddrPort, error) {
	if c.LocalAddr().(*net.TCPAddr).IP.To4() == nil {
		return originalDst6(c)
	}
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		var mreq *unix.IPv6Mreq
		mreq, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if serr != nil {
			return
		}
		// struct sockaddr_in: family(2) port(2, big endian) addr(4).
		b := mreq.Multiaddr
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), uint16(b[2])<<8|uint16(b[3]))
	})
	if err != nil {
		return ap, err
	}
	return ap, serr
}

// TestPrivilegedCaptureTraffic shows what the rules do to real traffic in a pod netns: outbound
// TCP lands on the capture listener with its original destination recoverable, excluded ports
// and excluded CIDRs bypass it (an address just outside the CIDR does not), DNS over UDP and TCP
// to the cluster DNS address reaches the resolver on HOST_IP:18054, IPv6 of a v4-only pod is
// dropped inbound and outbound (TCP and UDP, each direction shown on its own) and goes through
// again after Teardown, and inbound plaintext is refused in strict mode (except from the node)
// and accepted in permissive mode.
func TestPrivilegedCaptureTraffic(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tb := range testBackends() {
		t.Run(tb.name, func(t *testing.T) { captureTraffic(t, tb.b) })
	}
}

func captureTraffic(t *testing.T, b Backend) {
	tp := newTopo(t)
	cfg := Config{
		PodIPs: addrs(topoPodIP), HostIP: netip.MustParseAddr(topoHostIP), ClusterDNS: addrs("10.96.0.10"),
		NodeSources: prefixes(topoGateway + "/32"), ProbePorts: []uint16{8081}, ExcludeOutboundPorts: []uint16{7070},
		ExcludeOutboundCIDRs: prefixes(topoExcludedCIDR),
	}
	rs, err := Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(tp.pod.Path, rs); err != nil {
		t.Fatal(err)
	}

	// Outbound capture.
	_, captured := acceptOn(t, tp.pod, "127.0.0.1:15001")
	if err := dialFrom(tp.pod, "", "203.0.113.9:80"); err != nil {
		t.Fatalf("dial 203.0.113.9:80 from pod: %v", err)
	}
	expectCaptured(t, captured, nil, "203.0.113.9:80")
	// The cloud metadata address is refused, TCP with a reset, UDP dropped; allowed
	// (AllowCloudMetadata), it is captured like any other destination.
	addAddrs(t, tp.node, "lo", "169.254.169.254/32")
	_, metadata := acceptOn(t, tp.node, "169.254.169.254:80")
	if err := dialFrom(tp.pod, "", "169.254.169.254:80"); !isRefused(err) {
		t.Fatalf("dial the metadata service from the pod = %v, want connection refused", err)
	}
	tp.node.ServeUDPEcho(t, "169.254.169.254:53", "md:")
	if got, err := tp.pod.AskUDP("169.254.169.254:53", "q", time.Second); err == nil {
		t.Fatalf("UDP to the metadata address answered %q, want it dropped", got)
	}
	allowed := cfg
	allowed.AllowCloudMetadata = true
	if rs, err := Build(allowed); err != nil {
		t.Fatal(err)
	} else if _, err := b.Apply(tp.pod.Path, rs); err != nil {
		t.Fatal(err)
	}
	if err := dialFrom(tp.pod, "", "169.254.169.254:80"); err != nil {
		t.Fatalf("dial the metadata service, allowed: %v", err)
	}
	expectCaptured(t, captured, metadata, "169.254.169.254:80")
	if got, err := tp.pod.AskUDP("169.254.169.254:53", "q", 5*time.Second); err != nil || got != "md:q" {
		t.Fatalf("UDP to the metadata address, allowed = %q, %v", got, err)
	}
	if _, err := b.Apply(tp.pod.Path, rs); err != nil {
		t.Fatal(err)
	}
	// The explicit HTTP lane (127.0.0.1:18081 in the pod netns) is loopback: reached directly.
	_, lane := acceptOn(t, tp.pod, "127.0.0.1:18081")
	if err := dialFrom(tp.pod, "", "127.0.0.1:18081"); err != nil {
		t.Fatalf("dial the explicit lane: %v", err)
	}
	expectConn(t, "explicit lane", lane, captured).Close()
	// An excluded port goes to the real destination (the node), not to the capture listener.
	_, direct := acceptOn(t, tp.node, topoGateway+":7070")
	if err := dialFrom(tp.pod, "", topoGateway+":7070"); err != nil {
		t.Fatalf("dial excluded port: %v", err)
	}
	expectConn(t, "excluded port 7070", direct, captured).Close()

	// An excluded CIDR goes to the real destination; an address just outside it (same /24,
	// other /25) is captured. Both addresses are on the node's loopback, each with a listener.
	addAddrs(t, tp.node, "lo", topoInCIDR+"/32", topoOutCIDR+"/32")
	_, inCIDR := acceptOn(t, tp.node, topoInCIDR+":7171")
	_, outCIDR := acceptOn(t, tp.node, topoOutCIDR+":7171")
	if err := dialFrom(tp.pod, "", topoInCIDR+":7171"); err != nil {
		t.Fatalf("dial %s in excluded %s: %v", topoInCIDR, topoExcludedCIDR, err)
	}
	expectConn(t, topoInCIDR+" in excluded "+topoExcludedCIDR, inCIDR, captured).Close()
	if err := dialFrom(tp.pod, "", topoOutCIDR+":7171"); err != nil {
		t.Fatalf("dial %s outside excluded %s: %v", topoOutCIDR, topoExcludedCIDR, err)
	}
	expectCaptured(t, captured, outCIDR, topoOutCIDR+":7171")

	// DNS: a UDP query to the cluster DNS address reaches the resolver on HOST_IP:18054.
	tp.node.ServeUDPEcho(t, topoHostIP+":18054", "answer:")
	if err := queryUDP(tp.pod, "10.96.0.10:53", 5*time.Second); err != nil {
		t.Fatalf("DNS via cluster DNS address: %v", err)
	}

	// DNS over TCP takes the same way (to the resolver, not to the capture listener).
	_, tcpDNS := acceptOn(t, tp.node, topoHostIP+":18054")
	if err := dialFrom(tp.pod, "", "10.96.0.10:53"); err != nil {
		t.Fatalf("TCP DNS: %v", err)
	}
	expectConn(t, "TCP DNS to the resolver", tcpDNS, captured).Close()

	// IPv6 of a v4-only pod is dropped, not open, in each direction on its own. Permanent
	// neighbour entries take neighbour discovery (which the rules drop too) out of the picture,
	// so whatever the rules let through reaches its peer; UDP shows each direction alone (a TCP
	// handshake needs both).
	addIPv6(t, tp)
	addStaticNeighbours(t, tp)
	// Inbound: a listener on the pod's own IPv6 address (reached through eth0, not lo) is
	// unreachable from the node, and no datagram from the node reaches the pod.
	acceptOn(t, tp.pod, "[fd99::2]:8081")
	if err := dialTimeout(tp.node, "", "[fd99::2]:8081", time.Second); !isTimeout(err) {
		t.Fatalf("IPv6 node -> v4-only pod TCP = %v, want a timeout (dropped)", err)
	}
	podUDP6 := tp.pod.ServeUDPEcho(t, "[fd99::2]:5353", "answer:")
	if err := queryUDP(tp.node, "[fd99::2]:5353", time.Second); err == nil {
		t.Fatal("IPv6 node -> v4-only pod UDP got an answer; inbound IPv6 is open")
	}
	if n := podUDP6.Load(); n != 0 {
		t.Fatalf("inbound IPv6 UDP reached the v4-only pod (%d datagrams)", n)
	}
	// Outbound: the SYN to a listener on the node times out (not captured: the capture listener
	// is IPv4 only, so a redirect would be refused), and no datagram reaches the node.
	_, node6 := acceptOn(t, tp.node, "[fd99::1]:8082")
	if err := dialTimeout(tp.pod, "", "[fd99::1]:8082", time.Second); !isTimeout(err) {
		t.Fatalf("IPv6 v4-only pod -> node TCP = %v, want a timeout (dropped)", err)
	}
	nodeUDP6 := tp.node.ServeUDPEcho(t, "[fd99::1]:5353", "answer:")
	if err := queryUDP(tp.pod, "[fd99::1]:5353", time.Second); err == nil {
		t.Fatal("IPv6 v4-only pod -> node UDP got an answer; outbound IPv6 is open")
	}
	if n := nodeUDP6.Load(); n != 0 {
		t.Fatalf("outbound IPv6 UDP from the v4-only pod reached the node (%d datagrams)", n)
	}
	select {
	case c := <-node6:
		c.Close()
		t.Fatal("outbound IPv6 TCP from the v4-only pod reached the node")
	default:
	}

	// Inbound, strict: plaintext from another source is refused, 15008 is let in, and the node
	// only to the probe port.
	acceptOn(t, tp.pod, topoPodIP+":8080")
	acceptOn(t, tp.pod, topoPodIP+":8081")
	acceptOn(t, tp.pod, topoPodIP+":15008")
	if err := dialFrom(tp.node, topoOther, topoPodIP+":8080"); !isRefused(err) {
		t.Fatalf("strict: plaintext from %s to :8080 = %v, want connection refused", topoOther, err)
	}
	if err := dialFrom(tp.node, topoOther, topoPodIP+":8081"); !isRefused(err) {
		t.Fatalf("strict: plaintext from %s to the probe port :8081 = %v, want connection refused", topoOther, err)
	}
	if err := dialFrom(tp.node, topoOther, topoPodIP+":15008"); err != nil {
		t.Fatalf("strict: %s to :15008: %v", topoOther, err)
	}
	if err := dialFrom(tp.node, topoGateway, topoPodIP+":8081"); err != nil {
		t.Fatalf("strict: node (%s) to the probe port :8081: %v", topoGateway, err)
	}
	if err := dialFrom(tp.node, topoGateway, topoPodIP+":8080"); !isRefused(err) {
		t.Fatalf("strict: node (%s) to :8080, not a probe port = %v, want connection refused", topoGateway, err)
	}
	// An attachment recorded before probe ports were (NodeAllPorts) trusts the node everywhere.
	legacy := cfg
	legacy.ProbePorts, legacy.NodeAllPorts = nil, true
	if rs, err := Build(legacy); err != nil {
		t.Fatal(err)
	} else if _, err := b.Apply(tp.pod.Path, rs); err != nil {
		t.Fatal(err)
	}
	if err := dialFrom(tp.node, topoGateway, topoPodIP+":8080"); err != nil {
		t.Fatalf("strict, NodeAllPorts: node (%s) to :8080: %v", topoGateway, err)
	}
	// A socket inside the pod netns (the app itself, or an Envoy upstream socket opened in the
	// pod netns) reaches the application over lo, uncaptured and accepted.
	if err := dialFrom(tp.pod, "", topoPodIP+":8080"); err != nil {
		t.Fatalf("strict: pod-local connection to its own :8080: %v", err)
	}

	// Permissive: the same plaintext connection is accepted.
	cfg.Mode = ModePermissive
	rs, _ = Build(cfg)
	if changed, err := b.Apply(tp.pod.Path, rs); err != nil || !changed {
		t.Fatalf("apply permissive: %v %v", changed, err)
	}
	if err := dialFrom(tp.node, topoOther, topoPodIP+":8080"); err != nil {
		t.Fatalf("permissive: plaintext from %s to :8080: %v", topoOther, err)
	}
	if err := b.Teardown(tp.pod.Path); err != nil {
		t.Fatal(err)
	}
	// Control: without the rules the same IPv6 connections and datagrams go through. Neighbour
	// discovery failed while the rules dropped it, and a failed neighbour entry answers "no route
	// to host" until it is probed again, so each is retried until it converges (30 s: several
	// times the few seconds neighbour discovery takes to recover).
	testenv.Eventually(t, 30*time.Second, "IPv6 inbound after teardown", func() error { return dialFrom(tp.node, "", "[fd99::2]:8081") })
	testenv.Eventually(t, 30*time.Second, "IPv6 outbound TCP after teardown", func() error { return dialFrom(tp.pod, "", "[fd99::1]:8082") })
	expectConn(t, "IPv6 outbound TCP after teardown", node6, nil).Close()
	testenv.Eventually(t, 30*time.Second, "IPv6 outbound UDP after teardown", func() error { return queryUDP(tp.pod, "[fd99::1]:5353", time.Second) })
	testenv.Eventually(t, 30*time.Second, "IPv6 inbound UDP after teardown", func() error { return queryUDP(tp.node, "[fd99::2]:5353", time.Second) })
}

// addAddrs adds addresses (CIDR notation) to a link in ns; IPv6 ones without duplicate address
// detection (so they are usable at once instead of tentative).
func addAddrs(t *testing.T, ns *testenv.Netns, link string, addrs ...string) {
	t.Helper()
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range addrs {
		a, err := netlink.ParseAddr(s)
		if err != nil {
			t.Fatal(err)
		}
		if a.IP.To4() == nil {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(l, a); err != nil {
			t.Fatalf("add %s to %s: %v", s, link, err)
		}
	}
}

// addIPv6 gives the pod topoPodIPv6/64 with a default route via topoGatewayV6, and the node
// topoGatewayV6/64 and topoOtherV6/64, on their veth ends.
func addIPv6(t *testing.T, tp *topo) {
	t.Helper()
	addAddrs(t, tp.pod, "eth0", topoPodIPv6+"/64")
	addAddrs(t, tp.node, "vnode", topoGatewayV6+"/64", topoOtherV6+"/64")
	tp.pod.DefaultRoute(t, netip.MustParseAddr(topoGatewayV6))
}

// addStaticNeighbours adds permanent IPv6 neighbour entries for the two veth ends (the pod's
// topoPodIPv6 in the node, the node's topoGatewayV6 in the pod), so IPv6 packets leave without
// neighbour discovery.
func addStaticNeighbours(t *testing.T, tp *topo) {
	t.Helper()
	hp, err := tp.pod.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer hp.Close()
	hn, err := tp.node.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer hn.Close()
	eth0, err := hp.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	vnode, err := hn.LinkByName("vnode")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []struct {
		h         *netlink.Handle
		link, mac netlink.Link
		ip        string
	}{{hp, eth0, vnode, topoGatewayV6}, {hn, vnode, eth0, topoPodIPv6}} {
		if err := n.h.NeighAdd(&netlink.Neigh{LinkIndex: n.link.Attrs().Index, Family: unix.AF_INET6,
			State: netlink.NUD_PERMANENT, IP: net.ParseIP(n.ip), HardwareAddr: n.mac.Attrs().HardwareAddr}); err != nil {
			t.Fatalf("neighbour %s: %v", n.ip, err)
		}
	}
}

func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// TestPrivilegedDetectIPTablesMode shows that the backend with more rules wins and that an empty
// netns defaults to nft.
func TestPrivilegedDetectIPTablesMode(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tc := range []struct {
		tool string
		want IPTablesMode
	}{{"", IPTablesNFT}, {"iptables-legacy", IPTablesLegacy}, {"iptables-nft", IPTablesNFT}} {
		ns := testenv.NewNetns(t)
		if tc.tool != "" {
			for _, args := range [][]string{{"-N", "KUBE-TEST"}, {"-A", "KUBE-TEST", "-j", "RETURN"}} {
				if out, err := ns.Command(tc.tool, args...).CombinedOutput(); err != nil {
					t.Fatalf("%s: %v %s", tc.tool, err, out)
				}
			}
		}
		got, err := DetectIPTablesMode(ns.Path)
		if err != nil || got != tc.want {
			t.Fatalf("rules by %q: DetectIPTablesMode = %v, %v; want %v", tc.tool, got, err, tc.want)
		}
	}
}

// TestPrivilegedNFTablesLargeExclusions applies a rule set with 2000 excluded CIDRs and 2000
// excluded ports: far beyond the default netlink socket buffers, in one transaction.
func TestPrivilegedNFTablesLargeExclusions(t *testing.T) {
	testenv.RequireRoot(t)
	ns := testenv.NewNetns(t)
	cfg := goldenConfigs[0].cfg
	for i := range 2000 {
		cfg.ExcludeOutboundPorts = append(cfg.ExcludeOutboundPorts, uint16(20000+i))
		cfg.ExcludeOutboundCIDRs = append(cfg.ExcludeOutboundCIDRs, netip.PrefixFrom(netip.AddrFrom4([4]byte{172, byte(16 + i/256), byte(i % 256), 0}), 24))
	}
	rs, err := Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b NFTables
	if _, err := b.Apply(ns.Path, rs); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(ns.Path, rs); err != nil {
		t.Fatal(err)
	}
	if changed, err := b.Apply(ns.Path, rs); err != nil || changed {
		t.Fatalf("second apply = %v, %v", changed, err)
	}
}

// The IPv6 side of topo (addIPv6): pod fd99::2/64 (default route via fd99::1), node fd99::1/64
// and fd99::3/64 (another pod's source), HOST_IP fd98::1 on the node's loopback; the cluster DNS
// service address and the excluded prefix are only ever reached through the pod's rules.
const (
	topoPodIPv6      = "fd99::2"
	topoGatewayV6    = "fd99::1"
	topoOtherV6      = "fd99::3"
	topoHostIPv6     = "fd98::1"
	topoClusterDNSv6 = "fd96::a"
	// topoExcludedV6 is an excluded outbound prefix; topoInV6 is inside it and topoOutV6 just
	// outside (same /64), both on the node's loopback in captureIPv6.
	topoExcludedV6 = "fd97::/65"
	topoInV6       = "fd97::1"
	topoOutV6      = "fd97::8000:0:0:1"
)

// TestPrivilegedCaptureIPv6 shows IPv6 captured like IPv4 for a dual-stack pod, with every
// backend (nftables; iptables-nft and iptables-legacy through ip6tables): outbound TCP lands on
// [::1]:15001 with the original destination recoverable (IP6T_SO_ORIGINAL_DST), an excluded port
// and an excluded IPv6 prefix bypass it (an address just outside the prefix does not), DNS over
// UDP and TCP to the IPv6 cluster DNS address reaches the resolver on [HOST_IPv6]:18054, strict
// mode refuses IPv6 plaintext inbound except from the node's IPv6 source and to 15008, and
// permissive mode accepts it.
func TestPrivilegedCaptureIPv6(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tb := range testBackends() {
		t.Run(tb.name, func(t *testing.T) { captureIPv6(t, tb.b) })
	}
}

func captureIPv6(t *testing.T, b Backend) {
	tp := newTopo(t)
	addIPv6(t, tp)
	addAddrs(t, tp.node, "lo", topoHostIPv6+"/128", topoInV6+"/128", topoOutV6+"/128")
	cfg := Config{
		PodIPs: addrs(topoPodIP, topoPodIPv6), HostIP: netip.MustParseAddr(topoHostIP),
		HostIPv6: netip.MustParseAddr(topoHostIPv6), ClusterDNS: addrs("10.96.0.10", topoClusterDNSv6),
		NodeSources: prefixes(topoGateway+"/32", topoGatewayV6+"/128"), ProbePorts: []uint16{8080},
		ExcludeOutboundPorts: []uint16{7070}, ExcludeOutboundCIDRs: prefixes(topoExcludedV6),
	}
	rs, err := Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(tp.pod.Path, rs); err != nil {
		t.Fatal(err)
	}

	// Outbound TCP is captured; an excluded port and an excluded prefix go to the real
	// destination, an address just outside the prefix is captured.
	_, captured := acceptOn(t, tp.pod, "[::1]:15001")
	_, node80 := acceptOn(t, tp.node, "["+topoGatewayV6+"]:80")
	if err := dialFrom(tp.pod, "", "["+topoGatewayV6+"]:80"); err != nil {
		t.Fatalf("dial [%s]:80 from pod: %v", topoGatewayV6, err)
	}
	expectCaptured(t, captured, node80, "["+topoGatewayV6+"]:80")
	_, direct := acceptOn(t, tp.node, "["+topoGatewayV6+"]:7070")
	if err := dialFrom(tp.pod, "", "["+topoGatewayV6+"]:7070"); err != nil {
		t.Fatalf("dial excluded port over IPv6: %v", err)
	}
	expectConn(t, "IPv6 excluded port 7070", direct, captured).Close()
	_, inPrefix := acceptOn(t, tp.node, "["+topoInV6+"]:7171")
	_, outPrefix := acceptOn(t, tp.node, "["+topoOutV6+"]:7171")
	if err := dialFrom(tp.pod, "", "["+topoInV6+"]:7171"); err != nil {
		t.Fatalf("dial %s in excluded %s: %v", topoInV6, topoExcludedV6, err)
	}
	expectConn(t, topoInV6+" in excluded "+topoExcludedV6, inPrefix, captured).Close()
	if err := dialFrom(tp.pod, "", "["+topoOutV6+"]:7171"); err != nil {
		t.Fatalf("dial %s outside excluded %s: %v", topoOutV6, topoExcludedV6, err)
	}
	expectCaptured(t, captured, outPrefix, "["+topoOutV6+"]:7171")

	// DNS to the IPv6 cluster DNS address, UDP and TCP, reaches the resolver on
	// [HOST_IPv6]:18054 (not the capture listener); IPv4 DNS still reaches HOST_IP:18054.
	resolver := "[" + topoHostIPv6 + "]:18054"
	tp.node.ServeUDPEcho(t, resolver, "answer:")
	if err := queryUDP(tp.pod, "["+topoClusterDNSv6+"]:53", 5*time.Second); err != nil {
		t.Fatalf("UDP DNS via the IPv6 cluster DNS address: %v", err)
	}
	_, tcpDNS := acceptOn(t, tp.node, resolver)
	if err := dialFrom(tp.pod, "", "["+topoClusterDNSv6+"]:53"); err != nil {
		t.Fatalf("TCP DNS via the IPv6 cluster DNS address: %v", err)
	}
	expectConn(t, "IPv6 TCP DNS to the resolver", tcpDNS, captured).Close()
	tp.node.ServeUDPEcho(t, topoHostIP+":18054", "answer:")
	if err := queryUDP(tp.pod, "10.96.0.10:53", 5*time.Second); err != nil {
		t.Fatalf("UDP DNS via the IPv4 cluster DNS address of a dual-stack pod: %v", err)
	}

	// Inbound, strict: IPv6 plaintext from another source is refused, the node's IPv6 source
	// and 15008 are let in.
	acceptOn(t, tp.pod, "["+topoPodIPv6+"]:8080")
	acceptOn(t, tp.pod, "["+topoPodIPv6+"]:15008")
	app := "[" + topoPodIPv6 + "]:8080"
	if err := dialFrom(tp.node, topoOtherV6, app); !isRefused(err) {
		t.Fatalf("strict: IPv6 plaintext from %s to :8080 = %v, want connection refused", topoOtherV6, err)
	}
	if err := dialFrom(tp.node, topoOtherV6, "["+topoPodIPv6+"]:15008"); err != nil {
		t.Fatalf("strict: %s to :15008: %v", topoOtherV6, err)
	}
	if err := dialFrom(tp.node, topoGatewayV6, app); err != nil {
		t.Fatalf("strict: node (%s) to the probe port :8080: %v", topoGatewayV6, err)
	}

	// Permissive: the same IPv6 plaintext connection is accepted.
	cfg.Mode = ModePermissive
	rs, _ = Build(cfg)
	if changed, err := b.Apply(tp.pod.Path, rs); err != nil || !changed {
		t.Fatalf("apply permissive: %v %v", changed, err)
	}
	if err := dialFrom(tp.node, topoOtherV6, app); err != nil {
		t.Fatalf("permissive: IPv6 plaintext from %s to :8080: %v", topoOtherV6, err)
	}
	if err := b.Teardown(tp.pod.Path); err != nil {
		t.Fatal(err)
	}
}

// originalDst6 returns IP6T_SO_ORIGINAL_DST (struct sockaddr_in6) of an accepted IPv6 connection.
func originalDst6(c net.Conn) (netip.AddrPort, error) {
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		var info *unix.IPv6MTUInfo // 32 bytes: sockaddr_in6 (28) + mtu (4)
		info, serr = unix.GetsockoptIPv6MTUInfo(int(fd), unix.SOL_IPV6, ip6tSoOriginalDst)
		if serr == nil {
			a := info.Addr
			ap = netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port>>8|a.Port<<8)) // network order read on a little-endian CPU
		}
	})
	if err != nil {
		return ap, err
	}
	return ap, serr
}

// ip6tSoOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h), which x/sys
// does not name.
const ip6tSoOriginalDst = 80

func TestNewBackend(t *testing.T) {
	for name, want := range map[string]Backend{"": NFTables{}, "nftables": NFTables{},
		"iptables-nft": IPTables{Mode: IPTablesNFT}, "iptables-legacy": IPTables{Mode: IPTablesLegacy}} {
		if got, err := NewBackend(name); err != nil || got != want {
			t.Errorf("NewBackend(%q) = %v, %v; want %v", name, got, err, want)
		}
	}
	if _, err := NewBackend("ebpf"); err == nil || !strings.Contains(err.Error(), "ebpf") {
		t.Errorf("NewBackend(ebpf) = %v, want an error naming it", err)
	}
}

// TestPrivilegedApplySwitchesConfigs applies every golden configuration in turn to one netns
// (chains come and go between IPv4-only and dual-stack sets), so Apply replaces whatever the
// previous configuration left.
func TestPrivilegedApplySwitchesConfigs(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tb := range testBackends() {
		t.Run(tb.name, func(t *testing.T) {
			ns := testenv.NewNetns(t)
			for round := 0; round < 2; round++ {
				for _, tc := range goldenConfigs {
					rs, _ := Build(tc.cfg)
					if _, err := tb.b.Apply(ns.Path, rs); err != nil {
						t.Fatalf("%s: %v", tc.name, err)
					}
					if err := tb.b.Check(ns.Path, rs); err != nil {
						t.Fatalf("%s after switching: %v", tc.name, err)
					}
					// Nothing of the previous configuration is left: a dual-stack pod has no
					// IPv6 drop chain.
					out, _ := ns.Command(tb.list[0], tb.list[1:]...).CombinedOutput()
					if strings.HasPrefix(tb.list[0], "iptables") {
						out6, _ := ns.Command("ip6"+tb.list[0][2:], tb.list[1:]...).CombinedOutput()
						out = append(out, out6...)
					}
					if tc.name == "dual-stack" && strings.Contains(string(out), "out6-drop") {
						t.Fatalf("dual-stack after a v4-only config still drops IPv6:\n%s", out)
					}
				}
			}
			if err := tb.b.Teardown(ns.Path); err != nil {
				t.Fatal(err)
			}
		})
	}
}
