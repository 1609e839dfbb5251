//go:build linux

package dnsd

import (
	"net"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// TestUDPBatchAnswersWithoutAllocating: a query read with recvmmsg, answered by the fast path
// and written back with sendmmsg reaches the client intact, and the whole read-answer-write
// round allocates nothing (an allocation per batch made the server collect garbage every few
// seconds under load).
func TestUDPBatchAnswersWithoutAllocating(t *testing.T) {
	res, err := NewResolver(nil, ResolverOptions{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Update(testMesh()); err != nil {
		t.Fatal(err)
	}
	srv, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cl, err := net.DialUDP("udp", nil, srv.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	b, err := newUDPBatch(srv, 1232)
	if err != nil {
		t.Fatal(err)
	}
	m := new(dns.Msg)
	m.SetQuestion("web.default.mesh.", dns.TypeA)
	q, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	reply := make([]byte, 1232)
	var idx [1]int
	var answers [1][]byte
	var got int
	round := func() {
		if _, err := cl.Write(q); err != nil {
			t.Fatal(err)
		}
		n, err := b.read()
		if err != nil || n != 1 {
			t.Fatalf("read: %d datagrams, %v; want 1", n, err)
		}
		wire, from := b.packet(0)
		ans, ok := res.answerWire(b.wire[0][:0], wire, from.Addr())
		if !ok {
			t.Fatal("fast path did not answer web.default.mesh.")
		}
		b.wire[0], answers[0] = ans, ans
		if err := b.write(idx[:], answers[:]); err != nil {
			t.Fatal(err)
		}
		if got, err = cl.Read(reply); err != nil {
			t.Fatal(err)
		}
	}
	round()
	a := new(dns.Msg)
	if err := a.Unpack(reply[:got]); err != nil {
		t.Fatalf("unpack answer: %v", err)
	}
	if a.Id != m.Id || a.Rcode != dns.RcodeSuccess || len(a.Answer) != 1 || a.Answer[0].(*dns.A).A.String() != "10.96.0.20" {
		t.Fatalf("answer = %v, want id %d NOERROR web.default.mesh. A 10.96.0.20", a, m.Id)
	}
	if n := testing.AllocsPerRun(200, round); n != 0 {
		t.Errorf("a read-answer-write round allocates %v times, want 0", n)
	}
}
