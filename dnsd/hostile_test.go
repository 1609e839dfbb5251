package dnsd

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/aethermesh/aether/internal/testenv"
)

// startShortTimeoutServer starts a resolver server on loopback with short TCP timeouts, so
// hostile TCP clients are cut quickly, forwarding to upstreams.
func startShortTimeoutServer(t *testing.T, upstreams []string) string {
	t.Helper()
	return startResolverWith(t, upstreams, ForwarderOptions{Timeout: 300 * time.Millisecond},
		ServerConfig{ReadTimeout: 200 * time.Millisecond, IdleTimeout: 300 * time.Millisecond}).addr
}

// TestHostileTCPClients: TCP clients that stall after a length prefix, or mid-message, are cut
// after the read timeout without holding goroutines, while other clients are answered; a
// client that pipelines queries in one write gets every answer with its ID.
func TestHostileTCPClients(t *testing.T) {
	addr := startShortTimeoutServer(t, nil)
	base := runtime.NumGoroutine()
	var stalled []net.Conn
	for i := range 50 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		switch i % 3 {
		case 0: // a length prefix claiming the largest message, then nothing
			_, err = c.Write([]byte{0xFF, 0xFF})
		case 1: // half a query
			q := packedQuery(t, "web.mesh.", dns.TypeA, nil)
			b := binary.BigEndian.AppendUint16(nil, uint16(len(q)))
			_, err = c.Write(append(b, q[:len(q)/2]...))
		case 2: // one byte of the length
			_, err = c.Write([]byte{0})
		}
		if err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, c)
	}
	resp := ask(t, addr, "tcp", "web.mesh.", dns.TypeA, nil)
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Fatalf("answer beside stalled clients = %v", resp)
	}
	for i, c := range stalled {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("stalled client %d: read %d bytes, err %v; want the server to close it", i, n, err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for runtime.NumGoroutine() > base+2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base+2 {
		t.Errorf("goroutines = %d after stalled clients were cut, were %d", n, base)
	}

	// Pipelined: three queries in one write, answers in order with their IDs.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var out []byte
	names := []string{"web.mesh.", "nope.mesh.", "web.mesh."}
	for i, n := range names {
		q := query(n, dns.TypeA, func(m *dns.Msg) { m.Id = uint16(100 + i) })
		b, err := q.Pack()
		if err != nil {
			t.Fatal(err)
		}
		out = append(binary.BigEndian.AppendUint16(out, uint16(len(b))), b...)
	}
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	co := &dns.Conn{Conn: c}
	for i, n := range names {
		m, err := co.ReadMsg()
		if err != nil {
			t.Fatalf("pipelined answer %d: %v", i, err)
		}
		if m.Id != uint16(100+i) || m.Question[0].Name != n {
			t.Errorf("pipelined answer %d: id %d question %s", i, m.Id, m.Question[0].Name)
		}
	}
}

// rawUDP sends b to addr and returns the answer (nil after a generous wait for none).
func rawUDP(t *testing.T, addr string, b []byte) *dns.Msg {
	t.Helper()
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		return nil
	}
	m := new(dns.Msg)
	if err := m.Unpack(buf[:n]); err != nil {
		t.Fatalf("unpack answer to % x: %v", b, err)
	}
	return m
}

