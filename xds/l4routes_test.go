package xds

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	xdsmatcher "github.com/cncf/xds/go/xds/type/matcher/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

var (
	tlsKey  = model.ServiceKey{Namespace: "shop", Name: "tls"}
	tlsAKey = model.ServiceKey{Namespace: "shop", Name: "tls-a"}
	tlsBKey = model.ServiceKey{Namespace: "shop", Name: "tls-b"}
	dbV2Key = model.ServiceKey{Namespace: "shop", Name: "db-v2"}
)

// l4Mesh is goldenMesh with more TCP services (shop/db-v2 on 3306; shop/tls on 443 and 444,
// also imported; shop/tls-a and shop/tls-b on 443) and the L4 routes routes resolved; every
// route must be accepted.
func l4Mesh(t testing.TB, routes []model.Route) *model.Mesh {
	t.Helper()
	g := goldenMesh()
	ip := netip.MustParseAddr
	tcp := func(name string, port uint32) model.ServicePort {
		return model.ServicePort{Name: name, Port: port, TargetPort: port, Protocol: model.ProtocolTCP}
	}
	services := append(g.Services,
		&model.Service{Key: dbV2Key, Local: true, VIPs: []netip.Addr{ip("10.96.0.12")}, Ports: []model.ServicePort{tcp("mysql", 3306)}},
		&model.Service{Key: tlsKey, Local: true, Imported: true, VIPs: []netip.Addr{ip("10.96.0.13")}, ClustersetVIPs: []netip.Addr{ip("10.97.0.13")},
			Ports: []model.ServicePort{tcp("tls", 443), tcp("tls-alt", 444)}},
		&model.Service{Key: tlsAKey, Local: true, VIPs: []netip.Addr{ip("10.96.0.14")}, Ports: []model.ServicePort{tcp("tls", 443)}},
		&model.Service{Key: tlsBKey, Local: true, VIPs: []netip.Addr{ip("10.96.0.15")}, Ports: []model.ServicePort{tcp("tls", 443)}},
	)
	m := model.New(g.Version, g.Cluster, g.MeshDomain, g.TrustDomain, g.Node, services, g.Endpoints, g.Pods)
	return withL4Routes(t, m, routes)
}

// withL4Routes resolves routes (ResolveL4Routes) into m.L4Routing; every parent must be accepted.
func withL4Routes(t testing.TB, m *model.Mesh, routes []model.Route) *model.Mesh {
	t.Helper()
	var st []model.RouteStatus
	m.L4Routing, st = model.ResolveL4Routes(servicesOf(m), routes)
	mustAccept(t, st, false)
	return m
}

// l4Of is an L4 route of kind in shop, created age days into 2026, with parents,
// hostnames (TLSRoute) and backends.
func l4Of(kind model.RouteKind, name string, age int, parents []model.ParentRef, hostnames []string, backends ...model.BackendRef) model.Route {
	r := model.Route{RouteRef: model.RouteRef{Kind: kind, Namespace: "shop", Name: name}, Parents: parents, Hostnames: hostnames,
		Rules: []model.RouteRule{{Backends: backends}}}
	r.Created = r.Created.AddDate(2026, 0, age)
	return r
}

func svcParent(k model.ServiceKey, port uint32) model.ParentRef {
	return model.ParentRef{Kind: model.ParentService, Service: k, Port: port}
}

func svcBackend(k model.ServiceKey, port uint32, weight int32) model.BackendRef {
	return model.BackendRef{Kind: model.BackendService, Service: k, Port: port, Weight: weight}
}

// l4GoldenRoutes: a TCPRoute splitting db 3:1 with an invalid backend's share, TLSRoutes sharing
// tls:443 by exact and wildcard names (one also on the clusterset frontend), and a TLSRoute
// without hostnames on tls:444.
func l4GoldenRoutes() []model.Route {
	return []model.Route{
		l4Of(model.KindTCPRoute, "db-split", 0, []model.ParentRef{svcParent(dbKey, 3306)}, nil,
			svcBackend(dbKey, 3306, 3), svcBackend(dbV2Key, 3306, 1), svcBackend(model.ServiceKey{Namespace: "shop", Name: "nope"}, 3306, 1)),
		l4Of(model.KindTLSRoute, "tls-a", 0, []model.ParentRef{svcParent(tlsKey, 443)}, []string{"a.example", "*.wild.example", "*.deeper.wild.example"},
			svcBackend(tlsAKey, 443, 1)),
		l4Of(model.KindTLSRoute, "tls-b", 1, []model.ParentRef{svcParent(tlsKey, 443), {Kind: model.ParentServiceImport, Service: tlsKey, Port: 443}},
			[]string{"b.example"}, svcBackend(tlsBKey, 443, 1)),
		l4Of(model.KindTLSRoute, "tls-any", 0, []model.ParentRef{svcParent(tlsKey, 444)}, nil, svcBackend(tlsAKey, 443, 1)),
	}
}

