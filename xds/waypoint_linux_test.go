package xds

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/tunnel"
)

// The waypoint topology's services: web/echo in cluster b (exported, HTTP 80 -> 8080, TCP 9000
// echo and 9100 stream), web/secret in b (not exported, 80 -> 8081), web/near in a (local).
var (
	vipEcho    = netip.MustParseAddr("10.96.0.20") // b's local VIP of web/echo
	vipEchoSet = netip.MustParseAddr("10.96.1.20") // a's clusterset VIP of web/echo
	vipSecret  = netip.MustParseAddr("10.96.0.21")
	vipNear    = netip.MustParseAddr("10.96.0.30")
	// vipDirect is, in the benchmark only, a service in a whose endpoints are b's echo pods
	// registered as a's own: the direct mesh path (pod_ip:15008) between the same namespaces.
	vipDirect = netip.MustParseAddr("10.96.0.40")
)

// waypointTopo is two clusters of node namespaces on a routed underlay 192.168.250.0/24:
// cluster a with one node (a client pod "client" and a server pod "near"), cluster b with
// nodes b1 (server pod "srv1", client pod "bclient") and b2 (server pod "srv2"). Inside b the
// pod subnets are routed node to node (host-gw style); between the clusters only node IPs route.
// Every node runs its own Envoy and xDS server with EastWestWaypoint on; all share one CA.
type waypointTopo struct {
	a, b1, b2 *meshFixture
	ul        *testenv.Netns
	nodeIP    map[*meshFixture]netip.Addr
}

// newWaypointTopo builds the topology. identical gives a the pod subnet of b1 (10.46.0.0/24),
// else a has 10.44.0.0/24; b2 has 10.47.0.0/24.
func newWaypointTopo(t testing.TB, identical bool) *waypointTopo {
	t.Helper()
	opts := Options{EastWestWaypoint: true}
	w := &waypointTopo{nodeIP: map[*meshFixture]netip.Addr{}}
	w.a = newMeshFixture(t, time.Hour, false, opts)
	w.b1 = newMeshFixture(t, time.Hour, false, opts)
	w.b2 = newMeshFixture(t, time.Hour, false, opts)
	for _, f := range []*meshFixture{w.b1, w.b2} {
		// One development CA for both clusters (DESIGN.md, local substrate): restart the
		// agent with a's CA; Envoy is adopted.
		f.stopAgent()
		f.ca, f.rot = w.a.ca, identity.NewRotator(w.a.ca)
		f.startAgent()
	}
	aNet := byte(44)
	if identical {
		aNet = 46
	}
	w.a.usePodNet(aNet)
	w.b1.usePodNet(46)
	w.b2.usePodNet(47)
	w.ul = testenv.NewNetns(t)
	run(t, w.ul, "ip", "link", "add", "ulbr", "type", "bridge")
	run(t, w.ul, "ip", "link", "set", "ulbr", "up")
	for i, f := range []*meshFixture{w.a, w.b1, w.b2} {
		ip := netip.AddrFrom4([4]byte{192, 168, 250, byte(i + 1)})
		w.nodeIP[f] = ip
		u := "u" + strconv.Itoa(i)
		run(t, w.ul, "ip", "link", "add", u, "type", "veth", "peer", "name", "ul0", "netns", f.node.Name)
		run(t, w.ul, "ip", "link", "set", u, "master", "ulbr", "up")
		run(t, f.node, "ip", "addr", "add", ip.String()+"/24", "dev", "ul0")
		run(t, f.node, "ip", "link", "set", "ul0", "up")
		run(t, f.node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	}
	run(t, w.b1.node, "ip", "route", "add", "10.47.0.0/24", "via", w.nodeIP[w.b2].String())
	run(t, w.b2.node, "ip", "route", "add", "10.46.0.0/24", "via", w.nodeIP[w.b1].String())

	w.a.addPod("client", true)
	nearNS, _ := w.a.addPod("near", false)
	srv1, _ := w.b1.addPod("srv1", false)
	w.b1.addPod("bclient", true)
	srv2, _ := w.b2.addPod("srv2", false)
	for _, ns := range []*testenv.Netns{nearNS, srv1, srv2} {
		serveXFCC(t, ns.Listen(t, "0.0.0.0:8080"))
		serveEcho(ns.Listen(t, "0.0.0.0:9000"))
		serveStream(ns.Listen(t, "0.0.0.0:9100"))
	}
	serveXFCC(t, srv1.Listen(t, "0.0.0.0:8081"))
	return w
}

// usePodNet renumbers the fixture's bridge to 10.<n>.0.1/24; pods added later get 10.<n>.0.x.
func (f *meshFixture) usePodNet(n byte) {
	f.podNet = n
	run(f.t, f.node, "ip", "addr", "flush", "dev", "br0")
	run(f.t, f.node, "ip", "addr", "add", fmt.Sprintf("10.%d.0.1/24", n), "dev", "br0")
}

func run(t testing.TB, ns *testenv.Netns, name string, args ...string) {
	t.Helper()
	if out, err := ns.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s in %s: %v: %s", name, strings.Join(args, " "), ns.Name, err, out)
	}
}

