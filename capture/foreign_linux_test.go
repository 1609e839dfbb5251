//go:build linux

package capture

import (
	"fmt"
	"strings"
	"testing"

	"github.com/aethermesh/aether/internal/testenv"
)

// foreignNFT is nftables state other tools keep in a pod or node netns: a Flannel-like inet
// table whose NAT output chain has the same name as aether's, and a kube-proxy-like ip table with
// a regular chain, a set and a base chain jumping to it.
const foreignNFT = `table inet flannel-test {
	set podnets {
		type ipv4_addr
		flags interval
		elements = { 10.244.0.0/16 }
	}
	chain output_nat {
		type nat hook output priority -100; policy accept;
		ip daddr 10.96.0.0/12 tcp dport 80 return
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr @podnets oifname != "lo" masquerade
	}
	chain input {
		type filter hook input priority filter; policy accept;
		tcp dport 10250 accept comment "kubelet"
	}
}
table ip kube-proxy-test {
	chain services {
		ip daddr 10.96.0.1 tcp dport 443 return
	}
	chain output {
		type nat hook output priority -100; policy accept;
		jump services
	}
}
`

// foreignNFTTables are the tables of foreignNFT, as "nft list table" names them.
var foreignNFTTables = [][]string{{"inet", "flannel-test"}, {"ip", "kube-proxy-test"}}

// foreignIPTables is what kube-proxy and Flannel put into iptables: their own chains in nat and
// filter, and rules in the built-in nat PREROUTING, OUTPUT, POSTROUTING and filter INPUT,
// OUTPUT, FORWARD chains (the built-in chains aether jumps from). svc, pods and meta are
// addresses of the family.
func foreignIPTables(svc, pods, meta string) string {
	return fmt.Sprintf(`*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:FLANNEL-POSTRTG - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -d %[3]s -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 8181
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -m comment --comment "flanneld masq" -j FLANNEL-POSTRTG
-A KUBE-SERVICES -d %[1]s -p tcp -m comment --comment "default/kubernetes:https cluster IP" -m tcp --dport 443 -j RETURN
-A FLANNEL-POSTRTG -s %[2]s -d %[2]s -m comment --comment "flanneld masq" -j RETURN
COMMIT
*filter
:KUBE-FIREWALL - [0:0]
:FLANNEL-FWD - [0:0]
-A INPUT -j KUBE-FIREWALL
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
-A OUTPUT -j KUBE-FIREWALL
-A FORWARD -m comment --comment "flanneld forward" -j FLANNEL-FWD
-A KUBE-FIREWALL -m conntrack --ctstate INVALID -j DROP
-A FLANNEL-FWD -s %[2]s -j ACCEPT
COMMIT
`, svc, pods, meta)
}

// iptablesTools are the save/restore tool prefixes seeded with foreign rules in every case: both
// iptables flavours and both families, whatever backend aether uses.
var iptablesTools = []string{"iptables-nft", "ip6tables-nft", "iptables-legacy", "ip6tables-legacy"}

// seedForeign installs foreignNFT and foreignIPTables (through every iptables tool) in ns.
func seedForeign(t *testing.T, ns *testenv.Netns) {
	t.Helper()
	cmd := ns.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(foreignNFT)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("seed foreign nft tables: %v\n%s", err, out)
	}
	for _, tool := range iptablesTools {
		rules := foreignIPTables("10.96.0.1/32", "10.244.0.0/16", "169.254.169.254/32")
		if strings.HasPrefix(tool, "ip6") {
			rules = foreignIPTables("fd00:96::1/128", "fd00:10:244::/56", "fd00:ec2::254/128")
		}
		cmd := ns.Command(tool+"-restore", "--noflush", "-w")
		cmd.Stdin = strings.NewReader(rules)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("seed foreign %s rules: %v\n%s", tool, err, out)
		}
	}
}

