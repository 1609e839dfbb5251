package dnsd

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// fakeClock is the cache's clock in tests: monotonic nanoseconds that move only when told.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() int64              { return c.ns.Load() }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// cachingResolver is a resolver over the test mesh forwarding to upstream, with a cache of size
// entries on clock clk, and the registry of its metrics.
func cachingResolver(t testing.TB, upstream string, size int, clk *fakeClock) (*Resolver, *prometheus.Registry) {
	t.Helper()
	return cachingResolverWith(t, upstream, CacheOptions{Size: size}, clk)
}

// cachingResolverWith is cachingResolver with cache options o (its clock set here).
func cachingResolverWith(t testing.TB, upstream string, o CacheOptions, clk *fakeClock) (*Resolver, *prometheus.Registry) {
	t.Helper()
	return resolverWith(t, upstream, ForwarderOptions{Timeout: 5 * time.Second}, ResolverOptions{Cache: o}, clk)
}

// resolverWith is a resolver with the mesh of testMesh forwarding to upstream with fo, built with
// ro (its Registerer a new registry, returned; its cache on clk), closed at the test's end.
func resolverWith(t testing.TB, upstream string, fo ForwarderOptions, ro ResolverOptions, clk *fakeClock) (*Resolver, *prometheus.Registry) {
	t.Helper()
	fwd, err := NewForwarder([]string{upstream}, fo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })
	reg := prometheus.NewRegistry()
	ro.Registerer = reg
	ro.Cache.clock = clk.now
	res, err := NewResolver(fwd, ro)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Update(testMesh()); err != nil {
		t.Fatal(err)
	}
	return res, reg
}

// serveAsync runs req through ServeDNS (UDP) in a goroutine and delivers the answer, unpacked
// (empty when it does not unpack), on the returned channel.
func serveAsync(res *Resolver, req *dns.Msg) <-chan *dns.Msg {
	done := make(chan *dns.Msg, 1)
	go func() {
		w := &captureWriter{}
		res.ServeDNS(w, req)
		m := new(dns.Msg)
		_ = m.Unpack(w.out)
		done <- m
	}()
	return done
}

// serve runs req through ServeDNS (UDP, or TCP) and returns the answer unpacked and in wire
// form.
func serve(t testing.TB, res *Resolver, req *dns.Msg, tcp bool) (*dns.Msg, []byte) {
	t.Helper()
	w := &captureWriter{tcp: tcp}
	res.ServeDNS(w, req)
	m := new(dns.Msg)
	if err := m.Unpack(w.out); err != nil {
		t.Fatalf("answer to %s does not unpack: %v", qname(req), err)
	}
	return m, w.out
}

func mustRR(s string) dns.RR {
	rr, err := dns.NewRR(s)
	if err != nil {
		panic(err)
	}
	return rr
}

// reply returns an upstream handler answering every query with rcode and the records of the
// given sections (presentation form, "%s" standing for the question name), and an OPT when the
// query had one.
func reply(rcode int, answer, ns, extra []string, edit func(*dns.Msg)) func(w dns.ResponseWriter, r *dns.Msg) {
	return func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetRcode(r, rcode)
		m.RecursionAvailable = true
		name := r.Question[0].Name
		for _, s := range answer {
			m.Answer = append(m.Answer, mustRR(strings.ReplaceAll(s, "%s", name)))
		}
		for _, s := range ns {
			m.Ns = append(m.Ns, mustRR(strings.ReplaceAll(s, "%s", name)))
		}
		for _, s := range extra {
			m.Extra = append(m.Extra, mustRR(strings.ReplaceAll(s, "%s", name)))
		}
		if opt := r.IsEdns0(); opt != nil {
			m.SetEdns0(opt.UDPSize(), opt.Do())
		}
		if edit != nil {
			edit(m)
		}
		_ = w.WriteMsg(m)
	}
}

// soa is an SOA record of example. with the given TTL and MINIMUM.
func soa(ttl, minimum int) string {
	return fmt.Sprintf("example. %d IN SOA ns.example. host.example. 1 7200 1800 86400 %d", ttl, minimum)
}

