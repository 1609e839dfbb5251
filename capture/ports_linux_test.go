//go:build linux

package capture

import (
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
// permissive mode keeps working after its port turns strict, while a new one is refused.
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
	for _, p := range []string{"8080", "8081", "9090", "15008"} {
		acceptOn(t, tp.pod, topoPodIP+":"+p)
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

	// An established plaintext connection survives its port turning strict (in-established
	// comes first); a new one is refused.
	apply(base.withMode(ModePermissive))
	_, held := acceptOn(t, tp.pod, topoPodIP+":7070")
	var client net.Conn
	if err := tp.node.Do(func() (err error) {
		d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(topoOther)}}
		client, err = d.Dial("tcp", topoPodIP+":7070")
		return err
	}); err != nil {
		t.Fatalf("permissive: %s -> :7070: %v", topoOther, err)
	}
	defer client.Close()
	server := expectConn(t, "plaintext to :7070", held, nil)
	defer server.Close()
	toStrict := base
	toStrict.Mode, toStrict.StrictPorts = ModePermissive, []uint16{7070}
	apply(toStrict)
	exchange(t, client, server, "after :7070 turned strict")
	if err := dialFrom(tp.node, topoOther, topoPodIP+":7070"); !isRefused(err) {
		t.Fatalf("new plaintext to :7070 after it turned strict = %v, want connection refused", err)
	}
	apply(base) // the whole pod strict: the connection still stands
	exchange(t, client, server, "after the pod turned strict")
	if err := b.Teardown(tp.pod.Path); err != nil {
		t.Fatal(err)
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
