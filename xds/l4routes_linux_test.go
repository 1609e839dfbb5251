package xds

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

var (
	vipTLS        = netip.MustParseAddr("10.96.0.30")
	vipTLSBackend = map[string]netip.Addr{"v1": netip.MustParseAddr("10.96.0.31"), "v2": netip.MustParseAddr("10.96.0.32")}
)

// l4Fixture is the traffic fixture with two more server pods, v1 and v2, each answering a TCP
// connection on 9000 with its name (server-first) and TLS on 8443 with a certificate for
// <name>.example from the test CA; the fixture's server pod answers TLS on 8443 with one for
// default.example. Services web/tcp-v1 and web/tcp-v2 (9000) and web/tls-v1 and web/tls-v2
// (8443, TCP) select v1 and v2, web/tls (VIP vipTLS, 8443, TCP) the server pod.
type l4Fixture struct {
	*meshFixture
	roots *x509.CertPool
}

func startL4Fixture(t testing.TB, delta bool, build Options) *l4Fixture {
	f := &l4Fixture{meshFixture: startTrafficFixture(t, time.Hour, delta, build)}
	ca, err := testenv.NewCA("l4 test CA")
	if err != nil {
		t.Fatal(err)
	}
	f.roots = x509.NewCertPool()
	f.roots.AppendCertsFromPEM(ca.CertPEM)
	serveTLS := func(ns *testenv.Netns, name string) {
		crt, key, err := ca.Issue(name, nil, []string{name}, nil)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := tls.X509KeyPair(crt, key)
		if err != nil {
			t.Fatal(err)
		}
		l := tls.NewListener(ns.Listen(t, "0.0.0.0:8443"), &tls.Config{Certificates: []tls.Certificate{cert}})
		// The remote address shows the path: 127.0.0.1, the pod's inbound listener's leg, when
		// the connection came over the mesh.
		serveEach(l, func(c net.Conn) {
			ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
			_, _ = fmt.Fprintf(c, "%s from %s\n", name, ap.Addr())
		})
	}
	serveTLS(f.pods["server"], "default.example")
	serveBanner(f.pods["outside"].Listen(t, "0.0.0.0:8443"), bannerText)
	for _, name := range []string{"v1", "v2"} {
		ns, _ := f.addPod(name, false)
		serveBanner(ns.Listen(t, "0.0.0.0:9000"), name+"\n")
		serveTLS(ns, name+".example")
	}
	return f
}

// mesh is the traffic model with the L4 fixture's pods and services and the L4 routes routes.
func (f *l4Fixture) mesh(t testing.TB, version uint64, routes []model.Route) *model.Mesh {
	base := trafficMesh(f.meshFixture, version)
	services, pods := base.Services, base.Pods
	eps := base.Endpoints
	web := func(name string) model.ServiceKey { return model.ServiceKey{Namespace: "web", Name: name} }
	addSvc := func(name string, vip netip.Addr, port uint32, pod string) {
		k := web(name)
		services = append(services, &model.Service{Key: k, Local: true, VIPs: []netip.Addr{vip},
			Ports: []model.ServicePort{{Name: "p", Port: port, TargetPort: port, Protocol: model.ProtocolTCP}}})
		eps[k] = []model.Endpoint{{Service: k, Cluster: "c1", PodName: pod, PodUID: "uid-" + pod, IPs: []netip.Addr{f.ips[pod]}, NodeName: "node-1",
			Ports: []model.EndpointPort{{Port: port, Protocol: model.ProtocolTCP}}, SPIFFEID: model.SPIFFEID(f.td, "web", pod), Healthy: true}}
	}
	addSvc("tls", vipTLS, 8443, "server")
	for i, name := range []string{"v1", "v2"} {
		addSvc("tcp-"+name, netip.AddrFrom4([4]byte{10, 96, 0, byte(40 + i)}), 9000, name)
		addSvc("tls-"+name, vipTLSBackend[name], 8443, name)
		pods = append(pods, &model.LocalPod{UID: "uid-" + name, Namespace: "web", Name: name, ServiceAccount: name, NetnsPath: f.pods[name].Path,
			IPs: []netip.Addr{f.ips[name]}, Ready: true,
			Ports: []model.PodPort{{Port: 9000, Protocol: model.ProtocolTCP}, {Port: 8443, Protocol: model.ProtocolTCP}}})
	}
	for _, p := range pods {
		if p.Name == "server" {
			p.Ports = append(p.Ports, model.PodPort{Port: 8443, Protocol: model.ProtocolTCP})
		}
	}
	m := model.New(version, base.Cluster, base.MeshDomain, base.TrustDomain, base.Node, services, eps, pods)
	return withL4Routes(t, m, routes)
}

