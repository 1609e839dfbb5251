package capture

import (
	"strings"
	"testing"

	"github.com/aethermesh/aether/internal/testenv"
)

// TestPrivilegedRepairsPartialDrift: in a pod netns that also holds foreign rules (seedForeign),
// someone removes or edits part of aether's rules. Check reports drift for each edit, Apply
// repairs it (changed), Check passes again, and the foreign state prints as before.
func TestPrivilegedRepairsPartialDrift(t *testing.T) {
	testenv.RequireRoot(t)
	rs, err := Build(goldenConfigs[0].cfg) // strict IPv4: chains on nat OUTPUT, filter OUTPUT and INPUT
	if err != nil {
		t.Fatal(err)
	}
	type edit struct {
		name string
		cmds [][]string
	}
	jump := func(tool, table, builtin, chain string) []string {
		return []string{tool, "-w", "-t", table, "-D", builtin, "-m", "comment", "--comment", Tag + ":jump", "-j", chain}
	}
	byBackend := map[string][]edit{
		"nftables": {
			{"table deleted", [][]string{{"nft", "delete", "table", "inet", TableName}}},
			{"one chain deleted", [][]string{{"nft", "delete", "chain", "inet", TableName, "output_filter"}}},
			{"input chain flushed", [][]string{{"nft", "flush", "chain", "inet", TableName, "input_filter"}}},
			{"foreign rule inserted first in our chain", [][]string{{"nft", "insert", "rule", "inet", TableName, "input_filter", "accept"}}},
			{"rule appended to our chain", [][]string{{"nft", "add", "rule", "inet", TableName, "output_nat", "return"}}},
			{"chain policy set to drop", [][]string{{"nft", "chain", "inet", TableName, "output_filter", "{ policy drop; }"}}},
		},
	}
	for _, tool := range []string{"iptables-nft", "iptables-legacy"} {
		byBackend[tool] = []edit{
			{"nat OUTPUT jump deleted", [][]string{jump(tool, "nat", "OUTPUT", "AETHER-OUTPUT-NAT")}},
			{"filter INPUT jump deleted", [][]string{jump(tool, "filter", "INPUT", "AETHER-INPUT")}},
			{"filter OUTPUT jump deleted", [][]string{jump(tool, "filter", "OUTPUT", "AETHER-OUTPUT")}},
			{"chain flushed", [][]string{{tool, "-w", "-t", "filter", "-F", "AETHER-INPUT"}}},
			{"foreign rule inserted first in our chain", [][]string{{tool, "-w", "-t", "filter", "-I", "AETHER-INPUT", "1", "-j", "ACCEPT"}}},
			{"foreign rule appended to our nat chain", [][]string{{tool, "-w", "-t", "nat", "-A", "AETHER-OUTPUT-NAT", "-p", "tcp", "-j", "RETURN"}}},
			{"first rule moved last", [][]string{
				{tool, "-w", "-t", "filter", "-D", "AETHER-INPUT", "1"},
				{tool, "-w", "-t", "filter", "-A", "AETHER-INPUT", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-m", "comment", "--comment", rs.Chains[len(rs.Chains)-1].Rules[0].Comment(), "-j", "ACCEPT"},
			}},
			{"chain and its jump deleted", [][]string{
				jump(tool, "nat", "OUTPUT", "AETHER-OUTPUT-NAT"),
				{tool, "-w", "-t", "nat", "-F", "AETHER-OUTPUT-NAT"},
				{tool, "-w", "-t", "nat", "-X", "AETHER-OUTPUT-NAT"},
			}},
		}
	}
	for _, tb := range testBackends() {
		t.Run(tb.name, func(t *testing.T) {
			ns := testenv.NewNetns(t)
			seedForeign(t, ns)
			before := foreignState(t, ns)
			b := tb.b
			if _, err := b.Apply(ns.Path, rs); err != nil {
				t.Fatal(err)
			}
			for _, e := range byBackend[tb.name] {
				for _, c := range e.cmds {
					if out, err := ns.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
						t.Fatalf("%s: %v: %v\n%s", e.name, c, err, out)
					}
				}
				if err := b.Check(ns.Path, rs); !isDrift(err) {
					t.Errorf("%s: Check = %v, want drift", e.name, err)
				}
				if changed, err := b.Apply(ns.Path, rs); err != nil || !changed {
					t.Errorf("%s: repair = %v, %v; want changed", e.name, changed, err)
				}
				if err := b.Check(ns.Path, rs); err != nil {
					t.Errorf("%s: Check after repair = %v", e.name, err)
				}
				if after := foreignState(t, ns); after != before {
					t.Fatalf("%s: foreign state changed:\n--- before\n%s--- after\n%s", e.name, before, after)
				}
			}
			if strings.Contains(tb.name, "iptables") {
				out, _ := ns.Command(tb.list[0], tb.list[1:]...).CombinedOutput()
				if n := strings.Count(string(out), Tag+":jump"); n != len(rs.Chains) {
					t.Errorf("%d jumps after the repairs, want %d:\n%s", n, len(rs.Chains), out)
				}
			}
		})
	}
}
