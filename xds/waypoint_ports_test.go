package xds

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/model"
)

// socketSNI returns the SNI of a TLS transport socket.
func socketSNI(t *testing.T, ts *core.TransportSocket) string {
	t.Helper()
	var utc tlsv3.UpstreamTlsContext
	if err := ts.GetTypedConfig().UnmarshalTo(&utc); err != nil {
		t.Fatalf("transport socket %s: %v", ts.GetName(), err)
	}
	return utc.Sni
}

// endpointSNI returns the SNI Envoy sends to lb: the socket of the first of c's
// transport_socket_matches whose match is a subset of lb's envoy.transport_socket_match metadata
// (Cluster.transport_socket_matches: the first match wins), else c's transport_socket.
func endpointSNI(t *testing.T, c *clusterv3.Cluster, lb *endpointv3.LbEndpoint) string {
	t.Helper()
	md := lb.GetMetadata().GetFilterMetadata()["envoy.transport_socket_match"].GetFields()
	for _, m := range c.TransportSocketMatches {
		ok := true
		for k, v := range m.GetMatch().GetFields() {
			if have, found := md[k]; !found || !proto.Equal(have, v) {
				ok = false
			}
		}
		if ok {
			return socketSNI(t, m.TransportSocket)
		}
	}
	return socketSNI(t, c.TransportSocket)
}