// serveXFCC answers GETs with "xfcc=<X-Forwarded-Client-Cert>" and echoes POST bodies.
func serveXFCC(t testing.TB, l net.Listener) {
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			echoPost(w, r) // the latency benchmarks' echo
			return
		}
		fmt.Fprintf(w, "xfcc=%s", r.Header.Get("X-Forwarded-Client-Cert"))
	})}
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() { hs.Close() })
}

// serveStream writes zeros to every accepted connection until the peer goes away.
func serveStream(l net.Listener) {
	serveEach(l, func(c net.Conn) {
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
}

var byInXFCC = regexp.MustCompile(`By=([^;,]+)`)

// xfccBy extracts the answering side's URI (By=) from a body "xfcc=<XFCC>".
func xfccBy(body string) string {
	m := byInXFCC.FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return m[1]
}

// meshes returns the models of a, b1 and b2. withSrv1 false leaves srv1's endpoints out of a's
// registry view (b1 withdrew them). direct adds, in a only, web/direct: b's echo pods as a's own
// endpoints (the benchmark's direct mesh path; it needs pod routes between the clusters).
func (w *waypointTopo) meshes(version uint64, withSrv1, direct bool) (a, b1, b2 *model.Mesh) {
	td := w.a.td
	echo := model.ServiceKey{Namespace: "web", Name: "echo"}
	secret := model.ServiceKey{Namespace: "web", Name: "secret"}
	near := model.ServiceKey{Namespace: "web", Name: "near"}
	directKey := model.ServiceKey{Namespace: "web", Name: "direct"}
	echoPorts := func() []model.ServicePort {
		return []model.ServicePort{
			{Name: "http", Port: 80, TargetPort: 8080, Protocol: model.ProtocolHTTP},
			{Name: "echo", Port: 9000, TargetPort: 9000, Protocol: model.ProtocolTCP},
			{Name: "stream", Port: 9100, TargetPort: 9100, Protocol: model.ProtocolTCP},
		}
	}
	epPorts := []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.ProtocolHTTP}, {Name: "echo", Port: 9000, Protocol: model.ProtocolTCP}, {Name: "stream", Port: 9100, Protocol: model.ProtocolTCP}}
	ep := func(k model.ServiceKey, cluster string, f *meshFixture, pod, sa string, ports []model.EndpointPort) model.Endpoint {
		return model.Endpoint{Service: k, Cluster: cluster, PodName: pod, PodUID: "uid-" + pod, IPs: []netip.Addr{f.ips[pod]},
			NodeName: f.node.Name, NodeIP: w.nodeIP[f], Ports: ports, SPIFFEID: model.SPIFFEID(td, "web", sa), Healthy: true}
	}
	pod := func(f *meshFixture, name, ns, sa string, ports ...uint32) *model.LocalPod {
		p := &model.LocalPod{UID: "uid-" + name, Namespace: ns, Name: name, ServiceAccount: sa,
			NetnsPath: f.pods[name].Path, IPs: []netip.Addr{f.ips[name]}, Ready: true}
		for _, port := range ports {
			p.Ports = append(p.Ports, model.PodPort{Port: port, Protocol: model.ProtocolHTTP})
		}
		return p
	}
	bEcho := func(cluster string) []model.Endpoint {
		var eps []model.Endpoint
		if withSrv1 || cluster == "b" {
			eps = append(eps, ep(echo, cluster, w.b1, "srv1", "echo-1", epPorts))
		}
		return append(eps, ep(echo, cluster, w.b2, "srv2", "echo-2", epPorts))
	}
	bModel := func(f *meshFixture, pods ...*model.LocalPod) *model.Mesh {
		svcs := []*model.Service{
			{Key: echo, Local: true, Exported: true, VIPs: []netip.Addr{vipEcho}, Ports: echoPorts()},
			{Key: secret, Local: true, VIPs: []netip.Addr{vipSecret}, Ports: []model.ServicePort{{Port: 80, TargetPort: 8081, Protocol: model.ProtocolHTTP}}},
		}
		eps := map[model.ServiceKey][]model.Endpoint{
			echo:   bEcho("b"),
			secret: {ep(secret, "b", w.b1, "srv1", "echo-1", []model.EndpointPort{{Port: 8081, Protocol: model.ProtocolHTTP}})},
		}
		return model.New(version, "b", "mesh", td, model.Node{Name: f.node.Name, IP: w.nodeIP[f]}, svcs, eps, pods)
	}
	b1 = bModel(w.b1, pod(w.b1, "srv1", "web", "echo-1", 8080, 8081), pod(w.b1, "bclient", "shop", "bclient"))
	b2 = bModel(w.b2, pod(w.b2, "srv2", "web", "echo-2", 8080))

	aSvcs := []*model.Service{
		{Key: echo, Imported: true, ClustersetVIPs: []netip.Addr{vipEchoSet}, Ports: echoPorts()},
		{Key: near, Local: true, VIPs: []netip.Addr{vipNear}, Ports: echoPorts()},
	}
	aEps := map[model.ServiceKey][]model.Endpoint{
		echo: bEcho("b")[:map[bool]int{true: 2, false: 1}[withSrv1]],
		near: {ep(near, "a", w.a, "near", "near", epPorts)},
	}
	if !withSrv1 {
		aEps[echo] = []model.Endpoint{ep(echo, "b", w.b2, "srv2", "echo-2", epPorts)}
	}
	if direct {
		aSvcs = append(aSvcs, &model.Service{Key: directKey, Local: true, VIPs: []netip.Addr{vipDirect}, Ports: echoPorts()})
		for _, e := range bEcho("a") {
			e.Service = directKey
			aEps[directKey] = append(aEps[directKey], e)
		}
	}
	a = model.New(version, "a", "mesh", td, model.Node{Name: w.a.node.Name, IP: w.nodeIP[w.a]}, aSvcs, aEps,
		[]*model.LocalPod{pod(w.a, "client", "shop", "client"), pod(w.a, "near", "web", "near", 8080)})
	return a, b1, b2
}

