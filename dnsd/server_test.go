package dnsd

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/aethermesh/aether/model"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// stub is an upstream resolver on loopback (UDP and TCP on one port) that answers with fn.
type stub struct {
	addr    string
	queries atomic.Int64
	mu      sync.Mutex
	last    *dns.Msg
}

func startStub(t testing.TB, fn func(w dns.ResponseWriter, r *dns.Msg)) *stub {
	t.Helper()
	pc, l, err := listenBoth("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return startStubOn(t, pc, l, fn)
}

// startStubOn is startStub on sockets the caller opened (inside a network namespace, say).
func startStubOn(t testing.TB, pc net.PacketConn, l net.Listener, fn func(w dns.ResponseWriter, r *dns.Msg)) *stub {
	t.Helper()
	s := &stub{addr: pc.LocalAddr().String()}
	mux := dns.NewServeMux()
	mux.HandleFunc(".", func(w dns.ResponseWriter, r *dns.Msg) {
		s.queries.Add(1)
		s.mu.Lock()
		s.last = r.Copy()
		s.mu.Unlock()
		fn(w, r)
	})
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: mux}, {Listener: l, Handler: mux}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { _ = srv.ActivateAndServe() }()
		<-started
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return s
}

func (s *stub) lastQuery() *dns.Msg {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// answerA answers every A query with addresses 192.0.2.1.. (n records), NXDOMAIN for names
// ending in .svc.cluster.local. (playing kube-dns) and NOERROR/NODATA otherwise.
func answerA(n int) func(w dns.ResponseWriter, r *dns.Msg) {
	return func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		switch {
		case strings.HasSuffix(q.Name, ".cluster.local.") || strings.HasPrefix(q.Name, "nx."):
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA:
			for i := range n {
				m.Answer = append(m.Answer, &dns.A{
					Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
					A:   net.IPv4(192, 0, 2, byte(i+1)),
				})
			}
		}
		if opt := r.IsEdns0(); opt != nil {
			m.SetEdns0(opt.UDPSize(), opt.Do())
		}
		_ = w.WriteMsg(m)
	}
}

type testResolver struct {
	addr string
	reg  *prometheus.Registry
	res  *Resolver
}

func startResolver(t *testing.T, upstreams []string, fo ForwarderOptions) *testResolver {
	t.Helper()
	return startResolverWith(t, upstreams, fo, ServerConfig{})
}

// startResolverWith starts a resolver over the test mesh on a loopback port with sc (its Addr is
// set here), forwarding to upstreams.
func startResolverWith(t *testing.T, upstreams []string, fo ForwarderOptions, sc ServerConfig) *testResolver {
	t.Helper()
	return startResolverModel(t, upstreams, fo, sc, ResolverOptions{}, testMesh())
}

// startResolverModel is startResolverWith with resolver options ro (its Registerer is set here)
// and model m (nil: no Update, the resolver before its first model).
func startResolverModel(t *testing.T, upstreams []string, fo ForwarderOptions, sc ServerConfig, ro ResolverOptions, m *model.Mesh) *testResolver {
	t.Helper()
	fwd, err := NewForwarder(upstreams, fo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })
	reg := prometheus.NewRegistry()
	ro.Registerer = reg
	res, err := NewResolver(fwd, ro)
	if err != nil {
		t.Fatal(err)
	}
	if m != nil {
		if err := res.Update(m); err != nil {
			t.Fatal(err)
		}
	}
	sc.Addr = "127.0.0.1:0"
	srv := NewServer(res, sc)
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	u, tc := srv.Addrs()
	if u.String() != tc.String() {
		t.Fatalf("udp %s and tcp %s differ", u, tc)
	}
	return &testResolver{addr: u.String(), reg: reg, res: res}
}

// query is a question for name and qtype, changed by edit when it is not nil.
func query(name string, qtype uint16, edit func(*dns.Msg)) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if edit != nil {
		edit(m)
	}
	return m
}

