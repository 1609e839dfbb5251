//go:build linux

package capture

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/aethermesh/aether/internal/testenv"
)

// bridgeTopo is a node netns with a bridge cni0 (Flannel's: the gateway addresses on the bridge)
// and two pods, a (the attacker) and b, each on a veth port of it.
type bridgeTopo struct {
	node, a, b *testenv.Netns
	bridgeMAC  net.HardwareAddr
	aMAC, bMAC net.HardwareAddr
}

const (
	guardGateway  = "10.99.4.1"
	guardGateway6 = "fd99:4::1"
	guardPodA     = "10.99.4.2"
	guardPodB     = "10.99.4.3"
	guardPodB6    = "fd99:4::3"
	guardHostIP   = "198.18.4.1"
)

func newBridgeTopo(t *testing.T) *bridgeTopo {
	t.Helper()
	tp := &bridgeTopo{node: testenv.NewNetns(t), a: testenv.NewNetns(t), b: testenv.NewNetns(t)}
	hn, err := tp.node.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer hn.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "cni0"}}
	if err := hn.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	addAddrs(t, tp.node, "cni0", guardGateway+"/24", guardGateway6+"/64")
	addAddrs(t, tp.node, "lo", guardHostIP+"/32")
	for _, p := range []struct {
		ns   *testenv.Netns
		port string
		ips  []string
		mac  *net.HardwareAddr
	}{{tp.a, "va", []string{guardPodA + "/24", "fd99:4::2/64"}, &tp.aMAC}, {tp.b, "vb", []string{guardPodB + "/24", guardPodB6 + "/64"}, &tp.bMAC}} {
		h, err := netns.GetFromPath(p.ns.Path)
		if err != nil {
			t.Fatal(err)
		}
		err = hn.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p.port, MasterIndex: 0}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(h))})
		h.Close()
		if err != nil {
			t.Fatal(err)
		}
		port, _ := hn.LinkByName(p.port)
		if err := hn.LinkSetMaster(port, br); err != nil {
			t.Fatal(err)
		}
		if err := hn.LinkSetUp(port); err != nil {
			t.Fatal(err)
		}
		addAddrs(t, p.ns, "eth0", p.ips...)
		hp, err := p.ns.Netlink()
		if err != nil {
			t.Fatal(err)
		}
		eth0, _ := hp.LinkByName("eth0")
		if err := hp.LinkSetUp(eth0); err != nil {
			t.Fatal(err)
		}
		lo, _ := hp.LinkByName("lo")
		_ = hp.LinkSetUp(lo)
		*p.mac = eth0.Attrs().HardwareAddr
		hp.Close()
	}
	brl, _ := hn.LinkByName("cni0")
	if err := hn.LinkSetUp(brl); err != nil {
		t.Fatal(err)
	}
	tp.bridgeMAC = brl.Attrs().HardwareAddr
	return tp
}

