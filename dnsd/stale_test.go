package dnsd

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// modalUpstream is an upstream stub whose behaviour the test switches: "ok1" and "ok2" answer
// A 192.0.2.1 and 192.0.2.2 with TTL 10 (NXDOMAIN with SOA TTL and MINIMUM 60 for names
// starting with "nx."), "ttl0" answers A 192.0.2.3 with TTL 0, "servfail" answers SERVFAIL
// (a failure to the forwarder), and "slow" waits for release before answering as "ok2".
type modalUpstream struct {
	*stub
	mode    atomic.Value // string
	mu      sync.Mutex
	release chan struct{}
}

func startModalUpstream(t testing.TB) *modalUpstream {
	t.Helper()
	u := &modalUpstream{release: make(chan struct{})}
	u.mode.Store("ok1")
	u.stub = startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
		mode := u.mode.Load().(string)
		if mode == "slow" {
			u.mu.Lock()
			ch := u.release
			u.mu.Unlock()
			<-ch
			mode = "ok2"
		}
		nx := strings.HasPrefix(strings.ToLower(r.Question[0].Name), "nx.")
		switch {
		case mode == "servfail":
			reply(dns.RcodeServerFailure, nil, nil, nil, nil)(w, r)
		case nx:
			reply(dns.RcodeNameError, nil, []string{soa(60, 60)}, nil, nil)(w, r)
		case mode == "ttl0":
			reply(dns.RcodeSuccess, []string{"%s 0 IN A 192.0.2.3"}, nil, nil, nil)(w, r)
		case mode == "ok2":
			reply(dns.RcodeSuccess, []string{"%s 10 IN A 192.0.2.2"}, nil, nil, nil)(w, r)
		default:
			reply(dns.RcodeSuccess, []string{"%s 10 IN A 192.0.2.1"}, nil, nil, nil)(w, r)
		}
	})
	t.Cleanup(u.unblock)
	return u
}

// unblock answers every query waiting in "slow" mode (and the later ones).
func (u *modalUpstream) unblock() {
	u.mu.Lock()
	defer u.mu.Unlock()
	select {
	case <-u.release:
	default:
		close(u.release)
	}
}

// summary is an answer in short: the rcode, then each answer and authority record as
// address/TTL (SOA/TTL for an SOA).
func summary(m *dns.Msg) string {
	s := dns.RcodeToString[m.Rcode]
	for _, rr := range append(append([]dns.RR(nil), m.Answer...), m.Ns...) {
		switch rr := rr.(type) {
		case *dns.A:
			s += fmt.Sprintf(" %s/%d", rr.A, rr.Hdr.Ttl)
		default:
			s += fmt.Sprintf(" %s/%d", dns.TypeToString[rr.Header().Rrtype], rr.Header().Ttl)
		}
	}
	return s
}

// fakeTimer is the client response timer in tests: it records the durations asked for and
// fires at once while fire is set, never otherwise; or, when manual is set, when the test sends
// on manual (an unbuffered send returns once the waiting query has taken it).
type fakeTimer struct {
	mu     sync.Mutex
	asked  []time.Duration
	fire   atomic.Bool
	manual chan time.Time
}

func (f *fakeTimer) after(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	f.asked = append(f.asked, d)
	f.mu.Unlock()
	if f.manual != nil {
		return f.manual
	}
	if !f.fire.Load() {
		return nil
	}
	ch := make(chan time.Time, 1)
	ch <- time.Time{}
	return ch
}

// waitFor polls cond every millisecond until it holds, failing t after a generous deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// edeCodes returns the INFO-CODEs of the Extended DNS Error options (RFC 8914) in m's OPT, and
// whether m has an OPT at all.
func edeCodes(m *dns.Msg) (codes []uint16, hasOPT bool) {
	opt := m.IsEdns0()
	if opt == nil {
		return nil, false
	}
	for _, o := range opt.Option {
		if e, ok := o.(*dns.EDNS0_EDE); ok {
			codes = append(codes, e.InfoCode)
		}
	}
	return codes, true
}

// checkEDE checks the OPT of m, the answer to a query with an OPT (edns) or without: with one,
// an OPT whose Extended DNS Errors are want (none when want is nil); without, no OPT at all
// (RFC 6891 section 7: an OPT only in answer to one).
func checkEDE(t *testing.T, what string, m *dns.Msg, edns bool, want ...uint16) {
	t.Helper()
	codes, hasOPT := edeCodes(m)
	switch {
	case !edns && hasOPT:
		t.Errorf("%s: answer to a query without EDNS has an OPT: %v", what, m.IsEdns0())
	case edns && !hasOPT:
		t.Errorf("%s: answer to an EDNS query has no OPT", what)
	case edns && !slices.Equal(codes, want):
		t.Errorf("%s: Extended DNS Errors %v, want %v", what, codes, want)
	}
}

