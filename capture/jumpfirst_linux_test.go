//go:build linux

package capture

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
)

// TestPrivilegedForeignRuleBeforeJump: a foreign rule placed ahead of aether's in the pod netns.
//
// iptables backends: an ACCEPT inserted (-I) before aether's jump in nat OUTPUT takes the
// connections it matches past the capture listener, and one before the jump in filter INPUT lets
// plaintext past strict mode; the test shows both happen. Check reports each as drift ("not the
// chain's first rule"), Apply moves aether's jumps back to the front (the foreign rules stay,
// now behind them), after which the same connections are captured and refused again, Check
// passes and a second Apply changes nothing.
//
// nftables backend: the same ACCEPTs in a foreign base chain that runs before aether's
// (priority -150; a NAT chain cannot go at or below conntrack's -200) bypass nothing, because an
// accept ends only its own base chain (docs/capture.md); Check has nothing to report.
func TestPrivilegedForeignRuleBeforeJump(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tb := range testBackends() {
		t.Run(tb.name, func(t *testing.T) {
			tp := newTopo(t)
			rs, err := Build(Config{PodIPs: addrs(topoPodIP), HostIP: netip.MustParseAddr(topoHostIP), NodeSources: prefixes(topoGateway + "/32")})
			if err != nil {
				t.Fatal(err)
			}
			b := tb.b
			if _, err := b.Apply(tp.pod.Path, rs); err != nil {
				t.Fatal(err)
			}
			_, captured := acceptOn(t, tp.pod, "127.0.0.1:15001")
			_, direct := acceptOn(t, tp.node, topoGateway+":7272")
			_, app := acceptOn(t, tp.pod, topoPodIP+":8080")
			// outbound dials the node's port 7272 from the pod: "captured" or "direct".
			outbound := func() string {
				t.Helper()
				if err := dialFrom(tp.pod, "", topoGateway+":7272"); err != nil {
					t.Fatalf("dial %s:7272 from the pod: %v", topoGateway, err)
				}
				select {
				case c := <-captured:
					c.Close()
					return "captured"
				case c := <-direct:
					c.Close()
					return "direct"
				case <-time.After(10 * time.Second):
					t.Fatal("outbound connection reached no listener")
				}
				return ""
			}
			// inbound dials the pod's port 8080 in plaintext from another pod's address:
			// "refused" (strict mode) or "open".
			inbound := func() string {
				t.Helper()
				err := dialFrom(tp.node, topoOther, net.JoinHostPort(topoPodIP, "8080"))
				switch {
				case isRefused(err):
					return "refused"
				case err != nil:
					t.Fatalf("plaintext dial to the pod: %v", err)
				}
				select {
				case c := <-app:
					c.Close()
				case <-time.After(10 * time.Second):
					t.Fatal("plaintext connection accepted by no listener")
				}
				return "open"
			}
			if o, i := outbound(), inbound(); o != "captured" || i != "refused" {
				t.Fatalf("after apply: outbound %s, inbound %s; want captured, refused", o, i)
			}

			if tb.name == "nftables" {
				cmd := tp.pod.Command("nft", "-f", "-")
				cmd.Stdin = strings.NewReader(`table ip foreign-first {
	chain out { type nat hook output priority -150; policy accept; tcp dport 7272 accept; }
	chain in { type filter hook input priority -150; policy accept; tcp dport 8080 accept; }
}
`)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("foreign nft table: %v\n%s", err, out)
				}
				if o, i := outbound(), inbound(); o != "captured" || i != "refused" {
					t.Fatalf("with foreign accepts at priority -150: outbound %s, inbound %s; want captured, refused", o, i)
				}
				if err := b.Check(tp.pod.Path, rs); err != nil {
					t.Fatalf("Check with a foreign table = %v, want nil", err)
				}
				return
			}

			tool := tb.name // iptables-nft or iptables-legacy, IPv4
			for _, c := range [][]string{
				{tool, "-w", "-t", "nat", "-I", "OUTPUT", "1", "-p", "tcp", "--dport", "7272", "-j", "ACCEPT"},
				{tool, "-w", "-t", "filter", "-I", "INPUT", "1", "-p", "tcp", "--dport", "8080", "-j", "ACCEPT"},
			} {
				if out, err := tp.pod.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
					t.Fatalf("%v: %v\n%s", c, err, out)
				}
			}
			if o, i := outbound(), inbound(); o != "direct" || i != "open" {
				t.Fatalf("with foreign ACCEPTs first: outbound %s, inbound %s; want direct, open (the bypass this test is about)", o, i)
			}
			if err := b.Check(tp.pod.Path, rs); !isDrift(err) || !strings.Contains(err.Error(), "not the chain's first rule") {
				t.Fatalf("Check = %v, want drift naming the jump that is not first", err)
			}
			if changed, err := b.Apply(tp.pod.Path, rs); err != nil || !changed {
				t.Fatalf("repair = %v, %v; want changed", changed, err)
			}
			if err := b.Check(tp.pod.Path, rs); err != nil {
				t.Fatalf("Check after repair = %v", err)
			}
			if changed, err := b.Apply(tp.pod.Path, rs); err != nil || changed {
				t.Fatalf("second apply = %v, %v; want unchanged", changed, err)
			}
			if o, i := outbound(), inbound(); o != "captured" || i != "refused" {
				t.Fatalf("after repair: outbound %s, inbound %s; want captured, refused", o, i)
			}
			for _, c := range []struct{ table, chain, foreign string }{
				{"nat", "OUTPUT", "--dport 7272 -j ACCEPT"}, {"filter", "INPUT", "--dport 8080 -j ACCEPT"},
			} {
				out, err := tp.pod.Command(tool, "-w", "-t", c.table, "-S", c.chain).CombinedOutput()
				if err != nil {
					t.Fatalf("%s -S %s: %v\n%s", tool, c.chain, err, out)
				}
				rules := strings.Split(strings.TrimSpace(string(out)), "\n") // "-P CHAIN ACCEPT", then the rules
				if len(rules) != 3 || !strings.Contains(rules[1], Tag+":jump") || !strings.HasSuffix(rules[2], c.foreign) {
					t.Errorf("%s %s after repair:\n%s\nwant aether's jump first, then the foreign rule", c.table, c.chain, out)
				}
			}
		})
	}
}
