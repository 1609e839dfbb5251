package xds

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/envoy"
	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// edgeFixture is the traffic fixture plus an edge pod: its own network namespace on the node
// bridge, an EdgeServer listening on 127.0.0.1:EdgeXDSPort inside it (as the agent does) and a
// second real Envoy in it, bootstrapped as the provisioned edge Deployment's is.
type edgeFixture struct {
	*meshFixture
	edgeNS    *testenv.Netns
	edgeIP    netip.Addr
	srv       *EdgeServer
	adminSock string
	edgeID    string
	sup       *envoy.Supervisor
}

var gwKey = model.GatewayKey{Namespace: "gw", Name: "edge"}

func startEdgeFixture(t testing.TB) *edgeFixture {
	f := startTrafficFixture(t, time.Hour, true, Options{})
	ns, ip := f.addPod("edgepod", false)
	e := &edgeFixture{meshFixture: f, edgeNS: ns, edgeIP: ip, edgeID: model.SPIFFEID(f.td, gwKey.Namespace, model.EdgeServiceAccountName(gwKey.Name))}
	var err error
	e.srv, err = NewEdgeServer(gwKey, identity.Workload{UID: "edge-pod", SPIFFEID: e.edgeID}, identity.NewRotator(f.ca).Provider(), Options{}, f.log)
	if err != nil {
		t.Fatal(err)
	}
	l := ns.Listen(t, fmt.Sprintf("127.0.0.1:%d", EdgeXDSPort))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.srv.Serve(ctx, l); close(done) }()
	dir := filepath.Join(f.dir, "edge")
	e.adminSock = filepath.Join(f.dir, "edge-admin.sock")
	tools := testenv.RequireTools(t, testenv.ToolEnvoy)
	sup, err := envoy.NewSupervisor(envoy.SupervisorConfig{
		EnvoyPath: tools.Envoy,
		Bootstrap: envoy.BootstrapConfig{NodeID: EdgeNodeID(gwKey), XDSAddress: l.Addr().String(), AdminAddress: "unix://" + e.adminSock},
		StateDir:  dir,
		Prefix:    []string{"ip", "netns", "exec", ns.Name},
		ExtraArgs: []string{"--concurrency", "1", "--log-level", "info"},
		Logger:    f.log,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.sup = sup
	sctx, scancel := context.WithCancel(context.Background())
	sdone := make(chan struct{})
	go func() { _ = sup.Run(sctx); close(sdone) }()
	t.Cleanup(func() {
		scancel()
		<-sdone
		_ = sup.Stop()
		cancel()
		<-done
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "envoy.log"))
			t.Logf("edge envoy log (tail):\n%s", testenv.Tail(string(b), 6000))
		}
	})
	return e
}

// set serves g and waits until the edge Envoy holds that version's listeners, warm.
func (e *edgeFixture) set(t testing.TB, m *model.Mesh, g *model.EdgeGateway) {
	t.Helper()
	v, err := e.srv.Set(context.Background(), m, g)
	if err != nil {
		t.Fatalf("edge Set: %v", err)
	}
	testenv.Eventually(t, time.Minute, "edge Envoy holds version "+v, func() error {
		s, err := e.admin("/stats?filter=^listener_manager.total_listeners_(active|warming)$")
		if err != nil {
			return err
		}
		want := fmt.Sprintf("listener_manager.total_listeners_active: %d\nlistener_manager.total_listeners_warming: 0", len(g.Ports))
		if strings.TrimSpace(s) != want {
			return fmt.Errorf("%s", strings.TrimSpace(s))
		}
		if r, err := e.admin("/ready"); err != nil || strings.TrimSpace(r) != "LIVE" {
			return fmt.Errorf("edge /ready: %q %v", r, err)
		}
		return nil
	})
	rej, err := e.admin("/stats?filter=update_rejected")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(rej), "\n") {
		if line != "" && !strings.HasSuffix(line, ": 0") {
			t.Errorf("edge Envoy rejected an update: %s", line)
		}
	}
}

func (e *edgeFixture) admin(path string) (string, error) { return adminGet(e.adminSock, path) }

