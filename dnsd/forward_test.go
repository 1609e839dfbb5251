package dnsd

import (
	"context"
	"errors"
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

// hookedForwarder returns a forwarder to upstreams with its counters hooked into a registry (as
// the agent's resolver does), closed when t ends.
func hookedForwarder(t *testing.T, upstreams []string, o ForwarderOptions) (*Forwarder, *prometheus.Registry) {
	t.Helper()
	fwd, err := NewForwarder(upstreams, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })
	reg := prometheus.NewRegistry()
	if _, err := NewResolver(fwd, ResolverOptions{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	return fwd, reg
}

// exchangeA asks fwd for name's A records and returns the answer's addresses.
func exchangeA(t *testing.T, fwd *Forwarder, name string, tcp bool, edit func(*dns.Msg)) ([]string, *dns.Msg) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req := query(name, dns.TypeA, edit)
	resp, err := fwd.Exchange(ctx, req, tcp)
	if err != nil {
		t.Fatalf("exchange %s (tcp %v): %v", name, tcp, err)
	}
	if resp.Id != req.Id || len(resp.Question) != 1 || !strings.EqualFold(resp.Question[0].Name, name) {
		t.Fatalf("exchange %s: answer id %d question %v, want id %d and the name", name, resp.Id, resp.Question, req.Id)
	}
	var ips []string
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok {
			ips = append(ips, a.A.String())
		}
	}
	return ips, resp
}

// sources records the remote addresses (client ports) an upstream saw.
type sources struct {
	mu   sync.Mutex
	seen map[string]int
}

func (s *sources) add(a net.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[string]int{}
	}
	s.seen[a.String()]++
}

func (s *sources) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

// TestForwarderReusesConnections: sequential forwarded queries, cache misses all, reach the
// upstream from one UDP socket and one TCP connection (one source port each), and the
// connection metric counts one of each.
func TestForwarderReusesConnections(t *testing.T) {
	var udpSrc, tcpSrc sources
	up := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
		if isTCP(w.LocalAddr()) {
			tcpSrc.add(w.RemoteAddr())
		} else {
			udpSrc.add(w.RemoteAddr())
		}
		answerA(1)(w, r)
	})
	r := startResolver(t, []string{up.addr}, ForwarderOptions{})
	const n = 20
	for i := range n {
		for _, netw := range []string{"udp", "tcp"} {
			resp := ask(t, r.addr, netw, fmt.Sprintf("q%d.example.org.", i), dns.TypeA, nil)
			if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
				t.Fatalf("%s query %d: %v", netw, i, resp)
			}
		}
	}
	if got := up.queries.Load(); got != 2*n {
		t.Errorf("upstream got %d queries, want %d (no cache)", got, 2*n)
	}
	if u, c := udpSrc.count(), tcpSrc.count(); u != 1 || c != 1 {
		t.Errorf("upstream saw %d UDP source addresses and %d TCP ones, want 1 each: %v %v", u, c, udpSrc.seen, tcpSrc.seen)
	}
	for _, tr := range []string{"udp", "tcp"} {
		if got := metricSum(t, r.reg, MetricUpstreamConnections, map[string]string{"upstream": up.addr, "transport": tr}); got != 1 {
			t.Errorf("%s{transport=%s} = %v, want 1", MetricUpstreamConnections, tr, got)
		}
	}
}

// TestForwarderNoReuse: with MaxIdleConns negative every exchange opens its own socket.
func TestForwarderNoReuse(t *testing.T) {
	var src sources
	up := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) { src.add(w.RemoteAddr()); answerA(1)(w, r) })
	fwd, reg := hookedForwarder(t, []string{up.addr}, ForwarderOptions{MaxIdleConns: -1})
	for i := range 5 {
		exchangeA(t, fwd, fmt.Sprintf("q%d.example.org.", i), false, nil)
	}
	if got := metricSum(t, reg, MetricUpstreamConnections, map[string]string{"transport": "udp"}); got != 5 {
		t.Errorf("UDP sockets opened = %v, want 5", got)
	}
	if fwd.upstreams[0].udp.len() != 0 {
		t.Errorf("%d idle sockets kept, want none", fwd.upstreams[0].udp.len())
	}
}

