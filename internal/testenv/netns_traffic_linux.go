//go:build linux

package testenv

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Dial opens a TCP connection to addr ("host:port") from inside the namespace, with a 5 s
// connect timeout. The socket keeps its namespace after the call (sockets belong to the
// namespace they were created in), so the caller uses it from any goroutine.
func (n *Netns) Dial(addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s from netns %s: %w", addr, n.Name, err)
	}
	return c, nil
}

// Listen opens a TCP listener on addr inside the namespace and closes it when the test ends;
// a failure ends the test.
func (n *Netns) Listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	if err := n.Do(func() (err error) { l, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatalf("testenv: listen %s in netns %s: %v", addr, n.Name, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// HTTPClient returns an HTTP client (10 s timeout) whose connections start inside the
// namespace. keepAlive false closes each connection after its request.
func (n *Netns) HTTPClient(keepAlive bool) *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DisableKeepAlives: !keepAlive,
			DialContext:       func(_ context.Context, _, addr string) (net.Conn, error) { return n.Dial(addr) },
		},
	}
}

// ServeHTTP serves h on addr inside the namespace until the test ends.
func (n *Netns) ServeHTTP(t testing.TB, addr string, h http.Handler) {
	t.Helper()
	l := n.Listen(t, addr)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
}

// Veth connects two namespaces with a veth pair: interface nameA in a with address addrA, nameB
// in b with addrB (prefix form, e.g. 10.250.0.5/24), both up.
func Veth(t testing.TB, a *Netns, nameA string, addrA netip.Prefix, b *Netns, nameB string, addrB netip.Prefix) {
	t.Helper()
	ha, err := a.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer ha.Close()
	hb, err := b.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()
	tmp := "p" + b.Name[len(b.Name)-8:] + nameB
	if len(tmp) > 15 {
		tmp = tmp[:15]
	}
	if err := ha.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: nameA}, PeerName: tmp}); err != nil {
		t.Fatalf("testenv: add veth %s in %s: %v", nameA, a.Name, err)
	}
	bns, err := netns.GetFromPath(b.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer bns.Close()
	if err := ha.LinkSetNsFd(mustLink(t, ha, tmp), int(bns)); err != nil {
		t.Fatalf("testenv: move veth peer to %s: %v", b.Name, err)
	}
	if err := hb.LinkSetName(mustLink(t, hb, tmp), nameB); err != nil {
		t.Fatal(err)
	}
	for _, side := range []struct {
		h    *netlink.Handle
		name string
		addr netip.Prefix
	}{{ha, nameA, addrA}, {hb, nameB, addrB}} {
		l := mustLink(t, side.h, side.name)
		if err := side.h.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(side.addr)}); err != nil {
			t.Fatal(err)
		}
		if err := side.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
}

// DefaultRoute adds a default route via gw inside the namespace.
func (n *Netns) DefaultRoute(t testing.TB, gw netip.Addr) {
	t.Helper()
	h, err := n.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.RouteAdd(&netlink.Route{Gw: gw.AsSlice()}); err != nil {
		t.Fatalf("testenv: default route via %s in %s: %v", gw, n.Name, err)
	}
}

// Forward accepts TCP connections on addr inside the namespace and copies each to target,
// dialled from the test's own namespace (a node namespace reaching an API server or etcd on the
// root loopback, say). It stops, cutting the forwarded connections, when the test ends.
func (n *Netns) Forward(t testing.TB, addr, target string) {
	t.Helper()
	f := &Forwarder{}
	if err := f.Listen(n, addr, target); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(f.Close)
}

// Forwarder copies TCP connections accepted inside namespaces to targets dialled from the
// caller's namespace (5 s dial timeout; a connection whose target does not answer is closed).
// Close stops it and cuts every forwarded connection. Safe for concurrent use.
type Forwarder struct {
	mu     sync.Mutex
	ls     []net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Listen accepts connections on addr ("host:port") inside ns and forwards each to target.
func (f *Forwarder) Listen(ns *Netns, addr, target string) error {
	var l net.Listener
	if err := ns.Do(func() (err error) { l, err = net.Listen("tcp", addr); return err }); err != nil {
		return fmt.Errorf("forward: listen on %s in netns %s: %w", addr, ns.Name, err)
	}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		l.Close()
		return fmt.Errorf("forward: listen on %s in netns %s: forwarder closed", addr, ns.Name)
	}
	f.ls = append(f.ls, l)
	f.mu.Unlock()
	f.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			f.wg.Go(func() { f.pipe(c, target) })
		}
	})
	return nil
}

// track adds (or removes) a connection Close must cut; false when the forwarder is closed.
func (f *Forwarder) track(c net.Conn, add bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !add {
		delete(f.conns, c)
		return true
	}
	if f.closed {
		return false
	}
	if f.conns == nil {
		f.conns = map[net.Conn]struct{}{}
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Forwarder) pipe(down net.Conn, target string) {
	defer down.Close()
	up, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	if !f.track(down, true) || !f.track(up, true) {
		return
	}
	defer f.track(down, false)
	defer f.track(up, false)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, down); done <- struct{}{} }()
	go func() { _, _ = io.Copy(down, up); done <- struct{}{} }()
	<-done
}

