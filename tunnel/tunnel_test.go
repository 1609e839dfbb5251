package tunnel_test

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/tunnel"
	"github.com/aethermesh/aether/xds"
)

// testMesh is one node of cluster "b": pods web-1 (backs web and hidden) and cli; web is
// exported, hidden is not, remote is only imported; web also has a pod on another node and one
// in another cluster.
func testMesh(nodeIP netip.Addr) *model.Mesh {
	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	hidden := model.ServiceKey{Namespace: "shop", Name: "hidden"}
	remote := model.ServiceKey{Namespace: "edge", Name: "api"}
	port := func(p uint32) []model.ServicePort {
		return []model.ServicePort{{Port: 80, TargetPort: p, Protocol: model.ProtocolHTTP}}
	}
	ep := func(k model.ServiceKey, cluster, uid, ip, node string, healthy bool) model.Endpoint {
		return model.Endpoint{Service: k, Cluster: cluster, PodUID: uid, PodName: uid, IPs: []netip.Addr{netip.MustParseAddr(ip)},
			NodeName: node, NodeIP: netip.MustParseAddr("192.168.0.9"), Ports: []model.EndpointPort{{Port: 8080}},
			SPIFFEID: model.SPIFFEID("td", k.Namespace, "sa"), Healthy: healthy}
	}
	svcs := []*model.Service{
		{Key: web, Local: true, Exported: true, VIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}, Ports: port(8080)},
		{Key: hidden, Local: true, VIPs: []netip.Addr{netip.MustParseAddr("10.96.0.2")}, Ports: port(8080)},
		{Key: remote, Imported: true, ClustersetVIPs: []netip.Addr{netip.MustParseAddr("10.97.0.1")}, Ports: port(8080)},
	}
	eps := map[model.ServiceKey][]model.Endpoint{
		web: {
			ep(web, "b", "web-1", "10.1.0.5", "n1", true),
			ep(web, "b", "web-2", "10.1.1.5", "n2", true),
			ep(web, "c", "web-1", "10.1.0.5", "n1", true), // same UID and IP in another cluster
			ep(web, "b", "web-3", "10.1.0.6", "n1", false),
		},
		hidden: {ep(hidden, "b", "web-1", "10.1.0.5", "n1", true)},
		remote: {ep(remote, "c", "api-1", "10.1.0.7", "c1", true)},
	}
	pods := []*model.LocalPod{
		{UID: "web-1", Namespace: "shop", Name: "web-1", ServiceAccount: "sa", NetnsPath: "/var/run/netns/web-1", IPs: []netip.Addr{netip.MustParseAddr("10.1.0.5")}, Ready: true},
		{UID: "web-3", Namespace: "shop", Name: "web-3", ServiceAccount: "sa", NetnsPath: "/var/run/netns/web-3", IPs: []netip.Addr{netip.MustParseAddr("10.1.0.6")}},
	}
	return model.New(1, "b", "mesh", "td", model.Node{Name: "n1", IP: nodeIP}, svcs, eps, pods)
}