// TestForwarderIdleExpiry: an idle socket is closed once IdleTimeout has passed, and the next
// query opens a new one; Close closes the idle ones.
func TestForwarderIdleExpiry(t *testing.T) {
	up := startStub(t, answerA(1))
	fwd, reg := hookedForwarder(t, []string{up.addr}, ForwarderOptions{IdleTimeout: 50 * time.Millisecond})
	u := fwd.upstreams[0]
	exchangeA(t, fwd, "a.example.org.", false, nil)
	exchangeA(t, fwd, "a.example.org.", true, nil)
	deadline := time.Now().Add(20 * time.Second)
	for (u.udp.len() != 0 || u.tcp.len() != 0) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if u.udp.len() != 0 || u.tcp.len() != 0 {
		t.Fatalf("idle connections still held after their expiry: udp %d, tcp %d", u.udp.len(), u.tcp.len())
	}
	exchangeA(t, fwd, "b.example.org.", false, nil)
	if got := metricSum(t, reg, MetricUpstreamConnections, map[string]string{"transport": "udp"}); got != 2 {
		t.Errorf("UDP sockets opened = %v, want 2 (the first expired)", got)
	}

	fwd2, _ := hookedForwarder(t, []string{up.addr}, ForwarderOptions{})
	exchangeA(t, fwd2, "a.example.org.", false, nil)
	if fwd2.upstreams[0].udp.len() != 1 {
		t.Fatalf("idle sockets = %d, want 1", fwd2.upstreams[0].udp.len())
	}
	fwd2.Close()
	if fwd2.upstreams[0].udp.len() != 0 {
		t.Errorf("idle sockets after Close = %d, want 0", fwd2.upstreams[0].udp.len())
	}
	if ips, _ := exchangeA(t, fwd2, "a.example.org.", false, nil); len(ips) != 1 {
		t.Errorf("exchange after Close = %v", ips)
	}
}

// udpUpstream is a UDP upstream on loopback that hands every query to fn with its socket and
// sender, in one goroutine (queries are handled in arrival order).
func udpUpstream(t *testing.T, fn func(pc net.PacketConn, from net.Addr, q *dns.Msg)) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	servePackets(t, pc, func(from net.Addr, b []byte) {
		q := new(dns.Msg)
		if q.Unpack(b) == nil {
			fn(pc, from, q)
		}
	})
	return pc.LocalAddr().String()
}

// servePackets reads datagrams from pc in one goroutine until pc is closed (when the test ends)
// and hands each to fn with its sender; b is valid only during the call.
func servePackets(t *testing.T, pc net.PacketConn, fn func(from net.Addr, b []byte)) {
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			fn(from, buf[:n])
		}
	}()
}

// answerWith is the wire answer to q with one A record ip.
func answerWith(t *testing.T, q *dns.Msg, ip string) []byte {
	m := new(dns.Msg)
	m.SetReply(q)
	m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.ParseIP(ip)})
	b, err := m.Pack()
	if err != nil {
		t.Error(err)
	}
	return b
}

// sequentialIDs makes fwd number its upstream queries 1, 2, 3... so that a test knows them.
func sequentialIDs(fwd *Forwarder) {
	var n atomic.Uint32
	fwd.newID = func() uint16 { return uint16(n.Add(1)) }
}

// TestForwarderLateAnswers: an answer that arrives after its exchange has timed out, or a
// second answer to a query already answered, is never taken as the answer of a later query for
// the same name: the later query gets its own answer.
func TestForwarderLateAnswers(t *testing.T) {
	t.Run("after a timeout", func(t *testing.T) {
		// The upstream holds the first query's answer until the second query arrives, then
		// sends it, with the first query's ID, to the second query's socket (as if the socket
		// had been reused) and to the first's, before the second query's own answer.
		var first *dns.Msg
		var firstFrom net.Addr
		up := udpUpstream(t, func(pc net.PacketConn, from net.Addr, q *dns.Msg) {
			if first == nil {
				first, firstFrom = q, from
				return
			}
			late := answerWith(t, first, "203.0.113.66")
			_, _ = pc.WriteTo(late, from)
			_, _ = pc.WriteTo(late, firstFrom)
			_, _ = pc.WriteTo(answerWith(t, q, "192.0.2.2"), from)
		})
		fwd, reg := hookedForwarder(t, []string{up}, ForwarderOptions{Timeout: 200 * time.Millisecond})
		sequentialIDs(fwd)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := fwd.Exchange(ctx, query("same.example.org.", dns.TypeA, nil), false); err == nil {
			t.Fatal("first query answered, want a timeout")
		}
		ips, _ := exchangeA(t, fwd, "same.example.org.", false, nil)
		if len(ips) != 1 || ips[0] != "192.0.2.2" {
			t.Errorf("second query answered %v, want its own answer 192.0.2.2", ips)
		}
		if got := metricSum(t, reg, MetricUpstreamConnections, map[string]string{"transport": "udp"}); got != 2 {
			t.Errorf("UDP sockets opened = %v, want 2 (the one whose exchange timed out is closed)", got)
		}
		if got := metricSum(t, reg, MetricUpstreamStrayAnswers, nil); got != 1 {
			t.Errorf("stray answers = %v, want 1 (the late answer sent to the second socket)", got)
		}
	})
	t.Run("duplicate answer on a reused socket", func(t *testing.T) {
		// The first query is answered twice: its answer, then a second one with other data.
		// The second query, on the same socket, reads that duplicate first.
		n := 0
		up := udpUpstream(t, func(pc net.PacketConn, from net.Addr, q *dns.Msg) {
			n++
			_, _ = pc.WriteTo(answerWith(t, q, fmt.Sprintf("192.0.2.%d", n)), from)
			if n == 1 {
				_, _ = pc.WriteTo(answerWith(t, q, "203.0.113.66"), from)
			}
		})
		fwd, reg := hookedForwarder(t, []string{up}, ForwarderOptions{})
		sequentialIDs(fwd)
		for i := 1; i <= 2; i++ {
			ips, _ := exchangeA(t, fwd, "same.example.org.", false, nil)
			if want := fmt.Sprintf("192.0.2.%d", i); len(ips) != 1 || ips[0] != want {
				t.Errorf("query %d answered %v, want %s", i, ips, want)
			}
		}
		if got := metricSum(t, reg, MetricUpstreamConnections, map[string]string{"transport": "udp"}); got != 1 {
			t.Errorf("UDP sockets opened = %v, want 1 (reused)", got)
		}
		if got := metricSum(t, reg, MetricUpstreamStrayAnswers, nil); got != 1 {
			t.Errorf("stray answers = %v, want 1 (the duplicate)", got)
		}
	})
}

