package xds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

var (
	vipHTTP   = netip.MustParseAddr("10.96.0.10")
	vipTCP    = netip.MustParseAddr("10.96.0.11")
	vipBanner = netip.MustParseAddr("10.96.0.12")
)

const bannerText = "220 banner.test ESMTP ready\r\n"

// trafficMesh is the model of the traffic tests: two client pods (service accounts alpha and
// beta) and a server pod backing an HTTP service (80 -> 8080), a TCP service (9000) and a
// server-first TCP service (25 -> 2525).
func trafficMesh(f *meshFixture, version uint64) *model.Mesh {
	pod := func(name, ns, sa string) *model.LocalPod {
		return &model.LocalPod{UID: "uid-" + name, Namespace: ns, Name: name, ServiceAccount: sa,
			NetnsPath: f.pods[name].Path, IPs: []netip.Addr{f.ips[name]}, Ready: true}
	}
	srv := pod("server", "web", "server")
	srv.Ports = []model.PodPort{{Port: 8080, Protocol: model.ProtocolHTTP}, {Port: 9000, Protocol: model.ProtocolTCP}, {Port: 2525, Protocol: model.ProtocolTCP}}
	svc := func(name string, vip netip.Addr, port, target uint32, proto model.Protocol) *model.Service {
		return &model.Service{Key: model.ServiceKey{Namespace: "web", Name: name}, Local: true, VIPs: []netip.Addr{vip},
			Ports: []model.ServicePort{{Name: "p", Port: port, TargetPort: target, Protocol: proto}}}
	}
	ep := func(name string, port uint32, proto model.Protocol) model.Endpoint {
		return model.Endpoint{Service: model.ServiceKey{Namespace: "web", Name: name}, Cluster: "c1", PodName: "server", PodUID: "uid-server",
			IPs: []netip.Addr{f.ips["server"]}, NodeName: "node-1", Ports: []model.EndpointPort{{Port: port, Protocol: proto}},
			SPIFFEID: model.SPIFFEID(f.td, "web", "server"), Healthy: true}
	}
	services := []*model.Service{
		svc("http", vipHTTP, 80, 8080, model.ProtocolHTTP),
		svc("tcp", vipTCP, 9000, 9000, model.ProtocolTCP),
		svc("banner", vipBanner, 25, 2525, model.ProtocolTCP),
	}
	eps := map[model.ServiceKey][]model.Endpoint{
		{Namespace: "web", Name: "http"}:   {ep("http", 8080, model.ProtocolHTTP)},
		{Namespace: "web", Name: "tcp"}:    {ep("tcp", 9000, model.ProtocolTCP)},
		{Namespace: "web", Name: "banner"}: {ep("banner", 2525, model.ProtocolTCP)},
	}
	pods := []*model.LocalPod{pod("alpha", "shop", "alpha"), pod("beta", "shop", "beta"), srv}
	return model.New(version, "c1", "mesh", f.td, model.Node{Name: "node-1", IP: netip.MustParseAddr("10.44.0.1")}, services, eps, pods)
}

// startTrafficFixture builds the namespaces, starts the applications and serves the mesh.
func startTrafficFixture(t testing.TB, svidLifetime time.Duration, delta bool, build Options) *meshFixture {
	return startTrafficFixtureAt(t, "0.0.0.0", svidLifetime, delta, build)
}

// startTrafficFixtureAt is startTrafficFixture with the server pod's applications bound to
// appHost inside its netns ("0.0.0.0", or "127.0.0.1" for applications bound to the pod's
// loopback only).
func startTrafficFixtureAt(t testing.TB, appHost string, svidLifetime time.Duration, delta bool, build Options) *meshFixture {
	f := newMeshFixture(t, svidLifetime, delta, build)
	f.addPod("alpha", true)
	f.addPod("beta", true)
	srvNS, _ := f.addPod("server", false)
	outside, _ := f.addPod("outside", false) // a non-mesh host
	// The HTTP application answers with the XFCC header Envoy forwarded.
	hl := srvNS.Listen(t, appHost+":8080")
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			echoPost(w, r) // the latency benchmarks' echo
			return
		}
		fmt.Fprintf(w, "xfcc=%s", r.Header.Get("X-Forwarded-Client-Cert"))
	})}
	go func() { _ = hs.Serve(hl) }()
	t.Cleanup(func() { hs.Close() })
	serveEcho(srvNS.Listen(t, appHost+":9000"))
	serveBanner(srvNS.Listen(t, appHost+":2525"), bannerText)
	serveEcho(outside.Listen(t, "0.0.0.0:7000"))
	serveBanner(outside.Listen(t, "0.0.0.0:2222"), bannerText)
	outside.ServePeerAddr(t, "0.0.0.0:2223")
	f.set(trafficMesh(f, 1))
	return f
}

