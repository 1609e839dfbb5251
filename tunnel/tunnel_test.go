package tunnel_test

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/identity"
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
	path := filepath.Join("testdata", "tunnel.golden.json")
	if os.Getenv("REFRESH_GOLDEN") != "" {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	} else if want, err := os.ReadFile(path); err != nil || !bytes.Equal(got, want) {
		t.Errorf("%s differs (%v); review and refresh with REFRESH_GOLDEN=1 go test ./tunnel/", path, err)
	}

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
		r, err := xds.Build(m, svids, []byte("BUNDLE"), xds.Options{EastWestWaypoint: on})
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