func (w *waypointTopo) set(version uint64, withSrv1, direct bool) {
	a, b1, b2 := w.meshes(version, withSrv1, direct)
	w.b1.set(b1)
	w.b2.set(b2)
	w.a.set(a)
}

// tunnelPeer opens a TLS connection with SNI sni from ns to a tunnel listener at addr and returns
// the URI SAN of the certificate the far end shows (the destination pod's, the tunnel does no
// TLS); "" when none was shown. The pod then refuses the handshake (no client certificate).
func tunnelPeer(t *testing.T, ns *testenv.Netns, addr, sni string) string {
	t.Helper()
	conn, err := ns.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var peer string
	tc := tls.Client(conn, &tls.Config{ServerName: sni, InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if c, err := x509.ParseCertificate(raw[0]); err == nil && len(c.URIs) > 0 {
				peer = c.URIs[0].String()
			}
			return nil
		}})
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	_ = tc.Handshake()
	return peer
}

// stats returns Envoy's counters and gauges by name.
func (f *meshFixture) stats() map[string]int {
	f.t.Helper()
	s, err := f.admin("/stats")
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]int{}
	for _, line := range strings.Split(s, "\n") {
		name, v, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
			out[name] = n
		}
	}
	return out
}

// TestPrivilegedWaypoint drives the east-west waypoint through three real Envoys in two clusters
// of node namespaces whose node IPs route and pod CIDRs do not, once with distinct and once with
// identical pod CIDRs: a client pod in a reaches b's exported service by its clusterset VIP and by
// the explicit lane through b's nodes' tunnel listeners, ending at b's pods, which see the
// caller's SPIFFE ID (XFCC URI) and answer with their own (XFCC By, the certificate a's Envoy
// validated against the SAN pin); the tunnel listener does no TLS (no ssl stats) while the pod's
// inbound listener does the handshakes, and a raw TLS client through the tunnel is shown the
// pod's certificate; traffic inside a cluster stays direct (waypoint counters do not move) while
// the cross-cluster calls move them; a's pods cannot reach b's pod IPs; an unexported service's
// SNI, a random SNI, no SNI and plaintext are refused and counted by reason; withdrawing b1's
// endpoints takes it out of a's EDS and the traffic moves to b2.
func TestPrivilegedWaypoint(t *testing.T) {
	for _, c := range []struct {
		name      string
		identical bool
	}{{"distinct-pod-cidrs", false}, {"identical-pod-cidrs", true}} {
		t.Run(c.name, func(t *testing.T) { testWaypoint(t, c.identical) })
	}
}