// TestServeStaleRules: serve-stale (RFC 8767) step by step on a fake clock, with the maximum
// stale age 60 s. Each step moves the clock, sets the upstream's behaviour, asks (UDP, through
// ServeDNS) and checks the answer, whether the query reached the upstream, and which stale
// reason was counted. Answers are "rcode address/TTL ..." (summary); the upstream's TTL is 10 s.
// Every case runs with queries without EDNS and with an OPT: a stale answer to the latter
// carries the Extended DNS Error "Stale Answer" (3), or "Stale NXDOMAIN Answer" (19) for an
// NXDOMAIN (RFC 8914 sections 4.4, 4.20), a SERVFAIL because the upstream failed "No Reachable
// Authority" (22, section 4.23), any other answer none; an answer to the former has no OPT.
func TestServeStaleRules(t *testing.T) {
	type step = serveStaleStep
	for _, tc := range []struct {
		name  string
		qname string
		off   bool // serve-stale off (the default)
		steps []step
	}{
		{name: "stale answer with TTL 30 when the upstream fails", steps: []step{
			{mode: "ok1", want: "NOERROR 192.0.2.1/10", sent: true},
			{advance: 9 * time.Second, mode: "servfail", want: "NOERROR 192.0.2.1/1"},
			{advance: time.Second, mode: "servfail", want: "NOERROR 192.0.2.1/30", sent: true, stale: "failed"},
		}},
		{name: "off by default", off: true, steps: []step{
			{mode: "ok1", want: "NOERROR 192.0.2.1/10", sent: true},
			{advance: 10 * time.Second, mode: "servfail", want: "SERVFAIL", sent: true},
		}},
		{name: "not past the maximum stale age", steps: []step{
			{mode: "ok1", want: "NOERROR 192.0.2.1/10", sent: true},
			{advance: 69*time.Second + 999*time.Millisecond, mode: "servfail", want: "NOERROR 192.0.2.1/30", sent: true, stale: "failed"},
			{advance: time.Millisecond, mode: "servfail", want: "SERVFAIL", sent: true},
		}},
		{name: "fresh answer when the upstream answers", steps: []step{
			{mode: "ok1", want: "NOERROR 192.0.2.1/10", sent: true},
			{advance: 10 * time.Second, mode: "ok2", want: "NOERROR 192.0.2.2/10", sent: true},
			{advance: time.Second, mode: "servfail", want: "NOERROR 192.0.2.2/9"},
		}},
		{name: "failure recheck: 30 s of stale answers without asking", steps: []step{
			{mode: "ok1", want: "NOERROR 192.0.2.1/10", sent: true},
			{advance: 10 * time.Second, mode: "servfail", want: "NOERROR 192.0.2.1/30", sent: true, stale: "failed"},
			{advance: 29 * time.Second, mode: "ok2", want: "NOERROR 192.0.2.1/30", stale: "recheck"},
			{advance: time.Second, mode: "ok2", want: "NOERROR 192.0.2.2/10", sent: true},
		}},
		{name: "client response timer: stale answer, the refresh refills", steps: []step{
			{mode: "ok1", want: "NOERROR 192.0.2.1/10", sent: true},
			{advance: 10 * time.Second, mode: "slow", want: "NOERROR 192.0.2.1/30", sent: true, stale: "slow"},
			{mode: "servfail", want: "NOERROR 192.0.2.2/10"},
		}},
		{name: "stale NXDOMAIN: TTL at most the max negative TTL", qname: "nx.example.", steps: []step{
			{mode: "ok1", want: "NXDOMAIN SOA/60", sent: true},
			{advance: 5 * time.Second, mode: "servfail", want: "NXDOMAIN SOA/5", sent: true, stale: "failed"},
		}},
		{name: "an answer not cached replaces the stale entry", steps: []step{
			{mode: "ok1", want: "NOERROR 192.0.2.1/10", sent: true},
			{advance: 10 * time.Second, mode: "ttl0", want: "NOERROR 192.0.2.3/0", sent: true},
			{mode: "servfail", want: "SERVFAIL", sent: true},
		}},
	} {
		for _, edns := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/EDNS %v", tc.name, edns), func(t *testing.T) {
				serveStaleSteps(t, tc.qname, tc.off, edns, tc.steps)
			})
		}
	}
}

// serveStaleStep is one step of TestServeStaleRules.
type serveStaleStep struct {
	advance time.Duration
	mode    string // the upstream's (modalUpstream)
	want    string
	sent    bool   // the query reached the upstream
	stale   string // the stale reason counted ("": no stale answer)
}