// TestCacheRules: which forwarded answers are cached, and for how long (CacheOptions defaults:
// max TTL 30 s, max negative TTL 5 s). Each case asks twice at once (a second upstream query
// means not cached), then just before the lifetime ends (still a hit) and at its end (a miss).
func TestCacheRules(t *testing.T) {
	for _, tc := range []struct {
		name  string
		qtype uint16
		edit  func(*dns.Msg) // of the query
		up    func(w dns.ResponseWriter, r *dns.Msg)
		life  time.Duration // 0: not cached
	}{
		{name: "positive: smallest TTL of answer and authority", up: reply(dns.RcodeSuccess,
			[]string{"%s 20 IN A 192.0.2.1", "%s 25 IN A 192.0.2.2"}, []string{"example. 12 IN NS ns.example."}, nil, nil), life: 12 * time.Second},
		{name: "positive: additional records do not count", up: reply(dns.RcodeSuccess,
			[]string{"%s 20 IN A 192.0.2.1"}, nil, []string{"ns.example. 1 IN A 192.0.2.53"}, nil), life: 20 * time.Second},
		{name: "positive: OPT does not count", edit: func(m *dns.Msg) { m.SetEdns0(1232, false) }, up: reply(dns.RcodeSuccess,
			[]string{"%s 20 IN A 192.0.2.1"}, nil, nil, nil), life: 20 * time.Second},
		{name: "positive: capped by max TTL", up: reply(dns.RcodeSuccess,
			[]string{"%s 3600 IN A 192.0.2.1"}, nil, nil, nil), life: DefaultCacheMaxTTL},
		{name: "positive: CNAME chain counts", up: reply(dns.RcodeSuccess,
			[]string{"%s 4 IN CNAME target.example.", "target.example. 20 IN A 192.0.2.1"}, nil, nil, nil), life: 4 * time.Second},
		{name: "NXDOMAIN: SOA MINIMUM below SOA TTL", up: reply(dns.RcodeNameError, nil, []string{soa(60, 3)}, nil, nil), life: 3 * time.Second},
		{name: "NXDOMAIN: SOA TTL below MINIMUM", up: reply(dns.RcodeNameError, nil, []string{soa(2, 60)}, nil, nil), life: 2 * time.Second},
		{name: "NXDOMAIN: capped by max negative TTL", up: reply(dns.RcodeNameError, nil, []string{soa(60, 60)}, nil, nil), life: DefaultCacheMaxNegativeTTL},
		{name: "NODATA: SOA rules", qtype: dns.TypeAAAA, up: reply(dns.RcodeSuccess, nil, []string{soa(30, 4)}, nil, nil), life: 4 * time.Second},
		{name: "NODATA after a CNAME: SOA rules", up: reply(dns.RcodeSuccess,
			[]string{"%s 20 IN CNAME target.example."}, []string{soa(30, 3)}, nil, nil), life: 3 * time.Second},
		{name: "NXDOMAIN without SOA", up: reply(dns.RcodeNameError, nil, nil, nil, nil)},
		{name: "NODATA without SOA (referral)", up: reply(dns.RcodeSuccess, nil, []string{"example. 300 IN NS ns.example."}, nil, nil)},
		{name: "TTL 0", up: reply(dns.RcodeSuccess, []string{"%s 0 IN A 192.0.2.1"}, nil, nil, nil)},
		{name: "TTL 0 in authority", up: reply(dns.RcodeSuccess, []string{"%s 20 IN A 192.0.2.1"}, []string{"example. 0 IN NS ns.example."}, nil, nil)},
		{name: "negative, SOA MINIMUM 0", up: reply(dns.RcodeNameError, nil, []string{soa(60, 0)}, nil, nil)},
		{name: "SERVFAIL", up: reply(dns.RcodeServerFailure, nil, nil, nil, nil)},
		{name: "REFUSED", up: reply(dns.RcodeRefused, nil, nil, nil, nil)},
		{name: "FORMERR", up: reply(dns.RcodeFormatError, nil, nil, nil, nil)},
		{name: "NOTIMP", up: reply(dns.RcodeNotImplemented, nil, []string{soa(60, 60)}, nil, nil)},
		{name: "truncated (TC)", up: reply(dns.RcodeSuccess, []string{"%s 20 IN A 192.0.2.1"}, nil, nil,
			func(m *dns.Msg) { m.Truncated = true })},
		{name: "longer than maxCacheEntry", up: reply(dns.RcodeSuccess,
			[]string{"%s 20 IN TXT \"" + strings.Repeat("x", 250) + "\"" + strings.Repeat(" \""+strings.Repeat("y", 250)+"\"", 17)}, nil, nil, nil),
			edit: func(m *dns.Msg) { m.SetEdns0(8192, false) }},
		{name: "query with EDNS Client Subnet", edit: func(m *dns.Msg) {
			m.SetEdns0(1232, false)
			o := m.IsEdns0()
			o.Option = append(o.Option, &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(198, 51, 100, 0).To4()})
		}, up: reply(dns.RcodeSuccess, []string{"%s 20 IN A 192.0.2.1"}, nil, nil, nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startStub(t, tc.up)
			clk := &fakeClock{}
			res, _ := cachingResolver(t, up.addr, 100, clk)
			qtype := tc.qtype
			if qtype == 0 {
				qtype = dns.TypeA
			}
			// sent asks and reports whether the query reached the upstream (the forwarder
			// retries a failing one, so it may get more than one).
			sent := func() bool {
				before := up.queries.Load()
				serve(t, res, query("www.example.", qtype, tc.edit), false)
				return up.queries.Load() > before
			}
			if !sent() {
				t.Fatal("first query did not reach the upstream")
			}
			if tc.life == 0 {
				if !sent() {
					t.Error("second query answered from the cache, want it sent upstream (not cached)")
				}
				return
			}
			if sent() {
				t.Fatal("second query sent upstream, want it answered from the cache")
			}
			clk.advance(tc.life - time.Millisecond)
			if sent() {
				t.Errorf("query just before the lifetime (%s) ends sent upstream, want a hit", tc.life)
			}
			clk.advance(time.Millisecond)
			if !sent() {
				t.Errorf("query at the end of the lifetime (%s) answered from the cache, want it sent upstream", tc.life)
			}
		})
	}
}