// strayUpstream is an upstream on loopback, UDP and TCP on one port, playing a flood of forged
// answers: to every UDP query it first sends strays datagrams with other IDs (QR set, the
// question, A 203.0.113.66), then the answer, A 198.51.100.1; over TCP it answers A 192.0.2.1.
// It counts the TCP queries.
func strayUpstream(t *testing.T, strays int, tcpQueries *atomic.Int64) string {
	t.Helper()
	pc, l, err := listenBoth("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	servePackets(t, pc, func(from net.Addr, b []byte) {
		q := new(dns.Msg)
		if q.Unpack(b) != nil {
			return
		}
		forged := q.Copy()
		for i := range strays {
			forged.Id = q.Id + 1 + uint16(i)
			_, _ = pc.WriteTo(answerWith(t, forged, "203.0.113.66"), from)
		}
		_, _ = pc.WriteTo(answerWith(t, q, "198.51.100.1"), from)
	})
	srv := &dns.Server{Listener: l, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		tcpQueries.Add(1)
		m := new(dns.Msg)
		m.SetReply(r)
		m.Answer = append(m.Answer, mustRR(r.Question[0].Name+" 30 IN A 192.0.2.1"))
		_ = w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go func() { _ = srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { _ = srv.Shutdown() })
	return pc.LocalAddr().String()
}

// TestForwarderStrayDatagrams: the guard against forged answers flooding a reused UDP socket
// (RFC 5452 section 9), through real sockets. An upstream sends N datagrams with wrong IDs before
// each answer: with N at most 3 (a late or duplicated answer) the UDP answer is taken, but the
// socket that read them is closed rather than reused (the next query opens another, with
// another source port); with more, the exchange stops reading after the 4th and asks the same
// upstream over TCP, and the client gets the TCP answer. No forged record is ever answered.
func TestForwarderStrayDatagrams(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		strays                    int
		want                      string  // the answer's address
		opened, counted, fallback float64 // UDP sockets, stray datagrams and TCP fallbacks for two queries
	}{
		{name: "none", strays: 0, want: "198.51.100.1", opened: 1},
		{name: "a few", strays: 3, want: "198.51.100.1", opened: 2, counted: 6},
		{name: "a flood", strays: 200, want: "192.0.2.1", opened: 2, counted: 2 * (maxStrays + 1), fallback: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tcpQ atomic.Int64
			up := strayUpstream(t, tc.strays, &tcpQ)
			fwd, reg := hookedForwarder(t, []string{up}, ForwarderOptions{Timeout: 10 * time.Second})
			for i := range 2 {
				ips, _ := exchangeA(t, fwd, fmt.Sprintf("q%d.example.org.", i), false, nil)
				if len(ips) != 1 || ips[0] != tc.want {
					t.Errorf("query %d answered %v, want %s", i, ips, tc.want)
				}
			}
			if got := metricSum(t, reg, MetricUpstreamConnections, map[string]string{"transport": "udp"}); got != tc.opened {
				t.Errorf("UDP sockets opened = %v, want %v", got, tc.opened)
			}
			if got := metricSum(t, reg, MetricUpstreamStrayAnswers, nil); got != tc.counted {
				t.Errorf("%s = %v, want %v", MetricUpstreamStrayAnswers, got, tc.counted)
			}
			if got := metricSum(t, reg, MetricUpstreamStrayFallbacks, nil); got != tc.fallback {
				t.Errorf("%s = %v, want %v", MetricUpstreamStrayFallbacks, got, tc.fallback)
			}
			if got := tcpQ.Load(); float64(got) != tc.fallback {
				t.Errorf("TCP queries = %d, want %v", got, tc.fallback)
			}
			if got := metricSum(t, reg, MetricUpstreamFailures, nil); got != 0 {
				t.Errorf("%s = %v, want 0 (nothing failed)", MetricUpstreamFailures, got)
			}
		})
	}
}

