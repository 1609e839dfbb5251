package dnsd

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// captureWriter is a dns.ResponseWriter that keeps what the handler writes (UDP from shopPod).
type captureWriter struct {
	out []byte
	tcp bool
	// from is the client's address (zero: shopPod).
	from netip.Addr
}

func (w *captureWriter) LocalAddr() net.Addr {
	if w.tcp {
		return &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: DefaultPort}
	}
	return &net.UDPAddr{IP: net.IPv4(10, 0, 0, 1), Port: DefaultPort}
}
func (w *captureWriter) RemoteAddr() net.Addr {
	if w.from.IsValid() {
		return &net.UDPAddr{IP: w.from.AsSlice(), Port: 40000}
	}
	return &net.UDPAddr{IP: shopPod.AsSlice(), Port: 40000}
}
func (w *captureWriter) WriteMsg(m *dns.Msg) error {
	b, err := m.Pack()
	w.out = b
	return err
}
func (w *captureWriter) Write(b []byte) (int, error) {
	w.out = append([]byte(nil), b...)
	return len(b), nil
}
func (w *captureWriter) Close() error        { return nil }
func (w *captureWriter) TsigStatus() error   { return nil }
func (w *captureWriter) TsigTimersOnly(bool) {}
func (w *captureWriter) Hijack()             {}

// FuzzServeDNS feeds arbitrary bytes through the same steps as the server: miekg/dns unpacks
// them (the server drops what does not unpack) and the resolver answers. No upstreams are
// configured, so forwarded names answer SERVFAIL without network. Every answer must unpack,
// carry the query's ID and fit the client's UDP size; whatever the fast path (RespondWire)
// answers must be exactly the slow path's answer.
func FuzzServeDNS(f *testing.F) {
	seed := func(name string, qtype uint16, edit func(*dns.Msg)) { f.Add(packedQuery(f, name, qtype, edit)) }
	seed("web.mesh.", dns.TypeA, nil)
	seed("web.mesh.shop.svc.cluster.local.", dns.TypeAAAA, func(m *dns.Msg) { m.SetEdns0(1232, true) })
	seed("cart.shop.svc.clusterset.local.", dns.TypeANY, nil)
	seed("nope.mesh.", dns.TypeMX, func(m *dns.Msg) { m.SetEdns0(512, false); m.IsEdns0().SetVersion(3) })
	seed("mesh.", dns.TypeAXFR, func(m *dns.Msg) { m.Opcode = dns.OpcodeUpdate })
	seed("example.org.", dns.TypeA, nil)
	seed("_http._tcp.web.default.mesh.", dns.TypeSRV, nil)
	seed("_pg._tcp.db.mesh.", dns.TypeSRV, func(m *dns.Msg) { m.SetEdns0(600, false) })
	seed("_http._tcp.web.mesh.shop.svc.cluster.local.", dns.TypeSRV, nil)
	f.Add([]byte{0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0})
	res, err := NewResolver(nil, ResolverOptions{})
	if err != nil {
		f.Fatal(err)
	}
	if err := res.Update(testMesh()); err != nil {
		f.Fatal(err)
	}
	idx := res.Index()
	f.Fuzz(func(t *testing.T, b []byte) {
		// The fast path answers only what the slow path answers the same, byte for byte.
		checkFastMatchesSlow(t, idx, b, shopPod)
		req := new(dns.Msg)
		if req.Unpack(b) != nil || req.Response {
			return // the server's MsgAcceptFunc / unpack drops these
		}
		for _, tcp := range []bool{false, true} {
			w := &captureWriter{tcp: tcp}
			res.ServeDNS(w, req)
			resp := new(dns.Msg)
			if err := resp.Unpack(w.out); err != nil {
				t.Fatalf("answer does not unpack: %v\nquery % x\nanswer % x", err, b, w.out)
			}
			if resp.Id != req.Id || !resp.Response {
				t.Fatalf("answer id=%d qr=%v for query id=%d", resp.Id, resp.Response, req.Id)
			}
			if !tcp && len(w.out) > MaxUDPSize(req) {
				t.Fatalf("UDP answer %d bytes, client accepts %d", len(w.out), MaxUDPSize(req))
			}
		}
		_, _, _ = idx.Respond(nil, req, netip.Addr{}, dns.MinMsgSize)
	})
}