// TestCacheKey: the key is the lower-cased name, type, class and the DO, CD and AD bits; RD and
// the EDNS UDP size are not in it.
func TestCacheKey(t *testing.T) {
	up := startStub(t, reply(dns.RcodeSuccess, []string{"%s 20 IN A 192.0.2.1"}, []string{soa(30, 30)}, nil, nil))
	res, _ := cachingResolver(t, up.addr, 100, &fakeClock{})
	for i, c := range []struct {
		name  string
		qtype uint16
		edit  func(*dns.Msg)
		new   bool // a new key: sent upstream
	}{
		{"www.example.", dns.TypeA, nil, true},
		{"WWW.Example.", dns.TypeA, nil, false},
		{"www.example.", dns.TypeA, func(m *dns.Msg) { m.RecursionDesired = false }, false},
		{"www.example.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(4096, false) }, false},
		{"www.example.", dns.TypeAAAA, nil, true},
		{"www.example.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(1232, true) }, true},
		{"www.example.", dns.TypeA, func(m *dns.Msg) { m.CheckingDisabled = true }, true},
		{"www.example.", dns.TypeA, func(m *dns.Msg) { m.AuthenticatedData = true }, true},
		{"www.example.", dns.TypeA, func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS }, true},
		{"www.example.", dns.TypeA, func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS }, false},
		{"other.example.", dns.TypeA, nil, true},
	} {
		before := up.queries.Load()
		serve(t, res, query(c.name, c.qtype, c.edit), false)
		if sent := up.queries.Load() > before; sent != c.new {
			t.Errorf("query %d (%s %s): sent upstream %v, want %v", i, c.name, dns.TypeToString[c.qtype], sent, c.new)
		}
	}
	for _, c := range []struct {
		name string
		edit func(*dns.Msg)
	}{
		{"opcode NOTIFY", func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify }},
		{"opcode UPDATE", func(m *dns.Msg) { m.Opcode = dns.OpcodeUpdate }},
		{"a response", func(m *dns.Msg) { m.Response = true }},
		{"two questions", func(m *dns.Msg) { m.Question = append(m.Question, m.Question[0]) }},
		{"two OPT records", func(m *dns.Msg) { m.SetEdns0(1232, false); m.Extra = append(m.Extra, m.Extra[0]) }},
		{"TSIG", func(m *dns.Msg) { m.SetTsig("key.", dns.HmacSHA256, 300, 0) }},
		{"EDNS version 1", func(m *dns.Msg) { m.SetEdns0(1232, false); m.IsEdns0().SetVersion(1) }},
	} {
		if k, ok := cacheKey(query("www.example.", dns.TypeA, c.edit)); ok {
			t.Errorf("%s: cached under %q, want not cached", c.name, k)
		}
	}
}

