package xds

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/tunnel"
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
// handshake. A local Service's numeric targetPort that is also imported: other clusters' pods
// keep their own numbers, directly and through the waypoint (before, they were left out).
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
	// numeric is this cluster's Service with targetPort 8000, also imported: other clusters'
	// Services give the port their own targetPort.
	numeric := &model.Service{Key: api, Local: true, Imported: true, VIPs: []netip.Addr{netip.MustParseAddr("10.96.0.5")},
		ClustersetVIPs: []netip.Addr{netip.MustParseAddr("10.97.0.5")},
		Ports:          []model.ServicePort{{Name: "http", Port: 80, TargetPort: 8000, Protocol: model.ProtocolHTTP}}}
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
		// A local numeric targetPort: this cluster's pods serve it on that number (a pod
		// registered for another is not an endpoint), other clusters' pods on their own.
		// Before, the remote pods on 8001 and 8002 were left out of EDS.
		{"local numeric targetPort, imported: remote pods through the waypoint on their own numbers", numeric,
			[]model.Endpoint{ep("c1", "p1", netip.Addr{}, 8000, true), ep("c1", "p2", netip.Addr{}, 8009, true),
				ep("c2", "p3", n1, 8001, true), ep("c2", "p4", n1, 8001, true), ep("c2", "p5", n2, 8000, true), ep("c2", "p6", n2, 8002, true), ep("c2", "p7", n2, 8002, true)},
			[]string{"10.244.9.1:15008 HEALTHY w0 sni=8000",
				"192.168.0.21:15443 HEALTHY w2 sni=8001.api.edge.mesh", "192.168.0.22:15443 HEALTHY w2 sni=8002.api.edge.mesh"}, false},
		{"local numeric targetPort, imported, without the waypoint: remote pods dialled on their own numbers", numeric,
			[]model.Endpoint{ep("c1", "p1", netip.Addr{}, 8000, true), ep("c2", "p3", n1, 8001, true), ep("c2", "p5", n2, 8000, true)},
			[]string{"10.244.9.1:15008 HEALTHY w0 sni=8000", "10.244.9.3:15008 HEALTHY w0 sni=8001", "10.244.9.5:15008 HEALTHY w0 sni=8000"}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			exported := map[model.ServiceKey][]model.Endpoint{api: c.eps}
			m := model.New(1, "c1", "mesh", td, model.Node{Name: "n0", Region: "r1", Zone: "z1"}, []*model.Service{c.svc}, exported, nil)
			r, err := Build(m, fakeSVIDs(m), fakeBundles(m), Options{EastWestWaypoint: !c.direct})
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

// churnSources are the Sources of cluster a for TestTargetPortStableAcrossEndpointChurn: the
// local Service shop/db, whose targetPort is the name "pg"; shop/pay, known only from its
// ServiceImport, exported by b and c; and a client pod on this node. eps are the registry's
// endpoints in the order it lists them.
func churnSources(eps []model.Endpoint) model.Sources {
	client := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "client", UID: "uid-client"},
		Spec:       corev1.PodSpec{ServiceAccountName: "client"},
		Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	pay := model.ServiceKey{Namespace: "shop", Name: "pay"}
	return model.Sources{
		Cluster: "a", MeshDomain: "mesh", TrustDomain: model.DefaultTrustDomain,
		Node:           model.Node{Name: "n1", Region: "r1", Zone: "z1", IP: netip.MustParseAddr("192.168.0.1")},
		MeshNamespaces: map[string]bool{"shop": true},
		Services: []*corev1.Service{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db"},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.11", ClusterIPs: []string{"10.96.0.11"},
				Ports: []corev1.ServicePort{{Name: "sql", Port: 5432, TargetPort: intstr.FromString("pg"), AppProtocol: ptrTo("tcp")}}},
		}},
		Imports: []*mcsv1beta1.ServiceImport{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "pay"},
			Spec: mcsv1beta1.ServiceImportSpec{IPs: []string{"10.96.5.5"}, Ports: []mcsv1beta1.ServicePort{{Name: "grpc", Port: 9000}}}}},
		Pods: []*corev1.Pod{client},
		Attachments: map[string]cniv1.PodAttachment{"uid-client": {PodUID: "uid-client", Namespace: "shop", Name: "client",
			NetnsPath: "/var/run/netns/cni-client", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.5")}}},
		Endpoints: eps,
		Exports:   []model.ExportMark{{Service: pay, Cluster: "b"}, {Service: pay, Cluster: "c"}},
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestTargetPortStableAcrossEndpointChurn: a named targetPort (shop/db: "pg" is 6432 in two pods,
// 5432 in one) and an imported port (shop/pay: 9091 in two remote pods, 9090 in one), assembled
// by model.Assemble from the registry's endpoints. Listing them in another order gives
// byte-identical xDS resources; replacing a pod by another serving the same number, or an
// endpoint's health changing, changes only EDS; and a Builder rebuilds no cluster and no
// listener for either. For every option set. Before, each port's TargetPort was the first
// endpoint's in the registry's order: these steps flipped it to 5432 and 9090, and with it the
// clusters' default SNI and transport socket matches, and the EDS metadata of every endpoint.
func TestTargetPortStableAcrossEndpointChurn(t *testing.T) {
	td := model.DefaultTrustDomain
	db, pay := model.ServiceKey{Namespace: "shop", Name: "db"}, model.ServiceKey{Namespace: "shop", Name: "pay"}
	n1, n2 := netip.MustParseAddr("192.168.0.21"), netip.MustParseAddr("192.168.0.22")
	ep := func(k model.ServiceKey, cluster, pod string, node netip.Addr, port uint32, healthy bool) model.Endpoint {
		name, proto, region := "sql", model.ProtocolTCP, "r1"
		if k == pay {
			name, proto, region = "grpc", model.ProtocolGRPC, "r2"
		}
		return model.Endpoint{Service: k, Cluster: cluster, Region: region, Zone: "z1", PodName: pod, PodUID: "uid-" + pod,
			IPs: []netip.Addr{netip.MustParseAddr("10.244." + map[string]string{"a": "1", "b": "2", "c": "3"}[cluster] + "." + pod[1:])}, NodeIP: node,
			Ports: []model.EndpointPort{{Name: name, Port: port, Protocol: proto}}, SPIFFEID: model.SPIFFEID(td, "shop", k.Name), Healthy: healthy}
	}
	var (
		p1, p2, p3 = ep(pay, "b", "p1", n1, 9091, true), ep(pay, "b", "p2", n1, 9090, true), ep(pay, "c", "p3", n2, 9091, true)
		p4         = ep(pay, "b", "p4", n1, 9091, true) // replaces p1
		d1, d2, d3 = ep(db, "a", "d1", netip.Addr{}, 6432, true), ep(db, "a", "d2", netip.Addr{}, 5432, true), ep(db, "a", "d3", netip.Addr{}, 6432, true)
		d4         = ep(db, "a", "d4", netip.Addr{}, 6432, true) // replaces d3
		p3down     = ep(pay, "c", "p3", n2, 9091, false)
	)
	base := []model.Endpoint{p1, p2, p3, d1, d2, d3}
	steps := []struct {
		name    string
		eps     []model.Endpoint
		changed []string // resource kinds that may differ from base's
	}{
		{"listed in another order", []model.Endpoint{d2, p2, d3, p1, d1, p3}, nil},
		{"a pod replaced by one on the same number", []model.Endpoint{p2, p3, p4, d2, d1, d4}, []string{"endpoints"}},
		{"an endpoint turns unhealthy", []model.Endpoint{p2, p1, p3down, d2, d1, d3}, []string{"endpoints"}},
	}
	for _, opts := range []struct {
		name string
		o    Options
	}{
		{"default", Options{}},
		{"east-west-waypoint", Options{EastWestWaypoint: true}},
		{"transport-socket-matcher", Options{CertSelection: CertMatcher}},
	} {
		t.Run(opts.name, func(t *testing.T) {
			build := func(bl *Builder, eps []model.Endpoint) *Resources {
				t.Helper()
				m := model.Assemble(1, churnSources(eps))
				for _, k := range []model.ServiceKey{db, pay} {
					if s := m.Service(k); s == nil || len(s.Ports) != 1 {
						t.Fatalf("%s not in the model with one port: %+v", k, s)
					}
				}
				var r *Resources
				var err error
				if bl != nil {
					r, err = bl.Build(m, fakeSVIDs(m), fakeBundles(m))
				} else {
					r, err = Build(m, fakeSVIDs(m), fakeBundles(m), opts.o)
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := r.ValidateAll(); err != nil {
					t.Fatal(err)
				}
				return r
			}
			want := build(nil, base)
			bl := NewBuilder(opts.o)
			prev := build(bl, base)
			for _, step := range steps {
				got := build(nil, step.eps)
				if d := slices.DeleteFunc(differingKinds(t, got, want), func(k string) bool { return slices.Contains(step.changed, k) }); len(d) > 0 {
					t.Errorf("%s: %v differ, want only %v", step.name, d, step.changed)
				}
				r := build(bl, step.eps)
				for _, kind := range differingKinds(t, r, got) {
					t.Errorf("%s: the Builder's %s differ from a fresh Build", step.name, kind)
				}
				for i, c := range r.Clusters {
					if i >= len(prev.Clusters) || c != prev.Clusters[i] {
						t.Errorf("%s: the Builder rebuilt cluster %s", step.name, c.GetName())
					}
				}
				for i, l := range r.Listeners {
					// The node's tunnel listener is built afresh every time (small; its bytes
					// are compared above).
					if l.GetName() != tunnel.ListenerName && (i >= len(prev.Listeners) || l != prev.Listeners[i]) {
						t.Errorf("%s: the Builder rebuilt listener %s", step.name, l.GetName())
					}
				}
				prev = r
			}
		})
	}
}