// TestBuildGolden compares the tunnel resources with testdata/tunnel.golden.json (refresh with
// REFRESH_GOLDEN=1) and checks them as data: one chain per exported local service, its cluster
// holding only this node's pods of this cluster, refusal chains for the rest, no chain with a
// TLS transport socket, every resource valid.
func TestBuildGolden(t *testing.T) {
	r, err := tunnel.Build(testMesh(netip.MustParseAddr("192.168.0.9")), tunnel.Options{})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []proto.Message{r.Listener}
	for _, c := range r.Clusters {
		msgs = append(msgs, c)
	}
	for _, e := range r.Endpoints {
		msgs = append(msgs, e)
	}
	var out bytes.Buffer
	for _, m := range msgs {
		if v, ok := m.(interface{ ValidateAll() error }); ok {
			if err := v.ValidateAll(); err != nil {
				t.Errorf("%T invalid: %v", m, err)
			}
		}
		// protojson's whitespace is deliberately unstable: re-indent with encoding/json.
		b, err := protojson.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, b); err != nil {
			t.Fatal(err)
		}
		if err := json.Indent(&out, compact.Bytes(), "", "  "); err != nil {
			t.Fatal(err)
		}
		out.WriteString("\n")
	}
	got := out.Bytes()
	testenv.Golden(t, "tunnel.golden.json", got)

	l := r.Listener
	if addr := l.Address.GetSocketAddress(); addr.Address != "192.168.0.9" || addr.GetPortValue() != tunnel.Port {
		t.Errorf("listener address %v, want 192.168.0.9:15443", addr)
	}
	if l.DefaultFilterChain != nil {
		t.Error("listener has a default filter chain")
	}
	var chains []string
	for _, fc := range l.FilterChains {
		chains = append(chains, fc.Name+"="+strings.Join(fc.GetFilterChainMatch().GetServerNames(), ","))
		if fc.TransportSocket != nil {
			t.Errorf("chain %s has a transport socket: the tunnel must not terminate TLS", fc.Name)
		}
	}
	if want := []string{"shop/web=*.web.shop.mesh", "refuse-tls=", "refuse-raw="}; !slices.Equal(chains, want) {
		t.Errorf("chains %v, want %v", chains, want)
	}
	if len(r.Clusters) != 1 || r.Clusters[0].Name != "waypoint|shop/web" {
		t.Fatalf("clusters %v, want waypoint|shop/web only", r.Clusters)
	}
	var hosts []string
	for _, le := range r.Endpoints[0].Endpoints {
		for _, lb := range le.LbEndpoints {
			hosts = append(hosts, lb.GetEndpoint().Address.GetSocketAddress().Address+"/"+lb.HealthStatus.String())
		}
	}
	if want := []string{"10.1.0.5/HEALTHY", "10.1.0.6/UNHEALTHY"}; !slices.Equal(hosts, want) {
		t.Errorf("waypoint endpoints %v, want %v (this node's pods of this cluster only)", hosts, want)
	}
}

func TestBuildWithoutNodeIP(t *testing.T) {
	r, err := tunnel.Build(testMesh(netip.Addr{}), tunnel.Options{})
	if err != nil || r != nil {
		t.Errorf("Build without node IP = %v, %v; want nil, nil", r, err)
	}
}

// TestXDSBuildAddsWaypoint: xds.Build serves the tunnel resources only with EastWestWaypoint and
// the snapshot holding them is Consistent.
func TestXDSBuildAddsWaypoint(t *testing.T) {
	m := testMesh(netip.MustParseAddr("192.168.0.9"))
	svids := map[string]*identity.SVID{}
	for _, p := range m.Pods {
		id := p.SPIFFEID(m.TrustDomain)
		svids[id] = &identity.SVID{SPIFFEID: id, CertChainPEM: []byte("CERT"), KeyPEM: []byte("KEY")}
	}
	for _, on := range []bool{false, true} {
		r, err := xds.Build(m, svids, map[string][]byte{m.TrustDomain: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("BUNDLE")})}, xds.Options{EastWestWaypoint: on})
		if err != nil {
			t.Fatal(err)
		}
		has := slices.ContainsFunc(r.Listeners, func(l *listenerv3.Listener) bool { return l.Name == tunnel.ListenerName })
		if has != on {
			t.Errorf("EastWestWaypoint=%v: waypoint listener present = %v", on, has)
		}
		res := map[resource.Type][]types.Resource{}
		for _, l := range r.Listeners {
			res[resource.ListenerType] = append(res[resource.ListenerType], l)
		}
		for _, c := range r.Clusters {
			res[resource.ClusterType] = append(res[resource.ClusterType], c)
		}
		for _, e := range r.Endpoints {
			res[resource.EndpointType] = append(res[resource.EndpointType], e)
		}
		for _, rc := range r.Routes {
			res[resource.RouteType] = append(res[resource.RouteType], rc)
		}
		for _, s := range r.Secrets {
			res[resource.SecretType] = append(res[resource.SecretType], s)
		}
		snap, err := cache.NewSnapshot("1", res)
		if err != nil {
			t.Fatal(err)
		}
		if err := snap.Consistent(); err != nil {
			t.Errorf("EastWestWaypoint=%v: snapshot not consistent: %v", on, err)
		}
	}
}

