package dnsd

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/aethermesh/aether/model"
)

// benchResolver serves 1000 services svc-<i>.bench.mesh, as bench/dns/run.sh does.
func benchResolver(b *testing.B) *Resolver { return benchResolverWith(b, ResolverOptions{}) }

// benchResolverWith is benchResolver with options o (its Registerer is set here).
func benchResolverWith(b *testing.B, o ResolverOptions) *Resolver {
	b.Helper()
	var svcs []*model.Service
	for i := range 1000 {
		svcs = append(svcs, &model.Service{
			Key: model.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}, Local: true,
			VIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i / 256), byte(i % 256)})},
		})
	}
	o.Registerer = prometheus.NewRegistry()
	res, err := NewResolver(nil, o)
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
// answer, metrics) for the same names, on the query's wire form, bare, as the read loop calls
// it (answerWireGuarded, with its deferred recover), and "gated": guarded with the agent's source
// policy (Restrict, an allowed prefix, a per-source rate limit too high to refuse) for a
// non-loopback source.
func BenchmarkRespondWire(b *testing.B) {
	res := benchResolver(b)
	gated := benchResolverWith(b, ResolverOptions{Sources: SourcePolicy{Restrict: true,
		Allow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, RateLimit: 1 << 30}})
	lo, pod := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.1.2.3")
	for _, name := range []string{"svc-500.bench.mesh.", "nx-500.bench.mesh."} {
		for _, fn := range []struct {
			name   string
			answer func(buf, q []byte, src netip.Addr) ([]byte, bool)
			src    netip.Addr
		}{{"", res.answerWire, lo}, {"/guarded", res.answerWireGuarded, lo}, {"/gated", gated.answerWireGuarded, pod}} {
			b.Run(name+fn.name, func(b *testing.B) {
				req := new(dns.Msg)
				req.SetQuestion(name, dns.TypeA)
				q, err := req.Pack()
				if err != nil {
					b.Fatal(err)
				}
				buf := make([]byte, 0, 1024)
				b.ReportAllocs()
				for b.Loop() {
					if wire, ok := fn.answer(buf, q, fn.src); !ok || wire[3]&0x0F == dns.RcodeRefused {
						b.Fatal("fast path did not answer")
					}
				}
			})
		}
	}
}

// BenchmarkForwardedCache measures a forwarded name (upstream: a stub on loopback, the
// question's own answer with TTL 30, or TTL 0 for "miss" so that it is never cached): "miss" is
// the cache's overhead on top of the upstream exchange ("no cache" is the exchange alone);
// "hit" is ServeDNS answering from the cache (slow path: unpacked query) and answerWire the UDP
// fast path (wire query); "hit, prefetch on" the same with prefetch and serve-stale on (the
// clock does not move, so no prefetch starts: the cost of counting hits).
func BenchmarkForwardedCache(b *testing.B) {
	up := startStub(b, func(w dns.ResponseWriter, r *dns.Msg) {
		ttl := 30
		if strings.HasPrefix(r.Question[0].Name, "miss.") {
			ttl = 0
		}
		reply(dns.RcodeSuccess, []string{fmt.Sprintf("%%s %d IN A 192.0.2.1", ttl)}, nil, nil, nil)(w, r)
	})
	cached, _ := cachingResolver(b, up.addr, DefaultCacheSize, &fakeClock{})
	prefetching, _ := cachingResolverWith(b, up.addr, CacheOptions{Size: DefaultCacheSize, ServeStale: 24 * time.Hour, Prefetch: 10}, &fakeClock{})
	fwd, err := NewForwarder([]string{up.addr}, ForwarderOptions{})
	if err != nil {
		b.Fatal(err)
	}
	uncached, err := NewResolver(fwd, ResolverOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if err := uncached.Update(testMesh()); err != nil {
		b.Fatal(err)
	}
	serveBench := func(res *Resolver, name string) func(b *testing.B) {
		return func(b *testing.B) {
			req := query(name, dns.TypeA, nil)
			w := &captureWriter{}
			b.ReportAllocs()
			for b.Loop() {
				res.ServeDNS(w, req)
			}
		}
	}
	b.Run("no cache/ServeDNS", serveBench(uncached, "www.example.org."))
	b.Run("miss/ServeDNS", serveBench(cached, "miss.example.org."))
	b.Run("hit/ServeDNS", serveBench(cached, "www.example.org."))
	wireBench := func(res *Resolver) func(b *testing.B) {
		return func(b *testing.B) {
			q := packedQuery(b, "www.example.org.", dns.TypeA, nil)
			buf := make([]byte, 0, 1024)
			if _, ok := res.answerWire(buf, q, shopPod); !ok {
				b.Fatal("fast path did not answer the hit")
			}
			b.ReportAllocs()
			for b.Loop() {
				res.answerWire(buf, q, shopPod)
			}
		}
	}
	b.Run("hit/answerWire", wireBench(cached))
	b.Run("hit, prefetch on/ServeDNS", serveBench(prefetching, "www.example.org."))
	b.Run("hit, prefetch on/answerWire", wireBench(prefetching))
	// A hot entry in its last tenth while the prefetch budget is taken (upstreams slow): every
	// hit qualifies for a prefetch that cannot start.
	clk := &fakeClock{}
	starved, _ := cachingResolverWith(b, up.addr, CacheOptions{Size: DefaultCacheSize, Prefetch: 1}, clk)
	starved.ServeDNS(&captureWriter{}, query("www.example.org.", dns.TypeA, nil))
	clk.advance(28 * time.Second)
	for len(starved.cache.prefetchSlots) < cap(starved.cache.prefetchSlots) {
		starved.cache.prefetchSlots <- struct{}{}
	}
	b.Run("hit, prefetch budget taken/answerWire", wireBench(starved))
}

// BenchmarkNewIndex measures building the index (the resolver rebuilds it on every model change)
// for n services, each with a dual-stack VIP, a short name and two named ports (their SRV
// names), a tenth of them also imported (a clusterset name).
func BenchmarkNewIndex(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			var svcs []*model.Service
			for i := range n {
				s := &model.Service{
					Key: model.ServiceKey{Namespace: fmt.Sprintf("ns-%d", i%50), Name: fmt.Sprintf("svc-%d", i)}, Local: true,
					VIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i / 256), byte(i % 256)}),
						netip.AddrFrom16([16]byte{0xfd, 0, 15: byte(i)})},
					Ports: []model.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: model.ProtocolHTTP},
						{Name: "grpc", Port: 9090, TargetPort: 9090, Protocol: model.ProtocolGRPC}},
				}
				if i%10 == 0 {
					s.Imported, s.ClustersetVIPs = true, []netip.Addr{netip.AddrFrom4([4]byte{10, 97, byte(i / 256), byte(i % 256)})}
				}
				svcs = append(svcs, s)
			}
			m := model.New(1, "c", "", "", model.Node{}, svcs, nil, nil)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := NewIndex(m, IndexOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
