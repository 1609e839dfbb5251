//go:build linux

package capture

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
)

// TestPrivilegedPerPortModes shows the per-port inbound modes on real traffic in a pod netns,
// with each backend: a permissive pod with strict ports refuses plaintext on them (except the
// node on its probe port) and accepts it elsewhere and on 15008; a strict pod with a permissive
// port accepts plaintext there only; every apply is run twice (the second changes nothing);
// Check reports a live table of another policy as drift; and a connection accepted in
// permissive mode is cut when its port turns strict (by the rules at the caller's next packet,
// by CutRefused at the pod's end), while the connections the new policy still allows are kept.
func TestPrivilegedPerPortModes(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tb := range testBackends() {
		t.Run(tb.name, func(t *testing.T) { perPortModes(t, tb.b) })
	}
}

func perPortModes(t *testing.T, b Backend) {
	tp := newTopo(t)
	base := Config{
		PodIPs: addrs(topoPodIP), HostIP: netip.MustParseAddr(topoHostIP), ClusterDNS: addrs("10.96.0.10"),
		NodeSources: prefixes(topoGateway + "/32"), ProbePorts: []uint16{8081},
	}
	accepted := map[string]chan net.Conn{}
	for _, p := range []string{"8080", "8081", "9090", "15008"} {
		_, accepted[p] = acceptOn(t, tp.pod, topoPodIP+":"+p)
	}
	apply := func(c Config) RuleSet {
		t.Helper()
		rs, err := Build(c)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			changed, err := b.Apply(tp.pod.Path, rs)
			if err != nil {
				t.Fatalf("apply %d: %v", i+1, err)
			}
			if i == 1 && changed {
				t.Fatal("second apply of the same rule set changed the rules")
			}
		}
		if err := b.Check(tp.pod.Path, rs); err != nil {
			t.Fatal(err)
		}
		return rs
	}
	type dial struct {
		src, port string
		ok        bool
	}
	expect := func(what string, ds []dial) {
		t.Helper()
		for _, d := range ds {
			err := dialFrom(tp.node, d.src, topoPodIP+":"+d.port)
			switch {
			case d.ok && err != nil:
				t.Errorf("%s: %s -> :%s: %v, want accepted", what, d.src, d.port, err)
			case !d.ok && !isRefused(err):
				t.Errorf("%s: %s -> :%s = %v, want connection refused", what, d.src, d.port, err)
			}
		}
	}

	// Permissive with strict ports 8080 and 8081 (8081 is the probe port).
	perm := base
	perm.Mode, perm.StrictPorts = ModePermissive, []uint16{8080, 8081}
	permRS := apply(perm)
	expect("permissive, strict 8080 and 8081", []dial{
		{topoOther, "8080", false}, {topoOther, "8081", false}, {topoOther, "9090", true}, {topoOther, "15008", true},
		{topoGateway, "8081", true}, {topoGateway, "8080", false},
	})
	if err := dialFrom(tp.pod, "", topoPodIP+":8080"); err != nil {
		t.Errorf("permissive, strict 8080: the pod's own connection to :8080: %v", err)
	}

	// Strict with permissive port 9090.
	strict := base
	strict.PermissivePorts = []uint16{9090}
	strictRS := apply(strict)
	expect("strict, permissive 9090", []dial{
		{topoOther, "9090", true}, {topoOther, "8080", false}, {topoOther, "15008", true}, {topoGateway, "8081", true},
	})
	// The live table holds the strict policy: Check against the permissive one is drift, and
	// Apply of it changes the rules.
	if err := b.Check(tp.pod.Path, permRS); !isDrift(err) {
		t.Fatalf("Check of the permissive policy against the strict table = %v, want drift", err)
	}
	if changed, err := b.Apply(tp.pod.Path, permRS); err != nil || !changed {
		t.Fatalf("apply the permissive policy over the strict one = %v, %v; want changed", changed, err)
	}
	if err := b.Check(tp.pod.Path, strictRS); !isDrift(err) {
		t.Fatalf("Check of the strict policy against the permissive table = %v, want drift", err)
	}

	// A plaintext connection accepted while its port was permissive is cut when the port turns
	// strict: the caller's next packet gets a reset from the rules alone (the pod's end is left
	// open), and CutRefused closes the pod's end too. A connection to a port that stays open
	// (9090), the mTLS port and the node's probe connection are kept, by both.
	apply(base.withMode(ModePermissive))
	_, held := acceptOn(t, tp.pod, topoPodIP+":7070")
	_, held2 := acceptOn(t, tp.pod, topoPodIP+":7071")
	// A listener on every address, as most servers bind: its IPv4 callers' sockets are IPv6
	// sockets with v4-mapped addresses.
	_, held3 := acceptOn(t, tp.pod, ":7072")
	conn := func(src, port string, ch chan net.Conn) (client, server net.Conn) {
		t.Helper()
		if err := tp.node.Do(func() (err error) {
			d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
			client, err = d.Dial("tcp", topoPodIP+":"+port)
			return err
		}); err != nil {
			t.Fatalf("permissive: %s -> :%s: %v", src, port, err)
		}
		t.Cleanup(func() { client.Close() })
		server = expectConn(t, "plaintext to :"+port, ch, nil)
		t.Cleanup(func() { server.Close() })
		return client, server
	}
	cut70, srv70 := conn(topoOther, "7070", held)
	cut71, srv71 := conn(topoOther, "7071", held2)
	cut72, srv72 := conn(topoOther, "7072", held3)
	type kept struct {
		what           string
		client, server net.Conn
	}
	var keep []kept
	for _, k := range []struct{ src, port string }{{topoOther, "9090"}, {topoOther, "15008"}, {topoGateway, "8081"}} {
		drain(accepted[k.port]) // the connections of the checks above
		c, s := conn(k.src, k.port, accepted[k.port])
		keep = append(keep, kept{k.src + " -> :" + k.port, c, s})
	}
	toStrict := base
	toStrict.Mode, toStrict.StrictPorts = ModePermissive, []uint16{7070, 7071, 7072}
	toStrictRS := apply(toStrict)
	// The rules alone: the caller's next byte is answered with a reset and never reaches the pod.
	if _, err := cut70.Write([]byte{7}); err != nil {
		t.Fatalf("write after :7070 turned strict: %v", err)
	}
	testenv.ExpectClosed(t, cut70, "the caller on :7070, after its port turned strict")
	expectSilent(t, srv70, "the pod's end on :7070 (rules only)")
	if err := dialFrom(tp.node, topoOther, topoPodIP+":7070"); !isRefused(err) {
		t.Fatalf("new plaintext to :7070 after it turned strict = %v, want connection refused", err)
	}
	// CutRefused closes the pod's end of the three refused connections (the callers of 7071
	// and 7072 have not sent anything since), and nothing else.
	n, err := CutRefused(tp.pod.Path, toStrictRS)
	if err != nil || n != 3 {
		t.Fatalf("CutRefused = %d, %v; want 3 sockets closed (:7070, :7071, :7072)", n, err)
	}
	testenv.ExpectClosed(t, srv70, "the pod's end on :7070 after CutRefused")
	testenv.ExpectClosed(t, srv71, "the pod's end on :7071 after CutRefused")
	testenv.ExpectClosed(t, cut71, "the caller on :7071 after CutRefused")
	testenv.ExpectClosed(t, srv72, "the pod's end on :7072 (a v4-mapped socket) after CutRefused")
	testenv.ExpectClosed(t, cut72, "the caller on :7072 after CutRefused")
	if n, err := CutRefused(tp.pod.Path, toStrictRS); err != nil || n != 0 {
		t.Fatalf("CutRefused again = %d, %v; want nothing left to close", n, err)
	}
	for _, k := range keep {
		exchange(t, k.client, k.server, k.what+" after :7070 and :7071 turned strict")
	}
	// The whole pod strict: the connection to 9090 is refused now, mTLS and the probe are kept.
	allStrict := apply(base)
	if n, err := CutRefused(tp.pod.Path, allStrict); err != nil || n != 1 {
		t.Fatalf("CutRefused with the pod strict = %d, %v; want 1 (the caller on :9090)", n, err)
	}
	testenv.ExpectClosed(t, keep[0].server, "the pod's end on :9090 after the pod turned strict")
	testenv.ExpectClosed(t, keep[0].client, "the caller on :9090 after the pod turned strict")
	for _, k := range keep[1:] {
		exchange(t, k.client, k.server, k.what+" after the pod turned strict")
	}
	if err := b.Teardown(tp.pod.Path); err != nil {
		t.Fatal(err)
	}
}