// captureOf returns the capture listener of pod ns/name.
func captureOf(t *testing.T, r *Resources, pod string) *listenerv3.Listener {
	t.Helper()
	for _, l := range r.Listeners {
		if l.Name == "capture|"+pod {
			return l
		}
	}
	t.Fatalf("no capture listener of %s", pod)
	return nil
}

// TestBuildL4Golden builds goldenMesh with TCPRoutes and TLSRoutes and compares the client's
// capture listener (the shared matcher and chains with it) with its golden file; it passes
// ValidateAll and the snapshot is Consistent. Every other resource is the one of the same model
// without routes: routes change only the capture listeners.
func TestBuildL4Golden(t *testing.T) {
	m := l4Mesh(t, l4GoldenRoutes())
	r := buildValid(t, m, Options{})
	testenv.Golden(t, "l4.capture.json", stableJSON(t, asMessages([]*listenerv3.Listener{captureOf(t, r, "shop/client")})))

	plain := buildValid(t, l4Mesh(t, nil), Options{})
	for _, kind := range []string{"clusters", "endpoints", "routes", "secrets", "extensions"} {
		if slices.Contains(differingKinds(t, r, plain), kind) {
			t.Errorf("%s differ from the build without routes", kind)
		}
	}
	for i, l := range r.Listeners {
		if !strings.HasPrefix(l.Name, "capture|") && !proto.Equal(l, plain.Listeners[i]) {
			t.Errorf("listener %s differs from the build without routes", l.Name)
		}
	}
}

// TestL4ChainsShape checks what the L4 floor chains do, on the golden routes: a TCPRoute's VIP
// selects its route's chain, a weighted tcp_proxy over the backends' mesh clusters with an
// invalid backend's share to a cluster that does not exist; a TLSRoute's VIP (Service and
// clusterset) selects by transport and SNI, the Service's own floor chain for anything no route
// names; the tls_inspector runs on the TLS-routed ports only, and a capture listener without
// TLSRoutes has none (nor its timeout).
func TestL4ChainsShape(t *testing.T) {
	m := l4Mesh(t, l4GoldenRoutes())
	capture := captureOf(t, buildValid(t, m, Options{}), "shop/client")
	chains := map[string]*listenerv3.FilterChain{}
	for _, fc := range capture.FilterChains {
		chains[fc.Name] = fc
	}
	tcpProxy := func(name string) *tcpv3.TcpProxy {
		t.Helper()
		fc := chains[name]
		if fc == nil {
			t.Fatalf("no chain %s", name)
		}
		tp := &tcpv3.TcpProxy{}
		if err := fc.Filters[0].GetTypedConfig().UnmarshalTo(tp); err != nil {
			t.Fatal(err)
		}
		return tp
	}
	var split []string
	for _, c := range tcpProxy("tcproute|shop/db-split").GetWeightedClusters().GetClusters() {
		split = append(split, c.Name+"="+strings.Repeat("x", int(c.Weight)))
	}
	if got, want := strings.Join(split, " "), "db.shop.mesh:3306=xxx db-v2.shop.mesh:3306=x invalid|Service/shop/nope=x"; got != want {
		t.Errorf("db-split clusters %s, want %s", got, want)
	}
	if got := tcpProxy("tlsroute|shop/tls-a").GetCluster(); got != "tls-a.shop.mesh:443" {
		t.Errorf("tls-a cluster %s", got)
	}
	if got := tcpProxy("tcp|tls.shop.mesh:443").GetCluster(); got != "tls.shop.mesh:443" {
		t.Errorf("the Service's own floor chain goes to %s", got)
	}

	// The matcher: port, then IP, then (TLS) transport and SNI.
	ipMap := func(port string) map[string]*xdsmatcher.Matcher_OnMatch {
		return capture.FilterChainMatcher.GetMatcherTree().GetExactMatchMap().GetMap()[port].GetMatcher().GetMatcherTree().GetExactMatchMap().GetMap()
	}
	if got := ipMap("3306")["10.96.0.11"].GetAction().GetName(); got != "tcproute|shop/db-split" {
		t.Errorf("db VIP selects %q", got)
	}
	if got := ipMap("3306")["10.96.0.12"].GetAction().GetName(); got != "tcp|db-v2.shop.mesh:3306" {
		t.Errorf("db-v2 VIP (no route) selects %q", got)
	}
	for vip, want := range map[string]string{
		"10.96.0.13": "a.example b.example -> *.deeper.wild.example *.wild.example -> tcp|tls.shop.mesh:443 | tcp|tls.shop.mesh:443",
		"10.97.0.13": "b.example -> tcp|tls.shop.mesh:443 | tcp|tls.shop.mesh:443",
		"10.96.0.14": "tcp|tls-a.shop.mesh:443",
	} {
		if got := sniSummary(ipMap("443")[vip]); got != want {
			t.Errorf("443 %s: %s, want %s", vip, got, want)
		}
	}
	if got, want := sniSummary(ipMap("444")["10.96.0.13"]), "tlsroute|shop/tls-any | tcp|tls.shop.mesh:444"; got != want {
		t.Errorf("444: %s, want %s", got, want)
	}

	ti := capture.ListenerFilters[len(capture.ListenerFilters)-1]
	if ti.Name != "envoy.filters.listener.tls_inspector" {
		t.Fatalf("last listener filter %s, want the tls_inspector", ti.Name)
	}
	r := ti.FilterDisabled.GetNotMatch().GetDestinationPortRange()
	if r.GetStart() != 443 || r.GetEnd() != 445 {
		t.Errorf("tls_inspector enabled on %v, want ports 443-444 only", ti.FilterDisabled)
	}
	if capture.ListenerFiltersTimeout.AsDuration() != TLSInspectTimeout || !capture.ContinueOnListenerFiltersTimeout {
		t.Errorf("listener filters timeout %v continue %t", capture.ListenerFiltersTimeout, capture.ContinueOnListenerFiltersTimeout)
	}

	tcpOnly := captureOf(t, buildValid(t, l4Mesh(t, l4GoldenRoutes()[:1]), Options{}), "shop/client")
	plain := captureOf(t, buildValid(t, l4Mesh(t, nil), Options{}), "shop/client")
	if len(tcpOnly.ListenerFilters) != len(plain.ListenerFilters) || tcpOnly.ListenerFiltersTimeout != nil || tcpOnly.ContinueOnListenerFiltersTimeout {
		t.Errorf("a TCPRoute alone changed the listener filters: %v", tcpOnly.ListenerFilters)
	}
}