// serveStaleSteps runs the steps of a TestServeStaleRules case for name (default www.example.),
// serve-stale off or on (60 s), with queries with an OPT (edns) or without.
func serveStaleSteps(t *testing.T, name string, off, edns bool, steps []serveStaleStep) {
	up := startModalUpstream(t)
	clk, timer := &fakeClock{}, &fakeTimer{}
	o := CacheOptions{Size: 100, ServeStale: 60 * time.Second, after: timer.after}
	if off {
		o = CacheOptions{Size: 100}
	}
	res, reg := cachingResolverWith(t, up.addr, o, clk)
	if name == "" {
		name = "www.example."
	}
	var edit func(*dns.Msg)
	if edns {
		edit = func(m *dns.Msg) { m.SetEdns0(1232, false) }
	}
	for i, s := range steps {
		clk.advance(s.advance)
		up.mode.Store(s.mode)
		timer.fire.Store(s.mode == "slow")
		before := up.queries.Load()
		stale := map[string]float64{}
		for _, r := range staleReasonNames {
			stale[r] = metricSum(t, reg, MetricCacheStaleAnswers, map[string]string{"reason": r})
		}
		m, _ := serve(t, res, query(name, dns.TypeA, edit), false)
		if got := summary(m); got != s.want {
			t.Errorf("step %d: answer %q, want %q", i, got, s.want)
		}
		var ede []uint16
		switch {
		case s.stale != "" && m.Rcode == dns.RcodeNameError:
			ede = []uint16{dns.ExtendedErrorCodeStaleNXDOMAINAnswer}
		case s.stale != "":
			ede = []uint16{dns.ExtendedErrorCodeStaleAnswer}
		case m.Rcode == dns.RcodeServerFailure:
			ede = []uint16{dns.ExtendedErrorCodeNoReachableAuthority}
		}
		checkEDE(t, fmt.Sprintf("step %d", i), m, edns, ede...)
		if s.mode == "slow" {
			// The stale answer may come before the refresh reaches the upstream.
			waitFor(t, "the refresh to reach the upstream", func() bool { return up.queries.Load() > before })
		}
		if sent := up.queries.Load() > before; sent != s.sent {
			t.Errorf("step %d: sent upstream %v, want %v", i, sent, s.sent)
		}
		for _, r := range staleReasonNames {
			want := stale[r]
			if r == s.stale {
				want++
			}
			if got := metricSum(t, reg, MetricCacheStaleAnswers, map[string]string{"reason": r}); got != want {
				t.Errorf("step %d: %s{reason=%s} = %v, want %v", i, MetricCacheStaleAnswers, r, got, want)
			}
		}
		if s.mode == "slow" {
			// The client has its stale answer; the refresh goes on and refills the cache.
			up.unblock()
			waitFor(t, "the refresh to refill the cache", func() bool {
				k, _ := cacheKey(query(name, dns.TypeA, nil))
				e, _ := res.cache.get(k)
				return e != nil
			})
		}
	}
	timer.mu.Lock()
	defer timer.mu.Unlock()
	for _, d := range timer.asked {
		if d != 1800*time.Millisecond {
			t.Errorf("client response timer of %s, want 1.8s (RFC 8767 section 5)", d)
		}
	}
	if off != (len(timer.asked) == 0) {
		t.Errorf("client response timer started %d times; want none with serve-stale off, some with it on", len(timer.asked))
	}
}

// TestServeStaleNotPastMaxAge: an entry is never answered stale past the maximum stale age (60
// s; TTL 10 s, so until 70 s), even when the query came within it and waited for the client
// response timer: the age is checked when the stale answer would be sent. With the upstream slow,
// a query at 68 s whose timer fires 1.8 s later (69.8 s) gets the stale answer; one at 69 s whose
// timer fires at 70.8 s waits for the upstream and gets its answer.
func TestServeStaleNotPastMaxAge(t *testing.T) {
	for _, tc := range []struct {
		at    time.Duration
		want  string
		stale float64 // answers counted as "slow"
	}{
		{at: 68 * time.Second, want: "NOERROR 192.0.2.1/30", stale: 1},
		{at: 69 * time.Second, want: "NOERROR 192.0.2.2/10"},
	} {
		t.Run(tc.at.String(), func(t *testing.T) {
			up := startModalUpstream(t)
			clk, timer := &fakeClock{}, &fakeTimer{manual: make(chan time.Time)}
			res, reg := cachingResolverWith(t, up.addr, CacheOptions{Size: 100, ServeStale: 60 * time.Second, after: timer.after}, clk)
			const name = "www.example."
			if m, _ := serve(t, res, query(name, dns.TypeA, nil), false); summary(m) != "NOERROR 192.0.2.1/10" {
				t.Fatalf("first answer %s", summary(m))
			}
			up.mode.Store("slow")
			clk.advance(tc.at)
			done := serveAsync(res, query(name, dns.TypeA, nil))
			waitFor(t, "the refresh to reach the upstream", func() bool { return up.queries.Load() == 2 })
			clk.advance(ClientResponseTimer)
			timer.manual <- time.Time{} // the client response timer fires, the upstream still silent
			if tc.stale != 0 {
				if m := <-done; summary(m) != tc.want {
					t.Errorf("answer at the timer: %s, want %s", summary(m), tc.want)
				}
				up.unblock()
			} else {
				up.unblock()
				if m := <-done; summary(m) != tc.want {
					t.Errorf("answer: %s, want the upstream's %s (not the entry past its maximum stale age)", summary(m), tc.want)
				}
			}
			if got := metricSum(t, reg, MetricCacheStaleAnswers, nil); got != tc.stale {
				t.Errorf("%s = %v, want %v", MetricCacheStaleAnswers, got, tc.stale)
			}
		})
	}
}