// TestCacheHitAnswer: a hit carries the client's ID, RD and question (its letter case, RFC 4343
// / 0x20), the upstream's flags (RA, AA) and rcode, every TTL less the entry's age (never below
// 0), and an OPT only when the client sent one (ours: UDP size 1232, DO copied, none of the
// upstream's options such as its cookie). The UDP fast path gives the same bytes as ServeDNS.
func TestCacheHitAnswer(t *testing.T) {
	up := startStub(t, reply(dns.RcodeSuccess, []string{"%s 20 IN A 192.0.2.1"}, []string{"example. 25 IN NS ns.example."},
		[]string{"ns.example. 2 IN A 192.0.2.53"}, func(m *dns.Msg) {
			if o := m.IsEdns0(); o != nil {
				o.Option = append(o.Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef0123456789abcdef"})
			}
		}))
	clk := &fakeClock{}
	res, reg := cachingResolver(t, up.addr, 100, clk)
	cookie := func(m *dns.Msg) {
		m.SetEdns0(1232, false)
		o := m.IsEdns0()
		o.Option = append(o.Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef"})
	}
	first, _ := serve(t, res, query("ext.example.", dns.TypeA, cookie), false)
	if first.Rcode != dns.RcodeSuccess || len(first.Answer) != 1 || first.IsEdns0() == nil || len(first.IsEdns0().Option) != 1 {
		t.Fatalf("first answer (from the upstream, as it gave it) = %v", first)
	}
	clk.advance(3500 * time.Millisecond)
	for _, c := range []struct {
		name string
		edit func(*dns.Msg)
		opt  bool
		fast bool // the UDP fast path takes it
	}{
		{"no EDNS", nil, false, true},
		{"RD clear", func(m *dns.Msg) { m.RecursionDesired = false }, false, true},
		{"EDNS without options", func(m *dns.Msg) { m.SetEdns0(1400, false) }, true, true},
		{"EDNS with a cookie", cookie, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := query("ExT.eXample.", dns.TypeA, func(m *dns.Msg) {
				m.Id = 4242
				if c.edit != nil {
					c.edit(m)
				}
			})
			got, wire := serve(t, res, req, false)
			if got.Id != 4242 || got.Question[0].Name != "ExT.eXample." || got.RecursionDesired != req.RecursionDesired ||
				!got.RecursionAvailable || got.Authoritative || got.Rcode != dns.RcodeSuccess || got.Truncated {
				t.Errorf("header or question = %v", got)
			}
			var ttls []uint32
			for _, rr := range append(append(got.Answer, got.Ns...), got.Extra...) {
				if rr.Header().Rrtype != dns.TypeOPT {
					ttls = append(ttls, rr.Header().Ttl)
				}
			}
			if fmt.Sprint(ttls) != "[17 22 0]" {
				t.Errorf("TTLs (answer, authority, additional) = %v, want [17 22 0] (20, 25 and 2 less 3 s)", ttls)
			}
			opt := got.IsEdns0()
			if (opt != nil) != c.opt || opt != nil && (opt.UDPSize() != ednsUDPSize || opt.Do() || len(opt.Option) != 0) {
				t.Errorf("OPT = %v, want one: %v (size %d, no options)", opt, c.opt, ednsUDPSize)
			}
			q, err := req.Pack()
			if err != nil {
				t.Fatal(err)
			}
			fast, ok := res.answerWire(nil, q, shopPod)
			if ok != c.fast {
				t.Fatalf("fast path answered %v, want %v", ok, c.fast)
			}
			if ok && !bytes.Equal(fast, wire) {
				t.Errorf("fast path answer differs from ServeDNS's:\nfast % x\nslow % x", fast, wire)
			}
		})
	}
	if n := up.queries.Load(); n != 1 {
		t.Errorf("upstream got %d queries, want 1", n)
	}
	// Hits: one per ServeDNS above and one per fast path answer (3).
	if got := metricSum(t, reg, MetricCacheHits, nil); got != 7 {
		t.Errorf("%s = %v, want 7", MetricCacheHits, got)
	}
	if got := metricSum(t, reg, MetricDuration, map[string]string{"path": "cache"}); got != 7 {
		t.Errorf("%s{path=cache} = %v, want 7", MetricDuration, got)
	}
	clk.advance(20 * time.Second)
	if _, ok := res.answerWire(nil, packedQuery(t, "ext.example.", dns.TypeA, nil), shopPod); ok {
		t.Errorf("fast path answered from an expired entry")
	}
}

// TestCacheHitTruncates: a cached answer longer than the client's UDP size is truncated as the
// forwarded path truncates (TC set, within the size); TCP gets it whole.
func TestCacheHitTruncates(t *testing.T) {
	up := startStub(t, answerA(60))
	res, _ := cachingResolver(t, up.addr, 100, &fakeClock{})
	if m, _ := serve(t, res, query("big.example.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(4096, false) }), false); len(m.Answer) != 60 || m.Truncated {
		t.Fatalf("first answer: %d records, TC %v", len(m.Answer), m.Truncated)
	}
	m, wire := serve(t, res, query("big.example.", dns.TypeA, nil), false)
	if !m.Truncated || len(m.Answer) >= 60 || len(wire) > dns.MinMsgSize || m.IsEdns0() != nil {
		t.Errorf("UDP 512 hit: TC %v, %d records, %d bytes, OPT %v; want TC, fewer records, at most 512 bytes, no OPT", m.Truncated, len(m.Answer), len(wire), m.IsEdns0())
	}
	if _, ok := res.answerWire(nil, packedQuery(t, "big.example.", dns.TypeA, nil), shopPod); ok {
		t.Errorf("fast path answered a hit that needs truncation")
	}
	m, wire = serve(t, res, query("big.example.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(700, false) }), false)
	if !m.Truncated || len(wire) > 700 || m.IsEdns0() == nil {
		t.Errorf("UDP 700 hit: TC %v, %d bytes, OPT %v", m.Truncated, len(wire), m.IsEdns0())
	}
	m, _ = serve(t, res, query("big.example.", dns.TypeA, nil), true)
	if m.Truncated || len(m.Answer) != 60 {
		t.Errorf("TCP hit: TC %v, %d records, want all 60", m.Truncated, len(m.Answer))
	}
	if n := up.queries.Load(); n != 1 {
		t.Errorf("upstream got %d queries, want 1", n)
	}
}

// TestCacheCoalesces: identical queries in flight at once (same key and transport, any letter
// case) go upstream once, and each gets its own ID and question; for an answer that is not
// cached (TTL 0) as well, where the others get the upstream's answer without its OPT options.
func TestCacheCoalesces(t *testing.T) {
	for _, ttl := range []int{20, 0} {
		t.Run(fmt.Sprintf("TTL %d", ttl), func(t *testing.T) {
			release := make(chan struct{})
			answer := reply(dns.RcodeSuccess, []string{fmt.Sprintf("%%s %d IN A 192.0.2.1", ttl)}, nil, nil, func(m *dns.Msg) {
				if o := m.IsEdns0(); o != nil {
					o.Option = append(o.Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef0123456789abcdef"})
				}
			})
			up := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) { <-release; answer(w, r) })
			res, reg := cachingResolver(t, up.addr, 100, &fakeClock{})
			const n = 10
			var wg sync.WaitGroup
			got := make([]*dns.Msg, n)
			names := make([]string, n)
			for i := range n {
				names[i] = "same.example."
				if i%2 == 1 {
					names[i] = "SAME.Example."
				}
				wg.Go(func() {
					got[i], _ = serve(t, res, query(names[i], dns.TypeA, func(m *dns.Msg) { m.Id = uint16(100 + i); m.SetEdns0(1232, false) }), false)
				})
			}
			// Every query has missed the cache and the first is upstream; give the others time
			// to join it (they are past the miss count, a few instructions from the flight).
			deadline := time.Now().Add(30 * time.Second)
			for metricSum(t, reg, MetricCacheMisses, nil) < n || up.queries.Load() < 1 {
				if time.Now().After(deadline) {
					t.Fatalf("misses %v, upstream queries %d", metricSum(t, reg, MetricCacheMisses, nil), up.queries.Load())
				}
				time.Sleep(time.Millisecond)
			}
			time.Sleep(200 * time.Millisecond)
			close(release)
			wg.Wait()
			// With TTL 20 a query that joined late (after the first flight) finds the entry:
			// one upstream query whatever the scheduling. With TTL 0 it would be sent again.
			q := up.queries.Load()
			if ttl > 0 && q != 1 || q < 1 || q >= n {
				t.Errorf("upstream got %d queries for %d identical queries in flight, want 1 (TTL 0: fewer than %d)", q, n, n)
			}
			cookies := 0
			for i, m := range got {
				if m.Id != uint16(100+i) || m.Question[0].Name != names[i] || len(m.Answer) != 1 || m.IsEdns0() == nil {
					t.Errorf("answer %d = %v", i, m)
				}
				if len(m.IsEdns0().Option) > 0 {
					cookies++
				}
			}
			if cookies != int(q) {
				t.Errorf("%d answers carry the upstream's cookie, want %d (the queries sent upstream)", cookies, q)
			}
		})
	}
}

// TestCacheCoalescesQuestionlessRefusal: identical EDNS queries in flight at once, coalesced on
// one upstream query that a real upstream socket answers with a FORMERR or NOTIMP without a
// question (miekg/dns's SetRcodeFormatError, as CoreDNS and kube-dns write it). Every client gets
// the rcode with its own ID and question, and an OPT exactly when the upstream sent one: the
// client whose query went upstream and those that joined it alike, so that each EDNS client
// asks again without EDNS when the upstream refused it (RFC 6891 section 7).
func TestCacheCoalescesQuestionlessRefusal(t *testing.T) {
	for _, rcode := range []int{dns.RcodeFormatError, dns.RcodeNotImplemented} {
		for _, upstreamOPT := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, upstream OPT %v", dns.RcodeToString[rcode], upstreamOPT), func(t *testing.T) {
				release := make(chan struct{})
				up := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
					<-release
					m := new(dns.Msg)
					m.SetRcodeFormatError(r) // no question
					m.Rcode = rcode
					if upstreamOPT {
						m.SetEdns0(4096, false)
					}
					_ = w.WriteMsg(m)
				})
				res, reg := cachingResolver(t, up.addr, 100, &fakeClock{})
				const n = 4
				var wg sync.WaitGroup
				got := make([]*dns.Msg, n)
				for i := range n {
					wg.Go(func() {
						got[i], _ = serve(t, res, query("refused.example.", dns.TypeA, func(m *dns.Msg) { m.Id = uint16(100 + i); m.SetEdns0(1232, false) }), false)
					})
				}
				// Every query has missed the cache and the first is upstream; give the others
				// time to join it.
				waitFor(t, "every query to miss and one to reach the upstream", func() bool {
					return metricSum(t, reg, MetricCacheMisses, nil) == n && up.queries.Load() >= 1
				})
				time.Sleep(200 * time.Millisecond)
				close(release)
				wg.Wait()
				if q := up.queries.Load(); q >= n {
					t.Fatalf("upstream got %d queries for %d identical queries in flight: none coalesced", q, n)
				}
				for i, m := range got {
					if m.Id != uint16(100+i) || m.Rcode != rcode || len(m.Question) != 1 || m.Question[0].Name != "refused.example." {
						t.Errorf("answer %d = %v, want %s with its ID and question", i, m, dns.RcodeToString[rcode])
					}
					if (m.IsEdns0() != nil) != upstreamOPT {
						t.Errorf("answer %d has an OPT: %v; want one only when the upstream sent one (%v)", i, m.IsEdns0() != nil, upstreamOPT)
					}
				}
				if got := metricSum(t, reg, MetricUpstreamFailures, nil); got != 0 {
					t.Errorf("upstream failures = %v, want 0", got)
				}
			})
		}
	}
}