// TestWaypointEndpointsPerTargetPort: with EastWestWaypoint and a named targetPort (or an
// imported port) that remote pods resolve to different numbers, each remote node's one waypoint
// entry carries one target port (waypointPort), weighted by that node's healthy pods serving
// it, and the SNI Envoy picks for the entry is that port's waypoint SNI; direct endpoints keep
// their own "<port>" SNI; no address appears twice. Before, every entry had the service port's
// TargetPort's SNI and counted all the node's pods, and the pods on another number failed the
// handshake.
func TestWaypointEndpointsPerTargetPort(t *testing.T) {
	td := model.DefaultTrustDomain
	api := model.ServiceKey{Namespace: "edge", Name: "api"}
	n1, n2 := netip.MustParseAddr("192.168.0.21"), netip.MustParseAddr("192.168.0.22")
	ep := func(cluster, pod string, node netip.Addr, port uint32, healthy bool) model.Endpoint {
		return model.Endpoint{Service: api, Cluster: cluster, Region: "r2", Zone: "z9", PodName: pod, PodUID: "uid-" + pod,
			IPs: []netip.Addr{netip.MustParseAddr("10.244.9." + pod[len(pod)-1:])}, NodeIP: node,
			Ports: []model.EndpointPort{{Name: "http", Port: port, Protocol: model.ProtocolHTTP}}, SPIFFEID: model.SPIFFEID(td, "edge", "api"), Healthy: healthy}
	}
	imported := &model.Service{Key: api, Imported: true, ClustersetVIPs: []netip.Addr{netip.MustParseAddr("10.97.0.5")},
		Ports: []model.ServicePort{{Name: "http", Port: 80, TargetPort: 8000, Protocol: model.ProtocolHTTP, FromImport: true}}}
	named := &model.Service{Key: api, Local: true, Imported: true, VIPs: []netip.Addr{netip.MustParseAddr("10.96.0.5")},
		Ports: []model.ServicePort{{Name: "http", Port: 80, TargetPort: 8000, TargetPortName: "web", Protocol: model.ProtocolHTTP}}}
	cases := []struct {
		name   string
		svc    *model.Service
		eps    []model.Endpoint
		want   []string // "<address>:<port> <health> w<weight> sni=<SNI>", EDS order
		direct bool     // EastWestWaypoint off: remote pods are dialled at their pod IPs
	}{
		{"one target port everywhere", imported,
			[]model.Endpoint{ep("c2", "p1", n1, 8000, true), ep("c2", "p2", n1, 8000, true), ep("c2", "p3", n2, 8000, true)},
			[]string{"192.168.0.21:15443 HEALTHY w2 sni=8000.api.edge.mesh", "192.168.0.22:15443 HEALTHY w1 sni=8000.api.edge.mesh"}, false},
		{"imported port resolved per pod, one number per node", imported,
			[]model.Endpoint{ep("c2", "p1", n1, 8000, true), ep("c2", "p2", n1, 8000, true), ep("c2", "p3", n2, 8001, true), ep("c2", "p4", n2, 8001, true)},
			[]string{"192.168.0.21:15443 HEALTHY w2 sni=8000.api.edge.mesh", "192.168.0.22:15443 HEALTHY w2 sni=8001.api.edge.mesh"}, false},
		{"no remote pod on the first port", imported,
			[]model.Endpoint{ep("c2", "p1", n1, 8002, true), ep("c2", "p2", n2, 8003, true)},
			[]string{"192.168.0.21:15443 HEALTHY w1 sni=8002.api.edge.mesh", "192.168.0.22:15443 HEALTHY w1 sni=8003.api.edge.mesh"}, false},
		// One EDS host per address (Envoy keeps the first of duplicates): a node whose pods
		// disagree carries the port with the most healthy pods, then the most pods, then the
		// service port's TargetPort, then the lowest.
		{"a node's pods on two numbers: the most healthy pods", imported,
			[]model.Endpoint{ep("c2", "p1", n1, 8000, true), ep("c2", "p2", n1, 8001, true), ep("c2", "p3", n1, 8001, true), ep("c2", "p4", n2, 8000, true)},
			[]string{"192.168.0.21:15443 HEALTHY w2 sni=8001.api.edge.mesh", "192.168.0.22:15443 HEALTHY w1 sni=8000.api.edge.mesh"}, false},
		{"a node's pods on two numbers: a tie goes to TargetPort", imported,
			[]model.Endpoint{ep("c2", "p1", n1, 8001, true), ep("c2", "p2", n1, 8000, true)},
			[]string{"192.168.0.21:15443 HEALTHY w1 sni=8000.api.edge.mesh"}, false},
		{"a node's pods on two numbers: unhealthy ones do not count", imported,
			[]model.Endpoint{ep("c2", "p1", n1, 8000, true), ep("c2", "p2", n1, 8001, false), ep("c2", "p3", n1, 8001, false)},
			[]string{"192.168.0.21:15443 HEALTHY w1 sni=8000.api.edge.mesh"}, false},
		{"a node with no healthy pod: the port with the most pods", imported,
			[]model.Endpoint{ep("c2", "p1", n1, 8000, false), ep("c2", "p2", n1, 8001, false), ep("c2", "p3", n1, 8001, false)},
			[]string{"192.168.0.21:15443 UNHEALTHY w1 sni=8001.api.edge.mesh"}, false},
		{"without the waypoint, an imported port resolved per pod: each pod its own SNI", imported,
			[]model.Endpoint{ep("c2", "p1", n1, 8000, true), ep("c2", "p2", n1, 8001, true)},
			[]string{"10.244.9.1:15008 HEALTHY w0 sni=8000", "10.244.9.2:15008 HEALTHY w0 sni=8001"}, true},
		{"local named targetPort: direct and waypoint endpoints on other numbers", named,
			[]model.Endpoint{ep("c1", "p1", netip.Addr{}, 8000, true), ep("c1", "p2", netip.Addr{}, 8001, true),
				ep("c2", "p3", n1, 8001, true), ep("c2", "p4", n1, 8002, true), ep("c2", "p5", n1, 8002, true), ep("c2", "p6", n2, 8003, true)},
			[]string{"10.244.9.1:15008 HEALTHY w0 sni=8000", "10.244.9.2:15008 HEALTHY w0 sni=8001",
				"192.168.0.21:15443 HEALTHY w2 sni=8002.api.edge.mesh", "192.168.0.22:15443 HEALTHY w1 sni=8003.api.edge.mesh"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			exported := map[model.ServiceKey][]model.Endpoint{api: c.eps}
			m := model.New(1, "c1", "mesh", td, model.Node{Name: "n0", Region: "r1", Zone: "z1"}, []*model.Service{c.svc}, exported, nil)
			r, err := Build(m, fakeSVIDs(m), []byte("BUNDLE"), Options{EastWestWaypoint: !c.direct})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.ValidateAll(); err != nil {
				t.Fatal(err)
			}
			ci := slices.IndexFunc(r.Clusters, func(c *clusterv3.Cluster) bool { return c.Name == "api.edge.mesh:80" })
			ei := slices.IndexFunc(r.Endpoints, func(e *endpointv3.ClusterLoadAssignment) bool { return e.ClusterName == "api.edge.mesh:80" })
			if ci < 0 || ei < 0 {
				t.Fatalf("no cluster or EDS api.edge.mesh:80")
			}
			var got []string
			addrs := map[string]bool{}
			for _, l := range r.Endpoints[ei].Endpoints {
				for _, lb := range l.LbEndpoints {
					sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
					a := fmt.Sprintf("%s:%d", sa.Address, sa.GetPortValue())
					if addrs[a] {
						t.Errorf("EDS holds %s twice: Envoy would keep only the first", a)
					}
					addrs[a] = true
					got = append(got, fmt.Sprintf("%s:%d %s w%d sni=%s", sa.Address, sa.GetPortValue(), lb.HealthStatus,
						lb.GetLoadBalancingWeight().GetValue(), endpointSNI(t, r.Clusters[ci], lb)))
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("EDS api.edge.mesh:80:\n got %q\nwant %q", got, c.want)
			}
		})
	}
}
