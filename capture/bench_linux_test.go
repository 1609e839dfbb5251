//go:build linux

package capture

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/aethermesh/aether/internal/testenv"
)

// BenchmarkApply measures a full rule-set write into a pod netns (after a teardown, so every
// iteration writes) as the exclusion lists grow: n outbound ports, n inbound ports and n
// outbound CIDRs. Ports become one anonymous set per rule (nftables) or one multiport match
// (iptables; at most 15 ports per match, so the iptables cases stop at 15); CIDRs one rule each.
// Run: go test -run '^$' -bench BenchmarkApply ./capture/
func BenchmarkApply(b *testing.B) {
	testenv.RequireRoot(b)
	for _, tb := range testBackends() {
		for _, n := range []int{0, 15, 128, 1024} {
			if tb.name != "nftables" && n > 15 {
				continue
			}
			b.Run(fmt.Sprintf("%s/exclusions=%d", tb.name, n), func(b *testing.B) {
				ns := testenv.NewNetns(b)
				cfg := goldenConfigs[0].cfg
				for i := range n {
					cfg.ExcludeOutboundPorts = append(cfg.ExcludeOutboundPorts, uint16(20000+i))
					cfg.ExcludeInboundPorts = append(cfg.ExcludeInboundPorts, uint16(30000+i))
					cfg.ExcludeOutboundCIDRs = append(cfg.ExcludeOutboundCIDRs, netip.PrefixFrom(netip.AddrFrom4([4]byte{172, byte(16 + i/256), byte(i % 256), 0}), 24))
				}
				rs, err := Build(cfg)
				if err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for range b.N {
					b.StopTimer()
					if err := tb.b.Teardown(ns.Path); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					if _, err := tb.b.Apply(ns.Path, rs); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