// TestCacheEvictsAndCounts: a full cache evicts its least recently used entry; the metrics count
// hits, misses, entries and evictions.
func TestCacheEvictsAndCounts(t *testing.T) {
	up := startStub(t, answerA(1))
	res, reg := cachingResolver(t, up.addr, 2, &fakeClock{})
	for _, name := range []string{"a.example.", "b.example.", "a.example.", "c.example.", "a.example.", "b.example."} {
		serve(t, res, query(name, dns.TypeA, nil), false)
	}
	// a, b miss; a hits; c misses and evicts b (a was used since); a hits; b misses, evicts c.
	for _, c := range []struct {
		metric string
		want   float64
	}{
		{MetricCacheHits, 2}, {MetricCacheMisses, 4}, {MetricCacheEvictions, 2}, {MetricCacheEntries, 2},
	} {
		if got := metricSum(t, reg, c.metric, nil); got != c.want {
			t.Errorf("%s = %v, want %v", c.metric, got, c.want)
		}
	}
	if n := up.queries.Load(); n != 4 {
		t.Errorf("upstream got %d queries, want 4", n)
	}
}

// TestCacheOptions: bad options are errors naming the field and value; Size 0 is no cache.
func TestCacheOptions(t *testing.T) {
	for _, c := range []struct {
		o    CacheOptions
		want string
	}{
		{CacheOptions{Size: -1}, "Size -1"},
		{CacheOptions{Size: 10, MaxTTL: 1500 * time.Millisecond}, "MaxTTL 1.5s"},
		{CacheOptions{Size: 10, MaxNegativeTTL: -time.Second}, "MaxNegativeTTL -1s"},
		{CacheOptions{Size: 10, ServeStale: 1500 * time.Millisecond}, "ServeStale 1.5s"},
		{CacheOptions{Size: 10, ServeStale: -time.Second}, "ServeStale -1s"},
		{CacheOptions{Size: 10, ServeStale: MaxServeStale + time.Second}, "ServeStale 168h0m1s"},
		{CacheOptions{Size: 10, Prefetch: -1}, "Prefetch -1"},
	} {
		if _, err := NewResolver(nil, ResolverOptions{Cache: c.o}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewResolver(%+v) error = %v, want one naming %q", c.o, err, c.want)
		}
	}
	res, err := NewResolver(nil, ResolverOptions{})
	if err != nil || res.cache != nil {
		t.Errorf("zero options: cache %v, err %v; want none", res.cache, err)
	}
}