// TestHostileQueries: odd queries over UDP and TCP get the rcode the RFCs say, or the upstream's
// answer when the name is not the mesh's.
func TestHostileQueries(t *testing.T) {
	up := startStub(t, answerA(1))
	addr := startShortTimeoutServer(t, []string{up.addr})
	long := strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("b", 61) + "." // 255 octets
	cases := []struct {
		name  string
		q     func() []byte
		rcode int
		nans  int
	}{
		{"no question", func() []byte { m := new(dns.Msg); m.Id = 7; b, _ := m.Pack(); return b }, dns.RcodeFormatError, 0},
		{"two questions", func() []byte {
			m := query("web.mesh.", dns.TypeA, nil)
			m.Question = append(m.Question, m.Question[0])
			b, _ := m.Pack()
			return b
		}, dns.RcodeFormatError, 0},
		{"opcode UPDATE", func() []byte {
			return packedQuery(t, "web.mesh.", dns.TypeA, func(m *dns.Msg) { m.Opcode = dns.OpcodeUpdate })
		}, dns.RcodeNotImplemented, 0},
		{"opcode NOTIFY", func() []byte {
			return packedQuery(t, "web.mesh.", dns.TypeSOA, func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify })
		}, dns.RcodeNotImplemented, 0},
		{"header only, question cut", func() []byte { return packedQuery(t, "web.mesh.", dns.TypeA, nil)[:15] }, dns.RcodeFormatError, 0},
		{"AXFR of the mesh zone", func() []byte { return packedQuery(t, "mesh.", dns.TypeAXFR, nil) }, dns.RcodeRefused, 0},
		{"IXFR of the mesh zone", func() []byte { return packedQuery(t, "mesh.", dns.TypeIXFR, nil) }, dns.RcodeRefused, 0},
		{"ANY of a mesh name (A and AAAA)", func() []byte { return packedQuery(t, "web.mesh.", dns.TypeANY, nil) }, dns.RcodeSuccess, 2},
		{"CHAOS class mesh name", func() []byte {
			return packedQuery(t, "web.mesh.", dns.TypeA, func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS })
		}, dns.RcodeRefused, 0},
		{"EDNS version 1", func() []byte {
			return packedQuery(t, "web.mesh.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(1232, false); m.IsEdns0().SetVersion(1) })
		}, dns.RcodeBadVers, 0},
		{"two OPT records", func() []byte {
			return packedQuery(t, "web.mesh.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(1232, false); m.Extra = append(m.Extra, m.Extra[0]) })
		}, dns.RcodeFormatError, 0},
		{"unknown EDNS option", func() []byte {
			return packedQuery(t, "web.mesh.", dns.TypeA, func(m *dns.Msg) {
				m.SetEdns0(1232, false)
				m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_LOCAL{Code: 65001, Data: make([]byte, 300)})
			})
		}, dns.RcodeSuccess, 1},
		{"binary labels, forwarded", func() []byte { return packedQuery(t, "\\000\\.\\255.example.org.", dns.TypeA, nil) }, dns.RcodeSuccess, 1},
		{"255-octet name, forwarded", func() []byte { return packedQuery(t, long, dns.TypeA, nil) }, dns.RcodeSuccess, 1},
		{"255-octet name in the mesh zone", func() []byte {
			return packedQuery(t, strings.Repeat(strings.Repeat("a", 63)+".", 3)+strings.Repeat("b", 56)+".mesh.", dns.TypeA, nil)
		}, dns.RcodeNameError, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.q()
			for _, netw := range []string{"udp", "tcp"} {
				var m *dns.Msg
				if netw == "udp" {
					m = rawUDP(t, addr, b)
				} else {
					c, err := net.Dial("tcp", addr)
					if err != nil {
						t.Fatal(err)
					}
					_, err = c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...))
					if err != nil {
						t.Fatal(err)
					}
					_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
					m, err = (&dns.Conn{Conn: c}).ReadMsg()
					c.Close()
					if err != nil {
						t.Fatalf("tcp: %v", err)
					}
				}
				if m == nil {
					t.Fatalf("%s: no answer", netw)
				}
				if m.Rcode != tc.rcode || len(m.Answer) != tc.nans || !m.Response {
					t.Errorf("%s: rcode %s, %d answers, QR %v; want %s, %d", netw, dns.RcodeToString[m.Rcode], len(m.Answer), m.Response, dns.RcodeToString[tc.rcode], tc.nans)
				}
				if m.Id != binary.BigEndian.Uint16(b) {
					t.Errorf("%s: id %d, want the query's", netw, m.Id)
				}
			}
		})
	}
}

// rawUpstream is a UDP upstream on loopback that answers every query with reply(query bytes).
func rawUpstream(t *testing.T, reply func(q []byte) []byte) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	servePackets(t, pc, func(from net.Addr, q []byte) {
		if b := reply(append([]byte(nil), q...)); b != nil {
			_, _ = pc.WriteTo(b, from)
		}
	})
	return pc.LocalAddr().String()
}

