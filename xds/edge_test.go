package xds

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// goldenEdge is an edge Gateway over goldenMesh with every listener kind: two HTTP listeners on
// one port (a hostname and the catch-all), HTTPS with two certificates and a TLS passthrough
// listener sharing 443, a TCP listener with a 3:1 split and an invalid backend, and UDP.
func goldenEdge() *model.EdgeGateway {
	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	rule := func(b ...model.BackendRef) *model.RouteRule {
		return &model.RouteRule{Matches: []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/"}}}, Backends: b}
	}
	entry := func(name string, r *model.RouteRule) model.RouteEntry {
		return model.RouteEntry{Route: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: "gw", Name: name}, Rule: r, Match: r.Matches[0]}
	}
	be := func(k model.ServiceKey, port uint32, w int32) model.BackendRef {
		return model.BackendRef{Kind: model.BackendService, Service: k, Port: port, Weight: w}
	}
	cert := func(name string) model.Certificate {
		return model.Certificate{Ref: model.SecretKey{Namespace: "gw", Name: name}, CertPEM: []byte("CERT " + name), KeyPEM: []byte("KEY " + name), DNSNames: []string{name}}
	}
	invalid := model.BackendRef{Kind: model.BackendService, Service: model.ServiceKey{Namespace: "shop", Name: "gone"}, Port: 1, Weight: 1,
		Invalid: &model.Condition{Reason: "BackendNotFound"}}
	return &model.EdgeGateway{Key: model.GatewayKey{Namespace: "gw", Name: "edge"}, ServiceAccount: "edge-aether-edge", Ports: []model.EdgePort{
		{Port: 80, Listeners: []model.EdgeListener{
			{Name: "shop", Protocol: model.ListenerHTTP, Hostname: "shop.example", Hosts: []model.EdgeHost{
				{Hostname: "shop.example", Entries: []model.RouteEntry{entry("shop", rule(be(web, 80, 1)))}}}},
			{Name: "any", Protocol: model.ListenerHTTP, Hosts: []model.EdgeHost{
				{Hostname: "*.example", Entries: []model.RouteEntry{entry("wild", rule(be(web, 80, 1), invalid))}}}},
		}},
		{Port: 443, Listeners: []model.EdgeListener{
			{Name: "pass", Protocol: model.ListenerTLS, Hostname: "db.example", TLSMode: model.TLSPassthrough, L4: []model.EdgeL4Route{
				{Route: model.RouteRef{Kind: model.KindTLSRoute, Namespace: "gw", Name: "db"}, Hostnames: []string{"db.example"},
					Backends: []model.BackendRef{be(model.ServiceKey{Namespace: "shop", Name: "db"}, 3306, 1)}}}},
			{Name: "https", Protocol: model.ListenerHTTPS, TLSMode: model.TLSTerminate, Certificates: []model.Certificate{cert("a.example"), cert("b.example")},
				Hosts: []model.EdgeHost{{Hostname: "*", Entries: []model.RouteEntry{entry("secure", rule(be(web, 80, 1)))}}}},
		}},
		{Port: 6443, Listeners: []model.EdgeListener{
			{Name: "term", Protocol: model.ListenerTLS, TLSMode: model.TLSTerminate, Certificates: []model.Certificate{cert("c.example")}, L4: []model.EdgeL4Route{
				{Route: model.RouteRef{Kind: model.KindTLSRoute, Namespace: "gw", Name: "named"}, Hostnames: []string{"x.example"},
					Backends: []model.BackendRef{be(model.ServiceKey{Namespace: "shop", Name: "db"}, 3306, 1)}},
				{Route: model.RouteRef{Kind: model.KindTCPRoute, Namespace: "gw", Name: "rest"}, Backends: []model.BackendRef{be(web, 9090, 1)}},
				{Route: model.RouteRef{Kind: model.KindTCPRoute, Namespace: "gw", Name: "younger"}, Backends: []model.BackendRef{be(web, 80, 1)}},
			}},
		}},
		{Port: 3306, Listeners: []model.EdgeListener{
			{Name: "tcp", Protocol: model.ListenerTCP, L4: []model.EdgeL4Route{
				{Route: model.RouteRef{Kind: model.KindTCPRoute, Namespace: "gw", Name: "split"},
					Backends: []model.BackendRef{be(model.ServiceKey{Namespace: "shop", Name: "db"}, 3306, 3), be(model.ServiceKey{Namespace: "shop", Name: "web"}, 9090, 1)}}}},
		}},
		{Port: 53, Listeners: []model.EdgeListener{
			{Name: "dns", Protocol: model.ListenerUDP, L4: []model.EdgeL4Route{
				{Route: model.RouteRef{Kind: model.KindUDPRoute, Namespace: "gw", Name: "dns"}, Backends: []model.BackendRef{be(web, 53, 1)}}}},
		}},
	}}
}