// tcpUpstream is a TCP upstream on loopback that answers perConn queries on each connection
// and then closes it; it counts the connections it accepted. stop closes the listener and every
// connection.
func tcpUpstream(t *testing.T, perConn int, accepted *atomic.Int64) (addr string, stop func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	stop = func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}
	t.Cleanup(stop)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go func() {
				defer c.Close()
				co := &dns.Conn{Conn: c}
				for range perConn {
					q, err := co.ReadMsg()
					if err != nil {
						return
					}
					m := new(dns.Msg)
					m.SetReply(q)
					m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.IPv4(192, 0, 2, 1)})
					if co.WriteMsg(m) != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String(), stop
}

// TestForwarderTCPUpstreamCloses: an upstream that closes each TCP connection after one answer
// answers every query: the pooled connection it closed is replaced by a fresh one, once, and no
// failure is counted. An upstream that keeps its connections answers every query on one.
func TestForwarderTCPUpstreamCloses(t *testing.T) {
	const n = 5
	var closing, keeping atomic.Int64
	for _, tc := range []struct {
		name     string
		perConn  int
		accepted *atomic.Int64
		want     int64
	}{
		{"closes after each answer", 1, &closing, n},
		{"keeps its connections", 1000, &keeping, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up, _ := tcpUpstream(t, tc.perConn, tc.accepted)
			fwd, reg := hookedForwarder(t, []string{up}, ForwarderOptions{})
			for i := range n {
				if ips, _ := exchangeA(t, fwd, fmt.Sprintf("q%d.example.org.", i), true, nil); len(ips) != 1 {
					t.Fatalf("query %d: %v", i, ips)
				}
			}
			if got := tc.accepted.Load(); got != tc.want {
				t.Errorf("upstream accepted %d connections, want %d", got, tc.want)
			}
			if got := metricSum(t, reg, MetricUpstreamFailures, nil); got != 0 {
				t.Errorf("upstream failures = %v, want 0", got)
			}
		})
	}
	t.Run("the fresh connection fails too", func(t *testing.T) {
		var accepted atomic.Int64
		up, stop := tcpUpstream(t, 1, &accepted)
		fwd, reg := hookedForwarder(t, []string{up}, ForwarderOptions{})
		exchangeA(t, fwd, "a.example.org.", true, nil)
		stop() // the pooled connection is closed by the upstream, and a fresh one is refused
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := fwd.Exchange(ctx, query("b.example.org.", dns.TypeA, nil), true)
		if !errors.Is(err, ErrAllUpstreamsFailed) {
			t.Fatalf("exchange with the upstream gone = %v, want ErrAllUpstreamsFailed", err)
		}
		if got := metricSum(t, reg, MetricUpstreamFailures, map[string]string{"reason": "network"}); got != 1 {
			t.Errorf("network failures = %v, want 1 (one per query, the retry included)", got)
		}
		if got := metricSum(t, reg, MetricUpstreamConnections, map[string]string{"transport": "tcp"}); got != 1 {
			t.Errorf("TCP connections opened = %v, want 1 (the fresh one was refused)", got)
		}
	})
}

// bigAnswer answers every A query with n records, 192.0.2.x over TCP and 198.51.100.x over
// UDP, whatever the client's UDP size (an upstream that ignores it).
func bigAnswer(n int) func(w dns.ResponseWriter, r *dns.Msg) {
	return func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		net3 := net.IPv4(198, 51, 100, 0)
		if isTCP(w.LocalAddr()) {
			net3 = net.IPv4(192, 0, 2, 0)
		}
		for i := range n {
			ip := append(net.IP(nil), net3.To4()...)
			ip[3] = byte(i + 1)
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: ip})
		}
		if opt := r.IsEdns0(); opt != nil {
			m.SetEdns0(opt.UDPSize(), opt.Do())
		}
		_ = w.WriteMsg(m)
	}
}

