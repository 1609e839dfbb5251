package dnsd

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/aethermesh/aether/model"
)

// slowPath answers wire query b as the server's slow path does: miekg/dns unpacks it (a query
// that does not unpack, or a response, gets no answer from the resolver) and Index.Respond
// answers it with the client's UDP size.
func slowPath(idx *Index, b []byte, src netip.Addr) (wire []byte, rcode int, act Action, unpacked bool) {
	req := new(dns.Msg)
	if req.Unpack(b) != nil || req.Response {
		return nil, 0, 0, false
	}
	wire, rcode, act = idx.Respond(nil, req, src, MaxUDPSize(req))
	return wire, rcode, act, true
}

// checkFastMatchesSlow runs wire query b through both paths. When the fast path answers, its
// answer must be byte for byte the slow path's, with the same rcode and query type. It returns
// whether the fast path answered and the slow path's rcode and action.
func checkFastMatchesSlow(t *testing.T, idx *Index, b []byte, src netip.Addr) (fast bool, rcode int, act Action) {
	t.Helper()
	fwire, qtype, frcode, fast := idx.RespondWire(nil, b, src)
	swire, rcode, act, unpacked := slowPath(idx, b, src)
	if !fast {
		return false, rcode, act
	}
	if !unpacked {
		t.Fatalf("fast path answered a query the server drops\nquery % x", b)
	}
	if act != Answered {
		t.Fatalf("fast path answered a query the slow path %s\nquery % x", act, b)
	}
	if !bytes.Equal(fwire, swire) || frcode != rcode {
		t.Fatalf("fast answer differs from slow answer\nquery % x\nfast  % x (rcode %d)\nslow  % x (rcode %d)", b, fwire, frcode, swire, rcode)
	}
	req := new(dns.Msg)
	if err := req.Unpack(b); err != nil || len(req.Question) != 1 || req.Question[0].Qtype != qtype {
		t.Fatalf("fast path query type %d for query %v (unpack error %v)", qtype, req, err)
	}
	return true, rcode, act
}