// TestBuildEdgeGolden builds goldenEdge and compares every resource kind with its golden file;
// everything passes ValidateAll and the snapshot is consistent.
func TestBuildEdgeGolden(t *testing.T) {
	m := goldenMesh()
	id := model.SPIFFEID(m.TrustDomain, "gw", "edge-aether-edge")
	svid := &identity.SVID{SPIFFEID: id, CertChainPEM: []byte("SVID"), KeyPEM: []byte("SVID KEY"), NotAfter: time.Unix(2e9, 0)}
	r, err := BuildEdge(m, goldenEdge(), svid, fakeBundles(m), Options{EastWestWaypoint: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	if _, err := newSnapshot("1", r.typed(), nil); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	for _, kind := range []struct {
		name string
		xs   []byte
	}{
		{"listeners", stableJSON(t, asMessages(r.Listeners))},
		{"clusters", stableJSON(t, asMessages(r.Clusters))},
		{"endpoints", stableJSON(t, asMessages(r.Endpoints))},
		{"routes", stableJSON(t, asMessages(r.Routes))},
		{"secrets", stableJSON(t, asMessages(r.Secrets))},
	} {
		testenv.Golden(t, "edge."+kind.name+".json", kind.xs)
	}

	// The shape the design names, beside the golden files.
	lj := string(stableJSON(t, asMessages(r.Listeners)))
	for _, want := range []string{
		`"gateway|80"`, `"gateway|443"`, `"gateway|3306"`, `"gateway|udp|53"`, `"term|TLSRoute/gw/named"`, `"term|TCPRoute/gw/rest"`,
		`"envoy.filters.udp_listener.udp_proxy"`, `"db.example"`,
		`"cert|gw/a.example"`, `"cert|gw/b.example"`, `"stripAnyHostPort": true`, `"useRemoteAddress": true`,
	} {
		if !strings.Contains(lj, want) {
			t.Errorf("edge listeners lack %s", want)
		}
	}
	if rj := string(stableJSON(t, asMessages(r.Routes))); !strings.Contains(rj, `"invalid|Service/shop/gone"`) {
		t.Error("the invalid backend's share does not go to a cluster that does not exist")
	}
	if strings.Contains(lj, "gw/younger") {
		t.Error("a second TCPRoute on a TLS Terminate listener got a chain")
	}
	var routes []string
	for _, rc := range r.Routes {
		for _, vh := range rc.VirtualHosts {
			routes = append(routes, rc.Name+" "+strings.Join(vh.Domains, ","))
		}
	}
	want := "gateway|443|https * | gateway|80 shop.example | gateway|80 *.example | gateway|80 *"
	if got := strings.Join(routes, " | "); got != want {
		t.Errorf("virtual hosts\n got %s\nwant %s", got, want)
	}
	// The clusters are the mesh's, and they present the edge's SVID (the selector reads the
	// SPIFFE ID every edge listener sets first).
	for _, l := range r.Listeners {
		b, _ := protojson.Marshal(l)
		if l.GetUdpListenerConfig() == nil && !bytes.Contains(b, []byte(id)) {
			t.Errorf("listener %s does not set the edge's identity", l.Name)
		}
	}
}

// TestBuildEdgeRefusesMissingCertificate: a Terminate listener whose certificate has not been
// published yet fails the build (the server keeps the last good configuration), naming it.
func TestBuildEdgeRefusesMissingCertificate(t *testing.T) {
	g := goldenEdge()
	g.Ports[1].Listeners[1].Certificates[1].CertPEM = nil
	m := goldenMesh()
	svid := &identity.SVID{SPIFFEID: "spiffe://x/ns/gw/sa/e", CertChainPEM: []byte("C"), KeyPEM: []byte("K")}
	_, err := BuildEdge(m, g, svid, fakeBundles(m), Options{})
	if err == nil || !strings.Contains(err.Error(), "gw/b.example") || !strings.Contains(err.Error(), "https") {
		t.Fatalf("BuildEdge: %v, want an error naming listener https and certificate gw/b.example", err)
	}
}