// tcpRouteSplit is a TCPRoute on web/tcp:9000 sending 3 of 4 connections to tcp-v1, 1 to tcp-v2.
func tcpRouteSplit() model.Route {
	k := func(n string) model.ServiceKey { return model.ServiceKey{Namespace: "web", Name: n} }
	return model.Route{RouteRef: model.RouteRef{Kind: model.KindTCPRoute, Namespace: "web", Name: "split"},
		Parents: []model.ParentRef{{Kind: model.ParentService, Service: k("tcp"), Port: 9000}},
		Rules: []model.RouteRule{{Backends: []model.BackendRef{
			{Kind: model.BackendService, Service: k("tcp-v1"), Port: 9000, Weight: 3},
			{Kind: model.BackendService, Service: k("tcp-v2"), Port: 9000, Weight: 1},
		}}}}
}

// tlsRoutes are TLSRoutes on web/tls:8443: v1.example to tls-v1, b.example and *.two.example to
// tls-v2 (a name the backend's certificate does not hold: the client sees v2's own certificate).
func tlsRoutes() []model.Route {
	k := func(n string) model.ServiceKey { return model.ServiceKey{Namespace: "web", Name: n} }
	route := func(name string, hosts []string, to string) model.Route {
		return model.Route{RouteRef: model.RouteRef{Kind: model.KindTLSRoute, Namespace: "web", Name: name},
			Parents: []model.ParentRef{{Kind: model.ParentService, Service: k("tls"), Port: 8443}}, Hostnames: hosts,
			Rules: []model.RouteRule{{Backends: []model.BackendRef{{Kind: model.BackendService, Service: k(to), Port: 8443, Weight: 1}}}}}
	}
	return []model.Route{route("one", []string{"v1.example"}, "tls-v1"), route("two", []string{"b.example", "*.two.example"}, "tls-v2")}
}

