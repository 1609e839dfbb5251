//go:build linux

package agent

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"
	"github.com/aethermesh/aether/envoy"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// addEdgePod adds the edge pod of Gateway gw/<gateway> as the registrar's Deployment would make
// it (the edge ServiceAccount, capture opted out), attaches it through CNI ADD, and starts a
// real Envoy in its network namespace with the edge bootstrap (xDS from 127.0.0.1:15010 there).
// It returns the pod's namespace and IP.
func (m *gammaMesh) addEdgePod(t *testing.T, gateway string) (*testenv.Netns, netip.Addr) {
	t.Helper()
	m.pods++
	sa := model.EdgeServiceAccountName(gateway)
	must := mustCreate(t)
	must(m.cs.CoreV1().ServiceAccounts("gw").Create(m.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}))
	pod, err := m.cs.CoreV1().Pods("gw").Create(m.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: gateway + "-edge-1", Annotations: map[string]string{model.AnnotationCapture: "false"}},
		Spec: corev1.PodSpec{NodeName: "node-1", ServiceAccountName: sa, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "envoy", Image: "envoy"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.NewNetns(t)
	nodeSide := netip.MustParsePrefix(fmt.Sprintf("10.250.%d.1/24", m.pods))
	podSide := netip.MustParsePrefix(fmt.Sprintf("10.250.%d.2/24", m.pods))
	testenv.Veth(t, m.node, fmt.Sprintf("vp%d", m.pods), nodeSide, ns, "eth0", podSide)
	ns.DefaultRoute(t, nodeSide.Addr())
	if err := ns.Command("ip", "link", "set", "lo", "up").Run(); err != nil {
		t.Fatal(err)
	}
	resp, err := m.cni.Add(m.ctx, cniv1.Request{Network: "test", Attachment: cniv1.PodAttachment{
		ContainerID: "ctr-gw-" + pod.Name, PodUID: string(pod.UID), Namespace: "gw", Name: pod.Name,
		NetnsPath: ns.Path, IPs: []netip.Addr{podSide.Addr()}, Interface: "eth0"}})
	if err != nil {
		t.Fatalf("CNI ADD of the edge pod: %v", err)
	}
	if resp.Captured {
		t.Fatal("the edge pod was captured; it opts out")
	}
	dir := t.TempDir()
	boot, err := envoy.Bootstrap(envoy.BootstrapConfig{NodeID: "edge~gw~" + gateway, XDSAddress: "127.0.0.1:15010",
		AdminAddress: "unix://" + filepath.Join(dir, "admin.sock")})
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "envoy.log"))
	if err != nil {
		t.Fatal(err)
	}
	tools := testenv.RequireTools(t, testenv.ToolEnvoy)
	cmd := exec.Command("ip", "netns", "exec", ns.Name, tools.Envoy, "--config-yaml", string(boot),
		"--concurrency", "1", "--disable-hot-restart", "--log-level", "info")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("edge envoy log:\n%s", tailString(string(b), 6000))
		}
	})
	return ns, podSide.Addr()
}