// TestHostileUpstreams: an upstream that answers with the wrong ID, the wrong question, garbage,
// a message cut short or one larger than the client's UDP size never has its answer passed on
// as it is: the resolver fails over to the next upstream (or answers SERVFAIL when none is
// left), and a large answer is truncated to the client's size with TC set.
func TestHostileUpstreams(t *testing.T) {
	good := startStub(t, answerA(1))
	edit := func(fn func(m *dns.Msg)) func(q []byte) []byte {
		return func(q []byte) []byte {
			req := new(dns.Msg)
			if err := req.Unpack(q); err != nil {
				return nil
			}
			m := new(dns.Msg)
			m.SetReply(req)
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: req.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.IPv4(198, 51, 100, 1)})
			fn(m)
			b, _ := m.Pack()
			return b
		}
	}
	for _, tc := range []struct {
		name  string
		reply func(q []byte) []byte
	}{
		{"wrong id", edit(func(m *dns.Msg) { m.Id++ })},
		{"wrong question name", edit(func(m *dns.Msg) { m.Question[0].Name = "evil.example." })},
		{"wrong question type", edit(func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeMX })},
		{"no question", edit(func(m *dns.Msg) { m.Question = nil })},
		{"garbage", func(q []byte) []byte { return append(q[:2:2], 0x81, 0x80, 0, 1, 0, 9) }},
		{"cut short", func(q []byte) []byte { b := edit(func(*dns.Msg) {})(q); return b[:len(b)-3] }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := rawUpstream(t, tc.reply)
			addr := startShortTimeoutServer(t, []string{bad, good.addr})
			resp := ask(t, addr, "udp", "example.org.", dns.TypeA, nil)
			if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != "192.0.2.1" {
				t.Errorf("answer = %v, want the good upstream's", resp)
			}
			alone := startShortTimeoutServer(t, []string{bad})
			if resp := ask(t, alone, "udp", "example.org.", dns.TypeA, nil); resp.Rcode != dns.RcodeServerFailure || len(resp.Answer) != 0 {
				t.Errorf("with only the bad upstream: %v, want SERVFAIL", resp)
			}
		})
	}
	t.Run("oversized", func(t *testing.T) {
		// An upstream on UDP only that ignores the client's size: the TCP retry fails, and the
		// client gets the records of the datagram that fit its size, with TC set; an EDNS
		// client gets an OPT too (RFC 6891 section 7), the upstream's being past the cut.
		big := rawUpstream(t, edit(func(m *dns.Msg) {
			for i := range 300 {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.IPv4(198, 51, byte(i>>8), byte(i))})
			}
			m.SetEdns0(4096, false)
		}))
		addr := startShortTimeoutServer(t, []string{big})
		for _, tc := range []struct {
			name string
			edit func(*dns.Msg)
			size int
		}{
			{"no EDNS", nil, dns.MinMsgSize},
			{"EDNS 1232 DO", func(m *dns.Msg) { m.SetEdns0(1232, true) }, 1232},
		} {
			m := query("example.org.", dns.TypeA, tc.edit)
			b, _ := m.Pack()
			resp := rawUDP(t, addr, b)
			if resp == nil {
				t.Fatalf("%s: no answer", tc.name)
			}
			resp.Compress = true // as it was sent
			if !resp.Truncated || resp.Len() > tc.size || len(resp.Answer) == 0 {
				t.Errorf("%s: answer of %d bytes, TC %v, %d records; want truncated within %d bytes", tc.name, resp.Len(), resp.Truncated, len(resp.Answer), tc.size)
			}
			opt := resp.IsEdns0()
			if tc.edit == nil && opt != nil {
				t.Errorf("%s: answer with an OPT %v, want none", tc.name, opt)
			}
			if tc.edit != nil && (opt == nil || !opt.Do()) {
				t.Errorf("%s: answer with OPT %v, want an OPT with DO", tc.name, opt)
			}
		}
	})
}

