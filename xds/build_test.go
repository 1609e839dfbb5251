package xds

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// goldenMesh is a representative model: an HTTP service with two ports (one HTTP/2), a TCP
// service, an imported service with a clusterset VIP and endpoints in two clusters and zones, a
// UDP port (skipped), and two local pods (a client and a server backing two services).
func goldenMesh() *model.Mesh {
	td := model.DefaultTrustDomain
	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	db := model.ServiceKey{Namespace: "shop", Name: "db"}
	api := model.ServiceKey{Namespace: "edge", Name: "api"}
	// peers is headless; its named targetPort "web" is 8080 in web-1 and 8081 in peer-2.
	peers := model.ServiceKey{Namespace: "shop", Name: "peers"}
	ip := netip.MustParseAddr
	services := []*model.Service{
		{Key: web, Local: true, VIPs: []netip.Addr{ip("10.96.0.10")}, Ports: []model.ServicePort{
			{Name: "http", Port: 80, TargetPort: 8080, Protocol: model.ProtocolHTTP},
			{Name: "grpc", Port: 9090, TargetPort: 9090, Protocol: model.ProtocolGRPC},
			{Name: "dns", Port: 53, TargetPort: 53, Protocol: model.ProtocolUDP},
		}},
		{Key: db, Local: true, VIPs: []netip.Addr{ip("10.96.0.11")}, Ports: []model.ServicePort{
			{Name: "mysql", Port: 3306, TargetPort: 3306, Protocol: model.ProtocolTCP},
		}},
		{Key: api, Imported: true, ClustersetVIPs: []netip.Addr{ip("10.97.0.5")}, Ports: []model.ServicePort{
			{Name: "http", Port: 80, TargetPort: 8000, Protocol: model.ProtocolHTTP},
		}},
		{Key: peers, Local: true, Headless: true, Ports: []model.ServicePort{
			{Name: "http", Port: 80, TargetPort: 8080, TargetPortName: "web", Protocol: model.ProtocolHTTP},
			{Name: "raft", Port: 7000, TargetPort: 7000, Protocol: model.ProtocolTCP},
		}},
	}
	eps := map[model.ServiceKey][]model.Endpoint{
		web: {
			{Service: web, Cluster: "c1", Region: "r1", Zone: "z1", PodName: "web-1", PodUID: "uid-web-1", IPs: []netip.Addr{ip("10.244.1.7")},
				Ports: []model.EndpointPort{{Port: 8080, Protocol: model.ProtocolHTTP}, {Port: 9090, Protocol: model.ProtocolGRPC}}, SPIFFEID: model.SPIFFEID(td, "shop", "web"), Healthy: true},
			{Service: web, Cluster: "c1", Region: "r1", Zone: "z2", PodName: "web-2", PodUID: "uid-web-2", IPs: []netip.Addr{ip("10.244.2.7")},
				Ports: []model.EndpointPort{{Port: 8080, Protocol: model.ProtocolHTTP}}, SPIFFEID: model.SPIFFEID(td, "shop", "web"), Healthy: false},
		},
		db: {
			{Service: db, Cluster: "c1", Region: "r1", Zone: "z1", PodName: "db-0", PodUID: "uid-db-0", IPs: []netip.Addr{ip("10.244.1.9")},
				Ports: []model.EndpointPort{{Port: 3306, Protocol: model.ProtocolTCP}}, SPIFFEID: model.SPIFFEID(td, "shop", "db"), Healthy: true},
		},
		peers: {
			{Service: peers, Cluster: "c1", Region: "r1", Zone: "z1", PodName: "web-1", PodUID: "uid-web-1", IPs: []netip.Addr{ip("10.244.1.7")},
				Ports: []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.ProtocolHTTP}, {Name: "raft", Port: 7000, Protocol: model.ProtocolTCP}}, SPIFFEID: model.SPIFFEID(td, "shop", "web"), Healthy: true},
			{Service: peers, Cluster: "c1", Region: "r1", Zone: "z2", PodName: "peer-2", PodUID: "uid-peer-2", IPs: []netip.Addr{ip("10.244.2.9")},
				Ports: []model.EndpointPort{{Name: "http", Port: 8081, Protocol: model.ProtocolHTTP}, {Name: "raft", Port: 7000, Protocol: model.ProtocolTCP}}, SPIFFEID: model.SPIFFEID(td, "shop", "peer"), Healthy: true},
		},
		api: {
			{Service: api, Cluster: "c2", Region: "r2", Zone: "z9", PodName: "api-1", PodUID: "uid-api-1", IPs: []netip.Addr{ip("10.244.1.7")}, NodeIP: ip("192.168.0.21"),
				Ports: []model.EndpointPort{{Name: "http", Port: 8000, Protocol: model.ProtocolHTTP}}, SPIFFEID: model.SPIFFEID(td, "edge", "api"), Healthy: true},
			{Service: api, Cluster: "c2", Region: "r2", Zone: "z9", PodName: "api-2", PodUID: "uid-api-2", IPs: []netip.Addr{ip("10.244.1.8")}, NodeIP: ip("192.168.0.21"),
				Ports: []model.EndpointPort{{Name: "http", Port: 8000, Protocol: model.ProtocolHTTP}}, SPIFFEID: model.SPIFFEID(td, "edge", "api"), Healthy: true},
			{Service: api, Cluster: "c2", Region: "r2", Zone: "z9", PodName: "api-3", PodUID: "uid-api-3", IPs: []netip.Addr{ip("10.244.2.8")}, NodeIP: ip("192.168.0.22"),
				Ports: []model.EndpointPort{{Name: "http", Port: 8000, Protocol: model.ProtocolHTTP}}, SPIFFEID: model.SPIFFEID(td, "edge", "api"), Healthy: false},
		},
	}
	pods := []*model.LocalPod{
		{UID: "uid-client", Namespace: "shop", Name: "client", ServiceAccount: "client", NetnsPath: "/var/run/netns/cni-client", IPs: []netip.Addr{ip("10.244.1.5")}, Ready: true},
		{UID: "uid-web-1", Namespace: "shop", Name: "web-1", ServiceAccount: "web", NetnsPath: "/var/run/netns/cni-web-1", IPs: []netip.Addr{ip("10.244.1.7")}, Ready: true},
		{UID: "uid-db-0", Namespace: "shop", Name: "db-0", ServiceAccount: "db", NetnsPath: "/var/run/netns/cni-db-0", IPs: []netip.Addr{ip("10.244.1.9")}, Ready: true,
			Ports: []model.PodPort{{Port: 3306, Protocol: model.ProtocolTCP}}},
	}
	return model.New(7, "c1", "mesh", td, model.Node{Name: "n1", Region: "r1", Zone: "z1"}, services, eps, pods)
}