// TestServeStaleHoldsTheSameEntries: serve-stale stores and evicts nothing differently: after
// the same queries (names filling a cache of 3, expiry, stale answers while the upstream fails
// for one name, new names evicting), the cache holds the same keys in the same LRU order with
// serve-stale on as with it off.
func TestServeStaleHoldsTheSameEntries(t *testing.T) {
	var keys [2][]string
	var stale [2]float64
	for i, o := range []CacheOptions{{Size: 3}, {Size: 3, ServeStale: time.Hour}} {
		clk := &fakeClock{}
		// Every name is first cached; then "down." names fail.
		var downFails atomic.Bool
		upstream := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
			if downFails.Load() && strings.HasPrefix(r.Question[0].Name, "down.") {
				reply(dns.RcodeServerFailure, nil, nil, nil, nil)(w, r)
				return
			}
			reply(dns.RcodeSuccess, []string{"%s 10 IN A 192.0.2.1"}, nil, nil, nil)(w, r)
		})
		res, reg := cachingResolverWith(t, upstream.addr, o, clk)
		ask := func(names ...string) {
			for _, n := range names {
				serve(t, res, query(n, dns.TypeA, nil), false)
			}
		}
		ask("down.a.example.", "b.example.", "c.example.")
		clk.advance(11 * time.Second)
		downFails.Store(true)
		ask("down.a.example.", "down.a.example.", "d.example.", "c.example.")
		clk.advance(40 * time.Second)
		ask("down.a.example.", "e.example.")
		keys[i] = res.cache.lru.Keys()
		stale[i] = metricSum(t, reg, MetricCacheStaleAnswers, nil)
	}
	if !slices.Equal(keys[0], keys[1]) {
		t.Errorf("entries (oldest first) with serve-stale off %q, on %q; want the same", keys[0], keys[1])
	}
	if stale[0] != 0 || stale[1] != 3 {
		t.Errorf("stale answers off %v, on %v; want 0 and 3 (the queries for down.a.example. after expiry)", stale[0], stale[1])
	}
}

// TestPrefetch: an entry hit at least N times (--dns-cache-prefetch) is refreshed in the
// background by the hit that finds less than a tenth of its lifetime left (TTL 10 s: from 9 s
// on), so the query at 10 s, when it would have expired, is still a hit, with the refreshed
// answer. Each case hits the entry at the given times after it was stored, through ServeDNS or
// the UDP fast path (answerWire).
func TestPrefetch(t *testing.T) {
	for _, tc := range []struct {
		name     string
		n        int             // CacheOptions.Prefetch
		hits     []time.Duration // after the entry was stored
		wire     bool            // hits through the fast path
		prefetch bool
	}{
		{name: "at the threshold", n: 3, hits: []time.Duration{0, time.Second, 9 * time.Second}, prefetch: true},
		{name: "at the threshold, fast path", n: 3, hits: []time.Duration{0, time.Second, 9 * time.Second}, wire: true, prefetch: true},
		{name: "below the threshold", n: 3, hits: []time.Duration{0, 9 * time.Second}},
		{name: "before the last tenth", n: 1, hits: []time.Duration{0, 8*time.Second + 999*time.Millisecond}},
		{name: "hits counted before the last tenth", n: 2, hits: []time.Duration{time.Second, 9 * time.Second}, prefetch: true},
		{name: "off by default", hits: []time.Duration{0, time.Second, 9 * time.Second, 9500 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startModalUpstream(t)
			clk := &fakeClock{}
			res, reg := cachingResolverWith(t, up.addr, CacheOptions{Size: 100, Prefetch: tc.n}, clk)
			const name = "popular.example."
			if m, _ := serve(t, res, query(name, dns.TypeA, nil), false); summary(m) != "NOERROR 192.0.2.1/10" {
				t.Fatalf("first answer %v", m)
			}
			up.mode.Store("ok2")
			at := time.Duration(0)
			for i, h := range tc.hits {
				clk.advance(h - at)
				at = h
				want := fmt.Sprintf("NOERROR 192.0.2.1/%d", 10-int(h/time.Second))
				if tc.wire {
					b, ok := res.answerWire(nil, packedQuery(t, name, dns.TypeA, nil), shopPod)
					m := new(dns.Msg)
					if !ok || m.Unpack(b) != nil || summary(m) != want {
						t.Fatalf("hit %d at %s: fast path %v %v, want %s", i, h, ok, m, want)
					}
					continue
				}
				if m, _ := serve(t, res, query(name, dns.TypeA, nil), false); summary(m) != want {
					t.Fatalf("hit %d at %s: %s, want %s", i, h, summary(m), want)
				}
			}
			want, sent := "NOERROR 192.0.2.1/0", int64(1)
			if tc.prefetch {
				want, sent = "NOERROR 192.0.2.2/10", 2
				waitFor(t, "the prefetch to refresh the entry", func() bool {
					k, _ := cacheKey(query(name, dns.TypeA, nil))
					e, _ := res.cache.get(k)
					return e != nil && e.stored == clk.now()
				})
				want = fmt.Sprintf("NOERROR 192.0.2.2/%d", 10-int((10*time.Second-at)/time.Second))
			}
			if n := up.queries.Load(); n != sent {
				t.Errorf("upstream got %d queries before the entry's expiry, want %d", n, sent)
			}
			if got := metricSum(t, reg, MetricCachePrefetches, nil); got != float64(sent-1) {
				t.Errorf("%s = %v, want %v", MetricCachePrefetches, got, sent-1)
			}
			clk.advance(10*time.Second - at)
			before := up.queries.Load()
			m, _ := serve(t, res, query(name, dns.TypeA, nil), false)
			if tc.prefetch && (summary(m) != want || up.queries.Load() != before) {
				t.Errorf("at 10 s: %s (sent upstream: %v), want the prefetched %s from the cache", summary(m), up.queries.Load() != before, want)
			}
			if !tc.prefetch && up.queries.Load() == before {
				t.Errorf("at 10 s: answered from the cache, want a miss (no prefetch)")
			}
		})
	}
}