// TestForwarderOversizedUDPAnswer: an upstream UDP answer larger than the client's UDP size (512
// bytes without EDNS, RFC 1035 section 4.2.1; the EDNS size otherwise) is asked again over TCP,
// and the client gets that answer, truncated to its size by the server (TC set), not SERVFAIL.
// An answer that fits the EDNS size is taken from UDP. TestHostileUpstreams/oversized covers an
// upstream without TCP (the records of the datagram that fit).
func TestForwarderOversizedUDPAnswer(t *testing.T) {
	var udpQ, tcpQ atomic.Int64
	big := bigAnswer(100) // 100 A records: about 1.6 KB uncompressed
	up := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
		if isTCP(w.LocalAddr()) {
			tcpQ.Add(1)
		} else {
			udpQ.Add(1)
		}
		big(w, r)
	})
	r := startResolver(t, []string{up.addr}, ForwarderOptions{})

	resp := ask(t, r.addr, "udp", "big.example.org.", dns.TypeA, nil)
	resp.Compress = true // as it was sent
	if resp.Rcode != dns.RcodeSuccess || !resp.Truncated || len(resp.Answer) == 0 || resp.Len() > dns.MinMsgSize {
		t.Fatalf("client without EDNS: rcode %s, TC %v, %d records, %d bytes; want a truncated answer within 512 bytes",
			dns.RcodeToString[resp.Rcode], resp.Truncated, len(resp.Answer), resp.Len())
	}
	if a := resp.Answer[0].(*dns.A).A.String(); !strings.HasPrefix(a, "192.0.2.") {
		t.Errorf("client without EDNS got %s, want the TCP answer's records (192.0.2.x)", a)
	}
	if u, c := udpQ.Load(), tcpQ.Load(); u != 1 || c != 1 {
		t.Errorf("upstream got %d UDP and %d TCP queries, want 1 and 1", u, c)
	}
	if got := metricSum(t, r.reg, MetricUpstreamOversized, map[string]string{"upstream": up.addr}); got != 1 {
		t.Errorf("%s = %v, want 1", MetricUpstreamOversized, got)
	}

	resp = ask(t, r.addr, "udp", "big.example.org.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(4096, false) })
	if resp.Truncated || len(resp.Answer) != 100 || !strings.HasPrefix(resp.Answer[0].(*dns.A).A.String(), "198.51.100.") {
		t.Errorf("client with EDNS 4096: TC %v, %d records; want the whole UDP answer", resp.Truncated, len(resp.Answer))
	}
	resp = ask(t, r.addr, "udp", "big.example.org.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(1232, false) })
	if !resp.Truncated || len(resp.Answer) == 0 || !strings.HasPrefix(resp.Answer[0].(*dns.A).A.String(), "192.0.2.") {
		t.Errorf("client with EDNS 1232: TC %v, %d records; want the TCP answer truncated", resp.Truncated, len(resp.Answer))
	}
	if u, c := udpQ.Load(), tcpQ.Load(); u != 3 || c != 2 {
		t.Errorf("upstream got %d UDP and %d TCP queries in all, want 3 and 2", u, c)
	}

	// The forwarder alone returns the whole TCP answer; the server truncates.
	fwd, _ := hookedForwarder(t, []string{up.addr}, ForwarderOptions{})
	if ips, resp := exchangeA(t, fwd, "big.example.org.", false, nil); len(ips) != 100 || resp.Truncated || !strings.HasPrefix(ips[0], "192.0.2.") {
		t.Errorf("Exchange over UDP: TC %v, %d records (%v...); want the TCP answer's 100", resp.Truncated, len(ips), ips[:1])
	}
}

// TestForwarderConcurrent: concurrent queries over UDP and TCP each get the answer to their own
// question, and the sockets opened stay within the number of queries in flight (run with
// -race).
func TestForwarderConcurrent(t *testing.T) {
	up := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		// The answer names the question's label in a TXT record.
		m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 30}, Txt: []string{strings.SplitN(r.Question[0].Name, ".", 2)[0]}})
		_ = w.WriteMsg(m)
	})
	fwd, reg := hookedForwarder(t, []string{up.addr}, ForwarderOptions{})
	const workers, each = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				label := fmt.Sprintf("w%dq%d", w, i)
				req := query(label+".example.org.", dns.TypeTXT, nil)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				resp, err := fwd.Exchange(ctx, req, i%3 == 0)
				cancel()
				switch {
				case err != nil:
					errs <- err
				case len(resp.Answer) != 1 || resp.Answer[0].(*dns.TXT).Txt[0] != label || resp.Id != req.Id:
					errs <- fmt.Errorf("query %s answered %v", label, resp)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, tr := range []string{"udp", "tcp"} {
		if got := metricSum(t, reg, MetricUpstreamConnections, map[string]string{"transport": tr}); got < 1 || got > workers {
			t.Errorf("%s sockets opened = %v, want 1..%d (one per query in flight at most)", tr, got, workers)
		}
	}
	if got := metricSum(t, reg, MetricUpstreamFailures, nil); got != 0 {
		t.Errorf("upstream failures = %v, want 0", got)
	}
}