// fakeSVIDs returns placeholder SVIDs (Build copies the PEM bytes; it never parses them).
func fakeSVIDs(m *model.Mesh) map[string]*identity.SVID {
	out := map[string]*identity.SVID{}
	for _, p := range m.Pods {
		id := p.SPIFFEID(m.TrustDomain)
		out[id] = &identity.SVID{SPIFFEID: id, CertChainPEM: []byte("CERT " + id), KeyPEM: []byte("KEY " + id)}
	}
	return out
}

// testBundlePEM is a PEM CERTIFICATE block that is no certificate: what the pure builders'
// tests put in the trust bundle secret.
var testBundlePEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("BUNDLE")})

// fakeBundles is the trust bundles of m's trust domain: testBundlePEM.
func fakeBundles(m *model.Mesh) map[string][]byte {
	return map[string][]byte{m.TrustDomain: testBundlePEM}
}

// stableJSON renders messages as indented JSON with normalised whitespace (protojson's output is
// deliberately unstable).
func stableJSON(t *testing.T, msgs []proto.Message) []byte {
	t.Helper()
	var out bytes.Buffer
	out.WriteString("[\n")
	for i, m := range msgs {
		raw, err := protojson.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var compact, ind bytes.Buffer
		if err := json.Compact(&compact, raw); err != nil {
			t.Fatal(err)
		}
		if err := json.Indent(&ind, compact.Bytes(), "  ", "  "); err != nil {
			t.Fatal(err)
		}
		out.WriteString("  ")
		out.Write(ind.Bytes())
		if i < len(msgs)-1 {
			out.WriteString(",")
		}
		out.WriteString("\n")
	}
	out.WriteString("]\n")
	return out.Bytes()
}