// TestPrefetchOnceInFlight: with the upstream slow, the prefetch stays in flight; more hits in
// the entry's last tenth start no other prefetch, and a client query that misses once the
// entry has expired joins the prefetch's flight instead of sending its own query: one upstream
// query in all after the first.
func TestPrefetchOnceInFlight(t *testing.T) {
	up := startModalUpstream(t)
	clk := &fakeClock{}
	res, reg := cachingResolverWith(t, up.addr, CacheOptions{Size: 100, Prefetch: 1}, clk)
	const name = "popular.example."
	serve(t, res, query(name, dns.TypeA, nil), false)
	up.mode.Store("slow")
	clk.advance(9 * time.Second)
	for range 5 {
		serve(t, res, query(name, dns.TypeA, nil), false)
		if _, ok := res.answerWire(nil, packedQuery(t, name, dns.TypeA, nil), shopPod); !ok {
			t.Fatal("fast path did not answer the hit")
		}
	}
	waitFor(t, "the prefetch to reach the upstream", func() bool { return up.queries.Load() == 2 })
	clk.advance(time.Second)
	done := serveAsync(res, query(name, dns.TypeA, nil))
	waitFor(t, "the expired query's miss", func() bool { return metricSum(t, reg, MetricCacheMisses, nil) == 2 })
	time.Sleep(100 * time.Millisecond) // let it join the flight
	up.unblock()
	if m := <-done; summary(m) != "NOERROR 192.0.2.2/10" {
		t.Errorf("query after expiry: %s, want the prefetched answer", summary(m))
	}
	if n := up.queries.Load(); n != 2 {
		t.Errorf("upstream got %d queries, want 2 (the first and one prefetch)", n)
	}
	if got := metricSum(t, reg, MetricCachePrefetches, nil); got != 1 {
		t.Errorf("%s = %v, want 1", MetricCachePrefetches, got)
	}
}