func testWaypoint(t *testing.T, identical bool) {
	w := newWaypointTopo(t, identical)
	w.set(1, true, false)
	td := w.a.td
	clientID := model.SPIFFEID(td, "shop", "client")
	echo1, echo2 := model.SPIFFEID(td, "web", "echo-1"), model.SPIFFEID(td, "web", "echo-2")
	b1IP, b2IP := w.nodeIP[w.b1].String(), w.nodeIP[w.b2].String()
	const cx, rx = "tcp.waypoint.web.echo.downstream_cx_total", "tcp.waypoint.web.echo.downstream_cx_rx_bytes_total"

	t.Run("EDS holds one waypoint entry per remote node", func(t *testing.T) {
		s, err := w.a.admin("/clusters")
		if err != nil {
			t.Fatal(err)
		}
		for _, ip := range []string{b1IP, b2IP} {
			if !strings.Contains(s, "echo.web.mesh:80::"+ip+":15443::") {
				t.Errorf("a's cluster echo.web.mesh:80 lacks the waypoint %s:15443", ip)
			}
		}
		if strings.Contains(s, "echo.web.mesh:80::10.") {
			t.Errorf("a's cluster echo.web.mesh:80 holds a pod IP:\n%s", s)
		}
		for _, f := range []*meshFixture{w.a, w.b1, w.b2} {
			if n, last := f.srv.NACKs(); n != 0 {
				t.Errorf("NACKs = %d (last %q)", n, last)
			}
		}
	})

	t.Run("intra-cluster traffic stays direct", func(t *testing.T) {
		before1, before2 := w.b1.stats(), w.b2.stats()
		seen := map[string]bool{}
		for i := 0; i < 12; i++ {
			code, body, _, err := getBody(w.b1.pods["bclient"].HTTPClient(false), "http://"+vipEcho.String()+"/", nil)
			if err != nil || code != 200 || xfccURI(body) != model.SPIFFEID(td, "shop", "bclient") {
				t.Fatalf("b: GET echo VIP: %d %q %v", code, body, err)
			}
			seen[xfccBy(body)] = true
		}
		if !seen[echo1] || !seen[echo2] {
			t.Errorf("b's client reached %v, want both echo pods", seen)
		}
		code, body, _, err := getBody(w.a.pods["client"].HTTPClient(false), "http://"+vipNear.String()+"/", nil)
		if err != nil || code != 200 || xfccBy(body) != model.SPIFFEID(td, "web", "near") {
			t.Fatalf("a: GET near VIP: %d %q %v", code, body, err)
		}
		after1, after2 := w.b1.stats(), w.b2.stats()
		if after1[cx] != before1[cx] || after2[cx] != before2[cx] {
			t.Errorf("waypoint connections moved for intra-cluster traffic: b1 %d->%d, b2 %d->%d", before1[cx], after1[cx], before2[cx], after2[cx])
		}
	})

	t.Run("cross-cluster by VIP and lane through the waypoint", func(t *testing.T) {
		before1, before2 := w.b1.stats(), w.b2.stats()
		seen := map[string]bool{}
		for i := 0; i < 16; i++ {
			url, hdr := "http://"+vipEchoSet.String()+"/", map[string]string(nil)
			if i%2 == 1 {
				url, hdr = "http://127.0.0.1:18081/", map[string]string{"Host": "echo.web.mesh"}
			}
			code, body, _, err := getBody(w.a.pods["client"].HTTPClient(false), url, hdr)
			if err != nil || code != 200 {
				t.Fatalf("GET %s: %d %q %v", url, code, body, err)
			}
			if got := xfccURI(body); got != clientID {
				t.Errorf("b's application saw caller %q, want %q", got, clientID)
			}
			seen[xfccBy(body)] = true
		}
		if !seen[echo1] || !seen[echo2] || len(seen) != 2 {
			t.Errorf("answered by %v, want both b pods", seen)
		}
		c, err := w.a.pods["client"].Dial(vipEchoSet.String() + ":9000")
		if err != nil {
			t.Fatal(err)
		}
		if err := testenv.EchoOnce(c, strings.Repeat("tcp through the waypoint ", 64)); err != nil {
			t.Error(err)
		}
		c.Close()
		after1, after2 := w.b1.stats(), w.b2.stats()
		for _, n := range []struct {
			name          string
			before, after map[string]int
		}{{"b1", before1, after1}, {"b2", before2, after2}} {
			if n.after[cx] <= n.before[cx] || n.after[rx] <= n.before[rx] {
				t.Errorf("%s waypoint counters did not move: %s %d->%d, %s %d->%d", n.name, cx, n.before[cx], n.after[cx], rx, n.before[rx], n.after[rx])
			}
			for k := range n.after {
				if strings.HasPrefix(k, "listener.waypoint.ssl") {
					t.Errorf("%s tunnel listener has TLS stat %s: it must not terminate TLS", n.name, k)
				}
			}
		}
		srv1Inbound := "listener." + w.b1.ips["srv1"].String() + "_15008.ssl.handshake"
		if after1[srv1Inbound] <= before1[srv1Inbound] {
			t.Errorf("%s did not move (%d): the handshake should end at the pod", srv1Inbound, after1[srv1Inbound])
		}
	})

	t.Run("the tunnel shows the pod's certificate", func(t *testing.T) {
		if peer := tunnelPeer(t, w.a.node, b1IP+":15443", "8080.echo.web.mesh"); peer != echo1 {
			t.Errorf("certificate through b1's tunnel: %q, want the pod's %q", peer, echo1)
		}
	})

	t.Run("pod IPs of the other cluster are unreachable", func(t *testing.T) {
		for _, ip := range []netip.Addr{w.b1.ips["srv1"], w.b2.ips["srv2"]} {
			code, body, _, err := getBody(w.a.pods["client"].HTTPClient(false), "http://"+ip.String()+":8080/", nil)
			if err == nil && strings.Contains(body, "echo-") {
				t.Errorf("a's client reached b's pod %s directly: %d %q", ip, code, body)
			}
		}
	})

	t.Run("refusals counted by reason", func(t *testing.T) {
		before := w.b1.stats()
		for _, c := range []struct{ name, sni string }{
			{"unexported service", "8081.secret.web.mesh"},
			{"random", "random.example"},
			{"another cluster's name", "8080.near.web.mesh"},
			{"no SNI", ""},
		} {
			conn, err := w.a.node.Dial(b1IP + ":15443")
			if err != nil {
				t.Fatal(err)
			}
			tc := tls.Client(conn, &tls.Config{ServerName: c.sni, InsecureSkipVerify: true})
			_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
			if err := tc.Handshake(); err == nil {
				t.Errorf("%s (SNI %q): handshake succeeded, want refused", c.name, c.sni)
			}
			conn.Close()
		}
		conn, err := w.a.node.Dial(b1IP + ":15443")
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		if b, _ := io.ReadAll(conn); len(b) != 0 {
			t.Errorf("plaintext got an answer %q", b)
		}
		conn.Close()
		testenv.Eventually(t, time.Minute, "refusal counters", func() error {
			after := w.b1.stats()
			for reason, want := range map[string]int{tunnel.RefusedUnknownSNI: 3, tunnel.RefusedNoSNI: 1, tunnel.RefusedNotTLS: 1} {
				k := tunnel.RefusedStatPrefix + "." + reason + ".rbac.denied"
				if got := after[k] - before[k]; got != want {
					var names []string
					for n := range after {
						if after[n] != before[n] {
							names = append(names, fmt.Sprintf("%s+%d", n, after[n]-before[n]))
						}
					}
					return fmt.Errorf("%s moved by %d, want %d (rbac stats: %v)", k, got, want, names)
				}
			}
			if after[cx] != before[cx] {
				return fmt.Errorf("%s moved for refused connections", cx)
			}
			return nil
		})
	})

	t.Run("a withdrawn node leaves EDS and traffic moves", func(t *testing.T) {
		w.set(2, false, false)
		s, err := w.a.admin("/clusters")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(s, "echo.web.mesh:80::"+b1IP+":15443::") {
			t.Errorf("b1's waypoint is still in a's EDS")
		}
		for i := 0; i < 8; i++ {
			code, body, _, err := getBody(w.a.pods["client"].HTTPClient(false), "http://"+vipEchoSet.String()+"/", nil)
			if err != nil || code != 200 || xfccBy(body) != echo2 {
				t.Fatalf("GET after withdrawal: %d %q %v, want an answer from %s", code, body, err, echo2)
			}
		}
	})
}