// TestRespondWireMatchesRespond: over every case of the DNS rules table, with and without EDNS0
// (DO set or not, several UDP sizes), RD and CD, and the question in several letter cases, the
// fast path (RespondWire on the wire query) answers exactly what the slow path (unpack, then
// Respond) answers, and it answers every such query that the index answers with a
// NOERROR/NXDOMAIN; it leaves the rest (forwarded names, REFUSED, NOTIMP, FORMERR, BADVERS) to
// the slow path.
func TestRespondWireMatchesRespond(t *testing.T) {
	idx, err := NewIndex(testMesh(), IndexOptions{})
	if err != nil {
		t.Fatal(err)
	}
	variants := []struct {
		name string
		edit func(m *dns.Msg)
	}{
		{"plain", nil},
		{"RD", func(m *dns.Msg) { m.RecursionDesired = true }},
		{"RD CD", func(m *dns.Msg) { m.RecursionDesired = true; m.CheckingDisabled = true }},
		{"EDNS 1232", func(m *dns.Msg) { m.SetEdns0(1232, false) }},
		{"EDNS 4096 DO", func(m *dns.Msg) { m.SetEdns0(4096, true) }},
		{"EDNS 512", func(m *dns.Msg) { m.SetEdns0(512, false) }},
		{"EDNS 100", func(m *dns.Msg) { m.SetEdns0(100, true) }},
		{"EDNS cookie", func(m *dns.Msg) {
			m.SetEdns0(1232, false)
			opt := m.IsEdns0()
			opt.Option = append(opt.Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef"})
		}},
	}
	letterCases := map[string]func(string) string{
		"as given": func(s string) string { return s },
		"upper":    strings.ToUpper,
		"mixed": func(s string) string {
			b := []byte(s)
			for i := 0; i < len(b); i += 2 {
				b[i] = strings.ToUpper(string(b[i]))[0]
			}
			return string(b)
		},
	}
	answeredFast := 0
	for _, tc := range respondCases() {
		for _, v := range variants {
			for lc, letters := range letterCases {
				t.Run(tc.name+"/"+v.name+"/"+lc, func(t *testing.T) {
					req := new(dns.Msg)
					req.SetQuestion(letters(tc.qname), tc.qtype)
					req.RecursionDesired = false
					req.Id = 0xBEEF
					if tc.edit != nil {
						tc.edit(req)
					}
					if v.edit != nil {
						v.edit(req)
					}
					b, err := req.Pack()
					if err != nil {
						t.Fatal(err)
					}
					fast, rcode, act := checkFastMatchesSlow(t, idx, b, tc.src)
					wantFast := act == Answered && (rcode == dns.RcodeSuccess || rcode == dns.RcodeNameError) &&
						v.name != "EDNS cookie" // options: the slow path's (miekg/dns parses them)
					if fast != wantFast {
						t.Errorf("fast path answered = %v, want %v (slow path: %s, rcode %s)", fast, wantFast, act, dns.RcodeToString[rcode])
					}
					if fast {
						answeredFast++
					}
				})
			}
		}
	}
	if answeredFast == 0 {
		t.Fatal("the fast path answered no query")
	}
	t.Logf("fast path answered %d queries", answeredFast)
}

// TestRespondWireLeavesOddQueriesToSlowPath: queries outside the common case are not answered
// by the fast path (and, when it is given them anyway, nothing it answers differs from the
// slow path): compressed or over-long names, escaped characters, trailing bytes, responses,
// unknown OPT contents, the root name, short packets, and answers that need truncation.
func TestRespondWireLeavesOddQueriesToSlowPath(t *testing.T) {
	idx, err := NewIndex(testMesh(), IndexOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pack := func(name string, qtype uint16, edit func(*dns.Msg)) []byte { return packedQuery(t, name, qtype, edit) }
	header := []byte{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}
	long := append([]byte(nil), header...)
	for range 130 {
		long = append(long, 1, 'a')
	}
	long = append(long, 4, 'm', 'e', 's', 'h', 0, 0, 1, 0, 1)
	good := pack("web.mesh.", dns.TypeA, nil)
	for _, tc := range []struct {
		name string
		q    []byte
	}{
		{"compression pointer in the question", append(append([]byte(nil), header...), 0xC0, 12, 0, 1, 0, 1)},
		{"name over 255 bytes", long},
		{"escaped dot in a label", pack(`we\.b.mesh.`, dns.TypeA, nil)},
		{"space in a label", pack(`we\032b.mesh.`, dns.TypeA, nil)},
		{"trailing byte", append(append([]byte(nil), good...), 0)},
		{"response bit", pack("web.mesh.", dns.TypeA, func(m *dns.Msg) { m.Response = true })},
		{"EDNS version 1", pack("web.mesh.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(1232, false); m.IsEdns0().SetVersion(1) })},
		{"two OPT records", pack("web.mesh.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(1232, false); m.SetEdns0(1232, false) })},
		{"additional record that is not OPT", pack("web.mesh.", dns.TypeA, func(m *dns.Msg) {
			m.Extra = append(m.Extra, &dns.A{Hdr: dns.RR_Header{Name: "x.", Rrtype: dns.TypeA, Class: dns.ClassINET}, A: []byte{1, 2, 3, 4}})
		})},
		{"answer record in the query", pack("web.mesh.", dns.TypeA, func(m *dns.Msg) {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: "x.", Rrtype: dns.TypeA, Class: dns.ClassINET}, A: []byte{1, 2, 3, 4}})
		})},
		{"root name", pack(".", dns.TypeNS, nil)},
		{"header only", header},
		{"name cut short", good[:15]},
		{"no type and class", good[:len(good)-4]},
		{"IXFR", pack("mesh.", dns.TypeIXFR, nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if fast, _, _ := checkFastMatchesSlow(t, idx, tc.q, shopPod); fast {
				t.Errorf("fast path answered % x", tc.q)
			}
		})
	}

	t.Run("answer longer than the UDP size", func(t *testing.T) {
		var vips []netip.Addr
		for i := range 60 {
			vips = append(vips, netip.AddrFrom4([4]byte{10, 96, 2, byte(i)}))
		}
		big, err := NewIndex(model.New(1, "c1", "", "", model.Node{}, []*model.Service{
			{Key: model.ServiceKey{Namespace: "big", Name: "many"}, Local: true, VIPs: vips},
		}, nil, nil), IndexOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if fast, _, _ := checkFastMatchesSlow(t, big, pack("many.big.mesh.", dns.TypeA, nil), netip.Addr{}); fast {
			t.Error("fast path answered a query whose answer needs truncation")
		}
		edns := pack("many.big.mesh.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(1232, false) })
		if fast, _, _ := checkFastMatchesSlow(t, big, edns, netip.Addr{}); !fast {
			t.Error("fast path left a query whose answer fits EDNS 1232 to the slow path")
		}
	})
}

// TestRespondWireDoesNotAllocate: the fast path answers a mesh name, an NXDOMAIN and a
// search-list expansion without allocating (given a large enough buffer).
func TestRespondWireDoesNotAllocate(t *testing.T) {
	idx, err := NewIndex(testMesh(), IndexOptions{})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, 1024)
	for _, name := range []string{"web.default.mesh.", "nope.mesh.", "web.mesh.shop.svc.cluster.local."} {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		m.SetEdns0(1232, false)
		q, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		if _, _, _, ok := idx.RespondWire(buf, q, shopPod); !ok {
			t.Fatalf("fast path did not answer %s", name)
		}
		if n := testing.AllocsPerRun(100, func() { idx.RespondWire(buf, q, shopPod) }); n != 0 {
			t.Errorf("RespondWire(%s) allocates %v times per query, want 0", name, n)
		}
	}
}