// TestCacheThroughSockets: through the server's UDP (fast path) and TCP sockets, two lookups of
// a forwarded name send one query upstream and the second answer's TTL is lower; an NXDOMAIN is
// cached for min(SOA TTL, MINIMUM) (3 s here, under the 5 s cap); SERVFAIL is not cached; a
// changed upstream answer is seen once the TTL has passed.
func TestCacheThroughSockets(t *testing.T) {
	var addr atomic.Value
	addr.Store("192.0.2.1")
	up := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
		name := r.Question[0].Name
		switch {
		case strings.HasPrefix(name, "nx."):
			reply(dns.RcodeNameError, nil, []string{soa(60, 3)}, nil, nil)(w, r)
		case strings.HasPrefix(name, "fail."):
			reply(dns.RcodeServerFailure, nil, nil, nil, nil)(w, r)
		default:
			reply(dns.RcodeSuccess, []string{"%s 10 IN A " + addr.Load().(string)}, nil, nil, nil)(w, r)
		}
	})
	clk := &fakeClock{}
	r := startResolverModel(t, []string{up.addr}, ForwarderOptions{}, ServerConfig{}, ResolverOptions{Cache: CacheOptions{Size: 100, clock: clk.now}}, testMesh())
	for _, netw := range []string{"udp", "tcp"} {
		t.Run(netw, func(t *testing.T) {
			name := "www." + netw + ".example."
			sent := func() int64 { return up.queries.Load() }
			before := sent()
			a := ask(t, r.addr, netw, name, dns.TypeA, nil)
			clk.advance(2 * time.Second)
			b := ask(t, r.addr, netw, strings.ToUpper(name), dns.TypeA, nil)
			if sent()-before != 1 {
				t.Errorf("two lookups sent %d queries upstream, want 1", sent()-before)
			}
			if len(a.Answer) != 1 || len(b.Answer) != 1 || a.Answer[0].Header().Ttl != 10 || b.Answer[0].Header().Ttl != 8 {
				t.Fatalf("answers %v then %v, want TTL 10 then 8", a, b)
			}
			if b.Question[0].Name != strings.ToUpper(name) {
				t.Errorf("second answer's question %q, want the client's %q", b.Question[0].Name, strings.ToUpper(name))
			}

			nx := "nx." + netw + ".example."
			before = sent()
			for _, step := range []time.Duration{0, time.Second, 1999 * time.Millisecond, time.Millisecond} {
				clk.advance(step)
				if m := ask(t, r.addr, netw, nx, dns.TypeA, nil); m.Rcode != dns.RcodeNameError || len(m.Ns) != 1 {
					t.Fatalf("%s: %v", nx, m)
				}
			}
			if sent()-before != 2 {
				t.Errorf("NXDOMAIN lookups at 0, 1, 2.999 and 3 s sent %d queries upstream, want 2 (cached for 3 s)", sent()-before)
			}

			for i := range 2 {
				before = sent()
				if m := ask(t, r.addr, netw, "fail."+netw+".example.", dns.TypeA, nil); m.Rcode != dns.RcodeServerFailure {
					t.Fatalf("fail.: %v", m)
				}
				if sent() == before {
					t.Errorf("SERVFAIL lookup %d sent nothing upstream, want it sent (SERVFAIL is not cached)", i)
				}
			}
		})
	}
	t.Run("changed answer", func(t *testing.T) {
		name := "change.example."
		if m := ask(t, r.addr, "udp", name, dns.TypeA, nil); m.Answer[0].(*dns.A).A.String() != "192.0.2.1" {
			t.Fatalf("first answer %v", m)
		}
		addr.Store("192.0.2.99")
		clk.advance(9 * time.Second)
		if m := ask(t, r.addr, "udp", name, dns.TypeA, nil); m.Answer[0].(*dns.A).A.String() != "192.0.2.1" || m.Answer[0].Header().Ttl != 1 {
			t.Errorf("within the TTL: %v, want the cached 192.0.2.1 with TTL 1", m)
		}
		clk.advance(time.Second)
		if m := ask(t, r.addr, "udp", name, dns.TypeA, nil); m.Answer[0].(*dns.A).A.String() != "192.0.2.99" || m.Answer[0].Header().Ttl != 10 {
			t.Errorf("after the TTL: %v, want the upstream's new 192.0.2.99", m)
		}
	})
	if h := metricSum(t, r.reg, MetricCacheHits, nil); h < 6 {
		t.Errorf("%s = %v, want at least 6", MetricCacheHits, h)
	}
}