func asMessages[T proto.Message](xs []T) []proto.Message {
	out := make([]proto.Message, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

// TestBuildGolden builds representative models and compares every resource kind with its golden
// file; every resource passes ValidateAll and the snapshot is Consistent.
func TestBuildGolden(t *testing.T) {
	cases := []struct {
		name string
		mesh *model.Mesh
		opts Options
	}{
		{"representative", goldenMesh(), Options{}},
		{"empty", model.New(1, "c1", "", "", model.Node{}, nil, nil, nil), Options{}},
		{"upstream-netns", goldenMesh(), Options{UpstreamNetns: "/var/run/netns/node", ConnectTimeout: 2 * time.Second}},
		{"east-west-waypoint", goldenMesh(), Options{EastWestWaypoint: true}},
		{"transport-socket-matcher", goldenMesh(), Options{CertSelection: CertMatcher}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := buildValid(t, c.mesh, c.opts)
			again, _ := Build(c.mesh, fakeSVIDs(c.mesh), fakeBundles(c.mesh), c.opts)
			for _, kind := range []struct {
				name string
				a, b []proto.Message
			}{
				{"listeners", asMessages(r.Listeners), asMessages(again.Listeners)},
				{"clusters", asMessages(r.Clusters), asMessages(again.Clusters)},
				{"endpoints", asMessages(r.Endpoints), asMessages(again.Endpoints)},
				{"routes", asMessages(r.Routes), asMessages(again.Routes)},
				{"secrets", asMessages(r.Secrets), asMessages(again.Secrets)},
				{"extensions", asMessages(r.Extensions), asMessages(again.Extensions)},
			} {
				got := stableJSON(t, kind.a)
				if !bytes.Equal(got, stableJSON(t, kind.b)) {
					t.Errorf("%s: two builds of the same model differ", kind.name)
				}
				testenv.Golden(t, c.name+"."+kind.name+".json", got)
			}
		})
	}
}

// TestBuildShape checks the properties the design names, on the representative model.
func TestBuildShape(t *testing.T) {
	m := goldenMesh()
	r, err := Build(m, fakeSVIDs(m), fakeBundles(m), Options{})
	if err != nil {
		t.Fatal(err)
	}
	names := func(xs []proto.Message, get func(proto.Message) string) []string {
		var out []string
		for _, x := range xs {
			out = append(out, get(x))
		}
		return out
	}
	clusters := strings.Join(names(asMessages(r.Clusters), func(m proto.Message) string { return m.(interface{ GetName() string }).GetName() }), " ")
	for _, want := range []string{"web.shop.mesh:80", "web.shop.mesh:9090", "db.shop.mesh:3306", "api.edge.mesh:80", "passthrough|shop/web-1", "passthrough|shop/db-0", "inbound|shop/web-1:8080", "inbound|shop/db-0:3306"} {
		if !strings.Contains(clusters, want) {
			t.Errorf("clusters %q lack %q", clusters, want)
		}
	}
	if strings.Contains(clusters, ":53") {
		t.Errorf("UDP port got a cluster: %q", clusters)
	}
	for _, cla := range r.Endpoints {
		if cla.ClusterName != "web.shop.mesh:80" {
			continue
		}
		if len(cla.Endpoints) != 2 || cla.Endpoints[0].Priority != 0 || cla.Endpoints[1].Priority != 1 {
			t.Errorf("web:80 localities = %v, want same zone at priority 0, other zone at 1", cla.Endpoints)
		}
	}
	var inbound string
	for _, l := range r.Listeners {
		if l.Name == "inbound|shop/web-1" {
			b, _ := protojson.Marshal(l)
			inbound = string(b)
		}
	}
	for _, want := range []string{`"8080"`, `"8080.web.shop.mesh"`, `"9090.web.shop.mesh"`, `"requireClientCertificate":true`, "SANITIZE_SET"} {
		if !strings.Contains(inbound, want) {
			t.Errorf("inbound listener lacks %s", want)
		}
	}
}

// TestSetMeshKeepsLastGoodSnapshot: a model the builders reject leaves the served snapshot
// unchanged, returns the error and counts it.
func TestSetMeshKeepsLastGoodSnapshot(t *testing.T) {
	ca, _ := testCA(t, model.DefaultTrustDomain, time.Hour)
	reg := prometheus.NewRegistry()
	s, err := NewServer(ServerOptions{NodeID: "n", Identity: identity.NewRotator(ca).Provider(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	good := goldenMesh()
	v1, err := s.SetMesh(ctx, good)
	if err != nil {
		t.Fatal(err)
	}
	bad := goldenMesh()
	bad.Pods[0].NetnsPath = "" // a pod without a netns cannot get listeners
	if _, err := s.SetMesh(ctx, bad); err == nil || !strings.Contains(err.Error(), "netns") {
		t.Fatalf("SetMesh(bad) = %v, want an error naming the netns", err)
	}
	if got := s.Version(); got != v1 {
		t.Errorf("version after failed build = %q, want %q kept", got, v1)
	}
	snap, err := s.cache.GetSnapshot("n")
	if err != nil {
		t.Fatal(err)
	}
	if snap.GetVersion(resource.ListenerType) != v1 {
		t.Errorf("served snapshot version = %q, want %q", snap.GetVersion(resource.ListenerType), v1)
	}
	var mf dto.Metric
	if err := s.buildFailures.Write(&mf); err != nil {
		t.Fatal(err)
	}
	if n := mf.GetCounter().GetValue(); n != 1 {
		t.Errorf("aether_xds_build_failures_total = %v, want 1", n)
	}
	// An unknown version is refused by WaitForAck.
	if err := s.WaitForAck(ctx, "other.1"); err == nil {
		t.Error("WaitForAck(foreign version) = nil, want error")
	}
}

// TestInboundPortProtocolFromEndpoints: a port the pod declares without a protocol annotation
// (HTTP by default) but that a Service registers as TCP (appProtocol) gets a raw TCP inbound
// chain: the registered endpoint's protocol wins.
func TestInboundPortProtocolFromEndpoints(t *testing.T) {
	k := model.ServiceKey{Namespace: "shop", Name: "echo"}
	ip := netip.MustParseAddr("10.244.1.20")
	m := model.New(1, "c1", "", "", model.Node{}, []*model.Service{{Key: k, Local: true,
		VIPs: []netip.Addr{netip.MustParseAddr("10.96.0.20")}, Ports: []model.ServicePort{{Name: "tcp", Port: 9000, TargetPort: 9000, Protocol: model.ProtocolTCP, AppProtocol: true}}}},
		map[model.ServiceKey][]model.Endpoint{k: {{Service: k, Cluster: "c1", PodUID: "uid-echo", IPs: []netip.Addr{ip},
			Ports: []model.EndpointPort{{Name: "tcp", Port: 9000, Protocol: model.ProtocolTCP}}, Healthy: true}}},
		[]*model.LocalPod{{UID: "uid-echo", Namespace: "shop", Name: "echo", NetnsPath: "/var/run/netns/echo", IPs: []netip.Addr{ip}, Ready: true,
			Ports: []model.PodPort{{Name: "tcp", Port: 9000, Protocol: model.ProtocolHTTP}}, Services: []model.ServiceKey{k}}})
	r, err := Build(m, fakeSVIDs(m), fakeBundles(m), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range r.Listeners {
		if l.GetName() != "inbound|shop/echo" {
			continue
		}
		for _, fc := range l.GetFilterChains() {
			if fc.GetName() == "9000" {
				if got := fc.GetFilters()[len(fc.GetFilters())-1].GetName(); got != "envoy.filters.network.tcp_proxy" {
					t.Fatalf("inbound chain 9000 ends in %s, want tcp_proxy (the endpoint registers the port as TCP)", got)
				}
				return
			}
		}
	}
	t.Fatal("no inbound chain 9000 for shop/echo")
}

// TestEndpointPriority: this cluster's endpoints come first (0-2), other clusters' after them
// (3-5), and within each tier the node's zone, then its region, then other regions.
func TestEndpointPriority(t *testing.T) {
	m := model.New(1, "c1", "mesh", model.DefaultTrustDomain, model.Node{Name: "n1", Region: "r1", Zone: "z1"}, nil, nil, nil)
	for _, c := range []struct {
		cluster, region, zone string
		want                  uint32
	}{
		{"c1", "r1", "z1", 0}, {"c1", "r1", "z2", 1}, {"c1", "r2", "z1", 2}, {"c1", "", "", 2},
		{"c2", "r1", "z1", 3}, {"c2", "r1", "z2", 4}, {"c2", "r2", "z9", 5},
	} {
		if got := priority(m, &model.Endpoint{Cluster: c.cluster, Region: c.region, Zone: c.zone}); got != c.want {
			t.Errorf("priority of an endpoint in cluster %s, region %q, zone %q = %d, want %d", c.cluster, c.region, c.zone, got, c.want)
		}
	}
}

// TestLoadAssignmentTiers: a service port with endpoints in this cluster's other zone and in two
// localities of another cluster gets one priority per tier present, numbered from 0 without gaps:
// this cluster first, then the other cluster's endpoints in the node's region, then the rest.
func TestLoadAssignmentTiers(t *testing.T) {
	m := goldenMesh()
	api := model.ServiceKey{Namespace: "edge", Name: "api"}
	eps := m.Endpoints[api]
	near := eps[0]
	near.PodName, near.PodUID, near.Region, near.Zone, near.IPs = "api-near", "uid-api-near", "r1", "z1", []netip.Addr{netip.MustParseAddr("10.244.3.3")}
	local := eps[0]
	local.PodName, local.PodUID, local.Cluster, local.Region, local.Zone, local.IPs = "api-local", "uid-api-local", "c1", "r1", "z2", []netip.Addr{netip.MustParseAddr("10.244.4.4")}
	m.Endpoints[api] = append(append([]model.Endpoint{}, eps...), near, local)
	m = model.New(m.Version, m.Cluster, m.MeshDomain, m.TrustDomain, m.Node, m.Services, m.Endpoints, m.Pods)
	r, err := Build(m, fakeSVIDs(m), fakeBundles(m), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, cla := range r.Endpoints {
		if cla.ClusterName != "api.edge.mesh:80" {
			continue
		}
		for _, l := range cla.Endpoints {
			got = append(got, fmt.Sprintf("%d %s/%s/%s %d", l.Priority, l.Locality.SubZone, l.Locality.Region, l.Locality.Zone, len(l.LbEndpoints)))
		}
	}
	want := []string{"0 c1/r1/z2 1", "1 c2/r1/z1 1", "2 c2/r2/z9 3"}
	if !slices.Equal(got, want) {
		t.Errorf("api:80 localities = %q, want %q", got, want)
	}
}

// TestHandshakeTimeout: every listener that inspects TLS (the pods' inbound listeners, the
// waypoint's tunnel listener) bounds the wait for the ClientHello (listener_filters_timeout), and
// every chain that terminates TLS bounds the handshake (transport_socket_connect_timeout), at
// DefaultHandshakeTimeout or Options.HandshakeTimeout; the pod listeners bind with freebind.
func TestHandshakeTimeout(t *testing.T) {
	m := goldenMesh()
	m = model.New(m.Version, m.Cluster, m.MeshDomain, m.TrustDomain, model.Node{Name: "n1", IP: netip.MustParseAddr("192.168.0.10")}, m.Services, m.Endpoints, m.Pods)
	for _, c := range []struct {
		name string
		set  time.Duration
		want time.Duration
	}{{"default", 0, DefaultHandshakeTimeout}, {"set", 3 * time.Second, 3 * time.Second}} {
		t.Run(c.name, func(t *testing.T) {
			r, err := Build(m, fakeSVIDs(m), fakeBundles(m), Options{EastWestWaypoint: true, HandshakeTimeout: c.set})
			if err != nil {
				t.Fatal(err)
			}
			inspecting := 0
			for _, l := range r.Listeners {
				if !l.GetFreebind().GetValue() {
					t.Errorf("%s: no freebind", l.Name)
				}
				if !slices.ContainsFunc(l.ListenerFilters, func(f *listenerv3.ListenerFilter) bool { return f.Name == "envoy.filters.listener.tls_inspector" }) {
					continue
				}
				inspecting++
				if got := l.GetListenerFiltersTimeout().AsDuration(); got != c.want {
					t.Errorf("%s: listener_filters_timeout %s, want %s", l.Name, got, c.want)
				}
				for _, fc := range l.FilterChains {
					if got := fc.GetTransportSocketConnectTimeout().AsDuration(); fc.TransportSocket != nil && got != c.want {
						t.Errorf("%s chain %s: transport_socket_connect_timeout %s, want %s", l.Name, fc.Name, got, c.want)
					}
				}
			}
			if inspecting != 3 { // two inbound listeners and the tunnel listener
				t.Errorf("%d listeners inspect TLS, want 3", inspecting)
			}
		})
	}
}

// TestWaitForAckOlderThanWindow: a version older than the tracked window (64 versions) is
// satisfied once Envoy ACKed each type's last change, even when a type has not changed since
// before that version, so that no ACK of it will ever come (endpoint-only changes send no
// listeners or clusters).
func TestWaitForAckOlderThanWindow(t *testing.T) {
	s := newTestServer(t)
	ctx := context.Background()
	m := goldenMesh()
	v1, err := s.SetMesh(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	var v2 string
	for i := range 70 {
		// Only an endpoint's health changes: EDS, no listener or cluster.
		next := goldenMesh()
		for key, eps := range next.Endpoints {
			eps = slices.Clone(eps)
			eps[0].Healthy = i%2 == 0
			next.Endpoints[key] = eps
			break
		}
		if v2, err = s.SetMesh(ctx, next); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	lastL, lastC := s.lastL, s.lastC
	v2n, _ := s.parseVersion(v2)
	s.mu.Unlock()
	if lastL >= v2n-64 || lastC >= v2n-64 {
		t.Fatalf("listeners changed at %d and clusters at %d, want both before the window of %d", lastL, lastC, v2n)
	}
	v1n, _ := s.parseVersion(v1)
	old := s.epoch + "." + strconv.FormatUint(v1n+1, 10) // inside the run of endpoint changes, out of the window
	s.mu.Lock()
	s.ack(waitTypes[0], lastL, true, "")
	s.ack(waitTypes[1], lastC, true, "")
	s.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.WaitForAck(wctx, old); err != nil {
		t.Errorf("WaitForAck(%s) with listeners ACKed at %d and clusters at %d: %v", old, lastL, lastC, err)
	}
	// A version not served yet is not ACKed by what came before it.
	next := s.epoch + "." + strconv.FormatUint(v2n+1, 10)
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := s.WaitForAck(sctx, next); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitForAck(%s), not served yet: %v, want a deadline error", next, err)
	}
}

// buildValid builds m with fake SVIDs and fails t unless every resource passes ValidateAll and
// the snapshot is Consistent (every referenced cluster, route and secret is served).
func buildValid(t *testing.T, m *model.Mesh, opts Options) *Resources {
	t.Helper()
	r, err := Build(m, fakeSVIDs(m), fakeBundles(m), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.ValidateAll(); err != nil {
		t.Fatalf("ValidateAll: %v", err)
	}
	snap, err := cache.NewSnapshot("1", r.typed())
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Consistent(); err != nil {
		t.Fatalf("snapshot not Consistent: %v", err)
	}
	return r
}

// changingProvider is a development-CA provider that can also signal a change of its own, as
// SPIRE's rotations do.
type changingProvider struct {
	identity.Provider
	changed chan struct{}
}

func (p changingProvider) Changed() <-chan struct{} { return p.changed }

// TestProviderChangeRebuilds: when the identity provider signals new SVIDs of its own
// (Provider.Changed), the server rebuilds and serves a new snapshot without a new model.
func TestProviderChangeRebuilds(t *testing.T) {
	ca, _ := testCA(t, model.DefaultTrustDomain, time.Hour)
	p := changingProvider{Provider: identity.NewRotator(ca).Provider(), changed: make(chan struct{}, 1)}
	s, ctx := serveWith(t, p)
	v1, err := s.SetMesh(ctx, goldenMesh())
	if err != nil {
		t.Fatal(err)
	}
	p.changed <- struct{}{}
	testenv.Eventually(t, 10*time.Second, "a rebuild after the provider's change", func() error {
		if v := s.Version(); v == v1 {
			return fmt.Errorf("still version %s", v)
		}
		return nil
	})
}

// gatedProvider is a Rotator's Provider whose bundle and some IDs' SVIDs are withheld until the
// test lets them through (as SPIRE before the node's agent has them), signalling Changed then.
type gatedProvider struct {
	identity.Provider
	changed chan struct{}

	mu       sync.Mutex
	noBundle bool
	withheld map[string]bool
	lacks    map[string]bool // pod UIDs
}

func (p *gatedProvider) Lacks(uid string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lacks[uid]
}

func (p *gatedProvider) Changed() <-chan struct{} { return p.changed }

func (p *gatedProvider) Bundles() map[string][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.noBundle {
		return nil
	}
	return p.Provider.Bundles()
}

func (p *gatedProvider) SVIDs(ctx context.Context, pods []identity.Workload) (map[string]*identity.SVID, bool, error) {
	out, changed, err := p.Provider.SVIDs(ctx, pods)
	p.mu.Lock()
	defer p.mu.Unlock()
	for id := range p.withheld {
		delete(out, id)
	}
	return out, changed, err
}

// let runs f under the provider's lock, then signals Changed.
func (p *gatedProvider) let(f func()) {
	p.mu.Lock()
	f()
	p.mu.Unlock()
	p.changed <- struct{}{}
}

// TestWaitPodServed: without the mesh's trust bundle no snapshot is served, and the server builds
// again by itself once the provider has it; a pod whose SVID the provider does not have is left
// out of the snapshot and WaitPodServed waits for it, naming why when it gives up, and returns
// the version serving the pod once its SVID came.
func TestWaitPodServed(t *testing.T) {
	ca, _ := testCA(t, model.DefaultTrustDomain, time.Hour)
	m := goldenMesh()
	web := m.Pods[0]
	webID := web.SPIFFEID(m.TrustDomain)
	p := &gatedProvider{Provider: identity.NewRotator(ca).Provider(), changed: make(chan struct{}, 1),
		noBundle: true, withheld: map[string]bool{webID: true}}
	s, ctx := serveWith(t, p)
	if _, err := s.SetMesh(ctx, m); err == nil || !strings.Contains(err.Error(), "no trust bundle") {
		t.Fatalf("SetMesh without the bundle = %v, want an error saying so", err)
	}
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := s.WaitPodServed(short, web.UID)
	cancelShort()
	if err == nil || !strings.Contains(err.Error(), "no snapshot served yet") {
		t.Fatalf("WaitPodServed before any snapshot = %v", err)
	}
	p.let(func() { p.noBundle = false })
	testenv.Eventually(t, 10*time.Second, "a snapshot once the bundle came", func() error {
		if s.Version() == "" {
			return errors.New("none served")
		}
		return nil
	})
	short, cancelShort = context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = s.WaitPodServed(short, web.UID)
	cancelShort()
	if err == nil || !strings.Contains(err.Error(), "no SVID for "+webID) {
		t.Fatalf("WaitPodServed of a pod without its SVID = %v, want the reason", err)
	}
	if n := gaugeValue(s.unservedPods); n != 1 {
		t.Fatalf("aether_xds_pods_unserved = %v, want 1", n)
	}
	other := m.Pods[1]
	if other.SPIFFEID(m.TrustDomain) == webID {
		t.Fatal("golden mesh: want two pods of different identities first")
	}
	if v, err := s.WaitPodServed(ctx, other.UID); err != nil || v != s.Version() {
		t.Fatalf("WaitPodServed of a pod with its SVID = %q, %v; want the current version", v, err)
	}
	got := make(chan error, 1)
	go func() {
		v, err := s.WaitPodServed(ctx, web.UID)
		if err == nil && v == "" {
			err = errors.New("empty version")
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("WaitPodServed returned before the SVID came: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	p.let(func() { delete(p.withheld, webID) })
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitPodServed did not return after the SVID came")
	}
	if n := gaugeValue(s.unservedPods); n != 0 {
		t.Fatalf("aether_xds_pods_unserved = %v once every SVID came, want 0", n)
	}
	// A pod the provider has no SVID of its own for is left out, though its ID is served for
	// another pod.
	p.let(func() { p.lacks = map[string]bool{other.UID: true} })
	testenv.Eventually(t, 10*time.Second, "the pod lacking its own SVID left out", func() error {
		short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancelShort()
		if _, err := s.WaitPodServed(short, other.UID); err == nil || !strings.Contains(err.Error(), "no SVID of its own") {
			return fmt.Errorf("WaitPodServed = %v", err)
		}
		return nil
	})
}

// gaugeValue returns g's value.
func gaugeValue(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		return -1
	}
	return m.GetGauge().GetValue()
}

// expiringProvider is a Rotator's Provider whose earliest expiry is at: once it passed, the
// provider (as SPIRE's drops an expired SVID) reports the next one an hour away.
type expiringProvider struct {
	identity.Provider
	at time.Time
}

func (p expiringProvider) NextRenewal() time.Time {
	if time.Now().Before(p.at) {
		return p.at
	}
	return time.Now().Add(time.Hour)
}

// TestRotateAtExpiry: the server rebuilds when the earliest SVID expires, although by then the
// provider reports a later next renewal (the expired one is gone from it), so a pod whose SVID
// expired is left out at its expiry and not at some later event.
func TestRotateAtExpiry(t *testing.T) {
	ca, _ := testCA(t, model.DefaultTrustDomain, time.Hour)
	p := expiringProvider{Provider: identity.NewRotator(ca).Provider(), at: time.Now().Add(time.Second)}
	s, ctx := serveWith(t, p)
	v1, err := s.SetMesh(ctx, goldenMesh())
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "a rebuild at the expiry", func() error {
		if v := s.Version(); v == v1 {
			return fmt.Errorf("still version %s", v)
		}
		return nil
	})
}

// serveWith starts a Server on identity provider p, serving ADS on a loopback listener (its
// rotation loop runs) until the test ends, and returns it with the test's context.
func serveWith(t *testing.T, p identity.Provider) (*Server, context.Context) {
	t.Helper()
	s, err := NewServer(ServerOptions{NodeID: "n", Identity: p, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ctx, l) }()
	return s, ctx
}