// sniSummary renders a capture matcher action: a chain name, or for a TLS frontend
// "<exact names> -> <wildcards> -> <rest> | <not TLS>" (sorted exact names, wildcards in match
// order; a part left out when absent).
func sniSummary(a *xdsmatcher.Matcher_OnMatch) string {
	if a.GetAction() != nil {
		return a.GetAction().GetName()
	}
	tp := a.GetMatcher()
	notTLS := tp.GetOnNoMatch().GetAction().GetName()
	next := tp.GetMatcherTree().GetExactMatchMap().GetMap()["tls"]
	var parts []string
	if tree := next.GetMatcher().GetMatcherTree(); tree != nil {
		var names []string
		for n := range tree.GetExactMatchMap().GetMap() {
			names = append(names, n)
		}
		slices.Sort(names)
		parts = append(parts, strings.Join(names, " "))
		next = next.GetMatcher().GetOnNoMatch()
	}
	if list := next.GetMatcher().GetMatcherList(); list != nil {
		var wild []string
		for _, fm := range list.Matchers {
			wild = append(wild, "*"+fm.Predicate.GetSinglePredicate().GetValueMatch().GetSuffix())
		}
		parts = append(parts, strings.Join(wild, " "))
		next = next.GetMatcher().GetOnNoMatch()
	}
	parts = append(parts, next.GetAction().GetName())
	return strings.Join(parts, " -> ") + " | " + notTLS
}

// TestTLSInspectorPorts: the tls_inspector is enabled on the TLS-routed ports only, consecutive
// ones as one range.
func TestTLSInspectorPorts(t *testing.T) {
	for _, tc := range []struct {
		ports []uint32
		want  string
	}{
		{nil, ""},
		{[]uint32{443}, "443-444"},
		{[]uint32{443, 444, 445, 8443}, "443-446 8443-8444"},
	} {
		ti, err := tlsInspector(tc.ports)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		if ti != nil {
			if err := ti.ValidateAll(); err != nil {
				t.Errorf("%v: %v", tc.ports, err)
			}
			on := ti.FilterDisabled.GetNotMatch()
			rules := on.GetOrMatch().GetRules()
			if rules == nil {
				rules = append(rules, on)
			}
			for _, r := range rules {
				pr := r.GetDestinationPortRange()
				got = append(got, fmt.Sprintf("%d-%d", pr.Start, pr.End))
			}
		}
		if g := strings.Join(got, " "); g != tc.want {
			t.Errorf("%v: enabled on %s, want %s", tc.ports, g, tc.want)
		}
	}
}