// packedQuery is query in wire form; a message that does not pack fails tb.
func packedQuery(tb testing.TB, name string, qtype uint16, edit func(*dns.Msg)) []byte {
	tb.Helper()
	b, err := query(name, qtype, edit).Pack()
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func ask(t *testing.T, addr, net, name string, qtype uint16, edit func(*dns.Msg)) *dns.Msg {
	t.Helper()
	m := query(name, qtype, edit)
	c := &dns.Client{Net: net, Timeout: 20 * time.Second}
	resp, _, err := c.Exchange(m, addr)
	if err != nil && resp == nil {
		t.Fatalf("%s %s %s: %v", net, name, dns.TypeToString[qtype], err)
	}
	return resp
}

// metricSum returns the sum of a counter or gauge family's samples (a histogram's sample
// counts) whose labels include match.
func metricSum(t *testing.T, reg *prometheus.Registry, name string, match map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			for k, v := range match {
				if !hasLabel(m, k, v) {
					continue metric
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k && l.GetValue() == v {
			return true
		}
	}
	return false
}

// TestServerUDPAndTCP: both transports answer mesh names and forward the rest, and the metrics
// count them by type and rcode, with the latency histogram per path.
func TestServerUDPAndTCP(t *testing.T) {
	up := startStub(t, answerA(1))
	r := startResolver(t, []string{up.addr}, ForwarderOptions{})
	for _, netw := range []string{"udp", "tcp"} {
		resp := ask(t, r.addr, netw, "web.mesh.", dns.TypeA, nil)
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != "10.96.0.20" || !resp.Authoritative {
			t.Errorf("%s web.mesh A = %v", netw, resp)
		}
		resp = ask(t, r.addr, netw, "nope.mesh.", dns.TypeA, nil)
		if resp.Rcode != dns.RcodeNameError {
			t.Errorf("%s nope.mesh A rcode = %s", netw, dns.RcodeToString[resp.Rcode])
		}
		resp = ask(t, r.addr, netw, "example.org.", dns.TypeA, nil)
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || resp.Authoritative {
			t.Errorf("%s example.org A (forwarded) = %v", netw, resp)
		}
	}
	if got := metricSum(t, r.reg, MetricQueries, map[string]string{"type": "A", "rcode": "NOERROR"}); got != 4 {
		t.Errorf("%s{type=A,rcode=NOERROR} = %v, want 4", MetricQueries, got)
	}
	if got := metricSum(t, r.reg, MetricQueries, map[string]string{"type": "A", "rcode": "NXDOMAIN"}); got != 2 {
		t.Errorf("%s{type=A,rcode=NXDOMAIN} = %v, want 2", MetricQueries, got)
	}
	if got := metricSum(t, r.reg, MetricDuration, map[string]string{"path": "forward"}); got != 2 {
		t.Errorf("%s{path=forward} count = %v, want 2", MetricDuration, got)
	}
	if got := metricSum(t, r.reg, MetricDuration, map[string]string{"path": "local"}); got != 4 {
		t.Errorf("%s{path=local} count = %v, want 4", MetricDuration, got)
	}
}

// TestForwardKeepsEDNS0Options: the upstream sees the client's EDNS0 options (client subnet,
// cookie, an unknown local option), UDP size and DO bit, and a fresh query ID.
func TestForwardKeepsEDNS0Options(t *testing.T) {
	up := startStub(t, answerA(1))
	r := startResolver(t, []string{up.addr}, ForwarderOptions{})
	resp := ask(t, r.addr, "udp", "example.org.", dns.TypeA, func(m *dns.Msg) {
		m.Id = 777
		m.SetEdns0(1400, true)
		opt := m.IsEdns0()
		opt.Option = append(opt.Option,
			&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(198, 51, 100, 0).To4()},
			&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef"},
			&dns.EDNS0_LOCAL{Code: 65001, Data: []byte("aether")},
		)
	})
	if resp.Id != 777 || resp.Rcode != dns.RcodeSuccess {
		t.Fatalf("answer id=%d rcode=%s", resp.Id, dns.RcodeToString[resp.Rcode])
	}
	got := up.lastQuery()
	if got.Id == 777 {
		t.Errorf("upstream query reused the client's ID")
	}
	opt := got.IsEdns0()
	if opt == nil || opt.UDPSize() != 1400 || !opt.Do() || len(opt.Option) != 3 {
		t.Fatalf("upstream OPT = %v, want size 1400, DO and 3 options", opt)
	}
	if s, ok := opt.Option[0].(*dns.EDNS0_SUBNET); !ok || s.SourceNetmask != 24 || !s.Address.Equal(net.IPv4(198, 51, 100, 0)) {
		t.Errorf("client subnet option = %v", opt.Option[0])
	}
	if c, ok := opt.Option[1].(*dns.EDNS0_COOKIE); !ok || c.Cookie != "0123456789abcdef" {
		t.Errorf("cookie option = %v", opt.Option[1])
	}
	if l, ok := opt.Option[2].(*dns.EDNS0_LOCAL); !ok || l.Code != 65001 || string(l.Data) != "aether" {
		t.Errorf("local option = %v", opt.Option[2])
	}
}

// TestForwardTruncation: a forwarded answer too long for the client's UDP size arrives with TC
// set and within the size; over TCP the whole answer arrives.
func TestForwardTruncation(t *testing.T) {
	up := startStub(t, answerA(60))
	r := startResolver(t, []string{up.addr}, ForwarderOptions{})
	resp := ask(t, r.addr, "udp", "big.example.", dns.TypeA, nil)
	resp.Compress = true
	if !resp.Truncated || len(resp.Answer) >= 60 || resp.Len() > 512 {
		t.Errorf("UDP answer TC=%v records=%d len=%d, want TC, fewer than 60 records, at most 512 bytes", resp.Truncated, len(resp.Answer), resp.Len())
	}
	resp = ask(t, r.addr, "udp", "big.example.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(4096, false) })
	if resp.Truncated || len(resp.Answer) != 60 {
		t.Errorf("UDP EDNS 4096 answer TC=%v records=%d, want all 60", resp.Truncated, len(resp.Answer))
	}
	resp = ask(t, r.addr, "tcp", "big.example.", dns.TypeA, nil)
	if resp.Truncated || len(resp.Answer) != 60 {
		t.Errorf("TCP answer TC=%v records=%d, want all 60", resp.Truncated, len(resp.Answer))
	}
}

// deadAddr returns a loopback UDP address nobody listens on (ICMP port unreachable).
func deadAddr(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := pc.LocalAddr().String()
	pc.Close()
	return a
}

// TestUpstreamFailures covers the upstream down, slow, SERVFAIL, flapping and all-down cases.
func TestUpstreamFailures(t *testing.T) {
	const timeout = 300 * time.Millisecond
	good := func(t *testing.T) *stub { return startStub(t, answerA(1)) }
	t.Run("first upstream down fails over", func(t *testing.T) {
		g := good(t)
		r := startResolver(t, []string{deadAddr(t), g.addr}, ForwarderOptions{Timeout: timeout})
		resp := ask(t, r.addr, "udp", "example.org.", dns.TypeA, nil)
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
			t.Fatalf("answer = %v", resp)
		}
		if got := metricSum(t, r.reg, MetricUpstreamFailures, map[string]string{"reason": "network"}); got != 1 {
			t.Errorf("network failures = %v, want 1", got)
		}
	})
	t.Run("slow upstream times out, fails over, then is demoted", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		slow := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) { <-release })
		g := good(t)
		r := startResolver(t, []string{slow.addr, g.addr}, ForwarderOptions{Timeout: timeout, Backoff: time.Hour})
		for i := range 3 {
			resp := ask(t, r.addr, "udp", "example.org.", dns.TypeA, nil)
			if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
				t.Fatalf("query %d answer = %v", i, resp)
			}
		}
		if n := slow.queries.Load(); n != 1 {
			t.Errorf("slow upstream got %d queries, want 1 (demoted after its timeout)", n)
		}
		if got := metricSum(t, r.reg, MetricUpstreamFailures, map[string]string{"reason": "timeout", "upstream": slow.addr}); got != 1 {
			t.Errorf("timeouts = %v, want 1", got)
		}
	})
	t.Run("SERVFAIL from an upstream fails over", func(t *testing.T) {
		bad := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetRcode(r, dns.RcodeServerFailure)
			_ = w.WriteMsg(m)
		})
		g := good(t)
		r := startResolver(t, []string{bad.addr, g.addr}, ForwarderOptions{Timeout: timeout})
		resp := ask(t, r.addr, "tcp", "example.org.", dns.TypeA, nil)
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
			t.Fatalf("answer = %v", resp)
		}
	})
	t.Run("FORMERR without a question is the answer, not a failure", func(t *testing.T) {
		// miekg/dns's SetRcodeFormatError, as CoreDNS and kube-dns write a FORMERR: no
		// question section. This upstream adds an OPT even to a query without one.
		formerr := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetRcodeFormatError(r)
			m.SetEdns0(1232, false)
			_ = w.WriteMsg(m)
		})
		g := good(t)
		r := startResolver(t, []string{formerr.addr, g.addr}, ForwarderOptions{Timeout: timeout, Backoff: time.Hour})
		for i, netw := range []string{"udp", "tcp", "udp"} {
			resp := ask(t, r.addr, netw, "formerr.example.org.", dns.TypeA, nil)
			if resp.Rcode != dns.RcodeFormatError || len(resp.Question) != 1 || resp.Question[0].Name != "formerr.example.org." {
				t.Fatalf("query %d over %s: answer = %v, want FORMERR with the question", i, netw, resp)
			}
			// RFC 6891 section 7: no OPT in answer to a query without one.
			if resp.IsEdns0() != nil {
				t.Errorf("query %d over %s without EDNS: answer has an OPT: %v", i, netw, resp)
			}
		}
		if resp := ask(t, r.addr, "udp", "formerr.example.org.", dns.TypeA, func(q *dns.Msg) { q.SetEdns0(1232, false) }); resp.Rcode != dns.RcodeFormatError || resp.IsEdns0() == nil {
			t.Errorf("EDNS query: answer = %v, want FORMERR with the upstream's OPT", resp)
		}
		if n := formerr.queries.Load(); n != 4 {
			t.Errorf("upstream giving FORMERR got %d queries, want 4 (never demoted)", n)
		}
		if n := g.queries.Load(); n != 0 {
			t.Errorf("second upstream got %d queries, want 0", n)
		}
		if got := metricSum(t, r.reg, MetricUpstreamFailures, nil); got != 0 {
			t.Errorf("upstream failures = %v, want 0", got)
		}
	})
	t.Run("upstream refusals pass on their Extended DNS Errors", func(t *testing.T) {
		// Validating upstreams that answer SERVFAIL with a reason (RFC 8914): the client gets
		// their codes, each once, instead of 22; a query without EDNS still gets no OPT.
		refuse := func(rcode int, codes ...uint16) *stub {
			return startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
				m := new(dns.Msg)
				m.SetRcode(r, rcode)
				m.SetEdns0(1232, false)
				for _, c := range codes {
					m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_EDE{InfoCode: c, ExtraText: "from upstream"})
				}
				_ = w.WriteMsg(m)
			})
		}
		a := refuse(dns.RcodeServerFailure, dns.ExtendedErrorCodeDNSBogus)
		b := refuse(dns.RcodeRefused, dns.ExtendedErrorCodeDNSBogus, dns.ExtendedErrorCodeDNSKEYMissing)
		r := startResolver(t, []string{a.addr, b.addr}, ForwarderOptions{Timeout: timeout})
		for _, netw := range []string{"udp", "tcp"} {
			m := ask(t, r.addr, netw, "bogus.example.org.", dns.TypeA, func(q *dns.Msg) { q.SetEdns0(1232, true) })
			if m.Rcode != dns.RcodeServerFailure {
				t.Errorf("%s: rcode %s, want SERVFAIL", netw, dns.RcodeToString[m.Rcode])
			}
			checkEDE(t, netw+" refused with reasons", m, true, dns.ExtendedErrorCodeDNSBogus, dns.ExtendedErrorCodeDNSKEYMissing)
			checkEDE(t, netw+" refused with reasons, no EDNS", ask(t, r.addr, netw, "bogus.example.org.", dns.TypeA, nil), false)
		}
		// Refusals without a reason: 22, as when nothing answered.
		c := refuse(dns.RcodeServerFailure)
		r = startResolver(t, []string{c.addr}, ForwarderOptions{Timeout: timeout})
		m := ask(t, r.addr, "udp", "bogus.example.org.", dns.TypeA, func(q *dns.Msg) { q.SetEdns0(1232, false) })
		checkEDE(t, "refused without a reason", m, true, dns.ExtendedErrorCodeNoReachableAuthority)
	})
	t.Run("flapping upstream: every query answered", func(t *testing.T) {
		var n atomic.Int64
		flap := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
			if n.Add(1)%2 == 0 {
				return // drop every other query
			}
			answerA(1)(w, r)
		})
		g := good(t)
		// Backoff shorter than the timeout: the flapping upstream is retried first again soon.
		r := startResolver(t, []string{flap.addr, g.addr}, ForwarderOptions{Timeout: timeout, Backoff: time.Millisecond})
		for i := range 12 {
			resp := ask(t, r.addr, "udp", "example.org.", dns.TypeA, nil)
			if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
				t.Fatalf("query %d answer = %v", i, resp)
			}
			time.Sleep(2 * time.Millisecond)
		}
		if flap.queries.Load() < 6 || g.queries.Load() == 0 {
			t.Errorf("flapping upstream got %d queries, good one %d; want both used", flap.queries.Load(), g.queries.Load())
		}
	})
	t.Run("all upstreams down is SERVFAIL", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		slow := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) { <-release })
		r := startResolver(t, []string{deadAddr(t), slow.addr}, ForwarderOptions{Timeout: timeout})
		// With EDNS the SERVFAIL says why: Extended DNS Error 22, "No Reachable Authority"
		// (RFC 8914 section 4.23); without, it has no OPT (RFC 6891 section 7).
		for _, c := range []struct {
			netw string
			edns bool
		}{{"udp", true}, {"tcp", true}, {"udp", false}} {
			var edit func(*dns.Msg)
			if c.edns {
				edit = func(m *dns.Msg) { m.SetEdns0(1232, false) }
			}
			resp := ask(t, r.addr, c.netw, "example.org.", dns.TypeA, edit)
			if resp.Rcode != dns.RcodeServerFailure {
				t.Errorf("%s answer rcode=%s, want SERVFAIL", c.netw, dns.RcodeToString[resp.Rcode])
			}
			checkEDE(t, fmt.Sprintf("%s, EDNS %v", c.netw, c.edns), resp, c.edns, dns.ExtendedErrorCodeNoReachableAuthority)
		}
		// Mesh names never depend on the upstreams.
		resp := ask(t, r.addr, "udp", "web.mesh.", dns.TypeA, nil)
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
			t.Errorf("web.mesh with upstreams down = %v", resp)
		}
		if got := metricSum(t, r.reg, MetricQueries, map[string]string{"rcode": "SERVFAIL"}); got != 3 {
			t.Errorf("SERVFAIL count = %v, want 3", got)
		}
	})
	t.Run("each upstream is asked once per query", func(t *testing.T) {
		// A failing upstream is demoted by its failure in the first pass; before, the second
		// pass (demoted upstreams) asked it again: two queries to the one upstream, and with a
		// timeout twice the wait before the client's SERVFAIL.
		bad := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetRcode(r, dns.RcodeServerFailure)
			_ = w.WriteMsg(m)
		})
		other := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetRcode(r, dns.RcodeRefused)
			_ = w.WriteMsg(m)
		})
		for _, ups := range [][]*stub{{bad}, {bad, other}} {
			var addrs []string
			before := make([]int64, len(ups))
			for i, u := range ups {
				addrs = append(addrs, u.addr)
				before[i] = u.queries.Load()
			}
			r := startResolver(t, addrs, ForwarderOptions{Timeout: timeout})
			if resp := ask(t, r.addr, "udp", "example.org.", dns.TypeA, nil); resp.Rcode != dns.RcodeServerFailure {
				t.Errorf("%d upstreams failing: rcode %s, want SERVFAIL", len(ups), dns.RcodeToString[resp.Rcode])
			}
			for i, u := range ups {
				if n := u.queries.Load() - before[i]; n != 1 {
					t.Errorf("%d upstreams failing: upstream %d asked %d times for one query, want 1", len(ups), i, n)
				}
			}
		}
	})
	t.Run("clusterset names without ServiceImport: upstream answer, else NXDOMAIN", func(t *testing.T) {
		serving := startStub(t, answerA(1))
		r := startResolver(t, []string{serving.addr}, ForwarderOptions{Timeout: timeout})
		resp := ask(t, r.addr, "udp", "other.ns.svc.clusterset.local.", dns.TypeA, nil)
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
			t.Errorf("served by upstream: %v", resp)
		}
		refusing := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetRcode(r, dns.RcodeRefused)
			_ = w.WriteMsg(m)
		})
		r = startResolver(t, []string{refusing.addr}, ForwarderOptions{Timeout: timeout})
		resp = ask(t, r.addr, "udp", "other.ns.svc.clusterset.local.", dns.TypeA, nil)
		if resp.Rcode != dns.RcodeNameError || len(resp.Ns) != 1 || resp.Ns[0].String() != csSOA() || !resp.Authoritative {
			t.Errorf("no upstream serves clusterset.local: %v", resp)
		}
	})
}

