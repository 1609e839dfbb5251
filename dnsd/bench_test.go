package dnsd

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/aethermesh/aether/model"
)

// benchResolver serves 1000 services svc-<i>.bench.mesh, as bench/dns/run.sh does.
func benchResolver(b *testing.B) *Resolver {
	b.Helper()
	var svcs []*model.Service
	for i := range 1000 {
		svcs = append(svcs, &model.Service{
			Key: model.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}, Local: true,
			VIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i / 256), byte(i % 256)})},
		})
	}
	res, err := NewResolver(nil, ResolverOptions{Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	if err := res.Update(model.New(1, "c", "", "", model.Node{}, svcs, nil, nil)); err != nil {
		b.Fatal(err)
	}
	return res
}

// BenchmarkServeDNS measures the handler alone (no sockets, no miekg/dns server) for an
// existing mesh name and for an NXDOMAIN in the zone.
func BenchmarkServeDNS(b *testing.B) {
	res := benchResolver(b)
	for _, name := range []string{"svc-500.bench.mesh.", "nx-500.bench.mesh."} {
		b.Run(name, func(b *testing.B) {
			req := new(dns.Msg)
			req.SetQuestion(name, dns.TypeA)
			w := &captureWriter{}
			b.ReportAllocs()
			for b.Loop() {
				res.ServeDNS(w, req)
			}
		})
	}
}

// BenchmarkRespondWire measures the UDP fast path (Resolver.answerWire: index lookup, wire
// answer, metrics) for the same names, on the query's wire form.
func BenchmarkRespondWire(b *testing.B) {
	res := benchResolver(b)
	for _, name := range []string{"svc-500.bench.mesh.", "nx-500.bench.mesh."} {
		b.Run(name, func(b *testing.B) {
			req := new(dns.Msg)
			req.SetQuestion(name, dns.TypeA)
			q, err := req.Pack()
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, 0, 1024)
			src := netip.MustParseAddr("127.0.0.1")
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := res.answerWire(buf, q, src); !ok {
					b.Fatal("fast path did not answer")
				}
			}
		})
	}
}