// TestBuilderL4Routes: with a Builder, an L4 route change rebuilds the capture matcher, chains
// and listeners (as a fresh Build does) and keeps the capture route table (the same value: not
// sent again); an endpoint change with routes in place keeps the matcher and chains; removing
// the routes gives back the capture listener of the model without them.
func TestBuilderL4Routes(t *testing.T) {
	bl, memo := NewBuilder(Options{}), &hashMemo{}
	plain := l4Mesh(t, nil)
	r0, s0 := buildSnapshot(t, bl, plain, memo)
	routed := l4Mesh(t, l4GoldenRoutes())
	r1, s1 := buildSnapshot(t, bl, routed, memo)
	if d := differingKinds(t, r1, buildValid(t, routed, Options{})); len(d) > 0 {
		t.Fatalf("%v differ from a fresh Build", d)
	}
	c0, c1 := captureOf(t, r0, "shop/client"), captureOf(t, r1, "shop/client")
	if proto.Equal(c0.FilterChainMatcher, c1.FilterChainMatcher) || len(c1.ListenerFilters) != len(c0.ListenerFilters)+1 {
		t.Error("routes added: the capture matcher or listener filters did not change")
	}
	if s0.GetVersionMap(resource.RouteType)[CaptureRouteName] !=
		s1.GetVersionMap(resource.RouteType)[CaptureRouteName] {
		t.Error("routes added: the capture route table changed")
	}

	// One endpoint's health changes: the matcher and chains are the previous values.
	moved := l4Mesh(t, l4GoldenRoutes())
	moved.Endpoints[dbKey] = slices.Clone(moved.Endpoints[dbKey])
	moved.Endpoints[dbKey][0].Healthy = false
	r2, _ := buildSnapshot(t, bl, moved, memo)
	c2 := captureOf(t, r2, "shop/client")
	if c2.FilterChainMatcher != c1.FilterChainMatcher || chainsKey(c2.FilterChains) != chainsKey(c1.FilterChains) {
		t.Error("an endpoint change rebuilt the capture matcher or chains")
	}

	// Another split of the TCPRoute: a fresh Build's output, the TLS listener filter unchanged.
	resplit := l4GoldenRoutes()
	resplit[0].Rules[0].Backends[1].Weight = 5
	r3, _ := buildSnapshot(t, bl, l4Mesh(t, resplit), memo)
	if d := differingKinds(t, r3, buildValid(t, l4Mesh(t, resplit), Options{})); len(d) > 0 {
		t.Fatalf("resplit: %v differ from a fresh Build", d)
	}
	if c3 := captureOf(t, r3, "shop/client"); !proto.Equal(c3.ListenerFilters[len(c3.ListenerFilters)-1], c1.ListenerFilters[len(c1.ListenerFilters)-1]) {
		t.Error("resplit: the tls_inspector changed")
	}

	r4, _ := buildSnapshot(t, bl, l4Mesh(t, nil), memo)
	if c4 := captureOf(t, r4, "shop/client"); !proto.Equal(c4, c0) {
		t.Error("routes removed: the capture listener is not the one without routes")
	}
}

// TestL4LocalBackends: an L4 route's Service backend of a service that is local and imported is
// the Service's endpoints in this cluster (its local cluster, which its TCP ports now have as
// its HTTP ports do, GEP-1748), a ServiceImport backend the clusterset's.
func TestL4LocalBackends(t *testing.T) {
	imp := svcBackend(tlsKey, 443, 1)
	imp.Kind = model.BackendServiceImport
	m := l4Mesh(t, []model.Route{l4Of(model.KindTCPRoute, "both", 0, []model.ParentRef{svcParent(dbKey, 3306)}, nil, svcBackend(tlsKey, 443, 1), imp)})
	r := buildValid(t, m, Options{})
	var got []string
	for _, fc := range captureOf(t, r, "shop/client").FilterChains {
		if fc.Name != "tcproute|shop/both" {
			continue
		}
		tp := &tcpv3.TcpProxy{}
		if err := fc.Filters[0].GetTypedConfig().UnmarshalTo(tp); err != nil {
			t.Fatal(err)
		}
		for _, c := range tp.GetWeightedClusters().GetClusters() {
			got = append(got, c.Name)
		}
	}
	if want := "local|tls.shop.mesh:443 tls.shop.mesh:443"; strings.Join(got, " ") != want {
		t.Errorf("clusters %q, want %s", got, want)
	}
	have := map[string]bool{}
	for _, c := range r.Clusters {
		have[c.Name] = true
	}
	for _, c := range r.Endpoints {
		have["eds "+c.ClusterName] = true
	}
	for _, want := range []string{"local|tls.shop.mesh:443", "local|tls.shop.mesh:444", "eds local|tls.shop.mesh:443"} {
		if !have[want] {
			t.Errorf("no %s", want)
		}
	}
}