var uriInXFCC = regexp.MustCompile(`URI=([^;,]+)`)

// xfccURI extracts the caller's URI from a body "xfcc=<XFCC>".
func xfccURI(body string) string {
	m := uriInXFCC.FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return m[1]
}

// TestPrivilegedMeshTraffic drives the core paths through the real Envoy 1.40 and real
// namespaces: Envoy ACKs the snapshot (no NACK, update_rejected 0); HTTP to a service VIP with
// an arbitrary Host arrives over mTLS with the caller's SPIFFE ID in XFCC; the explicit lane;
// TCP to a TCP service's VIP arrives unchanged; a server-first service works through the capture
// listener and through passthrough; traffic to a non-mesh address passes through; two pods with
// different service accounts calling concurrently over keep-alive connections each arrive with
// their own identity; an inbound connection without a valid client certificate is refused.
func TestPrivilegedMeshTraffic(t *testing.T) { runProtocols(t, testMeshTraffic) }

// runProtocols runs a traffic scenario as a subtest per way of serving Envoy: state of the world,
// delta, and state of the world with the client certificate chosen by a transport socket
// matcher (CertMatcher).
func runProtocols(t *testing.T, scenario func(t *testing.T, delta bool, build Options)) {
	for _, c := range []struct {
		name  string
		delta bool
		build Options
	}{
		{"sotw", false, Options{}},
		{"delta", true, Options{}},
		{"sotw-transport-socket-matcher", false, Options{CertSelection: CertMatcher}},
	} {
		t.Run(c.name, func(t *testing.T) { scenario(t, c.delta, c.build) })
	}
}

