package dnsd

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// sourceResolver is a resolver over testMesh (local pods shopPod and defaultPod) with policy p,
// its metrics in reg.
func sourceResolver(t *testing.T, p SourcePolicy) (*Resolver, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	res, err := NewResolver(nil, ResolverOptions{Registerer: reg, Sources: p})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Update(testMesh()); err != nil {
		t.Fatal(err)
	}
	return res, reg
}

// rcodeFrom asks web.mesh. A from src through the UDP fast path and through ServeDNS (unpacked)
// and returns both rcodes (-1 when the fast path passed the query on).
func rcodeFrom(t *testing.T, res *Resolver, src netip.Addr) (fast, slow int) {
	t.Helper()
	q := packedQuery(t, "web.mesh.", dns.TypeA, nil)
	fast = -1
	if wire, ok := res.answerWire(nil, q, src); ok {
		var m dns.Msg
		if err := m.Unpack(wire); err != nil {
			t.Fatalf("fast path answer from %v does not unpack: %v", src, err)
		}
		fast = m.Rcode
	}
	w := &captureWriter{from: src}
	res.ServeDNS(w, query("web.mesh.", dns.TypeA, nil))
	var m dns.Msg
	if err := m.Unpack(w.out); err != nil {
		t.Fatalf("ServeDNS answer from %v does not unpack: %v", src, err)
	}
	return fast, m.Rcode
}

// TestSourcePolicyRestrict: with Restrict, the node's loopback, the Allow prefixes and the
// model's local pods get answers on both paths; any other source gets REFUSED, counted by
// reason; without a policy everyone is answered.
func TestSourcePolicyRestrict(t *testing.T) {
	res, reg := sourceResolver(t, SourcePolicy{Restrict: true, Allow: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}})
	for _, tc := range []struct {
		src  netip.Addr
		want int
	}{
		{netip.MustParseAddr("127.0.0.1"), dns.RcodeSuccess},
		{netip.MustParseAddr("::1"), dns.RcodeSuccess},
		{netip.MustParseAddr("192.0.2.7"), dns.RcodeSuccess},
		{shopPod, dns.RcodeSuccess},
		{defaultPod, dns.RcodeSuccess},
		{netip.MustParseAddr("10.244.9.9"), dns.RcodeRefused}, // another node's pod
		{netip.MustParseAddr("198.51.100.1"), dns.RcodeRefused},
	} {
		fast, slow := rcodeFrom(t, res, tc.src)
		if fast != tc.want || slow != tc.want {
			t.Errorf("from %v: fast path %s, ServeDNS %s; want %s on both", tc.src, dns.RcodeToString[fast], dns.RcodeToString[slow], dns.RcodeToString[tc.want])
		}
	}
	if got := metricSum(t, reg, MetricRefused, map[string]string{"reason": "source"}); got != 4 {
		t.Errorf("%s{reason=source} = %v, want 4 (two sources, two paths)", MetricRefused, got)
	}
	if _, err := NewResolver(nil, ResolverOptions{Sources: SourcePolicy{Allow: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}}}); err == nil ||
		!strings.Contains(err.Error(), "sources.allow[0]") {
		t.Errorf("NewResolver with an IPv4-mapped Allow prefix: %v, want an error naming sources.allow[0]", err)
	}
	open, _ := sourceResolver(t, SourcePolicy{})
	if fast, slow := rcodeFrom(t, open, netip.MustParseAddr("198.51.100.1")); fast != dns.RcodeSuccess || slow != dns.RcodeSuccess {
		t.Errorf("no policy: %s / %s, want answers", dns.RcodeToString[fast], dns.RcodeToString[slow])
	}
}

// TestSourcePolicyRateLimit: a source over RateLimit queries in one second is REFUSED (counted,
// reason rate), another source and loopback are not, and the next second admits it again.
func TestSourcePolicyRateLimit(t *testing.T) {
	g := newSourceGate(SourcePolicy{RateLimit: 100})
	now := time.Unix(1_800_000_000, 0)
	a, b := netip.MustParseAddr("10.244.0.5"), netip.MustParseAddr("10.244.0.6")
	for i := 0; i < 100; i++ {
		if g.admit(a, nil, now) != admitted {
			t.Fatalf("query %d of 100 in a second refused", i+1)
		}
	}
	if g.admit(a, nil, now.Add(999*time.Millisecond)) != refusedRate {
		t.Fatal("query 101 in the same second admitted")
	}
	// b shares a's slot only on a hash collision, which these two addresses do not have.
	if g.admit(b, nil, now) != admitted {
		t.Fatal("another source refused")
	}
	for i := 0; i < 1000; i++ {
		if g.admit(netip.MustParseAddr("127.0.0.1"), nil, now) != admitted {
			t.Fatal("loopback rate limited")
		}
	}
	if g.admit(a, nil, now.Add(time.Second)) != admitted {
		t.Fatal("the next second still refuses")
	}
	// Through the resolver: the refusal is REFUSED and counted.
	res, reg := sourceResolver(t, SourcePolicy{RateLimit: 2})
	codes := []int{}
	for i := 0; i < 3; i++ {
		fast, _ := rcodeFrom(t, res, a) // each call asks twice (fast path and ServeDNS)
		codes = append(codes, fast)
	}
	// Six queries at 2/s: whichever second boundary may fall among them, the first is answered
	// and a later fast-path query is refused.
	if codes[0] != dns.RcodeSuccess || (codes[1] != dns.RcodeRefused && codes[2] != dns.RcodeRefused) {
		t.Fatalf("fast-path rcodes with a limit of 2/s = %v, want an answer, then REFUSED", codes)
	}
	if got := metricSum(t, reg, MetricRefused, map[string]string{"reason": "rate"}); got < 1 {
		t.Errorf("%s{reason=rate} = %v, want the refusals counted", MetricRefused, got)
	}
}