// TestUpdateNeverBlocksLookups swaps indexes while queries run (go test -race checks the swap).
func TestUpdateNeverBlocksLookups(t *testing.T) {
	r := startResolver(t, nil, ForwarderOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for v := uint64(10); ctx.Err() == nil; v++ {
			m := testMesh()
			m.Version = v
			if err := r.res.Update(m); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i := range 200 {
		resp := ask(t, r.addr, "udp", "web.mesh.", dns.TypeA, nil)
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
			t.Fatalf("query %d during updates = %v", i, resp)
		}
	}
	cancel()
	wg.Wait()
}

// TestNewForwarderAddresses: upstreams are bare IP addresses or ip:port; a host name is an
// error naming it.
func TestNewForwarderAddresses(t *testing.T) {
	if _, err := NewForwarder([]string{"10.96.0.10", "[fd00::1]:5353", "127.0.0.1:53"}, ForwarderOptions{}); err != nil {
		t.Errorf("NewForwarder(valid) = %v", err)
	}
	if _, err := NewForwarder([]string{"kube-dns:53"}, ForwarderOptions{}); err == nil || !strings.Contains(err.Error(), "kube-dns") {
		t.Errorf("NewForwarder(hostname) error = %v, want one naming it", err)
	}
}

// TestServerSocketPaths: a socket bound to one address is served without IP_PKTINFO control
// messages (boundUDPConn); a wildcard socket keeps them, so that answers leave from the address
// the query arrived at. Both answer.
func TestServerSocketPaths(t *testing.T) {
	for _, tc := range []struct {
		addr  string
		plain bool
	}{
		{addr: "127.0.0.1:0", plain: true},
		{addr: "0.0.0.0:0", plain: false},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			res, err := NewResolver(nil, ResolverOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := res.Update(testMesh()); err != nil {
				t.Fatal(err)
			}
			srv := NewServer(res, ServerConfig{Addr: tc.addr})
			if err := srv.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer srv.Shutdown(context.Background())
			if _, plain := srv.udp.PacketConn.(boundUDPConn); plain != tc.plain {
				t.Errorf("plain PacketConn = %v, want %v", plain, tc.plain)
			}
			u, _ := srv.Addrs()
			port := u.(*net.UDPAddr).Port
			for _, netw := range []string{"udp", "tcp"} {
				resp := ask(t, net.JoinHostPort("127.0.0.1", fmt.Sprint(port)), netw, "web.mesh.", dns.TypeA, nil)
				if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
					t.Errorf("%s answer = %v", netw, resp)
				}
			}
		})
	}
}