// TestPrefetchBudget: prefetches take at most an eighth of the forward limit (16 here: 2).
// With the upstream silent for the popular names, 16 entries entering their last tenth together
// start 2 prefetches, which wait on the upstream, and skip the other 14 (counted); a client
// query missing the cache meanwhile is still forwarded and answered, not refused by the
// forward limit.
func TestPrefetchBudget(t *testing.T) {
	var hold atomic.Bool
	var held atomic.Int64
	release := make(chan struct{})
	answer := reply(dns.RcodeSuccess, []string{"%s 10 IN A 192.0.2.1"}, nil, nil, nil)
	up := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
		if hold.Load() && strings.HasPrefix(r.Question[0].Name, "pop") {
			held.Add(1)
			<-release // silent until the test ends
			reply(dns.RcodeServerFailure, nil, nil, nil, nil)(w, r)
			return
		}
		answer(w, r)
	})
	t.Cleanup(func() { close(release) }) // before the stub's shutdown (cleanups run last first)
	clk := &fakeClock{}
	const limit, popular = 16, 16
	res, reg := resolverWith(t, up.addr, ForwarderOptions{Timeout: time.Minute}, ResolverOptions{MaxForwards: limit,
		Cache: CacheOptions{Size: 100, Prefetch: 1}}, clk)
	name := func(i int) string { return fmt.Sprintf("pop%d.example.", i) }
	for i := range popular {
		if m, _ := serve(t, res, query(name(i), dns.TypeA, nil), false); summary(m) != "NOERROR 192.0.2.1/10" {
			t.Fatalf("%s: %s", name(i), summary(m))
		}
	}
	hold.Store(true)
	clk.advance(9 * time.Second) // every entry in its last tenth
	for i := range popular {
		if m, _ := serve(t, res, query(name(i), dns.TypeA, nil), false); summary(m) != "NOERROR 192.0.2.1/1" {
			t.Fatalf("%s in its last tenth: %s, want a hit", name(i), summary(m))
		}
	}
	started := metricSum(t, reg, MetricCachePrefetches, nil)
	waitFor(t, "every prefetch started to wait on the upstream", func() bool { return float64(held.Load()) == started })

	if m, _ := serve(t, res, query("miss.example.", dns.TypeA, nil), false); summary(m) != "NOERROR 192.0.2.1/10" {
		t.Errorf("client miss with %v prefetches waiting: %s, want the upstream's answer", started, summary(m))
	}
	if q := up.lastQuery(); q == nil || q.Question[0].Name != "miss.example." {
		t.Errorf("last query at the upstream: %v, want the client miss", q.Question)
	}
	budget := limit / prefetchShare
	if started != float64(budget) {
		t.Errorf("%s = %v, want %d (an eighth of the forward limit)", MetricCachePrefetches, started, budget)
	}
	if got := metricSum(t, reg, MetricCachePrefetchesSkipped, nil); got != float64(popular-budget) {
		t.Errorf("%s = %v, want %d", MetricCachePrefetchesSkipped, got, popular-budget)
	}
}

// TestPrefetchRetriesAfterBudget: a prefetch skipped because the budget (an eighth of a forward
// limit of 16: 2) was taken is tried again by a later hit that qualifies. With the upstream silent
// for the popular names, 16 entries in their last tenth start 2 prefetches and skip 14; once
// those 2 are answered, hits on the 14 start 2 more (still within the budget) and skip the other
// 12; hits on an entry whose prefetch is in flight start none (one per key); and at the entries'
// expiry the 4 prefetched ones are hits while the others miss.
func TestPrefetchRetriesAfterBudget(t *testing.T) {
	var hold atomic.Bool
	var held atomic.Int64
	var release atomic.Pointer[chan struct{}]
	newRelease := func() chan struct{} { ch := make(chan struct{}); release.Store(&ch); return ch }
	first := newRelease()
	up := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
		if hold.Load() && strings.HasPrefix(r.Question[0].Name, "pop") {
			held.Add(1)
			<-*release.Load()
			reply(dns.RcodeSuccess, []string{"%s 10 IN A 192.0.2.2"}, nil, nil, nil)(w, r)
			return
		}
		reply(dns.RcodeSuccess, []string{"%s 10 IN A 192.0.2.1"}, nil, nil, nil)(w, r)
	})
	t.Cleanup(func() { close(*release.Load()) }) // before the stub's shutdown
	clk := &fakeClock{}
	const limit, popular = 16, 16
	res, reg := resolverWith(t, up.addr, ForwarderOptions{Timeout: time.Minute}, ResolverOptions{MaxForwards: limit,
		Cache: CacheOptions{Size: 100, Prefetch: 1}}, clk)
	budget := limit / prefetchShare
	name := func(i int) string { return fmt.Sprintf("pop%d.example.", i) }
	hitAll := func(when string) {
		t.Helper()
		for i := range popular {
			m, _ := serve(t, res, query(name(i), dns.TypeA, nil), false)
			if m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
				t.Fatalf("%s: %s: %s, want a hit", when, name(i), summary(m))
			}
		}
	}
	// counts checks the prefetches started and skipped so far, and waits for every started one
	// to be held by the upstream.
	counts := func(when string, started, skipped int) {
		t.Helper()
		if got := metricSum(t, reg, MetricCachePrefetches, nil); got != float64(started) {
			t.Errorf("%s: %s = %v, want %d", when, MetricCachePrefetches, got, started)
		}
		if got := metricSum(t, reg, MetricCachePrefetchesSkipped, nil); got != float64(skipped) {
			t.Errorf("%s: %s = %v, want %d", when, MetricCachePrefetchesSkipped, got, skipped)
		}
		waitFor(t, when+": the prefetches to wait on the upstream", func() bool {
			return held.Load() == int64(metricSum(t, reg, MetricCachePrefetches, nil))
		})
	}
	for i := range popular {
		serve(t, res, query(name(i), dns.TypeA, nil), false)
	}
	hold.Store(true)
	clk.advance(9 * time.Second) // every entry in its last tenth
	hitAll("last tenth")
	counts("first hits", budget, popular-budget)

	// Hits while the budget is taken, within prefetchRetry of the skips: nothing is tried.
	clk.advance(prefetchRetry - time.Millisecond)
	hitAll("within the retry time")
	counts("within the retry time", budget, popular-budget)

	// Hits while the budget is taken, prefetchRetry after the skips: each skips again; none
	// starts a second prefetch of an entry whose prefetch is in flight.
	clk.advance(time.Millisecond)
	hitAll("budget taken")
	counts("budget taken", budget, 2*(popular-budget))

	// The first prefetches are answered: the budget is free, and the skipped entries try again
	// once prefetchRetry has passed since their last skip.
	newRelease()
	close(first)
	waitFor(t, "the first prefetches to end", func() bool { return len(res.cache.prefetchSlots) == 0 })
	hitAll("budget free, within the retry time")
	counts("budget free, within the retry time", budget, 2*(popular-budget))
	clk.advance(prefetchRetry)
	hitAll("budget free")
	started := 2 * budget
	skipped := 2*(popular-budget) + (popular - 2*budget)
	counts("budget free", started, skipped)
	if n := up.queries.Load(); n != int64(popular+started) {
		t.Errorf("upstream got %d queries, want %d (the first answers and the prefetches)", n, popular+started)
	}

	close(*release.Load())
	newRelease()
	waitFor(t, "the second prefetches to end", func() bool { return len(res.cache.prefetchSlots) == 0 })
	hold.Store(false)
	clk.advance(time.Second) // the first entries' expiry
	hits := metricSum(t, reg, MetricCacheHits, nil)
	hitAll("expiry")
	if got := metricSum(t, reg, MetricCacheHits, nil) - hits; got != float64(started) {
		t.Errorf("at the first entries' expiry: %v hits, want %d (the prefetched entries)", got, started)
	}
}