// chainFor returns the filter chain Envoy picks for a TLS connection with SNI sni
// (FilterChainMatch.server_names: an exact name first, then the longest wildcard suffix "*.x",
// which matches any name ending in ".x"; a chain without server_names only when none matched).
func chainFor(l *listenerv3.Listener, sni string) *listenerv3.FilterChain {
	var wildcard, fallback *listenerv3.FilterChain
	best := 0
	for _, fc := range l.FilterChains {
		m := fc.GetFilterChainMatch()
		if m.GetTransportProtocol() != "tls" {
			continue
		}
		if len(m.GetServerNames()) == 0 {
			fallback = fc
		}
		for _, n := range m.GetServerNames() {
			if n == sni {
				return fc
			}
			if suffix, ok := strings.CutPrefix(n, "*"); ok && strings.HasSuffix(sni, suffix) && len(suffix) > best {
				wildcard, best = fc, len(suffix)
			}
		}
	}
	if wildcard != nil {
		return wildcard
	}
	return fallback
}

// reached returns the pod addresses (healthy or not) a connection with SNI sni can reach: the
// hosts of the cluster its chain's tcp_proxy names; nil when a refusal chain takes it.
func reached(t *testing.T, r *tunnel.Resources, sni string) []string {
	t.Helper()
	fc := chainFor(r.Listener, sni)
	if fc == nil || len(fc.Filters) != 1 {
		return nil
	}
	var tp tcpv3.TcpProxy
	if err := fc.Filters[0].GetTypedConfig().UnmarshalTo(&tp); err != nil {
		return nil
	}
	var out []string
	for _, cla := range r.Endpoints {
		if cla.ClusterName != tp.GetCluster() {
			continue
		}
		for _, le := range cla.Endpoints {
			for _, lb := range le.LbEndpoints {
				out = append(out, lb.GetEndpoint().Address.GetSocketAddress().Address)
			}
		}
		return out
	}
	t.Errorf("chain %s names cluster %q, which has no load assignment", fc.Name, tp.GetCluster())
	return nil
}