// TestServerAnswersBursts: a burst of UDP queries in flight at once (read in batches by the fast
// path on Linux) mixing fast-path names, slow-path ones (forwarded, REFUSED) and
// garbage gets one correct answer per query: the fast answers byte for byte those of
// Index.Respond, the forwarded ones the upstream's. Over IPv4 and IPv6 loopback.
func TestServerAnswersBursts(t *testing.T) {
	up := startStub(t, answerA(1))
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		t.Run(addr, func(t *testing.T) {
			fwd, err := NewForwarder([]string{up.addr}, ForwarderOptions{})
			if err != nil {
				t.Fatal(err)
			}
			res, err := NewResolver(fwd, ResolverOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := res.Update(testMesh()); err != nil {
				t.Fatal(err)
			}
			srv := NewServer(res, ServerConfig{Addr: addr})
			if err := srv.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer srv.Shutdown(context.Background())
			u, _ := srv.Addrs()
			c, err := net.DialUDP("udp", nil, u.(*net.UDPAddr))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()

			type query struct {
				name      string
				qtype     uint16
				edns      bool
				class     uint16
				forwarded bool
			}
			kinds := []query{
				{name: "web.mesh.", qtype: dns.TypeA},
				{name: "NOPE.mesh.", qtype: dns.TypeAAAA, edns: true},
				{name: "cart.shop.svc.clusterset.local.", qtype: dns.TypeA, edns: true},
				{name: "example.org.", qtype: dns.TypeA, forwarded: true},
				{name: "web.mesh.", qtype: dns.TypeA, class: dns.ClassCHAOS},
				{name: "shop.mesh.", qtype: dns.TypeTXT},
			}
			want := map[uint16][]byte{}
			forwarded := map[uint16]bool{}
			// Bursts of burst queries in flight at once: enough for full batches, few enough
			// that neither socket's receive buffer overflows (UDP would drop the rest).
			const burst, bursts = 30, 10
			for first := uint16(1); first <= burst*bursts; first += burst {
				for id := first; id < first+burst; id++ {
					k := kinds[int(id)%len(kinds)]
					m := new(dns.Msg)
					m.SetQuestion(k.name, k.qtype)
					m.Id = id
					if k.class != 0 {
						m.Question[0].Qclass = k.class
					}
					if k.edns {
						m.SetEdns0(1232, id%2 == 0)
					}
					b, err := m.Pack()
					if err != nil {
						t.Fatal(err)
					}
					if k.forwarded {
						forwarded[id] = true
					} else {
						wire, _, act := res.Index().Respond(nil, m, netip.MustParseAddr(u.(*net.UDPAddr).IP.String()).Unmap(), MaxUDPSize(m))
						if act != Answered {
							t.Fatalf("%s: action %s", k.name, act)
						}
						want[id] = wire
					}
					if _, err := c.Write(b); err != nil {
						t.Fatal(err)
					}
					if id%10 == 0 {
						if _, err := c.Write([]byte{1, 2, 3}); err != nil { // garbage: dropped
							t.Fatal(err)
						}
					}
				}
				if err := c.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 4096)
				for got := 0; got < burst; got++ {
					n, err := c.Read(buf)
					if err != nil {
						t.Fatalf("burst at %d: after %d answers: %v", first, got, err)
					}
					id := uint16(buf[0])<<8 | uint16(buf[1])
					switch {
					case forwarded[id]:
						resp := new(dns.Msg)
						if err := resp.Unpack(buf[:n]); err != nil || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
							t.Errorf("forwarded answer %d: %v %v", id, resp, err)
						}
						delete(forwarded, id)
					case want[id] != nil:
						if !bytes.Equal(buf[:n], want[id]) {
							t.Errorf("answer %d:\n got % x\nwant % x", id, buf[:n], want[id])
						}
						delete(want, id)
					default:
						t.Errorf("unexpected or repeated answer id %d", id)
					}
				}
			}
			if len(want)+len(forwarded) != 0 {
				t.Errorf("%d queries unanswered", len(want)+len(forwarded))
			}
		})
	}
}