// TestPrefetchQuery: the query a prefetch sends carries the key's name, type, class and DO, CD
// and AD bits, with RD and an OPT.
func TestPrefetchQuery(t *testing.T) {
	for _, edit := range []func(*dns.Msg){
		nil,
		func(m *dns.Msg) { m.SetEdns0(4096, true) },
		func(m *dns.Msg) { m.CheckingDisabled, m.AuthenticatedData = true, true },
		func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS },
	} {
		req := query("Mixed.Example.", dns.TypeAAAA, edit)
		k, ok := cacheKey(req)
		if !ok {
			t.Fatal("not cacheable")
		}
		q := prefetchQuery(k)
		if back, _ := cacheKey(q); back != k || !q.RecursionDesired || q.IsEdns0() == nil {
			t.Errorf("prefetch query %v: key %q, want %q, RD and an OPT", q, back, k)
		}
	}
}

// TestServeStaleThroughSockets: through the server's UDP and TCP sockets and a real upstream on
// loopback, with serve-stale on (1 h): an expired name whose upstream is slow is answered at the
// client response timer from the stale entry (TTL 30) and the refresh then refills the cache
// with the upstream's new answer; once the upstream is stopped, an expired name is answered
// from the stale entry (TTL 30) instead of SERVFAIL. A stale answer to a query with an OPT
// carries the Extended DNS Error "Stale Answer" (3), or "Stale NXDOMAIN Answer" (19) for an
// NXDOMAIN, and one to a query without has no OPT; a name never cached gets SERVFAIL with "No
// Reachable Authority" (22) (RFC 8914 sections 4.4, 4.20, 4.23).
func TestServeStaleThroughSockets(t *testing.T) {
	var addr atomic.Value
	addr.Store("192.0.2.1")
	var slow atomic.Bool
	release := make(chan struct{})
	pc, l, err := listenBoth("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var queries atomic.Int64
	mux := dns.NewServeMux()
	mux.HandleFunc(".", func(w dns.ResponseWriter, r *dns.Msg) {
		queries.Add(1)
		if slow.Load() {
			<-release
		}
		if strings.HasPrefix(r.Question[0].Name, "nx.") {
			reply(dns.RcodeNameError, nil, []string{soa(60, 60)}, nil, nil)(w, r)
			return
		}
		reply(dns.RcodeSuccess, []string{"%s 10 IN A " + addr.Load().(string)}, nil, nil, nil)(w, r)
	})
	var servers []*dns.Server
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: mux}, {Listener: l, Handler: mux}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { _ = srv.ActivateAndServe() }()
		<-started
		servers = append(servers, srv)
	}
	stop := func() {
		for _, srv := range servers {
			_ = srv.Shutdown()
		}
	}
	t.Cleanup(stop)
	clk := &fakeClock{}
	r := startResolverModel(t, []string{pc.LocalAddr().String()}, ForwarderOptions{Timeout: 10 * time.Second}, ServerConfig{},
		ResolverOptions{Cache: CacheOptions{Size: 100, ServeStale: time.Hour, clock: clk.now}}, testMesh())
	nets := []string{"udp", "tcp"}
	name := func(netw string) string { return "www." + netw + ".example." }
	edns := func(m *dns.Msg) { m.SetEdns0(1232, false) }
	for _, netw := range nets {
		if m := ask(t, r.addr, netw, name(netw), dns.TypeA, nil); summary(m) != "NOERROR 192.0.2.1/10" {
			t.Fatalf("%s: first answer %s", netw, summary(m))
		}
		if m := ask(t, r.addr, netw, "nx."+name(netw), dns.TypeA, edns); summary(m) != "NXDOMAIN SOA/60" {
			t.Fatalf("%s: first answer for nx.: %s", netw, summary(m))
		}
	}

	// Slow upstream: stale answer at the client response timer, then the refresh refills.
	slow.Store(true)
	addr.Store("192.0.2.2")
	clk.advance(10 * time.Second)
	for _, netw := range nets {
		before := queries.Load()
		m := ask(t, r.addr, netw, name(netw), dns.TypeA, nil)
		if summary(m) != "NOERROR 192.0.2.1/30" {
			t.Errorf("%s, slow upstream: %s, want the stale 192.0.2.1 with TTL 30", netw, summary(m))
		}
		checkEDE(t, netw+", slow upstream", m, false)
		if queries.Load() == before {
			t.Errorf("%s, slow upstream: no refresh sent", netw)
		}
	}
	close(release)
	slow.Store(false)
	for _, netw := range nets {
		waitFor(t, netw+" refresh to refill the cache", func() bool {
			k, _ := cacheKey(query(name(netw), dns.TypeA, nil))
			e, _ := r.res.cache.get(k)
			return e != nil
		})
		before := queries.Load()
		if m := ask(t, r.addr, netw, name(netw), dns.TypeA, nil); summary(m) != "NOERROR 192.0.2.2/10" || queries.Load() != before {
			t.Errorf("%s after the refresh: %s (sent upstream %v), want the refreshed 192.0.2.2 from the cache", netw, summary(m), queries.Load() != before)
		}
	}

	// Stopped upstream: stale answer instead of SERVFAIL.
	stop()
	clk.advance(10 * time.Second)
	for _, netw := range nets {
		// The refresh fails ("failed"); the same name asked again with an OPT within the
		// failure recheck timer is answered stale at once ("recheck").
		m := ask(t, r.addr, netw, name(netw), dns.TypeA, nil)
		if summary(m) != "NOERROR 192.0.2.2/30" {
			t.Errorf("%s, upstream stopped: %s, want the stale 192.0.2.2 with TTL 30", netw, summary(m))
		}
		checkEDE(t, netw+", upstream stopped", m, false)
		m = ask(t, r.addr, netw, name(netw), dns.TypeA, edns)
		if summary(m) != "NOERROR 192.0.2.2/30" {
			t.Errorf("%s, upstream stopped, EDNS: %s, want the stale 192.0.2.2 with TTL 30", netw, summary(m))
		}
		checkEDE(t, netw+", upstream stopped, EDNS", m, true, dns.ExtendedErrorCodeStaleAnswer)
		m = ask(t, r.addr, netw, "nx."+name(netw), dns.TypeA, edns)
		if summary(m) != "NXDOMAIN SOA/5" {
			t.Errorf("%s, upstream stopped, nx.: %s, want the stale NXDOMAIN with TTL 5", netw, summary(m))
		}
		checkEDE(t, netw+", upstream stopped, nx.", m, true, dns.ExtendedErrorCodeStaleNXDOMAINAnswer)
		for _, edit := range []func(*dns.Msg){nil, edns} {
			m = ask(t, r.addr, netw, "never."+netw+".example.", dns.TypeA, edit)
			if m.Rcode != dns.RcodeServerFailure {
				t.Errorf("%s, upstream stopped, name never cached: %s, want SERVFAIL", netw, summary(m))
			}
			checkEDE(t, netw+", upstream stopped, name never cached", m, edit != nil, dns.ExtendedErrorCodeNoReachableAuthority)
		}
	}
	for reason, want := range map[string]float64{"slow": 2, "failed": 4, "recheck": 2} {
		if got := metricSum(t, r.reg, MetricCacheStaleAnswers, map[string]string{"reason": reason}); got != want {
			t.Errorf("%s{reason=%s} = %v, want %v", MetricCacheStaleAnswers, reason, got, want)
		}
	}
	if got := metricSum(t, r.reg, MetricDuration, map[string]string{"path": "stale"}); got != 8 {
		t.Errorf("%s{path=stale} = %v, want 8", MetricDuration, got)
	}
}
