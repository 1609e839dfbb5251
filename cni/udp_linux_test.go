//go:build linux

package cni

import (
	"context"
	"errors"
	"fmt"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/internal/testenv"
)

// TestPrivilegedCNIUDPRedirects: a captured pod has no UDP redirect while no UDPRoute is bound;
// SetUDPRedirects puts one per routed frontend into every captured pod's rules before it returns
// (and into a pod added later), a changed local port replaces it, and an empty set removes it,
// with the nftables and both iptables backends.
func TestPrivilegedCNIUDPRedirects(t *testing.T) {
	testenv.RequireRoot(t)
	for i, tc := range []struct {
		name    string
		backend capture.Backend
		list    []string
	}{
		{"nftables", capture.NFTables{}, []string{"nft", "list", "table", "inet", capture.TableName}},
		{"iptables-nft", capture.IPTables{Mode: capture.IPTablesNFT}, []string{"iptables-nft-save", "-t", "nat"}},
		{"iptables-legacy", capture.IPTables{Mode: capture.IPTablesLegacy}, []string{"iptables-legacy-save", "-t", "nat"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(sockDir(t), "cni.sock")
			n := newNode(t, "1.0.0", fmt.Sprintf("10.244.%d.0/24", 70+i), sock, nil)
			state := t.TempDir()
			fb := &toggleBackend{Backend: tc.backend}
			a := startAgentBackend(t, sock, state, ServerConfig{}, &staticLookup{}, &recordingDataplane{}, nil, fb)
			first := testenv.NewNetns(t)
			if _, err := n.add(t, podRT(first, "ctr-a", "mesh", "a")); err != nil {
				t.Fatal(err)
			}
			rules := func(ns *testenv.Netns) string {
				t.Helper()
				out, err := ns.Command(tc.list[0], tc.list[1:]...).CombinedOutput()
				if err != nil {
					t.Fatalf("%v: %v\n%s", tc.list, err, out)
				}
				var udp []string
				for _, l := range strings.Split(string(out), "\n") {
					if strings.Contains(l, "aether:out-udp-") {
						udp = append(udp, strings.TrimSpace(l))
					}
				}
				return strings.Join(udp, "\n")
			}
			if got := rules(first); got != "" {
				t.Fatalf("UDP redirect without UDPRoutes:\n%s", got)
			}
			vip := netip.MustParseAddr("10.96.0.24")
			set := func(local uint16) {
				t.Helper()
				var rs []capture.UDPRedirect
				if local != 0 {
					rs = []capture.UDPRedirect{{VIP: vip, Port: 53, LocalPort: local}}
				}
				if err := a.srv.SetUDPRedirects(context.Background(), rs); err != nil {
					t.Fatal(err)
				}
			}
			set(15177)
			second := testenv.NewNetns(t)
			if _, err := n.add(t, podRT(second, "ctr-b", "mesh", "b")); err != nil {
				t.Fatal(err)
			}
			for _, ns := range []*testenv.Netns{first, second} {
				if got := rules(ns); !strings.Contains(got, "10.96.0.24") || !strings.Contains(got, "15177") || strings.Count(got, "\n") != 0 {
					t.Fatalf("%s: UDP redirect after SetUDPRedirects:\n%q", ns.Name, got)
				}
			}
			// A flow to the VIP and port that was DNAT'ed to the old local port: the change
			// forgets it (its next datagram meets the new rule).
			flow := udpFlow(t, first, vip, 53)
			set(16001)
			if flows := udpFlows(t, first, vip, 53); flows != 0 {
				t.Errorf("%d conntrack entries to %s:53 left after the local port changed (flow %v)", flows, vip, flow)
			}
			if got := rules(first); !strings.Contains(got, "16001") || strings.Contains(got, "15177") {
				t.Fatalf("UDP redirect after a local port change:\n%s", got)
			}
			// A restarted agent repairs the pods' rules with the persisted set: the redirects
			// stay (a drifted pod gets them back), and setting the same set changes nothing.
			a.stop()
			if err := tc.backend.Teardown(second.Path); err != nil {
				t.Fatal(err)
			}
			// A flow the drifted pod sent meanwhile goes with the repair that restores its rules.
			udpFlow(t, second, vip, 53)
			a = startAgentBackend(t, sock, state, ServerConfig{}, &staticLookup{}, &recordingDataplane{}, nil, fb)
			for _, ns := range []*testenv.Netns{first, second} {
				if got := rules(ns); !strings.Contains(got, "16001") || strings.Count(got, "\n") != 0 {
					t.Fatalf("%s: UDP redirect after the agent restarted:\n%q", ns.Name, got)
				}
			}
			if n := udpFlows(t, second, vip, 53); n != 0 {
				t.Errorf("%d conntrack entries to %s:53 left after the repair restored the drifted pod's rules", n, vip)
			}
			set(16001)
			set(0)
			for _, ns := range []*testenv.Netns{first, second} {
				if got := rules(ns); got != "" {
					t.Fatalf("%s: UDP redirect left after the set emptied:\n%s", ns.Name, got)
				}
			}
			// A change that did not reach every pod is applied again by the same call (the
			// agent's retry), not taken as done.
			fb.fail.Store(true)
			if err := a.srv.SetUDPRedirects(context.Background(), []capture.UDPRedirect{{VIP: vip, Port: 53, LocalPort: 15177}}); err == nil {
				t.Fatal("SetUDPRedirects with the pods' rules unwritable: no error")
			}
			fb.fail.Store(false)
			set(15177)
			for _, ns := range []*testenv.Netns{first, second} {
				if got := rules(ns); !strings.Contains(got, "15177") {
					t.Fatalf("%s: the retried change is not in the rules:\n%s", ns.Name, got)
				}
			}
			set(0)
			// A persisted set the capture would refuse (an IPv6 VIP, no host IPv6 address) is
			// ignored: the pods' rules still build, and a new pod is added.
			a.stop()
			if err := os.WriteFile(filepath.Join(state, "udp-redirects"), []byte(`[{"VIP":"fd00::24","Port":53,"LocalPort":15999}]`), 0o600); err != nil {
				t.Fatal(err)
			}
			startAgentBackend(t, sock, state, ServerConfig{}, &staticLookup{}, &recordingDataplane{}, nil, tc.backend)
			third := testenv.NewNetns(t)
			if _, err := n.add(t, podRT(third, "ctr-c", "mesh", "c")); err != nil {
				t.Fatalf("ADD with an unusable persisted UDP set: %v", err)
			}
			if got := rules(third); got != "" {
				t.Fatalf("UDP redirect from an unusable persisted set:\n%s", got)
			}
		})
	}
}