// TestForwarderContextCancelled: Exchange returns the context's error when it is cancelled
// while an upstream has not answered, well before the upstream timeout.
func TestForwarderContextCancelled(t *testing.T) {
	asked := make(chan struct{}, 1)
	up := udpUpstream(t, func(net.PacketConn, net.Addr, *dns.Msg) { asked <- struct{}{} })
	fwd, _ := hookedForwarder(t, []string{up}, ForwarderOptions{Timeout: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-asked; cancel() }()
	_, err := fwd.Exchange(ctx, query("a.example.org.", dns.TypeA, nil), false)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Exchange = %v, want context.Canceled", err)
	}
	if n := fwd.upstreams[0].udp.len(); n != 0 {
		t.Errorf("%d idle sockets after a cancelled exchange, want 0 (closed)", n)
	}
}

// TestForwarderContextCancelledBeforeExchange: a context cancelled before or just as the
// exchange starts ends it at once; its cancellation is never lost to the socket's own deadline
// (the upstream never answers, and the upstream timeout is an hour). Over UDP and TCP, many
// times, since the cancellation (context.AfterFunc's goroutine) and the exchange race.
func TestForwarderContextCancelledBeforeExchange(t *testing.T) {
	// UDP and TCP on one port (listenBoth retries when the TCP port is taken); neither answers.
	pc, l, err := listenBoth("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	servePackets(t, pc, func(net.Addr, []byte) {})
	up := pc.LocalAddr().String()
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() }) // never answers
		}
	}()
	fwd, _ := hookedForwarder(t, []string{up}, ForwarderOptions{Timeout: time.Hour})
	for _, tcp := range []bool{false, true} {
		runs := 20000 // the race shows about once in 10,000 runs over UDP
		if tcp {
			runs = 100 // the dial fails at once
		}
		for i := range runs {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			done := make(chan error, 1)
			go func() {
				_, err := fwd.Exchange(ctx, query("a.example.org.", dns.TypeA, nil), tcp)
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("tcp %v, run %d: Exchange = %v, want context.Canceled", tcp, i, err)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("tcp %v, run %d: Exchange with a cancelled context still waiting after 30s: the cancellation was lost", tcp, i)
			}
		}
	}
}

// fakeConn is a net.Conn whose Close is counted (connPool's unit tests need nothing else).
type fakeConn struct {
	net.Conn
	closed atomic.Int32
}

func (c *fakeConn) Close() error { c.closed.Add(1); return nil }

// TestConnPool: the most recently used idle connection is taken first; at most max are kept
// (the others closed); one idle for expire or more is closed instead of taken; close closes
// every idle one and the ones given back later.
func TestConnPool(t *testing.T) {
	const s = int64(time.Second)
	p := &connPool{max: 2, expire: 10 * time.Second}
	defer p.close()
	a, b, c := &fakeConn{}, &fakeConn{}, &fakeConn{}
	if p.get(0) != nil {
		t.Fatal("empty pool gave a connection")
	}
	p.put(a, 1*s)
	p.put(b, 2*s)
	p.put(c, 3*s) // over max
	if c.closed.Load() != 1 || p.len() != 2 {
		t.Fatalf("third connection: closed %d, pool holds %d; want closed, 2 held", c.closed.Load(), p.len())
	}
	if got := p.get(4 * s); got != b {
		t.Fatalf("get = %v, want the most recently used", got)
	}
	p.put(b, 5*s)
	// At 11.5 s: a (idle since 1 s) has expired, b (since 5 s) has not.
	if got := p.get(11*s + s/2); got != b {
		t.Fatalf("get at 11.5s = %v, want b", got)
	}
	if p.get(11*s+s/2) != nil || a.closed.Load() != 1 {
		t.Fatalf("expired connection: taken, or closed %d times; want closed once", a.closed.Load())
	}
	p.put(b, 12*s)
	if p.get(22*s) != nil || b.closed.Load() != 1 {
		t.Fatalf("connection idle for exactly expire: want closed, closed %d", b.closed.Load())
	}
	d, e := &fakeConn{}, &fakeConn{}
	p.put(d, 30*s)
	p.close()
	p.put(e, 31*s)
	if d.closed.Load() != 1 || e.closed.Load() != 1 || p.len() != 0 {
		t.Errorf("after close: closed %d and %d, %d held; want both closed once, none held", d.closed.Load(), e.closed.Load(), p.len())
	}
}

