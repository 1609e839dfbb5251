package xds

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	xdsmatcher "github.com/cncf/xds/go/xds/type/matcher/v3"
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

var udpHostIP = netip.MustParseAddr("192.168.0.10")

// TestBuildUDPRouteGolden: a UDPRoute on web:53 gives the node one UDP listener on
// HOST_IP:<the frontend's local port> in the node's netns, relaying only datagrams from the
// node's pods (golden: the listener, and the route's cluster), and the route one static cluster
// of its backends' pods; nothing else changes. Without UDPRoutes there is no UDP listener at
// all; without a host address of the VIP's family the frontend is not served.
func TestBuildUDPRouteGolden(t *testing.T) {
	m := udpMesh(t, true)
	fs := m.UDPFrontends()
	if len(fs) != 1 || fs[0].VIP != netip.MustParseAddr("10.96.0.10") || fs[0].Port != 53 {
		t.Fatalf("frontends %+v, want web's VIP 10.96.0.10:53", fs)
	}
	opts := Options{HostIP: udpHostIP, UpstreamNetns: "/var/run/netns/node"}
	r := buildValid(t, m, opts)
	udp := udpListeners(r.Listeners)
	if len(udp) != 1 || udp[0].Name != fmt.Sprintf("udp|192.168.0.10:%d", fs[0].LocalPort) {
		t.Fatalf("UDP listeners %v, want one, udp|192.168.0.10:%d", udp, fs[0].LocalPort)
	}
	l := udp[0]
	ci := slices.IndexFunc(r.Clusters, func(c *clusterv3.Cluster) bool { return c.Name == "udproute|shop/dns-split" })
	if ci < 0 {
		t.Fatal("no cluster udproute|shop/dns-split")
	}
	testenv.Golden(t, "udproute.json", stableJSON(t, []proto.Message{l, r.Clusters[ci]}))

	// The shape: HOST_IP:<local port> in the node's netns, UDP, freebind, udp_proxy to the
	// cluster for the node's pods only.
	sa := l.Address.GetSocketAddress()
	if sa.Address != "192.168.0.10" || sa.GetPortValue() != uint32(fs[0].LocalPort) || sa.NetworkNamespaceFilepath != "/var/run/netns/node" ||
		sa.Protocol != core.SocketAddress_UDP || l.UdpListenerConfig == nil || !l.GetFreebind().GetValue() {
		t.Errorf("UDP listener %v", l)
	}
	var pods []string
	for _, p := range m.Pods {
		for _, a := range p.IPs {
			pods = append(pods, a.String()+"/32")
		}
	}
	slices.Sort(pods)
	if got := udpSourceRanges(t, l); !slices.Equal(got, slices.Compact(pods)) {
		t.Errorf("sources %v, want the local pods' addresses %v (no node pod CIDRs)", got, pods)
	}
	// With the node's pod CIDRs, the ranges and the addresses outside them.
	withCIDRs := model.New(m.Version, m.Cluster, m.MeshDomain, m.TrustDomain,
		model.Node{Name: "n1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}, m.Services, m.Endpoints, m.Pods)
	withCIDRs.L4Routing = m.L4Routing
	var outside []string
	for _, a := range pods {
		if !strings.HasPrefix(a, "10.244.1.") {
			outside = append(outside, a)
		}
	}
	want := slices.Sorted(slices.Values(append([]string{"10.244.1.0/24"}, outside...)))
	if got := udpSourceRanges(t, udpListeners(buildValid(t, withCIDRs, opts).Listeners)[0]); !slices.Equal(got, want) {
		t.Errorf("sources with pod CIDRs %v, want %v", got, want)
	}

	// No pod CIDRs and no local pod: no listener (none could tell the node's pods from anyone).
	bare := model.New(m.Version, m.Cluster, m.MeshDomain, m.TrustDomain, model.Node{Name: "n1"}, m.Services, m.Endpoints, nil)
	bare.L4Routing = m.L4Routing
	if ls := udpListeners(buildValid(t, bare, opts).Listeners); len(ls) > 0 {
		t.Errorf("UDP listeners %v on a node with no pod CIDRs and no pods: they would relay from anywhere", ls)
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
	ww := buildValid(t, m, Options{HostIP: udpHostIP, EastWestWaypoint: true})
	wc := ww.Clusters[slices.IndexFunc(ww.Clusters, func(c *clusterv3.Cluster) bool { return c.Name == "udproute|shop/dns-split" })]
	if n := len(wc.LoadAssignment.Endpoints[0].LbEndpoints); n != 2 {
		t.Errorf("with EastWestWaypoint %d endpoints, want 2 (c1's)", n)
	}

	plain := buildValid(t, udpMesh(t, false), opts)
	if ls := udpListeners(plain.Listeners); len(ls) > 0 {
		t.Errorf("UDP listeners %v without a UDPRoute", ls)
	}
	for _, kind := range []string{"endpoints", "routes", "secrets", "extensions"} {
		if slices.Contains(differingKinds(t, r, plain), kind) {
			t.Errorf("%s differ from the build without routes", kind)
		}
	}
	if len(r.Clusters) != len(plain.Clusters)+1 || len(r.Listeners) != len(plain.Listeners)+1 {
		t.Errorf("%d clusters and %d listeners, want %d and %d", len(r.Clusters), len(r.Listeners), len(plain.Clusters)+1, len(plain.Listeners)+1)
	}

	// No IPv4 host address: the IPv4 frontend is neither served nor redirected.
	if ls := udpListeners(buildValid(t, m, Options{HostIPv6: netip.MustParseAddr("fd00::10")}).Listeners); len(ls) > 0 {
		t.Errorf("UDP listeners %v without HostIP", ls)
	}
	if got := (Options{HostIPv6: netip.MustParseAddr("fd00::10")}).UDPFrontends(m); len(got) > 0 {
		t.Errorf("UDPFrontends without HostIP: %+v", got)
	}

	// A held frontend (its redirect may still be installed) keeps its listener and cluster
	// after its route is gone.
	heldOpts := opts
	heldOpts.UDPHeld = func() []model.UDPFrontend { return fs }
	held := buildValid(t, udpMesh(t, false), heldOpts)
	if len(held.Listeners) != len(r.Listeners) || !slices.ContainsFunc(held.Clusters, func(c *clusterv3.Cluster) bool { return c.Name == "udproute|shop/dns-split" }) {
		t.Errorf("held frontend: %d listeners (want %d), clusters %v", len(held.Listeners), len(r.Listeners), names(held.Clusters))
	}
}

// TestUDPServedHeldPortWaits: a model frontend whose local port a held frontend of another VIP
// still has is not served until the held one is released (its listener keeps the held one's
// route); a held frontend of the same VIP and port gives way to the model's.
func TestUDPServedHeldPortWaits(t *testing.T) {
	m := udpMesh(t, true)
	fs := m.UDPFrontends()
	other := fs[0]
	other.VIP = netip.MustParseAddr("10.96.0.99")
	other.Route.Route.Name = "old-route"
	opts := Options{HostIP: udpHostIP, UDPHeld: func() []model.UDPFrontend { return []model.UDPFrontend{other} }}
	if got := udpServed(m, opts); len(got) != 1 || got[0].VIP != other.VIP || got[0].Route.Route.Name != "old-route" {
		t.Errorf("served %+v, want only the held frontend on local port %d", got, other.LocalPort)
	}
	// A previous agent's redirect (held without a route) keeps the port and is not served.
	routeless := model.UDPFrontend{VIP: other.VIP, Port: other.Port, LocalPort: other.LocalPort}
	opts.UDPHeld = func() []model.UDPFrontend { return []model.UDPFrontend{routeless} }
	if got := udpServed(m, opts); len(got) != 0 {
		t.Errorf("served %+v, want nothing while a route-less held frontend has the port", got)
	}
	same := fs[0]
	same.Route.Route.Name = "old-route"
	opts.UDPHeld = func() []model.UDPFrontend { return []model.UDPFrontend{same} }
	if got := udpServed(m, opts); len(got) != 1 || got[0].Route.Route != fs[0].Route.Route {
		t.Errorf("served %+v, want the model's frontend (same VIP and port) with the model's route", got)
	}
}

// udpListeners are the mesh's routed UDP listeners among ls.
func udpListeners(ls []*listenerv3.Listener) []*listenerv3.Listener {
	var out []*listenerv3.Listener
	for _, l := range ls {
		if strings.HasPrefix(l.Name, "udp|") {
			out = append(out, l)
		}
	}
	return out
}

// udpSourceRanges are the source ranges of l's udp_proxy matcher, as "<addr>/<len>".
func udpSourceRanges(t *testing.T, l *listenerv3.Listener) []string {
	t.Helper()
	up := &udpv3.UdpProxyConfig{}
	if err := l.ListenerFilters[0].GetTypedConfig().UnmarshalTo(up); err != nil {
		t.Fatal(err)
	}
	ipm := &xdsmatcher.IPMatcher{}
	if err := up.GetMatcher().GetMatcherTree().GetCustomMatch().GetTypedConfig().UnmarshalTo(ipm); err != nil {
		t.Fatalf("udp_proxy matcher %v: %v", up.GetMatcher(), err)
	}
	if up.GetMatcher().GetOnNoMatch() != nil {
		t.Errorf("udp_proxy matcher has on_no_match: datagrams from elsewhere would be relayed")
	}
	var out []string
	for _, rm := range ipm.RangeMatchers {
		for _, c := range rm.Ranges {
			out = append(out, fmt.Sprintf("%s/%d", c.AddressPrefix, c.PrefixLen.GetValue()))
		}
	}
	return out
}

func names(cs []*clusterv3.Cluster) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}