// udpFlow creates a conntrack entry in ns of a UDP flow from 10.250.0.9:40000 to vip:port, as a
// pod's socket leaves one, and returns it.
func udpFlow(t *testing.T, ns *testenv.Netns, vip netip.Addr, port uint16) *netlink.ConntrackFlow {
	t.Helper()
	src := net.ParseIP("10.250.0.9").To4()
	f := &netlink.ConntrackFlow{FamilyType: unix.AF_INET, TimeOut: 120,
		Forward: netlink.IPTuple{SrcIP: src, DstIP: vip.AsSlice(), SrcPort: 40000, DstPort: port, Protocol: unix.IPPROTO_UDP},
		Reverse: netlink.IPTuple{SrcIP: vip.AsSlice(), DstIP: src, SrcPort: port, DstPort: 40000, Protocol: unix.IPPROTO_UDP}}
	if err := ns.Do(func() error { return netlink.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, f) }); err != nil {
		t.Fatalf("create a conntrack entry in %s: %v", ns.Name, err)
	}
	if n := udpFlows(t, ns, vip, port); n != 1 {
		t.Fatalf("%d conntrack entries to %s:%d after creating one", n, vip, port)
	}
	return f
}

// udpFlows counts the conntrack entries in ns of UDP flows to vip:port.
func udpFlows(t *testing.T, ns *testenv.Netns, vip netip.Addr, port uint16) int {
	t.Helper()
	var flows []*netlink.ConntrackFlow
	if err := ns.Do(func() (err error) {
		flows, err = netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range flows {
		if f.Forward.Protocol == unix.IPPROTO_UDP && f.Forward.DstIP.Equal(vip.AsSlice()) && f.Forward.DstPort == port {
			n++
		}
	}
	return n
}

// toggleBackend is a capture backend whose Apply fails while fail is set.
type toggleBackend struct {
	capture.Backend
	fail atomic.Bool
}

func (b *toggleBackend) Apply(netnsPath string, rs capture.RuleSet) (bool, error) {
	if b.fail.Load() {
		return false, errors.New("rules unwritable (test)")
	}
	return b.Backend.Apply(netnsPath, rs)
}