// Close stops accepting, cuts every forwarded connection and waits for the copies to end.
func (f *Forwarder) Close() {
	f.mu.Lock()
	f.closed = true
	for _, l := range f.ls {
		l.Close()
	}
	f.ls = nil
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// EchoOnce writes msg on c and reads the same bytes back (10 s deadline).
func EchoOnce(c net.Conn, msg string) error {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("read echo: %w", err)
	}
	if string(buf) != msg {
		return fmt.Errorf("echo = %q, want %q", buf, msg)
	}
	return nil
}

func mustLink(t testing.TB, h *netlink.Handle, name string) netlink.Link {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("testenv: link %s: %v", name, err)
	}
	return l
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// ServeUDPEcho answers every datagram sent to addr ("host:port") inside the namespace with
// prefix followed by the datagram, until the test ends (a stand-in for a resolver or any UDP
// peer). It returns the count of datagrams received.
func (n *Netns) ServeUDPEcho(t testing.TB, addr, prefix string) *atomic.Int32 {
	t.Helper()
	var pc net.PacketConn
	if err := n.Do(func() (err error) { pc, err = net.ListenPacket("udp", addr); return err }); err != nil {
		t.Fatalf("testenv: listen udp %s in %s: %v", addr, n.Name, err)
	}
	t.Cleanup(func() { pc.Close() })
	var got atomic.Int32
	go func() {
		buf := make([]byte, 512)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			got.Add(1)
			_, _ = pc.WriteTo(append([]byte(prefix), buf[:k]...), from)
		}
	}()
	return &got
}

// AskUDP sends msg from inside the namespace to addr over UDP and returns the first datagram
// that comes back within timeout, or the error (a timeout when none does).
func (n *Netns) AskUDP(addr, msg string, timeout time.Duration) (string, error) {
	var got string
	err := n.Do(func() error {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		buf := make([]byte, 512)
		k, err := c.Read(buf)
		got = string(buf[:k])
		return err
	})
	return got, err
}

// ServePeerAddr answers every TCP connection to addr inside the namespace with the address the
// connection came from, as seen here ("10.250.1.2\n", no port), and closes it, until the test
// ends: what a peer of the mesh sees as the source of a connection.
func (n *Netns) ServePeerAddr(t testing.TB, addr string) {
	t.Helper()
	l := n.Listen(t, addr)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			_, _ = io.WriteString(c, host+"\n")
			c.Close()
		}
	}()
}

// PeerAddr dials addr (a ServePeerAddr server, directly or through the mesh) from inside the
// namespace and returns the source address the server saw. A connection refused, reset or
// closed without an answer (wrapping io.EOF) is an error.
func (n *Netns) PeerAddr(addr string) (netip.Addr, error) {
	c, err := n.Dial(addr)
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("peer address from %s via netns %s: %w", addr, n.Name, err)
	}
	if len(b) == 0 {
		// What a proxy that accepted the connection but could not reach the server gives.
		return netip.Addr{}, fmt.Errorf("peer address from %s via netns %s: closed without an answer: %w", addr, n.Name, io.EOF)
	}
	a, err := netip.ParseAddr(string(bytes.TrimSpace(b)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("peer address from %s via netns %s: answer %q: %w", addr, n.Name, b, err)
	}
	return a, nil
}

// AddAddrs adds addrs to link inside the namespace; IPv6 addresses skip duplicate address
// detection (IFA_F_NODAD), so they are usable at once.
func (n *Netns) AddAddrs(t testing.TB, link string, addrs ...netip.Prefix) {
	t.Helper()
	h, err := n.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l := mustLink(t, h, link)
	for _, a := range addrs {
		na := &netlink.Addr{IPNet: prefixNet(a)}
		if a.Addr().Is6() {
			na.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(l, na); err != nil {
			t.Fatalf("testenv: add %s to %s in %s: %v", a, link, n.Name, err)
		}
	}
}

// LinkMAC returns the hardware address of link inside the namespace.
func (n *Netns) LinkMAC(t testing.TB, link string) net.HardwareAddr {
	t.Helper()
	h, err := n.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	return mustLink(t, h, link).Attrs().HardwareAddr
}

// NeighMAC returns the hardware address link's neighbour table inside the namespace holds for ip,
// or nil without an entry.
func (n *Netns) NeighMAC(t testing.TB, link string, ip netip.Addr) net.HardwareAddr {
	t.Helper()
	h, err := n.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	list, err := h.NeighList(mustLink(t, h, link).Attrs().Index, netlinkFamily(ip))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list {
		if a, ok := netip.AddrFromSlice(e.IP); ok && a.Unmap() == ip {
			return e.HardwareAddr
		}
	}
	return nil
}

// SetNeigh makes link's neighbour table inside the namespace hold a stale (not permanent) entry
// ip -> mac, as address resolution would leave it.
func (n *Netns) SetNeigh(t testing.TB, link string, ip netip.Addr, mac net.HardwareAddr) {
	t.Helper()
	h, err := n.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.NeighSet(&netlink.Neigh{LinkIndex: mustLink(t, h, link).Attrs().Index, Family: netlinkFamily(ip), State: netlink.NUD_STALE,
		IP: ip.AsSlice(), HardwareAddr: mac}); err != nil {
		t.Fatalf("testenv: neighbour %s -> %s on %s in %s: %v", ip, mac, link, n.Name, err)
	}
}

// netlinkFamily is the netlink address family of ip (FAMILY_V4 or FAMILY_V6).
func netlinkFamily(ip netip.Addr) int {
	if ip.Is6() {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}
