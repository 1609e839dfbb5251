package dnsd

import (
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

// captureWriter is a dns.ResponseWriter that keeps what the handler writes (UDP from shopPod).
type captureWriter struct {
	out []byte
	tcp bool
}

func (w *captureWriter) LocalAddr() net.Addr {
	if w.tcp {
		return &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: DefaultPort}
	}
	return &net.UDPAddr{IP: net.IPv4(10, 0, 0, 1), Port: DefaultPort}
}
func (w *captureWriter) RemoteAddr() net.Addr {
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
