//go:build (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm) && linux

package capture

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	nft "github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/internal/testenv"
)

// TestPrivilegedBackend runs Backend on loaded maps and real pod netns through one pod's life:
// each step's wanted state is written beside it, and every Apply runs twice (the second changes
// nothing). A forced SetPod failure leaves the pod with the whole nft rule set and no map
// entries (never neither), the next Apply goes back to eBPF, a deleted map entry is drift that
// Apply repairs, Prune forgets pods whose netns is not kept, and Teardown leaves nothing.
func TestPrivilegedBackend(t *testing.T) {
	requireEBPF(t)
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var failNext error
	var fallbacks []string
	b := &Backend{Capture: c, NFT: nft.NFTables{},
		FailSetPod: func(string) error { return failNext },
		OnFallback: func(p string, _ error) { fallbacks = append(fallbacks, p) }}
	pod, other := testenv.NewNetns(t), testenv.NewNetns(t)
	rs, err := nft.Build(nft.Config{PodIPs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}, HostIP: netip.MustParseAddr("10.1.0.1"),
		ClusterDNS: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, ExcludeOutboundPorts: []uint16{7000}, BypassMark: nft.DefaultBypassMark})
	if err != nil {
		t.Fatal(err)
	}
	cookie, err := NetnsCookie(pod.Path)
	if err != nil {
		t.Fatal(err)
	}
	inMaps := func(ck uint64) bool {
		t.Helper()
		pods, err := c.ListPods()
		if err != nil {
			t.Fatal(err)
		}
		_, ok := pods[ck]
		return ok
	}
	ruleText := func(ns *testenv.Netns) string {
		out, _ := ns.Command("nft", "list", "ruleset").CombinedOutput()
		return string(out)
	}
	apply := func(step string, ns *testenv.Netns) {
		t.Helper()
		if _, err := b.Apply(ns.Path, rs); err != nil {
			t.Fatalf("%s: Apply: %v", step, err)
		}
		if changed, err := b.Apply(ns.Path, rs); err != nil || changed {
			t.Fatalf("%s: second Apply = %v, %v; want nothing changed", step, changed, err)
		}
		if err := b.Check(ns.Path, rs); err != nil {
			t.Fatalf("%s: Check after Apply: %v", step, err)
		}
	}
	for _, step := range []struct {
		name string
		fail error
		// wantEBPF: the pod's settings in the maps, no nat redirect or DNAT in its netns;
		// else the whole nft rule set and no map entries.
		wantEBPF      bool
		wantFallbacks int
	}{
		{name: "eBPF", wantEBPF: true},
		// Each Apply tries eBPF again: apply's two calls fall back twice.
		{name: "forced SetPod failure after a settings change: nft", fail: errors.New("forced"), wantFallbacks: 2},
		{name: "SetPod works again: back to eBPF", wantEBPF: true, wantFallbacks: 2},
	} {
		failNext = step.fail
		if step.fail != nil {
			// A change of settings makes Apply call SetPod.
			rs.Config.ExcludeOutboundPorts = []uint16{7000, 7001}
			if rs, err = nft.Build(rs.Config); err != nil {
				t.Fatal(err)
			}
		}
		apply(step.name, pod)
		text := ruleText(pod)
		if got := inMaps(cookie); got != step.wantEBPF {
			t.Errorf("%s: pod in the maps = %v, want %v", step.name, got, step.wantEBPF)
		}
		redirect, dnat := strings.Contains(text, "redirect to :15001"), strings.Contains(text, "dnat")
		if step.wantEBPF && (redirect || dnat) || !step.wantEBPF && !(redirect && dnat) {
			t.Errorf("%s: nat redirect %v, DNAT %v in the pod netns; want both %v:\n%s", step.name, redirect, dnat, !step.wantEBPF, text)
		}
		if !strings.Contains(text, "input_filter") {
			t.Errorf("%s: the filter chains are gone:\n%s", step.name, text)
		}
		if len(fallbacks) != step.wantFallbacks {
			t.Errorf("%s: OnFallback called %d times, want %d", step.name, len(fallbacks), step.wantFallbacks)
		}
	}
	failNext = nil

	// A lost map entry is drift; Apply restores it.
	if err := c.DeletePod(cookie); err != nil {
		t.Fatal(err)
	}
	var drift *nft.DriftError
	if err := b.Check(pod.Path, rs); !errors.As(err, &drift) {
		t.Fatalf("Check with the map entry deleted = %v, want a DriftError", err)
	}
	if changed, err := b.Apply(pod.Path, rs); err != nil || !changed || !inMaps(cookie) {
		t.Fatalf("Apply after the drift = %v, %v (in the maps %v); want it restored", changed, err, inMaps(cookie))
	}

	// Prune keeps the pods it is told to and those applied after since, forgets the rest.
	apply("other pod", other)
	otherCookie, err := NetnsCookie(other.Path)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := b.Prune(time.Now().Add(-time.Hour), []string{pod.Path}); err != nil || n != 0 || !inMaps(otherCookie) {
		t.Fatalf("Prune with the other pod applied after since = %d, %v; want nothing removed", n, err)
	}
	if n, err := b.Prune(time.Now(), []string{pod.Path}); err != nil || n != 1 || inMaps(otherCookie) || !inMaps(cookie) {
		t.Fatalf("Prune keeping the pod = %d, %v (other in the maps %v, pod %v); want the other removed", n, err, inMaps(otherCookie), inMaps(cookie))
	}

	// Retiring (a node back in nft mode): the pod gets the whole nft rule set, its entries go,
	// and Prune retires the programs once no pod is left.
	r := &Backend{Capture: c, NFT: nft.NFTables{}, Retire: true, PinDir: t.TempDir()}
	if _, err := r.Apply(pod.Path, rs); err != nil {
		t.Fatalf("retiring Apply: %v", err)
	}
	if text := ruleText(pod); inMaps(cookie) || !strings.Contains(text, "redirect to :15001") {
		t.Fatalf("after a retiring Apply: in the maps %v, rules:\n%s", inMaps(cookie), text)
	}
	if err := r.Check(pod.Path, rs); err != nil {
		t.Fatalf("retiring Check: %v", err)
	}
	if n, err := r.Prune(time.Now(), []string{pod.Path}); err != nil || n != 0 || r.active() != nil {
		t.Fatalf("retiring Prune = %d, %v (active %v); want the programs retired", n, err, r.active() != nil)
	}
	if c, err = Load(); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b.Capture = c
	if _, err := b.Apply(pod.Path, rs); err != nil || !inMaps(cookie) {
		t.Fatalf("Apply on fresh maps = %v (in the maps %v)", err, inMaps(cookie))
	}

	for i := range 2 {
		if err := b.Teardown(pod.Path); err != nil {
			t.Fatalf("Teardown %d: %v", i+1, err)
		}
	}
	if inMaps(cookie) || strings.Contains(ruleText(pod), "aether") {
		t.Errorf("after Teardown: in the maps %v, rules:\n%s", inMaps(cookie), ruleText(pod))
	}
}