// TestWireBufs: buffers come in size classes from 512 bytes to 64 KiB, at least as long as
// asked.
func TestWireBufs(t *testing.T) {
	for _, tc := range []struct{ n, size int }{
		{0, 512}, {1, 512}, {512, 512}, {513, 1024}, {1024, 1024}, {1233, 2048}, {4097, 8192}, {65535, 65536}, {65536, 65536},
	} {
		bp := getWireBuf(tc.n)
		if len(*bp) != tc.size {
			t.Errorf("getWireBuf(%d) = %d bytes, want %d", tc.n, len(*bp), tc.size)
		}
		putWireBuf(bp)
	}
}

// TestSameQuestion: an answer's question matches the query's with the name in another letter
// case (RFC 4343), and not with another name, type, class or question count; an answer cut
// within its question does not match.
func TestSameQuestion(t *testing.T) {
	q := packedQuery(t, "www.Example.org.", dns.TypeA, nil)
	qend, ok := questionEnd(q)
	if !ok || qend != len(q) {
		t.Fatalf("questionEnd = %d, %v; want %d", qend, ok, len(q))
	}
	for _, tc := range []struct {
		name string
		a    []byte
		want bool
	}{
		{"same", packedQuery(t, "www.Example.org.", dns.TypeA, nil), true},
		{"other case", packedQuery(t, "WWW.example.ORG.", dns.TypeA, nil), true},
		{"with records after it", func() []byte {
			m := query("www.example.org.", dns.TypeA, nil)
			m.Response = true
			m.Answer = append(m.Answer, mustRR("www.example.org. 30 IN A 192.0.2.1"))
			b, _ := m.Pack()
			return b
		}(), true},
		{"other name", packedQuery(t, "www.example.com.", dns.TypeA, nil), false},
		{"other label split", packedQuery(t, "ww.wexample.org.", dns.TypeA, nil), false},
		{"other type", packedQuery(t, "www.example.org.", dns.TypeAAAA, nil), false},
		{"other class", packedQuery(t, "www.example.org.", dns.TypeA, func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS }), false},
		{"no question", func() []byte { m := new(dns.Msg); b, _ := m.Pack(); return b }(), false},
		{"cut in the question", packedQuery(t, "www.example.org.", dns.TypeA, nil)[:qend-1], false},
	} {
		if got := sameQuestion(tc.a, q, qend); got != tc.want {
			t.Errorf("%s: sameQuestion = %v, want %v", tc.name, got, tc.want)
		}
	}
	for _, bad := range [][]byte{q[:11], q[:qend-3], {0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xC0, 12, 0, 1, 0, 1}} {
		if _, ok := questionEnd(bad); ok {
			t.Errorf("questionEnd(% x) ok, want not", bad)
		}
	}
}

// TestCutAnswer: the first bytes of an answer too long for them keep the records they hold
// whole, with counts to match and TC set; a record cut in the middle is dropped with the ones
// after it. The upstream's OPT is never kept; for a client that sent an OPT the cut answer ends
// with the resolver's own (UDP size 1232, the client's DO), records dropped to make room for it
// (RFC 6891 section 7: an OPT in every answer to an EDNS query, a truncated one too).
func TestCutAnswer(t *testing.T) {
	m := query("big.example.org.", dns.TypeA, nil)
	m.Response = true
	for i := range 60 {
		m.Answer = append(m.Answer, mustRR(fmt.Sprintf("big.example.org. 30 IN A 192.0.2.%d", i)))
	}
	m.Ns = append(m.Ns, mustRR("example.org. 30 IN NS ns.example.org."))
	noOPT, err := m.Pack() // uncompressed: 31 bytes per A record (17-byte name, 10, 4)
	if err != nil {
		t.Fatal(err)
	}
	m.SetEdns0(4096, false) // the upstream's, last in the additional section
	full, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	qend, _ := questionEnd(full)
	l0 := len(noOPT) // where the upstream's OPT starts
	for _, tc := range []struct {
		size, answers, ns int
		edns, do          bool
	}{
		{size: 512, answers: (512 - qend) / 31},
		{size: 512, answers: (512 - optLen - qend) / 31, edns: true, do: true},
		{size: 512, answers: (512 - optLen - qend) / 31, edns: true},
		{size: qend},
		{size: qend, edns: true}, // no room for an OPT: none
		{size: qend + optLen, edns: true},
		{size: qend + 31, answers: 1},
		{size: qend + 31, edns: true},
		{size: qend + 31 + optLen, answers: 1, edns: true},
		{size: qend + 30},
		{size: l0 - 1, answers: 60},
		{size: l0, answers: 60, ns: 1},
		{size: len(full), answers: 60, ns: 1}, // the upstream's OPT dropped: the client sent none
		{size: len(full), answers: 60, ns: 1, edns: true, do: true},
		{size: len(full) - 1, answers: 60, edns: true},
	} {
		wire := cutAnswer(full[:tc.size], qend, tc.edns, tc.do)
		got := new(dns.Msg)
		if err := got.Unpack(wire); err != nil {
			t.Errorf("cut at %d (edns %v): unpack: %v", tc.size, tc.edns, err)
			continue
		}
		if len(wire) > tc.size || !got.Truncated || len(got.Answer) != tc.answers || len(got.Ns) != tc.ns || got.Question[0].Name != "big.example.org." {
			t.Errorf("cut at %d (edns %v): %d bytes, TC %v, %d answers, %d NS; want at most %d bytes, TC, %d, %d",
				tc.size, tc.edns, len(wire), got.Truncated, len(got.Answer), len(got.Ns), tc.size, tc.answers, tc.ns)
		}
		opt := got.IsEdns0()
		wantOPT := tc.edns && tc.size >= qend+optLen
		switch {
		case wantOPT && (opt == nil || opt.UDPSize() != ednsUDPSize || opt.Do() != tc.do || len(got.Extra) != 1):
			t.Errorf("cut at %d (edns %v, DO %v): additional %v; want only the resolver's OPT (UDP size %d, DO %v)", tc.size, tc.edns, tc.do, got.Extra, ednsUDPSize, tc.do)
		case !wantOPT && len(got.Extra) != 0:
			t.Errorf("cut at %d (edns %v): additional %v; want none", tc.size, tc.edns, got.Extra)
		}
	}
}