// TestBuildSplitPorts: when an exported service's pods on this node serve it on different target
// ports (a named targetPort resolved per pod), a connection whose SNI names a port reaches only
// the pods serving that port (an exact-SNI chain and cluster per port not every pod serves);
// ports every pod serves stay on the service's wildcard chain. Before, the wildcard chain sent
// every SNI of the service to every pod, and the pods without the SNI's port failed the
// handshake.
func TestBuildSplitPorts(t *testing.T) {
	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	type pod struct {
		ip      string
		ports   []uint32
		udp     uint32 // a UDP port: never served through :15008
		healthy bool
	}
	cases := []struct {
		name     string
		pods     []pod
		chains   []string            // listener chains and their server names
		clusters []string            // cluster names
		reach    map[uint32][]string // target port: pods its SNI reaches
	}{
		{"every pod on the same ports", []pod{{"10.1.0.5", []uint32{8080, 9090}, 0, true}, {"10.1.0.6", []uint32{8080, 9090}, 53, false}},
			[]string{"shop/web=*.web.shop.mesh", "refuse-tls=", "refuse-raw="},
			[]string{"waypoint|shop/web"},
			map[uint32][]string{8080: {"10.1.0.5", "10.1.0.6"}, 9090: {"10.1.0.5", "10.1.0.6"}}},
		{"named port resolved to two numbers, a shared numeric port", []pod{
			{"10.1.0.5", []uint32{8080, 9090}, 0, true}, {"10.1.0.6", []uint32{8081, 9090}, 0, true}, {"10.1.0.7", []uint32{8081, 9090}, 0, false}},
			[]string{"shop/web=*.web.shop.mesh", "shop/web:8080=8080.web.shop.mesh", "shop/web:8081=8081.web.shop.mesh", "refuse-tls=", "refuse-raw="},
			[]string{"waypoint|shop/web", "waypoint|shop/web:8080", "waypoint|shop/web:8081"},
			map[uint32][]string{8080: {"10.1.0.5"}, 8081: {"10.1.0.6", "10.1.0.7"}, 9090: {"10.1.0.5", "10.1.0.6", "10.1.0.7"}}},
		{"a pod without one of the ports", []pod{{"10.1.0.5", []uint32{8080, 9090}, 0, true}, {"10.1.0.6", []uint32{8080}, 9090, true}},
			[]string{"shop/web=*.web.shop.mesh", "shop/web:9090=9090.web.shop.mesh", "refuse-tls=", "refuse-raw="},
			[]string{"waypoint|shop/web", "waypoint|shop/web:9090"},
			map[uint32][]string{8080: {"10.1.0.5", "10.1.0.6"}, 9090: {"10.1.0.5"}}},
		{"no pod on this node", nil,
			[]string{"shop/web=*.web.shop.mesh", "refuse-tls=", "refuse-raw="},
			[]string{"waypoint|shop/web"},
			map[uint32][]string{8080: nil}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var eps []model.Endpoint
			var pods []*model.LocalPod
			for i, p := range c.pods {
				uid := fmt.Sprintf("web-%d", i)
				e := model.Endpoint{Service: web, Cluster: "b", PodUID: uid, PodName: uid, IPs: []netip.Addr{netip.MustParseAddr(p.ip)},
					NodeName: "n1", SPIFFEID: model.SPIFFEID("td", "shop", "sa"), Healthy: p.healthy}
				for _, port := range p.ports {
					e.Ports = append(e.Ports, model.EndpointPort{Name: fmt.Sprint(port), Port: port, Protocol: model.ProtocolTCP})
				}
				if p.udp != 0 {
					e.Ports = append(e.Ports, model.EndpointPort{Name: "udp", Port: p.udp, Protocol: model.ProtocolUDP})
				}
				eps = append(eps, e)
				pods = append(pods, &model.LocalPod{UID: uid, Namespace: "shop", Name: uid, NetnsPath: "/var/run/netns/" + uid, IPs: e.IPs, Ready: p.healthy})
			}
			svcs := []*model.Service{{Key: web, Local: true, Exported: true, VIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
				Ports: []model.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, TargetPortName: "http", Protocol: model.ProtocolTCP}}}}
			m := model.New(1, "b", "mesh", "td", model.Node{Name: "n1", IP: netip.MustParseAddr("192.168.0.9")}, svcs, map[model.ServiceKey][]model.Endpoint{web: eps}, pods)
			r, err := tunnel.Build(m, tunnel.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Listener.ValidateAll(); err != nil {
				t.Fatal(err)
			}
			var chains, clusters []string
			for _, fc := range r.Listener.FilterChains {
				chains = append(chains, fc.Name+"="+strings.Join(fc.GetFilterChainMatch().GetServerNames(), ","))
			}
			for i, cl := range r.Clusters {
				if err := cl.ValidateAll(); err != nil {
					t.Error(err)
				}
				clusters = append(clusters, cl.Name)
				if r.Endpoints[i].ClusterName != cl.Name {
					t.Errorf("load assignment %d is %s, want %s", i, r.Endpoints[i].ClusterName, cl.Name)
				}
			}
			if !slices.Equal(chains, c.chains) {
				t.Errorf("chains\n got %q\nwant %q", chains, c.chains)
			}
			if !slices.Equal(clusters, c.clusters) {
				t.Errorf("clusters %q, want %q", clusters, c.clusters)
			}
			for port, want := range c.reach {
				sni := tunnel.SNI(m, web, port)
				if got := reached(t, r, sni); !slices.Equal(got, want) {
					t.Errorf("SNI %s reaches %q, want %q", sni, got, want)
				}
			}
			if got := reached(t, r, "1.web.shop.mesh"); len(c.pods) > 0 && len(got) != len(c.pods) {
				t.Errorf("SNI of a port no pod serves reaches %q, want the service's wildcard chain (every pod, which refuses it)", got)
			}
			if got := reached(t, r, "8080.other.shop.mesh"); got != nil {
				t.Errorf("another service's SNI reaches %q, want refused", got)
			}
		})
	}
}