// edgeMesh is the traffic mesh plus two server-first TCP services on the server pod that name
// themselves (tcp-a on 9101 says "A", tcp-b on 9102 says "B") and a TLS service (tls on 8443,
// the server's own TLS, which the edge passes through).
func edgeMesh(f *meshFixture, version uint64) *model.Mesh {
	base := trafficMesh(f, version)
	services := append([]*model.Service(nil), base.Services...)
	eps := map[model.ServiceKey][]model.Endpoint{}
	for k, v := range base.Endpoints {
		eps[k] = v
	}
	var srv *model.LocalPod
	pods := make([]*model.LocalPod, 0, len(base.Pods))
	for _, p := range base.Pods {
		if p.Name == "server" {
			c := *p
			srv = &c
			p = srv
		}
		pods = append(pods, p)
	}
	for i, n := range []struct {
		name string
		port uint32
	}{{"tcp-a", 9101}, {"tcp-b", 9102}, {"tls", 8443}, {"stream", 9100}} {
		k := model.ServiceKey{Namespace: "web", Name: n.name}
		services = append(services, &model.Service{Key: k, Local: true, VIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 1, byte(i + 1)})},
			Ports: []model.ServicePort{{Name: "p", Port: n.port, TargetPort: n.port, Protocol: model.ProtocolTCP}}})
		eps[k] = []model.Endpoint{{Service: k, Cluster: "c1", PodName: "server", PodUID: "uid-server", IPs: []netip.Addr{f.ips["server"]}, NodeName: "node-1",
			Ports: []model.EndpointPort{{Port: n.port, Protocol: model.ProtocolTCP}}, SPIFFEID: model.SPIFFEID(f.td, "web", "server"), Healthy: true}}
		srv.Ports = append(srv.Ports, model.PodPort{Port: n.port, Protocol: model.ProtocolTCP})
	}
	udp := model.ServiceKey{Namespace: "web", Name: "udp"}
	services = append(services, &model.Service{Key: udp, Local: true, VIPs: []netip.Addr{netip.MustParseAddr("10.96.1.9")},
		Ports: []model.ServicePort{{Name: "dns", Port: 53, TargetPort: 5353, Protocol: model.ProtocolUDP}}})
	eps[udp] = []model.Endpoint{{Service: udp, Cluster: "c1", PodName: "server", PodUID: "uid-server", IPs: []netip.Addr{f.ips["server"]}, NodeName: "node-1",
		Ports: []model.EndpointPort{{Port: 5353, Protocol: model.ProtocolUDP}}, SPIFFEID: model.SPIFFEID(f.td, "web", "server"), Healthy: true}}
	srv.Ports = append(srv.Ports, model.PodPort{Port: 5353, Protocol: model.ProtocolUDP})
	return model.New(version, base.Cluster, base.MeshDomain, base.TrustDomain, base.Node, services, eps, pods)
}