func testMeshTraffic(t *testing.T, delta bool, build Options) {
	f := startTrafficFixture(t, time.Hour, delta, build)
	alpha, beta := f.pods["alpha"], f.pods["beta"]
	alphaID, betaID := model.SPIFFEID(f.td, "shop", "alpha"), model.SPIFFEID(f.td, "shop", "beta")

	t.Run("no NACK", f.wantNoRejections)

	t.Run("HTTP via VIP carries the caller's identity", func(t *testing.T) {
		for _, host := range []string{"anything.example", "http.web.mesh", vipHTTP.String()} {
			code, body, _, err := getBody(alpha.HTTPClient(false), "http://"+vipHTTP.String()+":80/x", map[string]string{"Host": host})
			if err != nil || code != 200 {
				t.Fatalf("GET VIP with Host %s: %d %q %v", host, code, body, err)
			}
			if got := xfccURI(body); got != alphaID {
				t.Errorf("Host %s: XFCC URI = %q (body %q), want %q", host, got, body, alphaID)
			}
		}
	})

	t.Run("explicit lane", func(t *testing.T) {
		for _, host := range []string{"http.web.mesh", "http.mesh", "http.web.mesh:80"} {
			code, body, _, err := getBody(beta.HTTPClient(false), "http://127.0.0.1:18081/", map[string]string{"Host": host})
			if err != nil || code != 200 || xfccURI(body) != betaID {
				t.Errorf("lane Host %s: %d %q %v, want 200 with XFCC URI %s", host, code, body, err, betaID)
			}
		}
	})

	t.Run("TCP floor", func(t *testing.T) {
		if err := echoVia(alpha, vipTCP.String()+":9000", strings.Repeat("floor bytes \x00\xff ", 100)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("server-first through the floor", func(t *testing.T) {
		c, err := alpha.Dial(vipBanner.String() + ":25")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := readBanner(c, bannerText); err != nil {
			t.Fatal(err)
		}
		if err := testenv.EchoOnce(c, "EHLO x\r\n"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("passthrough", func(t *testing.T) {
		if err := echoVia(alpha, f.ips["outside"].String()+":7000", "to a non-mesh host"); err != nil {
			t.Fatal(err)
		}
		b, err := alpha.Dial(f.ips["outside"].String() + ":2222")
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if err := readBanner(b, bannerText); err != nil {
			t.Fatalf("server-first passthrough: %v", err)
		}
		// The passthrough leaves from alpha's own netns: the peer sees alpha's address, not
		// the node's (the bridge address, which strict mode trusts).
		saw, err := alpha.PeerAddr(f.ips["outside"].String() + ":2223")
		if err != nil {
			t.Fatal(err)
		}
		if saw != f.ips["alpha"] {
			t.Fatalf("non-mesh peer saw the passthrough from %v, want alpha's address %v", saw, f.ips["alpha"])
		}
	})

	t.Run("two identities over keep-alive", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for _, c := range []struct {
			ns *testenv.Netns
			id string
		}{{alpha, alphaID}, {beta, betaID}} {
			ns := c.ns
			for w := 0; w < 3; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cl := ns.HTTPClient(true)
					for i := 0; i < 30; i++ {
						code, body, _, err := getBody(cl, "http://"+vipHTTP.String()+"/", nil)
						if err != nil || code != 200 {
							errs <- fmt.Errorf("%s: %d %q %v", c.id, code, body, err)
							return
						}
						if got := xfccURI(body); got != c.id {
							errs <- fmt.Errorf("request from %s arrived as %q", c.id, got)
							return
						}
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("inbound refuses a connection without a valid client certificate", func(t *testing.T) {
		target := f.ips["server"].String() + ":15008"
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(f.ca.BundlePEM())
		try := func(certs []tls.Certificate) error {
			raw, err := f.pods["outside"].Dial(target)
			if err != nil {
				return err
			}
			defer raw.Close()
			c := tls.Client(raw, &tls.Config{ServerName: "8080", RootCAs: pool, Certificates: certs, InsecureSkipVerify: true})
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if err := c.Handshake(); err != nil {
				return err
			}
			// TLS 1.3: the server's verdict on the client certificate arrives with the first read.
			if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				return err
			}
			buf := make([]byte, 64)
			_, err = c.Read(buf)
			return err
		}
		if err := try(nil); err == nil {
			t.Errorf("inbound without client certificate: request served, want refusal")
		}
		other, _ := testCA(t, f.td, time.Hour)
		svid, err := other.Issue(context.Background(), model.SPIFFEID(f.td, "shop", "alpha"))
		if err != nil {
			t.Fatal(err)
		}
		cert, _ := tls.X509KeyPair(svid.CertChainPEM, svid.KeyPEM)
		if err := try([]tls.Certificate{cert}); err == nil {
			t.Errorf("inbound with a certificate from another CA: request served, want refusal")
		}
		// The same request with a certificate of the trust domain is served: the refusals above
		// are about the certificate, not the path.
		good, err := f.ca.Issue(context.Background(), model.SPIFFEID(f.td, "shop", "alpha"))
		if err != nil {
			t.Fatal(err)
		}
		gc, _ := tls.X509KeyPair(good.CertChainPEM, good.KeyPEM)
		if err := try([]tls.Certificate{gc}); err != nil {
			t.Errorf("inbound with a valid client certificate: %v", err)
		}
	})
}

// TestPrivilegedInboundLoopbackApp binds the server pod's applications to 127.0.0.1 only
// inside its netns. The inbound listener on pod_ip:15008 reaches them through the inbound
// cluster (bind source 127.0.0.1 in the pod's netns): an HTTP call and a TCP connection by VIP
// from a meshed pod arrive, while a plaintext dial to pod_ip:<port> from another pod finds
// nothing listening there.
func TestPrivilegedInboundLoopbackApp(t *testing.T) {
	f := startTrafficFixtureAt(t, "127.0.0.1", time.Hour, true, Options{})
	alpha, outside, server := f.pods["alpha"], f.pods["outside"], f.ips["server"]
	alphaID := model.SPIFFEID(f.td, "shop", "alpha")

	t.Run("HTTP via VIP", func(t *testing.T) {
		code, body, _, err := getBody(alpha.HTTPClient(false), "http://"+vipHTTP.String()+"/", nil)
		if err != nil || code != 200 {
			t.Fatalf("GET VIP: %d %q %v", code, body, err)
		}
		if got := xfccURI(body); got != alphaID {
			t.Errorf("XFCC URI = %q (body %q), want %q", got, body, alphaID)
		}
	})

	t.Run("TCP via VIP", func(t *testing.T) {
		if err := echoVia(alpha, vipTCP.String()+":9000", "to a loopback-only application"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("server-first via VIP", func(t *testing.T) {
		c, err := alpha.Dial(vipBanner.String() + ":25")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := readBanner(c, bannerText); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("plaintext to pod_ip:port from another pod does not reach it", func(t *testing.T) {
		for _, port := range []string{"8080", "9000", "2525"} {
			c, err := outside.Dial(server.String() + ":" + port)
			if err == nil {
				c.Close()
				t.Errorf("plaintext dial %s:%s from another pod connected, want refused", server, port)
			} else if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("plaintext dial %s:%s: %v, want connection refused", server, port, err)
			}
		}
		// The same pod is reachable from there: the refusals are about the bind address.
		c, err := outside.Dial(server.String() + ":15008")
		if err != nil {
			t.Fatalf("dial the inbound listener %s:15008 from the same pod: %v", server, err)
		}
		c.Close()
	})
}

// TestPrivilegedEnvoyACKsAndNACKs serves the representative golden model (its netns paths and pod
// addresses made real), built with each option set, to the real Envoy: it is ACKed with
// update_rejected 0. A snapshot Envoy rejects (a listener in a namespace that does not exist) is
// NACKed, counted and logged with its error_detail, and the next good snapshot is ACKed again.
func TestPrivilegedEnvoyACKsAndNACKs(t *testing.T) {
	for _, c := range []struct {
		name  string
		delta bool
		build Options
	}{
		{"sotw", false, Options{}},
		{"delta", true, Options{}},
		{"east-west-waypoint", true, Options{EastWestWaypoint: true}},
		{"transport-socket-matcher", true, Options{CertSelection: CertMatcher}},
	} {
		t.Run(c.name, func(t *testing.T) { testACKsAndNACKs(t, c.delta, c.build) })
	}
}

func testACKsAndNACKs(t *testing.T, delta bool, build Options) {
	f := newMeshFixture(t, time.Hour, delta, build)
	m := goldenMesh()
	for _, p := range m.Pods {
		ns, ip := f.addPod(p.Name, false)
		p.NetnsPath, p.IPs = ns.Path, []netip.Addr{ip}
	}
	good := model.New(2, m.Cluster, m.MeshDomain, f.td, m.Node, m.Services, m.Endpoints, m.Pods)
	f.set(good)
	f.wantNoRejections(t)
	bad := goldenMesh()
	for i, p := range bad.Pods {
		p.NetnsPath, p.IPs = good.Pods[i].NetnsPath, good.Pods[i].IPs
	}
	bad.Pods[0].NetnsPath = "/var/run/netns/aether-does-not-exist"
	badMesh := model.New(3, m.Cluster, m.MeshDomain, f.td, m.Node, bad.Services, bad.Endpoints, bad.Pods)
	v, err := f.srv.SetMesh(context.Background(), badMesh)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "NACK of the bad snapshot", func() error {
		if n, _ := f.srv.NACKs(); n == 0 {
			return fmt.Errorf("no NACK yet")
		}
		return nil
	})
	_, last := f.srv.NACKs()
	if !strings.Contains(last, "aether-does-not-exist") && !strings.Contains(strings.ToLower(last), "namespace") {
		t.Errorf("NACK error_detail = %q, want it to name the namespace", last)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := f.srv.WaitForAck(ctx, v); !errors.Is(err, ErrRejected) {
		t.Errorf("WaitForAck of a NACKed snapshot = %v, want ErrRejected", err)
	}
	f.set(model.New(4, m.Cluster, m.MeshDomain, f.td, m.Node, good.Services, good.Endpoints, good.Pods))
}