// foreignState prints everything in ns that is not aether's: the foreign nft tables as
// "nft list table" prints them, and every iptables tool's save output without aether's chains,
// aether's tagged rules, comments and chain counters.
func foreignState(t *testing.T, ns *testenv.Netns) string {
	t.Helper()
	var b strings.Builder
	for _, tbl := range foreignNFTTables {
		out, err := ns.Command("nft", "list", "table", tbl[0], tbl[1]).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list table %s %s: %v\n%s", tbl[0], tbl[1], err, out)
		}
		fmt.Fprintf(&b, "## nft %s %s\n%s", tbl[0], tbl[1], out)
	}
	for _, tool := range iptablesTools {
		out, err := ns.Command(tool + "-save").CombinedOutput()
		if err != nil {
			t.Fatalf("%s-save: %v\n%s", tool, err, out)
		}
		fmt.Fprintf(&b, "## %s-save\n", tool)
		for _, l := range strings.Split(string(out), "\n") {
			if l == "" || strings.HasPrefix(l, "#") || strings.Contains(l, ChainPrefix) || strings.Contains(l, Tag+":") {
				continue
			}
			if strings.HasPrefix(l, ":") { // ":CHAIN POLICY [packets:bytes]": drop the counters
				l = strings.Join(strings.Fields(l)[:2], " ")
			}
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// aetherState prints whatever of aether's is in ns, in any backend: table inet aether and every
// iptables line naming an aether chain or carrying an aether tag. It is empty when nothing of
// aether's is left.
func aetherState(t *testing.T, ns *testenv.Netns) string {
	t.Helper()
	var b strings.Builder
	if out, err := ns.Command("nft", "list", "table", "inet", TableName).CombinedOutput(); err == nil {
		fmt.Fprintf(&b, "## nft inet %s\n%s", TableName, out)
	}
	for _, tool := range iptablesTools {
		out, err := ns.Command(tool + "-save").CombinedOutput()
		if err != nil {
			t.Fatalf("%s-save: %v\n%s", tool, err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, ChainPrefix) || strings.Contains(l, Tag+":") {
				fmt.Fprintf(&b, "%s: %s\n", tool, l)
			}
		}
	}
	return b.String()
}

// TestPrivilegedForeignRulesUntouched shows that every backend touches only aether's own state
// (issue 6: "every rule carries an aether tag so check, cleanup and repair touch only ours").
// A pod netns is seeded with what kube-proxy, Flannel and other tools keep there (nft tables of
// other names, one with a chain named like aether's; iptables chains KUBE-SERVICES,
// KUBE-FIREWALL, FLANNEL-* and foreign rules in the built-in nat PREROUTING/OUTPUT/POSTROUTING
// and filter INPUT/OUTPUT/FORWARD chains, through iptables-nft and iptables-legacy, IPv4 and
// IPv6). Then Apply, Check, Apply again (no change), Apply of another configuration (which
// replaces chains), Check, repair after a hand deletion, Teardown and Teardown again run; after
// each step the foreign state prints byte-identical to before, Check is not confused by it, and
// after Teardown nothing of aether's is left.
func TestPrivilegedForeignRulesUntouched(t *testing.T) {
	testenv.RequireRoot(t)
	cfgs := map[string]Config{}
	for _, tc := range goldenConfigs {
		cfgs[tc.name] = tc.cfg
	}
	first, err := Build(cfgs["strict-exclusions"])
	if err != nil {
		t.Fatal(err)
	}
	second, err := Build(cfgs["dual-stack"])
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range testBackends() {
		t.Run(tb.name, func(t *testing.T) {
			ns := testenv.NewNetns(t)
			seedForeign(t, ns)
			before := foreignState(t, ns)
			if !strings.Contains(before, "KUBE-SERVICES") || !strings.Contains(before, "flannel-test") {
				t.Fatalf("foreign state was not seeded:\n%s", before)
			}
			b := tb.b
			unchanged := func(step string) {
				t.Helper()
				if after := foreignState(t, ns); after != before {
					t.Fatalf("after %s the foreign state changed:\n--- before\n%s--- after\n%s", step, before, after)
				}
			}
			if err := b.Check(ns.Path, first); !isDrift(err) {
				t.Fatalf("Check with only foreign rules = %v, want drift", err)
			}
			unchanged("check before apply")
			if changed, err := b.Apply(ns.Path, first); err != nil || !changed {
				t.Fatalf("apply = %v, %v; want changed", changed, err)
			}
			unchanged("apply")
			if err := b.Check(ns.Path, first); err != nil {
				t.Fatalf("check after apply: %v", err)
			}
			unchanged("check")
			if changed, err := b.Apply(ns.Path, first); err != nil || changed {
				t.Fatalf("second apply = %v, %v; want unchanged", changed, err)
			}
			unchanged("second apply")
			if changed, err := b.Apply(ns.Path, second); err != nil || !changed {
				t.Fatalf("apply of another configuration = %v, %v; want changed", changed, err)
			}
			unchanged("apply of another configuration")
			if err := b.Check(ns.Path, second); err != nil {
				t.Fatalf("check after switching: %v", err)
			}
			if out, err := ns.Command(tb.vandal[0], tb.vandal[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v\n%s", tb.vandal, err, out)
			}
			if err := b.Check(ns.Path, second); !isDrift(err) {
				t.Fatalf("check after deleting aether rules by hand = %v, want drift", err)
			}
			if changed, err := b.Apply(ns.Path, second); err != nil || !changed {
				t.Fatalf("repair = %v, %v; want changed", changed, err)
			}
			unchanged("repair")
			if got := aetherState(t, ns); got == "" {
				t.Fatal("no aether rules found while applied: aetherState sees nothing")
			}
			for i := range 2 {
				if err := b.Teardown(ns.Path); err != nil {
					t.Fatalf("teardown %d: %v", i+1, err)
				}
				unchanged(fmt.Sprintf("teardown %d", i+1))
			}
			if left := aetherState(t, ns); left != "" {
				t.Fatalf("aether state left after teardown:\n%s", left)
			}
		})
	}
}