// TestPrivilegedEdgeGatewayAgent drives the whole edge path from Gateway API objects in a real
// API server: the agent finds the edge pod on its node by its ServiceAccount, serves it its
// Gateway over xDS inside the pod's network namespace, and a real Envoy there carries traffic
// from a host outside the mesh to meshed pods: HTTP by hostname (the backend sees the edge's
// SPIFFE ID), HTTPS with two published certificates chosen by SNI, TLS passthrough by SNI to a
// backend's own TLS, a UDPRoute on a Service carrying a captured pod's datagrams, TCP split by
// weight, UDP datagrams; a route from a namespace the listener does not allow is not served.
func TestPrivilegedEdgeGatewayAgent(t *testing.T) {
	testenv.RequireRoot(t)
	m := startGAMMAMeshWith(t, "--edge-certificate-namespace", "aether-system")
	ctx := m.ctx
	must := mustCreate(t)
	// Pods reach each other's addresses through the node (the edge pod dials its backends'
	// :15008, the outside client dials the edge pod): the node forwards, as a real node does.
	if out, err := m.node.Command("sysctl", "-w", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		t.Fatalf("sysctl in the node: %v: %s", err, out)
	}
	for _, ns := range []string{"gw", "aether-system", "outside"} {
		must(m.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))
	}
	web := m.addEchoPod(t, "web-1", map[string]string{"app": "web"})
	m.addService(t, "web", map[string]string{"app": "web"}, httpPort("http", 80))
	for _, n := range []struct {
		name   string
		port   int32
		banner string
	}{{"tcp-a", 9101, "A\n"}, {"tcp-b", 9102, "B\n"}} {
		ns := m.addPod(t, podSpec{namespace: "shop", name: n.name, labels: map[string]string{"app": n.name}, port: n.port})
		l := ns.Listen(t, fmt.Sprintf("0.0.0.0:%d", n.port))
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				_, _ = c.Write([]byte(n.banner))
				c.Close()
			}
		}()
		if _, err := m.cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: n.name},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": n.name}, Ports: []corev1.ServicePort{
				{Name: "tcp", Port: n.port, TargetPort: intstr.FromInt32(n.port), AppProtocol: new("tcp")}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	udpNS := m.addPod(t, podSpec{namespace: "shop", name: "udp-1", labels: map[string]string{"app": "udp"}, port: 5353})
	udpSeen := udpNS.ServeUDPEcho(t, "0.0.0.0:5353", "echo:")
	udpSvc, err := m.cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "udp"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "udp"}, Ports: []corev1.ServicePort{
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(5353)}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A meshed (captured) caller for the mesh UDPRoute below.
	meshCaller := m.addPod(t, podSpec{namespace: "shop", name: "caller-1", labels: map[string]string{"app": "caller"}, port: 8080})
	client := m.addPod(t, podSpec{namespace: "outside", name: "client", labels: map[string]string{"app": "client"}, port: 8080})

	// The listener certificate as the registrar publishes it for the agents.
	ca, err := testenv.NewCA("edge test CA")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	// Two listener certificates, as the registrar publishes them for the agents.
	for _, name := range []string{"app", "other"} {
		crt, key, err := ca.Issue(name+".example", nil, []string{name + ".example"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		must(m.cs.CoreV1().Secrets("aether-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "edge-cert-" + name,
			Labels:      map[string]string{model.LabelEdgeCertificate: "true"},
			Annotations: map[string]string{model.AnnotationCertificateRef: "gw/" + name + "-tls"}},
			Type: corev1.SecretTypeTLS, Data: map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key}}, metav1.CreateOptions{}))
	}
	// A backend that speaks TLS itself (its own certificate), for the passthrough listener: it
	// answers with the SNI it saw.
	tlsNS := m.addPod(t, podSpec{namespace: "shop", name: "tls-1", labels: map[string]string{"app": "tls"}, port: 8443})
	bcrt, bkey, err := ca.Issue("backend.example", nil, []string{"backend.example"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	bpair, err := tls.X509KeyPair(bcrt, bkey)
	if err != nil {
		t.Fatal(err)
	}
	tl := tls.NewListener(tlsNS.Listen(t, "0.0.0.0:8443"), &tls.Config{Certificates: []tls.Certificate{bpair}})
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if tc := c.(*tls.Conn); tc.Handshake() == nil {
					fmt.Fprintf(c, "sni=%s\n", tc.ConnectionState().ServerName)
				}
			}()
		}
	}()
	if _, err := m.cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "tls"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "tls"}, Ports: []corev1.ServicePort{
			{Name: "tls", Port: 443, TargetPort: intstr.FromInt32(8443), AppProtocol: new("tls")}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	must(m.gw.GatewayV1().GatewayClasses().Create(ctx, &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "aether"},
		Spec: gwv1.GatewayClassSpec{ControllerName: model.GatewayControllerName}}, metav1.CreateOptions{}))
	hostname := func(h string) *gwv1.Hostname { v := gwv1.Hostname(h); return &v }
	all := &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{From: new(gwv1.NamespacesFromAll)}}
	must(m.gw.GatewayV1().Gateways("gw").Create(ctx, &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: "edge"}, Spec: gwv1.GatewaySpec{
		GatewayClassName: "aether",
		Listeners: []gwv1.Listener{
			{Name: "http", Protocol: gwv1.HTTPProtocolType, Port: 8080, Hostname: hostname("*.example"), AllowedRoutes: all},
			{Name: "https", Protocol: gwv1.HTTPSProtocolType, Port: 8443, AllowedRoutes: all,
				TLS: &gwv1.ListenerTLSConfig{Mode: new(gwv1.TLSModeTerminate), CertificateRefs: []gwv1.SecretObjectReference{{Name: "app-tls"}, {Name: "other-tls"}}}},
			{Name: "pass", Protocol: gwv1.TLSProtocolType, Port: 9443, TLS: &gwv1.ListenerTLSConfig{Mode: new(gwv1.TLSModePassthrough)}},
			{Name: "tcp", Protocol: gwv1.TCPProtocolType, Port: 9000},
			{Name: "udp", Protocol: gwv1.UDPProtocolType, Port: 5300},
			// Only routes of namespace gw may attach here.
			{Name: "private", Protocol: gwv1.HTTPProtocolType, Port: 8081},
		},
	}}, metav1.CreateOptions{}))
	gwParent := func(section string) gwv1.ParentReference {
		return gwv1.ParentReference{Name: "edge", Namespace: new(gwv1.Namespace("gw")), SectionName: new(gwv1.SectionName(section))}
	}
	backend := func(name string, port int32, weight int32) gwv1.BackendRef {
		return gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: gwv1.ObjectName(name), Namespace: new(gwv1.Namespace("shop")), Port: new(gwv1.PortNumber(port))}, Weight: &weight}
	}
	// Backends in shop, routes in shop: same namespace, no ReferenceGrant needed.
	rt := httpRoute("shop", "app", []gwv1.ParentReference{gwParent("http"), gwParent("https")},
		gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: backend("web", 80, 1)}}})
	rt.Spec.Hostnames = []gwv1.Hostname{"app.example", "other.example"}
	must(m.gw.GatewayV1().HTTPRoutes("shop").Create(ctx, rt, metav1.CreateOptions{}))
	refused := httpRoute("shop", "private", []gwv1.ParentReference{gwParent("private")},
		gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: backend("web", 80, 1)}}})
	must(m.gw.GatewayV1().HTTPRoutes("shop").Create(ctx, refused, metav1.CreateOptions{}))
	// The TCP and UDP listeners take routes of the Gateway's namespace only (the default, From
	// Same): those routes live in gw, their backends in shop, allowed by a ReferenceGrant.
	must(m.gw.GatewayV1().TCPRoutes("gw").Create(ctx, &gwv1.TCPRoute{ObjectMeta: metav1.ObjectMeta{Name: "split"}, Spec: gwv1.TCPRouteSpec{
		CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{gwParent("tcp")}},
		Rules:           []gwv1.TCPRouteRule{{BackendRefs: []gwv1.BackendRef{backend("tcp-a", 9101, 3), backend("tcp-b", 9102, 1)}}},
	}}, metav1.CreateOptions{}))
	must(m.gw.GatewayV1().UDPRoutes("gw").Create(ctx, &gwv1.UDPRoute{ObjectMeta: metav1.ObjectMeta{Name: "dns"}, Spec: gwv1.UDPRouteSpec{
		CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{gwParent("udp")}},
		Rules:           []gwv1.UDPRouteRule{{BackendRefs: []gwv1.BackendRef{backend("udp", 53, 1)}}},
	}}, metav1.CreateOptions{}))
	must(m.gw.GatewayV1().ReferenceGrants("shop").Create(ctx, &gwv1.ReferenceGrant{ObjectMeta: metav1.ObjectMeta{Name: "from-gw"}, Spec: gwv1.ReferenceGrantSpec{
		From: []gwv1.ReferenceGrantFrom{{Group: gwv1.GroupName, Kind: "TCPRoute", Namespace: "gw"}, {Group: gwv1.GroupName, Kind: "UDPRoute", Namespace: "gw"},
			{Group: gwv1.GroupName, Kind: "TLSRoute", Namespace: "gw"}},
		To: []gwv1.ReferenceGrantTo{{Group: "", Kind: "Service"}},
	}}, metav1.CreateOptions{}))

	must(m.gw.GatewayV1().TLSRoutes("gw").Create(ctx, &gwv1.TLSRoute{ObjectMeta: metav1.ObjectMeta{Name: "backend"}, Spec: gwv1.TLSRouteSpec{
		CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{gwParent("pass")}},
		Hostnames:       []gwv1.Hostname{"backend.example"},
		Rules:           []gwv1.TLSRouteRule{{BackendRefs: []gwv1.BackendRef{backend("tls", 443, 1)}}},
	}}, metav1.CreateOptions{}))

	_, edgeIP := m.addEdgePod(t, "edge")
	edge := edgeIP.String()
	plain := httpClient(client, false)
	testenv.Eventually(t, 90*time.Second, "the edge serves app.example", func() error {
		a, err := do(ctx, plain, http.MethodGet, "http://"+edge+":8080/x", map[string]string{"Host": "app.example"})
		if err != nil {
			return err
		}
		if a.status != 200 {
			return fmt.Errorf("status %d: %s", a.status, a.body)
		}
		return nil
	})
	edgeID := model.SPIFFEID(model.DefaultTrustDomain, "gw", model.EdgeServiceAccountName("edge"))

	t.Run("HTTP by hostname, the edge's identity at the backend", func(t *testing.T) {
		a, err := do(ctx, plain, http.MethodGet, "http://"+edge+":8080/x", map[string]string{"Host": "app.example"})
		if err != nil || a.status != 200 || a.echo.Pod != "web-1" {
			t.Fatalf("GET: %+v %v", a, err)
		}
		if xfcc := a.echo.header("X-Forwarded-Client-Cert"); !strings.Contains(xfcc, "URI="+edgeID) {
			t.Errorf("backend saw XFCC %q, want the edge's %s", xfcc, edgeID)
		}
		if a, err := do(ctx, plain, http.MethodGet, "http://"+edge+":8080/x", map[string]string{"Host": "nobody.example"}); err != nil || a.status != 404 {
			t.Errorf("a host no route names: %d %v, want 404", a.status, err)
		}
		if web.count("/x") < 2 {
			t.Errorf("web-1 counted %d requests to /x", web.count("/x"))
		}
	})

	t.Run("HTTPS, the published certificate chosen by SNI", func(t *testing.T) {
		for _, name := range []string{"app.example", "other.example"} {
			var seen []string
			c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
				DialContext: func(_ context.Context, _, addr string) (net.Conn, error) { return client.Dial(addr) },
				TLSClientConfig: &tls.Config{ServerName: name, RootCAs: pool, VerifyConnection: func(cs tls.ConnectionState) error {
					seen = cs.PeerCertificates[0].DNSNames
					return nil
				}}}}
			a, err := do(ctx, c, http.MethodGet, "https://"+edge+":8443/secure", map[string]string{"Host": name})
			if err != nil || a.status != 200 || a.echo.Pod != "web-1" {
				t.Fatalf("GET over TLS to %s: %+v %v", name, a, err)
			}
			if len(seen) != 1 || seen[0] != name {
				t.Errorf("SNI %s: the edge presented a certificate for %v", name, seen)
			}
		}
	})

	t.Run("TLS passthrough by SNI", func(t *testing.T) {
		raw, err := client.Dial(edge + ":9443")
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
		c := tls.Client(raw, &tls.Config{ServerName: "backend.example", RootCAs: pool})
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || line != "sni=backend.example\n" {
			t.Fatalf("through the passthrough listener: %q %v", line, err)
		}
		if got := c.ConnectionState().PeerCertificates[0].DNSNames; len(got) != 1 || got[0] != "backend.example" {
			t.Errorf("passthrough: certificate for %v, want the backend's own", got)
		}
	})

	t.Run("a route from a namespace the listener does not allow is not served", func(t *testing.T) {
		a, err := do(ctx, plain, http.MethodGet, "http://"+edge+":8081/x", nil)
		if err != nil || a.status != 404 {
			t.Errorf("GET on the private listener: %d %v, want 404 (route shop/private is not allowed there)", a.status, err)
		}
	})

	t.Run("UDPRoute on a Service in the mesh", func(t *testing.T) {
		vip := net.JoinHostPort(udpSvc.Spec.ClusterIP, "53")
		// Without a route, UDP is not captured: nothing serves the VIP here (no kube-proxy).
		if got, err := meshCaller.AskUDP(vip, "before", time.Second); err == nil {
			t.Fatalf("UDP to the VIP before any UDPRoute answered %q", got)
		}
		route := &gwv1.UDPRoute{ObjectMeta: metav1.ObjectMeta{Name: "mesh-dns"}, Spec: gwv1.UDPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{serviceParent("", "udp", 53)}},
			Rules:           []gwv1.UDPRouteRule{{BackendRefs: []gwv1.BackendRef{backend("udp", 53, 1)}}},
		}}
		must(m.gw.GatewayV1().UDPRoutes("shop").Create(ctx, route, metav1.CreateOptions{}))
		testenv.Eventually(t, time.Minute, "a captured pod's datagrams to the VIP reach the route's backend", func() error {
			got, err := meshCaller.AskUDP(vip, "mesh", 2*time.Second)
			if err != nil || got != "echo:mesh" {
				return fmt.Errorf("%q %v", got, err)
			}
			return nil
		})
		if err := m.gw.GatewayV1().UDPRoutes("shop").Delete(ctx, route.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, time.Minute, "no redirect once the route is gone", func() error {
			if got, err := meshCaller.AskUDP(vip, "after", time.Second); err == nil {
				return fmt.Errorf("still answered %q", got)
			}
			return nil
		})
	})

	t.Run("TCPRoute weights", func(t *testing.T) {
		seen := map[string]int{}
		for range 200 {
			c, err := client.Dial(edge + ":9000")
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
		if seen["A"]+seen["B"] != 200 || seen["A"] < 120 || seen["A"] > 180 {
			t.Errorf("connections by backend %v, want about 150 A and 50 B", seen)
		}
	})

	t.Run("UDPRoute datagrams", func(t *testing.T) {
		got, err := client.AskUDP(edge+":5300", "ping", 5*time.Second)
		if err != nil || got != "echo:ping" {
			t.Errorf("UDP through the edge: %q %v", got, err)
		}
		if udpSeen.Load() < 1 {
			t.Error("the UDP backend saw nothing")
		}
	})
}