// TestCacheHitFastPathDoesNotAllocate: the UDP fast path answers a cache hit without allocating
// (the key is built in the parsed query's buffer, the answer in the reader's), with serve-stale
// and prefetch on too as long as no prefetch starts (the hits are counted in the entry).
func TestCacheHitFastPathDoesNotAllocate(t *testing.T) {
	up := startStub(t, answerA(1))
	for _, o := range []CacheOptions{{Size: 100}, {Size: 100, ServeStale: time.Hour, Prefetch: 1}, {Size: 100, Prefetch: 1 << 30}} {
		res, _ := cachingResolverWith(t, up.addr, o, &fakeClock{})
		serve(t, res, query("ext.example.", dns.TypeA, nil), false)
		q := packedQuery(t, "Ext.Example.", dns.TypeA, nil)
		buf := make([]byte, 0, 1024)
		if _, ok := res.answerWire(buf, q, shopPod); !ok {
			t.Fatal("fast path did not answer the hit")
		}
		if n := testing.AllocsPerRun(1000, func() { res.answerWire(buf, q, shopPod) }); n != 0 {
			t.Errorf("%+v: fast path cache hit: %v allocations per query, want 0", o, n)
		}
	}
}

// cacheKey is appendCacheKey as a string.
func cacheKey(req *dns.Msg) (string, bool) {
	k, ok := appendCacheKey(nil, req)
	return string(k), ok
}