// FuzzUpstreamAnswer: whatever an upstream sends, checking it against the query (sameQuestion),
// cutting it to the client's size (cutAnswer) and parsing it never panics, and a cut answer
// that parses has TC set and fits the size. A FORMERR or NOTIMP without a question parses as
// the answer with the query's question, packs again (the cache packs it for coalesced
// queries), and has the upstream's OPT when it had one (with extended rcode 0) and the query
// had one, else none (RFC 6891 section 7).
func FuzzUpstreamAnswer(f *testing.F) {
	req := query("big.example.org.", dns.TypeA, nil)
	var q, qe fwdQuery
	if err := q.pack(req); err != nil {
		f.Fatal(err)
	}
	if err := qe.pack(query("big.example.org.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(1232, false) })); err != nil {
		f.Fatal(err)
	}
	m := req.Copy()
	m.Response = true
	for i := range 40 {
		m.Answer = append(m.Answer, mustRR(fmt.Sprintf("big.example.org. 30 IN A 192.0.2.%d", i)))
	}
	for _, c := range []bool{false, true} {
		m.Compress = c
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(q.msg())
	for _, opt := range []bool{false, true} {
		r := new(dns.Msg)
		r.SetRcodeFormatError(req)
		r.Id = q.id()
		if opt {
			r.SetEdns0(4096, false)
			r.IsEdns0().Option = append(r.IsEdns0().Option, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeOther, ExtraText: "x"})
		}
		b, err := r.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		u := &upstream{addr: "192.0.2.53:53"}
		if questionlessRefusal(b) {
			var up dns.Msg
			upOPT := up.Unpack(b) == nil && up.IsEdns0() != nil && up.IsEdns0().ExtendedRcode() == 0
			for _, fq := range []*fwdQuery{&q, &qe} {
				edns := fq.req.IsEdns0() != nil
				resp, _, _, err := u.parse(b, fq)
				if err != nil || len(resp.Question) != 1 || resp.Question[0] != req.Question[0] {
					t.Fatalf("question-less refusal parsed as %v, %v; want the answer with the query's question", resp, err)
				}
				if _, err := resp.Pack(); err != nil {
					t.Fatalf("question-less refusal parsed as %v, which does not pack: %v", resp, err)
				}
				if (resp.IsEdns0() != nil) != (upOPT && edns) {
					t.Fatalf("question-less refusal to a query with EDNS %v parsed with OPT %v; the upstream's (extended rcode 0): %v", edns, resp.IsEdns0(), upOPT)
				}
			}
			return
		}
		if !sameQuestion(b, q.msg(), q.qend) {
			return
		}
		_, _, _, _ = u.parse(b, &q)
		size := min(len(b), q.limit)
		for _, edns := range []bool{false, true} {
			wire := cutAnswer(b[:size], q.qend, edns, true)
			if len(wire) > size {
				t.Fatalf("cut answer of %d bytes from %d", len(wire), size)
			}
			resp, _, _, err := u.parse(wire, &q)
			if err != nil {
				continue
			}
			if !resp.Truncated {
				t.Fatalf("cut answer without TC: %v", resp)
			}
			if opt := resp.IsEdns0(); (opt != nil) != (edns && size >= q.qend+optLen) {
				t.Fatalf("cut answer (edns %v, %d bytes) with OPT %v", edns, size, opt)
			}
		}
	})
}