// TestPrivilegedEdgeGateway drives a real edge Envoy, programmed by an EdgeServer in its pod's
// network namespace, from a host outside the mesh: HTTP by Host to a meshed backend, which sees
// the edge's SPIFFE ID in XFCC; HTTPS with two certificates chosen by SNI; TLS passthrough by
// SNI (the backend's own certificate reaches the client); UDP datagrams to a pod; a TCP listener whose route splits 3:1
// between two backends, observed over many connections; a host no route names answered 404.
func TestPrivilegedEdgeGateway(t *testing.T) {
	e := startEdgeFixture(t)
	f := e.meshFixture
	srvNS := f.pods["server"]
	serveBanner(srvNS.Listen(t, "0.0.0.0:9101"), "A\n")
	serveBanner(srvNS.Listen(t, "0.0.0.0:9102"), "B\n")
	udpSeen := srvNS.ServeUDPEcho(t, "0.0.0.0:5353", "echo:")
	ca, err := testenv.NewCA("edge test CA")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	issue := func(name string) (tls.Certificate, model.Certificate) {
		c, k, err := ca.Issue(name, nil, []string{name}, nil)
		if err != nil {
			t.Fatal(err)
		}
		kp, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return kp, model.Certificate{Ref: model.SecretKey{Namespace: "gw", Name: name}, CertPEM: c, KeyPEM: k, DNSNames: []string{name}}
	}
	backendCert, _ := issue("backend.example")
	_, certA := issue("a.example")
	_, certB := issue("b.example")
	// The TLS backend answers with the SNI it saw, over its own TLS.
	tl := tls.NewListener(srvNS.Listen(t, "0.0.0.0:8443"), &tls.Config{Certificates: []tls.Certificate{backendCert}})
	serveEach(tl, func(c net.Conn) {
		if tc, ok := c.(*tls.Conn); ok && tc.Handshake() == nil {
			fmt.Fprintf(c, "sni=%s\n", tc.ConnectionState().ServerName)
		}
	})

	web := model.ServiceKey{Namespace: "web", Name: "http"}
	entry := func(route, header string) model.RouteEntry {
		rule := &model.RouteRule{
			Matches:  []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/"}}},
			Filters:  []model.RouteFilter{{Type: model.FilterResponseHeaderModifier, Headers: &model.HeaderModifier{Set: []model.Header{{Name: "x-route", Value: header}}}}},
			Backends: []model.BackendRef{{Kind: model.BackendService, Service: web, Port: 80, Weight: 1}},
		}
		return model.RouteEntry{Route: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: "gw", Name: route}, Rule: rule, Match: rule.Matches[0]}
	}
	backend := func(name string, port uint32, weight int32) model.BackendRef {
		return model.BackendRef{Kind: model.BackendService, Service: model.ServiceKey{Namespace: "web", Name: name}, Port: port, Weight: weight}
	}
	g := &model.EdgeGateway{Key: gwKey, ServiceAccount: model.EdgeServiceAccountName(gwKey.Name), Ports: []model.EdgePort{
		{Port: 8080, Listeners: []model.EdgeListener{{Name: "http", Protocol: model.ListenerHTTP, Hosts: []model.EdgeHost{
			{Hostname: "app.example", Entries: []model.RouteEntry{entry("app", "app")}},
		}}}},
		{Port: 8443, Listeners: []model.EdgeListener{
			{Name: "https", Protocol: model.ListenerHTTPS, TLSMode: model.TLSTerminate, Certificates: []model.Certificate{certA, certB},
				Hosts: []model.EdgeHost{{Hostname: "*", Entries: []model.RouteEntry{entry("secure", "secure")}}}},
		}},
		{Port: 9443, Listeners: []model.EdgeListener{
			{Name: "pass", Protocol: model.ListenerTLS, TLSMode: model.TLSPassthrough, L4: []model.EdgeL4Route{
				{Route: model.RouteRef{Kind: model.KindTLSRoute, Namespace: "gw", Name: "pass"}, Hostnames: []string{"backend.example"}, Backends: []model.BackendRef{backend("tls", 8443, 1)}},
			}},
		}},
		{Port: 5300, Listeners: []model.EdgeListener{
			{Name: "udp", Protocol: model.ListenerUDP, L4: []model.EdgeL4Route{
				{Route: model.RouteRef{Kind: model.KindUDPRoute, Namespace: "gw", Name: "dns"}, Backends: []model.BackendRef{backend("udp", 53, 1)}},
			}},
		}},
		{Port: 9000, Listeners: []model.EdgeListener{
			{Name: "tcp", Protocol: model.ListenerTCP, L4: []model.EdgeL4Route{
				{Route: model.RouteRef{Kind: model.KindTCPRoute, Namespace: "gw", Name: "split"}, Backends: []model.BackendRef{backend("tcp-a", 9101, 3), backend("tcp-b", 9102, 1)}},
			}},
		}},
	}}
	m := edgeMesh(f, 2)
	f.set(m)
	e.set(t, m, g)

	outside := f.pods["outside"]
	edge := e.edgeIP.String()
	dial := func(_ context.Context, _, addr string) (net.Conn, error) { return outside.Dial(addr) }

	t.Run("HTTP by Host to a meshed backend, the edge's identity in XFCC", func(t *testing.T) {
		code, body, hdr, err := getBody(outside.HTTPClient(false), "http://"+edge+":8080/x", map[string]string{"Host": "app.example"})
		if err != nil || code != 200 {
			t.Fatalf("GET: %d %q %v", code, body, err)
		}
		if got := xfccURI(body); got != e.edgeID {
			t.Errorf("backend saw XFCC URI %q, want the edge's %q", got, e.edgeID)
		}
		if hdr.Get("x-route") != "app" {
			t.Errorf("x-route = %q, want app", hdr.Get("x-route"))
		}
		// A client's own XFCC is not passed on: the backend sees only the edge's.
		_, body, _, err = getBody(outside.HTTPClient(false), "http://"+edge+":8080/x", map[string]string{"Host": "app.example", "X-Forwarded-Client-Cert": "By=spiffe://evil/x;URI=spiffe://aether.test/ns/web/sa/admin"})
		if err != nil || strings.Contains(body, "admin") || xfccURI(body) != e.edgeID {
			t.Errorf("forged XFCC: body %q %v, want only the edge's identity", body, err)
		}
		code, _, _, err = getBody(outside.HTTPClient(false), "http://"+edge+":8080/x", map[string]string{"Host": "other.example"})
		if err != nil || code != 404 {
			t.Errorf("GET with a host no route names: %d %v, want 404", code, err)
		}
	})

	t.Run("HTTPS, the certificate chosen by SNI", func(t *testing.T) {
		for _, name := range []string{"a.example", "b.example"} {
			c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dial,
				TLSClientConfig: &tls.Config{ServerName: name, RootCAs: pool}}}
			resp, err := c.Get("https://" + edge + ":8443/")
			if err != nil {
				t.Fatalf("GET with SNI %s: %v", name, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if got := resp.TLS.PeerCertificates[0].DNSNames; len(got) != 1 || got[0] != name {
				t.Errorf("SNI %s: the edge presented a certificate for %v", name, got)
			}
			if resp.StatusCode != 200 || xfccURI(string(b)) != e.edgeID || resp.Header.Get("x-route") != "secure" {
				t.Errorf("SNI %s: %d %q x-route %q", name, resp.StatusCode, b, resp.Header.Get("x-route"))
			}
		}
	})

	t.Run("TLS passthrough by SNI", func(t *testing.T) {
		raw, err := outside.Dial(edge + ":9443")
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
		c := tls.Client(raw, &tls.Config{ServerName: "backend.example", RootCAs: pool})
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			t.Fatalf("passthrough: %v", err)
		}
		if line != "sni=backend.example\n" {
			t.Errorf("backend said %q", line)
		}
		if got := c.ConnectionState().PeerCertificates[0].DNSNames; len(got) != 1 || got[0] != "backend.example" {
			t.Errorf("passthrough: certificate for %v, want the backend's own", got)
		}
		// Another SNI has no chain: the edge closes the connection.
		raw2, err := outside.Dial(edge + ":9443")
		if err != nil {
			t.Fatal(err)
		}
		defer raw2.Close()
		_ = raw2.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tls.Client(raw2, &tls.Config{ServerName: "nobody.example", RootCAs: pool}).Handshake(); err == nil {
			t.Error("an SNI no TLSRoute names got through")
		}
	})

	t.Run("UDPRoute datagrams", func(t *testing.T) {
		for i := range 3 {
			msg := fmt.Sprintf("datagram %d", i)
			got, err := outside.AskUDP(edge+":5300", msg, 5*time.Second)
			if err != nil || got != "echo:"+msg {
				t.Errorf("UDP through the edge: %q %v, want %q", got, err, "echo:"+msg)
			}
		}
		if n := udpSeen.Load(); n < 3 {
			t.Errorf("the UDP backend received %d datagrams, want 3", n)
		}
	})

	t.Run("TCPRoute weights", func(t *testing.T) {
		seen := map[string]int{}
		const n = 200
		for range n {
			c, err := outside.Dial(edge + ":9000")
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if err != nil {
				t.Fatalf("TCP through the edge: %v", err)
			}
			seen[strings.TrimSpace(line)]++
		}
		// 3:1 gives A 150 of 200 on average; 120..180 holds with overwhelming probability.
		if seen["A"]+seen["B"] != n || seen["A"] < 120 || seen["A"] > 180 {
			t.Errorf("connections by backend %v, want about 150 A and 50 B", seen)
		}
	})
}