// tlsPeer dials addr from ns with TLS and SNI sni, verifies the server's certificate for
// verifyAs against the test CA (so that it is the backend's own certificate, never one Envoy
// presents), and returns the certificate's DNS name and the first line the server sends.
func (f *l4Fixture) tlsPeer(ns *testenv.Netns, addr, sni, verifyAs string) (string, string, error) {
	raw, err := ns.Dial(addr)
	if err != nil {
		return "", "", err
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(5 * time.Second))
	c := tls.Client(raw, &tls.Config{ServerName: sni, InsecureSkipVerify: true, VerifyConnection: func(cs tls.ConnectionState) error {
		opts := x509.VerifyOptions{Roots: f.roots, DNSName: verifyAs}
		_, err := cs.PeerCertificates[0].Verify(opts)
		return err
	}})
	if err := c.Handshake(); err != nil {
		return "", "", fmt.Errorf("TLS to %s with SNI %s: %w", addr, sni, err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return c.ConnectionState().PeerCertificates[0].DNSNames[0], strings.TrimSpace(line), err
}

// TestPrivilegedL4Routes serves mesh TCPRoutes and TLSRoutes on the real Envoy (delta): a
// TCPRoute's 3:1 split is observed over 200 connections from a captured pod to the Service's VIP;
// TLSRoutes send two SNI names (one by a wildcard) to two different backends with the client's
// own TLS intact (the backend's certificate reaches the client, verified against the backend's
// CA; the backend sees the connection from its pod's inbound listener, so it came over mesh
// mTLS), and a name no route has, or no SNI, to the Service's own backend; the other paths (an
// HTTP service, a server-first TCP service, passthrough) keep working; removing the routes gives
// each port back its default floor. Envoy rejects nothing. As state of the world, delta, and
// with CertMatcher (runProtocols).
func TestPrivilegedL4Routes(t *testing.T) { runProtocols(t, testL4Routes) }

func testL4Routes(t *testing.T, delta bool, build Options) {
	f := startL4Fixture(t, delta, build)
	alpha := f.pods["alpha"]
	tcpVIP, tlsVIP := vipTCP.String()+":9000", vipTLS.String()+":8443"
	f.set(f.mesh(t, 2, nil))

	// count opens n connections to the TCP service's VIP, each sending "echo\n" and reading a
	// line: v1's or v2's name (their servers speak first) or "echo" (the Service's own backend,
	// an echo server).
	count := func(t *testing.T, n int) map[string]int {
		t.Helper()
		seen := map[string]int{}
		for i := 0; i < n; i++ {
			c, err := alpha.Dial(tcpVIP)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Write([]byte("echo\n"))
			line, err := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
			seen[strings.TrimSpace(line)]++
		}
		return seen
	}
	if seen := count(t, 5); seen["echo"] != 5 {
		t.Fatalf("before the route: %v, want the Service's own backend", seen)
	}
	if got, _, err := f.tlsPeer(alpha, tlsVIP, "v1.example", "default.example"); err != nil || got != "default.example" {
		t.Fatalf("before the routes, v1.example: %q %v, want the Service's own backend", got, err)
	}

	f.set(f.mesh(t, 3, append(tlsRoutes(), tcpRouteSplit())))
	t.Run("no NACK", f.wantNoRejections)
	t.Run("TCPRoute 3:1 over 200 connections", func(t *testing.T) {
		seen := count(t, 200)
		// Binomial(200, 3/4): mean 150, standard deviation 6.1; 120-180 is about 5 deviations.
		if seen["v1"]+seen["v2"] != 200 || seen["v1"] < 120 || seen["v1"] > 180 {
			t.Errorf("connections per backend %v, want about 150 v1 and 50 v2", seen)
		}
		t.Logf("connections per backend: %v", seen)
	})
	t.Run("TLSRoutes by SNI, the client's TLS end to end", func(t *testing.T) {
		for _, c := range []struct{ sni, cert, line string }{
			{"v1.example", "v1.example", "v1.example from 127.0.0.1"},
			{"V1.Example", "v1.example", "v1.example from 127.0.0.1"},
			{"X.Two.Example", "v2.example", "v2.example from 127.0.0.1"},
			{"b.example", "v2.example", "v2.example from 127.0.0.1"},
			{"x.two.example", "v2.example", "v2.example from 127.0.0.1"},
			{"a.b.two.example", "v2.example", "v2.example from 127.0.0.1"},
			{"unnamed.example", "default.example", "default.example from 127.0.0.1"},
			{"two.example", "default.example", "default.example from 127.0.0.1"}, // a wildcard needs a label in front
			{"", "default.example", "default.example from 127.0.0.1"},            // no SNI
		} {
			cert, line, err := f.tlsPeer(alpha, tlsVIP, c.sni, c.cert)
			if err != nil || cert != c.cert || line != c.line {
				t.Errorf("SNI %q: certificate %q, line %q, %v; want %s from %s", c.sni, cert, line, err, c.cert, c.line)
			}
		}
	})
	t.Run("other paths", func(t *testing.T) {
		code, body, _, err := getBody(alpha.HTTPClient(false), "http://"+vipHTTP.String()+"/", nil)
		if err != nil || code != 200 {
			t.Errorf("HTTP service: %d %q %v", code, body, err)
		}
		// Server-first: on a port without TLSRoutes (25), and on one with TLSRoutes (8443, a
		// non-mesh host through passthrough), where tls_inspector waits TLSInspectTimeout for
		// bytes the client never sends first, then lets the connection through.
		for _, addr := range []string{vipBanner.String() + ":25", f.ips["outside"].String() + ":8443"} {
			start := time.Now()
			c, err := alpha.Dial(addr)
			if err != nil {
				t.Fatal(err)
			}
			if err := readBanner(c, bannerText); err != nil {
				t.Errorf("server-first %s: %v", addr, err)
			}
			c.Close()
			t.Logf("server-first %s: banner after %v", addr, time.Since(start))
		}
		if err := echoVia(alpha, f.ips["outside"].String()+":7000", "passthrough"); err != nil {
			t.Errorf("passthrough: %v", err)
		}
	})

	f.set(f.mesh(t, 4, nil))
	t.Run("routes removed: the default floors", func(t *testing.T) {
		if seen := count(t, 20); seen["echo"] != 20 {
			t.Errorf("after the route: %v, want every connection to the Service's own backend", seen)
		}
		for _, sni := range []string{"v1.example", "b.example"} {
			if got, _, err := f.tlsPeer(alpha, tlsVIP, sni, "default.example"); err != nil || got != "default.example" {
				t.Errorf("after the routes, %s: %q %v, want the Service's own backend", sni, got, err)
			}
		}
	})
	f.wantNoRejections(t)
}

// TestPrivilegedL4RoutesACK: Envoy 1.40 takes the golden L4 routes (exact and wildcard SNI
// names, a ServiceImport frontend, an invalid backend's share, a TLSRoute without hostnames) and
// a TLSRoute on a port apart from the others (the tls_inspector enabled on two port ranges), as
// state of the world and delta, and rejects nothing.
func TestPrivilegedL4RoutesACK(t *testing.T) {
	for _, delta := range []bool{false, true} {
		t.Run(fmt.Sprintf("delta=%t", delta), func(t *testing.T) {
			f := newMeshFixture(t, time.Hour, delta, Options{})
			routes := append(l4GoldenRoutes(), l4Of(model.KindTLSRoute, "db-v2", 0, []model.ParentRef{svcParent(dbV2Key, 3306)},
				[]string{"db.example"}, svcBackend(dbKey, 3306, 1)))
			m := l4Mesh(t, routes)
			for _, p := range m.Pods {
				ns, ip := f.addPod(p.Name, false)
				p.NetnsPath, p.IPs = ns.Path, []netip.Addr{ip}
			}
			good := model.New(2, m.Cluster, m.MeshDomain, f.td, m.Node, m.Services, m.Endpoints, m.Pods)
			good.L4Routing = m.L4Routing
			r, err := Build(good, fakeSVIDs(good), fakeBundles(good), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got := captureOf(t, r, "shop/client").ListenerFilters; len(got[len(got)-1].FilterDisabled.GetNotMatch().GetOrMatch().GetRules()) != 2 {
				t.Fatalf("tls_inspector not on two port ranges: %v", got[len(got)-1])
			}
			f.set(good)
			f.wantNoRejections(t)
		})
	}
}
