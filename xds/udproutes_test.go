package xds

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	udpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/udp/udp_proxy/v3"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

var dnsV2Key = model.ServiceKey{Namespace: "shop", Name: "dns-v2"}

// udpMesh is goldenMesh with shop/dns-v2 (UDP 53, one pod in c1, one in c2) and, when route,
// a UDPRoute on web:53 (UDP) splitting 3:1 between web:53 and dns-v2:53.
func udpMesh(t *testing.T, route bool) *model.Mesh {
	t.Helper()
	g := goldenMesh()
	ip := netip.MustParseAddr
	services := append(g.Services, &model.Service{Key: dnsV2Key, Local: true, Imported: true, VIPs: []netip.Addr{ip("10.96.0.30")},
		Ports: []model.ServicePort{{Name: "dns", Port: 53, TargetPort: 5353, Protocol: model.ProtocolUDP}}})
	eps := g.Endpoints
	eps[webKey][0].Ports = append(eps[webKey][0].Ports, model.EndpointPort{Port: 53, Protocol: model.ProtocolUDP})
	eps[dnsV2Key] = []model.Endpoint{
		{Service: dnsV2Key, Cluster: "c1", PodName: "dns-1", PodUID: "uid-dns-1", IPs: []netip.Addr{ip("10.244.1.30")}, Healthy: true,
			Ports: []model.EndpointPort{{Name: "dns", Port: 5353, Protocol: model.ProtocolUDP}}},
		{Service: dnsV2Key, Cluster: "c2", PodName: "dns-2", PodUID: "uid-dns-2", IPs: []netip.Addr{ip("10.245.1.30")}, Healthy: true,
			Ports: []model.EndpointPort{{Name: "dns", Port: 5353, Protocol: model.ProtocolUDP}}},
	}
	m := model.New(g.Version, g.Cluster, g.MeshDomain, g.TrustDomain, g.Node, services, eps, g.Pods)
	if !route {
		return m
	}
	return withL4Routes(t, m, []model.Route{l4Of(model.KindUDPRoute, "dns-split", 0, []model.ParentRef{svcParent(webKey, 53)}, nil,
		svcBackend(webKey, 53, 3), svcBackend(dnsV2Key, 53, 1))})
}

// TestBuildUDPRouteGolden: a UDPRoute on web:53 gives every pod one UDP listener in its netns on
// the frontend's local port (golden: the client's, and the route's cluster), and the route one
// static cluster of its backends' pods; nothing else changes. Without UDPRoutes there is no UDP
// listener at all.
func TestBuildUDPRouteGolden(t *testing.T) {
	m := udpMesh(t, true)
	fs := m.UDPFrontends()
	if len(fs) != 1 || fs[0].VIP != netip.MustParseAddr("10.96.0.10") || fs[0].Port != 53 {
		t.Fatalf("frontends %+v, want web's VIP 10.96.0.10:53", fs)
	}
	r := buildValid(t, m, Options{})
	var udp []*listenerv3.Listener
	for _, l := range r.Listeners {
		if strings.HasPrefix(l.Name, "udp|") {
			udp = append(udp, l)
		}
	}
	if len(udp) != len(m.Pods) {
		t.Fatalf("%d UDP listeners, want one per pod (%d)", len(udp), len(m.Pods))
	}
	client := udp[slices.IndexFunc(udp, func(l *listenerv3.Listener) bool { return l.Name == fmt.Sprintf("udp|shop/client|%d", fs[0].LocalPort) })]
	ci := slices.IndexFunc(r.Clusters, func(c *clusterv3.Cluster) bool { return c.Name == "udproute|shop/dns-split" })
	if ci < 0 {
		t.Fatal("no cluster udproute|shop/dns-split")
	}
	testenv.Golden(t, "udproute.json", stableJSON(t, []proto.Message{client, r.Clusters[ci]}))

	// The shape: 127.0.0.1:<local port> in the client's netns, UDP, udp_proxy to the cluster.
	sa := client.Address.GetSocketAddress()
	if sa.Address != "127.0.0.1" || sa.GetPortValue() != uint32(fs[0].LocalPort) || sa.NetworkNamespaceFilepath != "/var/run/netns/cni-client" ||
		sa.Protocol != core.SocketAddress_UDP || client.UdpListenerConfig == nil {
		t.Errorf("client UDP listener address %v", client.Address)
	}
	up := &udpv3.UdpProxyConfig{}
	if err := client.ListenerFilters[0].GetTypedConfig().UnmarshalTo(up); err != nil {
		t.Fatal(err)
	}
	// Weights: web:53 (3) over its one healthy pod, dns-v2:53 (1) over its two.
	var got []string
	for _, e := range r.Clusters[ci].LoadAssignment.Endpoints[0].LbEndpoints {
		a := e.GetEndpoint().Address.GetSocketAddress()
		got = append(got, fmt.Sprintf("%s:%d/%v*%d", a.Address, a.GetPortValue(), a.Protocol, e.LoadBalancingWeight.GetValue()))
	}
	if want := "10.244.1.7:53/UDP*3000 10.244.1.30:5353/UDP*500 10.245.1.30:5353/UDP*500"; strings.Join(got, " ") != want {
		t.Errorf("endpoints %s, want %s", strings.Join(got, " "), want)
	}
	// With the east-west waypoint, only this cluster's pods (the waypoint carries TLS only).
	ww := buildValid(t, m, Options{EastWestWaypoint: true})
	wc := ww.Clusters[slices.IndexFunc(ww.Clusters, func(c *clusterv3.Cluster) bool { return c.Name == "udproute|shop/dns-split" })]
	if n := len(wc.LoadAssignment.Endpoints[0].LbEndpoints); n != 2 {
		t.Errorf("with EastWestWaypoint %d endpoints, want 2 (c1's)", n)
	}

	plain := buildValid(t, udpMesh(t, false), Options{})
	for _, l := range plain.Listeners {
		if strings.HasPrefix(l.Name, "udp|") {
			t.Errorf("UDP listener %s without a UDPRoute", l.Name)
		}
	}
	for _, kind := range []string{"endpoints", "routes", "secrets", "extensions"} {
		if slices.Contains(differingKinds(t, r, plain), kind) {
			t.Errorf("%s differ from the build without routes", kind)
		}
	}
	if len(r.Clusters) != len(plain.Clusters)+1 || len(r.Listeners) != len(plain.Listeners)+len(m.Pods) {
		t.Errorf("%d clusters and %d listeners, want %d and %d", len(r.Clusters), len(r.Listeners), len(plain.Clusters)+1, len(plain.Listeners)+len(m.Pods))
	}

	// A held frontend (its redirect may still be installed) keeps its listeners and cluster
	// after its route is gone.
	held := buildValid(t, udpMesh(t, false), Options{UDPHeld: func() []model.UDPFrontend { return fs }})
	if len(held.Listeners) != len(r.Listeners) || !slices.ContainsFunc(held.Clusters, func(c *clusterv3.Cluster) bool { return c.Name == "udproute|shop/dns-split" }) {
		t.Errorf("held frontend: %d listeners (want %d), clusters %v", len(held.Listeners), len(r.Listeners), names(held.Clusters))
	}
}

func names(cs []*clusterv3.Cluster) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}
