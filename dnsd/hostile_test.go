package dnsd

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// startShortTimeoutServer starts a resolver server on loopback with short TCP timeouts, so
// hostile TCP clients are cut quickly, forwarding to upstreams.
func startShortTimeoutServer(t *testing.T, upstreams []string) string {
	t.Helper()
	fwd, err := NewForwarder(upstreams, ForwarderOptions{Timeout: 300 * time.Millisecond})
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
	srv := NewServer(res, ServerConfig{Addr: "127.0.0.1:0", ReadTimeout: 200 * time.Millisecond, IdleTimeout: 300 * time.Millisecond})
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
	u, _ := srv.Addrs()
	return u.String()
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