// listenUDP opens a UDP socket on addr inside ns and sends the source of every datagram on the
// channel.
func listenUDP(t *testing.T, ns *testenv.Netns, addr string) <-chan netip.Addr {
	t.Helper()
	var c net.PacketConn
	if err := ns.Do(func() (err error) { c, err = net.ListenPacket("udp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ch := make(chan netip.Addr, 64)
	go func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			ch <- from.(*net.UDPAddr).AddrPort().Addr().Unmap()
		}
	}()
	return ch
}

// TestPrivilegedNodeGuard checks the node source guard on a real bridge: a pod that writes the
// gateway's address as its source (IPv4, IPv6), or claims it in ARP or a neighbour advertisement,
// reaches its neighbour without the guard (so the test can fail) and not with it, while the pod's
// own traffic and the node's traffic from the gateway address still pass; check spots drift,
// apply repairs it, teardown removes it.
func TestPrivilegedNodeGuard(t *testing.T) {
	testenv.RequireRoot(t)
	tp := newBridgeTopo(t)
	got4 := listenUDP(t, tp.b, "0.0.0.0:9999")
	got6 := listenUDP(t, tp.b, "[::]:9998")
	gw, gw6 := netip.MustParseAddr(guardGateway), netip.MustParseAddr(guardGateway6)
	podA, podB, podB6 := netip.MustParseAddr(guardPodA), netip.MustParseAddr(guardPodB), netip.MustParseAddr(guardPodB6)
	aLL := netip.MustParseAddr("fe80::2")

	// spoofs sends every forgery once and reports which reached b.
	spoofs := func() (udp4, udp6, arp, nd bool) {
		tp.b.SetNeigh(t, "eth0", gw, tp.bridgeMAC)
		tp.b.SetNeigh(t, "eth0", gw6, tp.bridgeMAC)
		testenv.SendFrame(t, tp.a, testenv.UDPFrame(tp.bMAC, tp.aMAC, gw, podB, 9999))
		testenv.SendFrame(t, tp.a, testenv.UDPFrame(tp.bMAC, tp.aMAC, gw6, podB6, 9998))
		testenv.SendFrame(t, tp.a, testenv.ARPRequest(tp.aMAC, gw, podB))
		testenv.SendFrame(t, tp.a, testenv.NeighborAdvert(tp.aMAC, aLL, gw6, podB6, tp.bMAC))
		deadline := time.After(2 * time.Second)
		for {
			select {
			case src := <-got4:
				udp4 = udp4 || src == gw
			case src := <-got6:
				udp6 = udp6 || src == gw6
			case <-deadline:
				arp = tp.b.NeighMAC(t, "eth0", gw).String() == tp.aMAC.String()
				nd = tp.b.NeighMAC(t, "eth0", gw6).String() == tp.aMAC.String()
				return
			}
		}
	}
	if u4, u6, arp, nd := spoofs(); !u4 || !u6 || !arp || !nd {
		t.Fatalf("without the guard every forgery should reach the neighbour (else this test proves nothing): udp4 %v udp6 %v arp %v nd %v", u4, u6, arp, nd)
	}

	g := NFTGuard{NetnsPath: tp.node.Path}
	addrs := []netip.Addr{gw, gw6, netip.MustParseAddr(guardHostIP), gw}
	if changed, err := g.Apply(addrs); err != nil || !changed {
		t.Fatalf("apply: changed %v, %v", changed, err)
	}
	if changed, err := g.Apply(addrs); err != nil || changed {
		t.Fatalf("apply again: changed %v, %v (want a no-op)", changed, err)
	}
	if err := g.Check(addrs); err != nil {
		t.Fatal(err)
	}
	if u4, u6, arp, nd := spoofs(); u4 || u6 || arp || nd {
		t.Fatalf("with the guard a forgery reached the neighbour: udp4 %v udp6 %v arp %v nd %v", u4, u6, arp, nd)
	}
	// The allowed paths: the pod's own address, and the node itself sending from the gateway.
	testenv.SendFrame(t, tp.a, testenv.UDPFrame(tp.bMAC, tp.aMAC, podA, podB, 9999))
	expectSource(t, got4, podA, "the pod's own datagram")
	if err := tp.node.Do(func() error {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP(guardGateway)}, &net.UDPAddr{IP: net.ParseIP(guardPodB), Port: 9999})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("node"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	expectSource(t, got4, gw, "the node's datagram from the gateway address")

	// Drift: another address in a set, a rule deleted. Check names it; Apply repairs it.
	if err := g.Check(append(addrs, netip.MustParseAddr("10.99.4.77"))); !isDrift(err) {
		t.Fatalf("check with another address set: %v, want drift", err)
	}
	if out, err := tp.node.Command("nft", "flush", "chain", "bridge", GuardTable, guardChain).CombinedOutput(); err != nil {
		t.Fatalf("nft flush: %v: %s", err, out)
	}
	if err := g.Check(addrs); !isDrift(err) {
		t.Fatalf("check after a flush: %v, want drift", err)
	}
	if changed, err := g.Apply(addrs); err != nil || !changed {
		t.Fatalf("repair: changed %v, %v", changed, err)
	}
	if err := g.Check(addrs); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Apply([]netip.Addr{{}}); err == nil {
		t.Fatal("apply with an invalid address succeeded")
	}
	if err := g.Check(addrs); err != nil {
		t.Fatalf("a refused apply changed the guard: %v", err)
	}

	if err := g.Teardown(); err != nil {
		t.Fatal(err)
	}
	if err := g.Teardown(); err != nil {
		t.Fatalf("second teardown: %v", err)
	}
	var de *DriftError
	if err := g.Check(addrs); !errors.As(err, &de) {
		t.Fatalf("check after teardown: %v, want drift", err)
	}
}

func expectSource(t *testing.T, ch <-chan netip.Addr, want netip.Addr, what string) {
	t.Helper()
	select {
	case got := <-ch:
		if got != want {
			t.Fatalf("%s: source %s, want %s", what, got, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: nothing arrived", what)
	}
}