// TestForwardsBeforeFirstModel: until its first model the resolver forwards every name that
// cannot be a mesh name (so a node's pods keep resolving cluster and external names while the
// agent waits for the API server or the registry) and answers SERVFAIL for names in the mesh
// domain, in svc.clusterset.local, and search-list expansions holding either; the first model
// then answers mesh names.
func TestForwardsBeforeFirstModel(t *testing.T) {
	up := startStub(t, answerA(1))
	r := startResolverModel(t, []string{up.addr}, ForwarderOptions{}, ServerConfig{}, ResolverOptions{MeshDomain: "corp"}, nil)
	for _, c := range []struct {
		name  string
		rcode int
		sent  bool // reached the upstream
	}{
		{"example.org.", dns.RcodeSuccess, true},
		{"kubernetes.default.svc.cluster.local.", dns.RcodeNameError, true},
		{"web.mesh.", dns.RcodeSuccess, true}, // not the mesh domain here
		{"web.corp.", dns.RcodeServerFailure, false},
		{"WEB.Shop.CORP.", dns.RcodeServerFailure, false},
		{"corp.", dns.RcodeServerFailure, false},
		{"cart.shop.svc.clusterset.local.", dns.RcodeServerFailure, false},
		{"web.corp.shop.svc.cluster.local.", dns.RcodeServerFailure, false},
		{"cart.shop.svc.clusterset.local.shop.svc.cluster.local.", dns.RcodeServerFailure, false},
		{"example.org.shop.svc.cluster.local.", dns.RcodeNameError, true},
		// Cluster names that hold the mesh domain's or clusterset's labels but cannot be a
		// search-list expansion of a mesh name (<mesh name>.<ns>.svc.<clusterDomain>, the mesh
		// name below its zone's apex): Service cart in namespace corp, a Service named corp,
		// a Service named svc in a namespace named clusterset.
		{"cart.corp.svc.cluster.local.", dns.RcodeNameError, true},
		{"corp.shop.svc.cluster.local.", dns.RcodeNameError, true},
		{"x.svc.clusterset.local.svc.cluster.local.", dns.RcodeNameError, true},
		{"web.shop.corp.shop.svc.cluster.local.", dns.RcodeServerFailure, false},
	} {
		for _, network := range []string{"udp", "tcp"} {
			before := up.queries.Load()
			m := ask(t, r.addr, network, c.name, dns.TypeA, nil)
			if m.Rcode != c.rcode {
				t.Errorf("%s %s before the first model: rcode %s, want %s", network, c.name, dns.RcodeToString[m.Rcode], dns.RcodeToString[c.rcode])
			}
			if sent := up.queries.Load() > before; sent != c.sent {
				t.Errorf("%s %s before the first model: forwarded %v, want %v", network, c.name, sent, c.sent)
			}
			if c.sent {
				continue
			}
			// The resolver's own SERVFAIL says why (RFC 8914 section 4.15), to EDNS clients only.
			checkEDE(t, network+" "+c.name+" before the first model", m, false)
			m = ask(t, r.addr, network, c.name, dns.TypeA, func(q *dns.Msg) { q.SetEdns0(1232, true) })
			if m.Rcode != dns.RcodeServerFailure || !m.RecursionAvailable || m.IsEdns0() == nil || !m.IsEdns0().Do() {
				t.Errorf("%s %s before the first model with EDNS (DO): rcode %s, RA %v, OPT %v; want SERVFAIL, RA and an OPT with DO", network, c.name, dns.RcodeToString[m.Rcode], m.RecursionAvailable, m.IsEdns0())
			}
			checkEDE(t, network+" "+c.name+" before the first model", m, true, dns.ExtendedErrorCodeNotReady)
		}
	}
	mesh := testMesh()
	if err := r.res.Update(model.New(mesh.Version, mesh.Cluster, "corp", "", mesh.Node, mesh.Services, mesh.Endpoints, mesh.Pods)); err != nil {
		t.Fatal(err)
	}
	if m := ask(t, r.addr, "udp", "web.default.corp.", dns.TypeA, nil); m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
		t.Errorf("web.default.corp. after the first model: %v", m)
	}
}