// FuzzCacheEntry feeds arbitrary upstream answers to the cache: whatever it keeps must be
// served, through ServeDNS's path (answerMsg) and the UDP fast path alike, as a message that
// unpacks, carries the query's ID and question, has every record of the upstream's answer (OPT
// aside) with its TTL less the entry's age, and fits the client's UDP size; the fast path's
// bytes must be exactly the slow path's.
func FuzzCacheEntry(f *testing.F) {
	for _, m := range []*dns.Msg{
		cacheSeed("www.example.", dns.RcodeSuccess, "www.example. 20 IN A 192.0.2.1", "example. 25 IN NS ns.example.", "ns.example. 2 IN A 192.0.2.53"),
		cacheSeed("nx.example.", dns.RcodeNameError, "", soa(60, 3), ""),
		cacheSeed("c.example.", dns.RcodeSuccess, "c.example. 20 IN CNAME t.example.", soa(30, 3), ""),
		cacheSeed("t.example.", dns.RcodeSuccess, "t.example. 20 IN TXT \"hello\"", "", "t.example. 5 IN AAAA 2001:db8::1"),
	} {
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, true)
		f.Add(b, false)
	}
	m, err := newMetrics(nil, func() float64 { return 0 })
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte, edns bool) {
		resp := new(dns.Msg)
		if resp.Unpack(b) != nil || len(resp.Question) != 1 {
			return
		}
		q := resp.Question[0]
		req := new(dns.Msg)
		req.SetQuestion(q.Name, q.Qtype)
		req.Question[0].Qclass = q.Qclass
		req.Id = 4242
		if edns {
			req.SetEdns0(1232, false)
		}
		c, err := newCache(CacheOptions{Size: 4, clock: func() int64 { return 0 }})
		if err != nil {
			t.Fatal(err)
		}
		c.m = m
		e := c.newCacheEntry(req, resp, 0)
		if e == nil {
			return
		}
		stored := new(dns.Msg)
		if err := stored.Unpack(e.wire); err != nil {
			t.Fatalf("entry does not unpack: %v", err)
		}
		age := int64(time.Second)
		wire, ok := e.answerMsg(nil, req, dns.MaxMsgSize, age, 0)
		if !ok {
			t.Fatalf("entry does not answer its own question %v", q)
		}
		got := new(dns.Msg)
		if err := got.Unpack(wire); err != nil {
			t.Fatalf("answer does not unpack: %v\n% x", err, wire)
		}
		if got.Id != req.Id || len(got.Question) != 1 || got.Question[0] != req.Question[0] || got.Rcode != resp.Rcode {
			t.Fatalf("answer header or question: %v", got)
		}
		want := append(append(append([]dns.RR(nil), stored.Answer...), stored.Ns...), stored.Extra...)
		var have []dns.RR
		for _, rr := range append(append(got.Answer, got.Ns...), got.Extra...) {
			if rr.Header().Rrtype != dns.TypeOPT {
				have = append(have, rr)
			}
		}
		if len(have) != len(want) {
			t.Fatalf("answer has %d records, entry %d", len(have), len(want))
		}
		for i := range want {
			if w := want[i].Header().Ttl - min(want[i].Header().Ttl, 1); have[i].Header().Ttl != w {
				t.Fatalf("record %d TTL %d, want %d (stored %d less 1 s)", i, have[i].Header().Ttl, w, want[i].Header().Ttl)
			}
		}
		if (got.IsEdns0() != nil) != edns {
			t.Fatalf("answer OPT %v, query had one: %v", got.IsEdns0(), edns)
		}
		// Over UDP: within the client's size, and the fast path gives the same bytes.
		udp, _ := e.answerMsg(nil, req, MaxUDPSize(req), age, 0)
		if len(udp) > MaxUDPSize(req) {
			t.Fatalf("UDP answer %d bytes, client accepts %d", len(udp), MaxUDPSize(req))
		}
		pq, err := req.Pack()
		if err != nil {
			return
		}
		var wq wireQuery
		if !wq.parse(pq) {
			return
		}
		c.add(wq.cacheKey(pq), e)
		c.clock = func() int64 { return age }
		if fast, _, ok := c.answerWire(nil, pq, &wq); ok && !bytes.Equal(fast, udp) {
			t.Fatalf("fast path answer differs:\nfast % x\nslow % x", fast, udp)
		}
	})
}

// cacheSeed is an upstream answer to name (type A) with rcode and one record per section
// (presentation form; "" for none).
func cacheSeed(name string, rcode int, answer, ns, extra string) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	m.Response, m.Rcode, m.RecursionAvailable = true, rcode, true
	for _, s := range []struct {
		rr  string
		sec *[]dns.RR
	}{{answer, &m.Answer}, {ns, &m.Ns}, {extra, &m.Extra}} {
		if s.rr != "" {
			*s.sec = append(*s.sec, mustRR(s.rr))
		}
	}
	return m
}