// TestTCPConnectionLimit: with MaxTCPConns clients holding connections open (stalled after a
// 64 KiB length prefix, each pinning a buffer of that size), one more connection is closed at
// once instead of pinning more memory; once they go, TCP queries are answered again.
func TestTCPConnectionLimit(t *testing.T) {
	res, err := NewResolver(nil, ResolverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Update(testMesh()); err != nil {
		t.Fatal(err)
	}
	const limit = 4
	srv := NewServer(res, ServerConfig{Addr: "127.0.0.1:0", ReadTimeout: time.Minute, IdleTimeout: time.Minute, MaxTCPConns: limit})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	_, a := srv.Addrs()
	addr := a.String()
	var held []net.Conn
	for range limit {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte{0xFF, 0xFF}); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// The server accepts them in order; the next one finds no slot.
	testenv.Eventually(t, 30*time.Second, "a connection over the limit is closed", func() error {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != io.EOF {
			return fmt.Errorf("read: %v, want EOF", err)
		}
		return nil
	})
	for _, c := range held {
		c.Close()
	}
	testenv.Eventually(t, 30*time.Second, "a TCP answer after the held connections closed", func() error {
		c := &dns.Client{Net: "tcp", Timeout: 5 * time.Second}
		resp, _, err := c.Exchange(query("web.mesh.", dns.TypeA, nil), addr)
		if err != nil {
			return err
		}
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
			return fmt.Errorf("answer %v", resp)
		}
		return nil
	})
}

// TestForwardLimit: with MaxForwards queries waiting on an upstream that never answers, one
// more forwarded query (a plain name, and a clusterset name, which must not get a cacheable
// NXDOMAIN) is answered SERVFAIL at once, without a goroutine and a socket of its own held for
// the forward timeout, with an OPT for an EDNS query but no Extended DNS Error (no upstream
// was asked, so "No Reachable Authority" would be wrong); mesh names are still answered.
func TestForwardLimit(t *testing.T) {
	release := make(chan struct{})
	silent := startStub(t, func(w dns.ResponseWriter, r *dns.Msg) {
		<-release
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeServerFailure)
		_ = w.WriteMsg(m)
	})
	fwd, err := NewForwarder([]string{silent.addr}, ForwarderOptions{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	const limit = 2
	res, err := NewResolver(fwd, ResolverOptions{MaxForwards: limit})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Update(testMesh()); err != nil {
		t.Fatal(err)
	}
	srv := NewServer(res, ServerConfig{Addr: "127.0.0.1:0"})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	defer close(release) // first: the held queries end, then Shutdown has nothing to wait for
	u, _ := srv.Addrs()
	addr := u.String()
	// limit queries that wait on the silent upstream.
	for i := range limit {
		c, err := net.Dial("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write(packedQuery(t, fmt.Sprintf("slow%d.example.org.", i), dns.TypeA, nil)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 30*time.Second, "the silent upstream holds the first queries", func() error {
		if n := silent.queries.Load(); n < limit {
			return fmt.Errorf("%d queries at the upstream", n)
		}
		return nil
	})
	for _, name := range []string{"one-more.example.org.", "other.ns.svc.clusterset.local."} {
		// The client gives up long before the forward timeout (a minute): only an answer
		// given at once arrives.
		c := &dns.Client{Net: "udp", Timeout: 10 * time.Second}
		resp, _, err := c.Exchange(query(name, dns.TypeA, func(m *dns.Msg) { m.SetEdns0(1232, false) }), addr)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if resp.Rcode != dns.RcodeServerFailure {
			t.Errorf("%s over the forward limit: %s, want SERVFAIL", name, dns.RcodeToString[resp.Rcode])
		}
		checkEDE(t, name+" over the forward limit", resp, true)
	}
	if n := silent.queries.Load(); n != limit {
		t.Errorf("the upstream got %d queries, want %d", n, limit)
	}
	if resp := ask(t, addr, "udp", "web.mesh.", dns.TypeA, nil); resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Errorf("mesh name at the forward limit: %v", resp)
	}
}