// drain closes the connections waiting in ch.
func drain(ch chan net.Conn) {
	for {
		select {
		case c := <-ch:
			c.Close()
		default:
			return
		}
	}
}

// expectSilent fails the test, naming what, when c reads anything or fails within 300 ms: the
// connection is open and nothing reached it.
func expectSilent(t *testing.T, c net.Conn, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	n, err := c.Read(make([]byte, 1))
	var ne net.Error
	if n > 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("%s: read = %d, %v; want nothing (no byte, no close)", what, n, err)
	}
}

// withMode returns c with Mode set to m.
func (c Config) withMode(m Mode) Config { c.Mode = m; return c }

// exchange sends one byte each way over an established connection and fails the test, naming
// what, when either does not arrive within 5 s.
func exchange(t *testing.T, client, server net.Conn, what string) {
	t.Helper()
	for _, p := range []struct {
		from, to net.Conn
		dir      string
	}{{client, server, "client to server"}, {server, client, "server to client"}} {
		if _, err := p.from.Write([]byte{7}); err != nil {
			t.Fatalf("%s: write %s: %v", what, p.dir, err)
		}
		_ = p.to.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 1)
		if _, err := io.ReadFull(p.to, b); err != nil {
			t.Fatalf("%s: read %s: %v", what, p.dir, err)
		}
	}
}