// TestHandlerPanicRecovered: a query whose handling panics, on the UDP fast path, in ServeDNS
// over UDP and over TCP, gets SERVFAIL; each panic is counted by path, and the server goes on
// answering other queries on both transports.
func TestHandlerPanicRecovered(t *testing.T) {
	up := startStub(t, answerA(1))
	fwd, err := NewForwarder([]string{up.addr}, ForwarderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })
	reg := prometheus.NewRegistry()
	res, err := NewResolver(fwd, ResolverOptions{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Update(testMesh()); err != nil {
		t.Fatal(err)
	}
	res.testHook = func(q []byte) {
		if bytes.Contains(q, []byte("\x04boom")) {
			panic("planted panic")
		}
	}
	srv := NewServer(res, ServerConfig{Addr: "127.0.0.1:0"})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	addr := srv.udp.PacketConn.LocalAddr().String()
	for _, netw := range []string{"udp", "tcp"} {
		if resp := ask(t, addr, netw, "boom.mesh.", dns.TypeA, nil); resp.Rcode != dns.RcodeServerFailure {
			t.Fatalf("%s boom.mesh. = %s, want SERVFAIL", netw, dns.RcodeToString[resp.Rcode])
		}
		if resp := ask(t, addr, netw, "web.mesh.", dns.TypeA, nil); resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
			t.Fatalf("%s web.mesh. after a panic = %v, want the answer", netw, resp)
		}
	}
	// UDP: the fast path panicked and passed the query on, ServeDNS panicked; TCP: ServeDNS.
	if got := metricSum(t, reg, MetricHandlerPanics, map[string]string{"path": "fast"}); got != 1 {
		t.Errorf("%s{path=fast} = %v, want 1", MetricHandlerPanics, got)
	}
	if got := metricSum(t, reg, MetricHandlerPanics, map[string]string{"path": "serve"}); got != 2 {
		t.Errorf("%s{path=serve} = %v, want 2", MetricHandlerPanics, got)
	}
}
