package xds

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

var vipNamed = netip.MustParseAddr("10.96.0.30")

// serveWho answers every connection with "<name> <caller IP>\n", then echoes. Through the mesh
// the caller is the inbound cluster's 127.0.0.1 in the pod's netns; passed through, it is the
// client pod's own IP.
func serveWho(l net.Listener, name string) {
	serveEach(l, func(c net.Conn) {
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		if _, err := fmt.Fprintf(c, "%s %s\n", name, host); err == nil {
			_, _ = io.Copy(c, c)
		}
	})
}

// askWho dials addr from ns and returns the first line the server writes.
func askWho(ns *testenv.Netns, addr string) (string, error) {
	c, err := ns.Dial(addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// headlessMesh is the model of TestPrivilegedHeadlessAndPerPodPorts: pods srv1 and srv2 back
// web (VIP, HTTP port 80 to the named targetPort "web") and the headless peers (HTTP 80 to "web",
// TCP 7000 to "raft"); the name "web" is 8080 in srv1 and 8081 in srv2, "raft" 7000 and 7001.
// ext is a local service with neither a VIP nor clusterIP None (an ExternalName Service). peers
// has extra more endpoints in this cluster on another node (10.120.0.0/16, on 8080 and 7000).
func headlessMesh(f *meshFixture, extra int) *model.Mesh {
	k := func(name string) model.ServiceKey { return model.ServiceKey{Namespace: "web", Name: name} }
	web, peers, ext := k("web"), k("peers"), k("ext")
	httpPort := model.ServicePort{Name: "http", Port: 80, TargetPort: 8080, TargetPortName: "web", Protocol: model.ProtocolHTTP}
	raftPort := model.ServicePort{Name: "raft", Port: 7000, TargetPort: 7000, TargetPortName: "raft", Protocol: model.ProtocolTCP}
	services := []*model.Service{
		{Key: web, Local: true, VIPs: []netip.Addr{vipNamed}, Ports: []model.ServicePort{httpPort}},
		{Key: peers, Local: true, Headless: true, Ports: []model.ServicePort{httpPort, raftPort}},
		{Key: ext, Local: true, Ports: []model.ServicePort{{Name: "http", Port: 80, TargetPort: 80, Protocol: model.ProtocolHTTP}}},
	}
	ep := func(svc model.ServiceKey, pod string, ports ...model.EndpointPort) model.Endpoint {
		return model.Endpoint{Service: svc, Cluster: "c1", PodName: pod, PodUID: "uid-" + pod, IPs: []netip.Addr{f.ips[pod]}, NodeName: "node-1",
			Ports: ports, SPIFFEID: model.SPIFFEID(f.td, "web", "server"), Healthy: true}
	}
	h := func(p uint32) model.EndpointPort {
		return model.EndpointPort{Name: "http", Port: p, Protocol: model.ProtocolHTTP}
	}
	r := func(p uint32) model.EndpointPort {
		return model.EndpointPort{Name: "raft", Port: p, Protocol: model.ProtocolTCP}
	}
	eps := map[model.ServiceKey][]model.Endpoint{
		web:   {ep(web, "srv1", h(8080)), ep(web, "srv2", h(8081))},
		peers: {ep(peers, "srv1", h(8080), r(7000)), ep(peers, "srv2", h(8081), r(7001))},
	}
	for i := 0; i < extra; i++ {
		x := ep(peers, fmt.Sprintf("x%d", i), h(8080), r(7000))
		x.IPs, x.NodeName = []netip.Addr{netip.AddrFrom4([4]byte{10, 120, byte(i >> 8), byte(i)})}, "node-2"
		eps[peers] = append(eps[peers], x)
	}
	pod := func(name, ns, sa string, ports ...model.PodPort) *model.LocalPod {
		return &model.LocalPod{UID: "uid-" + name, Namespace: ns, Name: name, ServiceAccount: sa,
			NetnsPath: f.pods[name].Path, IPs: []netip.Addr{f.ips[name]}, Ready: true, Ports: ports}
	}
	pods := []*model.LocalPod{
		pod("alpha", "shop", "alpha"),
		pod("srv1", "web", "server", model.PodPort{Name: "web", Port: 8080, Protocol: model.ProtocolHTTP}, model.PodPort{Name: "raft", Port: 7000, Protocol: model.ProtocolTCP}),
		pod("srv2", "web", "server", model.PodPort{Name: "web", Port: 8081, Protocol: model.ProtocolHTTP}, model.PodPort{Name: "raft", Port: 7001, Protocol: model.ProtocolTCP}),
	}
	return model.New(1, "c1", "mesh", f.td, model.Node{Name: "node-1", IP: netip.MustParseAddr("10.44.0.1")}, services, eps, pods)
}

// TestPrivilegedHeadlessAndPerPodPorts drives a headless Service and a named targetPort that
// differs between pods through the real Envoy 1.40: Envoy ACKs (no NACK, update_rejected 0);
// a client connecting to a headless Service's pod IP and own port (HTTP and TCP) reaches that
// pod over mTLS (the HTTP server sees the caller's SPIFFE ID in XFCC, the TCP server a
// connection from the inbound cluster, not from the node), a non-meshed pod is still passed
// through, the explicit lane balances a headless Service's name over its pods, a VIP-less
// service that is not headless has no lane virtual host (404, not 503), and requests to the VIP
// of a service whose named targetPort is 8080 in one pod and 8081 in the other reach both pods.
// The headless HTTP requests take the capture chain captureHeadlessChain, whose route table
// CaptureHeadlessRouteName Envoy loaded (the VIP route table holds no pod address: a request
// routed by it would get 404). With more headless endpoints than the ECDS filter's map holds
// (maxHeadlessMap), whose addresses are then capture matcher entries naming the same chains, the
// headless pods are reached the same way.
func TestPrivilegedHeadlessAndPerPodPorts(t *testing.T) { runProtocols(t, testHeadlessAndPerPodPorts) }

func testHeadlessAndPerPodPorts(t *testing.T, delta bool, build Options) {
	f := newMeshFixture(t, time.Hour, delta, build)
	alpha, _ := f.addPod("alpha", true)
	for i, name := range []string{"srv1", "srv2"} {
		ns, _ := f.addPod(name, false)
		ns.ServeHTTP(t, fmt.Sprintf("0.0.0.0:%d", 8080+i), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "pod=%s xfcc=%s", name, r.Header.Get("X-Forwarded-Client-Cert"))
		}))
		serveWho(ns.Listen(t, fmt.Sprintf("0.0.0.0:%d", 7000+i)), name)
	}
	plain, _ := f.addPod("plain", false) // not meshed: no endpoint anywhere
	serveWho(plain.Listen(t, "0.0.0.0:7000"), "plain")
	f.set(headlessMesh(f, 0))
	alphaID := model.SPIFFEID(f.td, "shop", "alpha")
	headlessHTTP := func(t *testing.T) {
		for i, name := range []string{"srv1", "srv2"} {
			url := fmt.Sprintf("http://%s:%d/", f.ips[name], 8080+i)
			code, body, _, err := getBody(alpha.HTTPClient(false), url, nil)
			if err != nil || code != 200 || !strings.HasPrefix(body, "pod="+name+" ") || xfccURI(body) != alphaID {
				t.Errorf("GET %s: %d %q %v, want 200 from %s with XFCC URI %s", url, code, body, err, name, alphaID)
			}
		}
		reload := "http.outbound_http.rds." + CaptureHeadlessRouteName + ".config_reload"
		if s, err := envoyStats(f, reload); err != nil || s[reload] < 1 {
			t.Errorf("%s = %v %v, want Envoy to have loaded the headless route table", reload, s[reload], err)
		}
	}
	headlessTCP := func(t *testing.T) {
		for i, name := range []string{"srv1", "srv2"} {
			addr := fmt.Sprintf("%s:%d", f.ips[name], 7000+i)
			if got, err := askWho(alpha, addr); err != nil || got != name+" 127.0.0.1" {
				t.Errorf("dial %s: %q %v, want %q (through the pod's inbound listener)", addr, got, err, name+" 127.0.0.1")
			}
		}
	}

	t.Run("no NACK", f.wantNoRejections)

	t.Run("headless pod IP, HTTP, reaches that pod over mTLS", headlessHTTP)
	t.Run("headless pod IP, TCP, reaches that pod over mTLS", headlessTCP)

	t.Run("non-meshed pod IP passes through", func(t *testing.T) {
		// Passed through, the connection leaves from alpha's own netns: alpha's address.
		addr, want := f.ips["plain"].String()+":7000", "plain "+f.ips["alpha"].String()
		if got, err := askWho(alpha, addr); err != nil || got != want {
			t.Errorf("dial %s: %q %v, want %q", addr, got, err, want)
		}
	})

	t.Run("lane", func(t *testing.T) {
		seen := map[string]bool{}
		for i := 0; i < 40 && len(seen) < 2; i++ {
			code, body, _, err := getBody(alpha.HTTPClient(false), "http://127.0.0.1:18081/", map[string]string{"Host": "peers.web.mesh"})
			if err != nil || code != 200 || xfccURI(body) != alphaID {
				t.Fatalf("lane Host peers.web.mesh: %d %q %v, want 200 with XFCC URI %s", code, body, err, alphaID)
			}
			seen[strings.Fields(body)[0]] = true
		}
		if !seen["pod=srv1"] || !seen["pod=srv2"] {
			t.Errorf("lane reached %v, want both pods", seen)
		}
		code, body, _, err := getBody(alpha.HTTPClient(false), "http://127.0.0.1:18081/", map[string]string{"Host": "ext.web.mesh"})
		if err != nil || code != http.StatusNotFound {
			t.Errorf("lane Host ext.web.mesh: %d %q %v, want 404 (no virtual host)", code, body, err)
		}
	})

	t.Run("named targetPort per pod through the VIP", func(t *testing.T) {
		seen := map[string]bool{}
		for i := 0; i < 40 && len(seen) < 2; i++ {
			code, body, _, err := getBody(alpha.HTTPClient(false), "http://"+vipNamed.String()+"/", nil)
			if err != nil || code != 200 || xfccURI(body) != alphaID {
				t.Fatalf("GET VIP: %d %q %v, want 200 with XFCC URI %s", code, body, err, alphaID)
			}
			seen[strings.Fields(body)[0]] = true
		}
		if !seen["pod=srv1"] || !seen["pod=srv2"] {
			t.Errorf("requests to the VIP reached %v, want both pods, each on its own port", seen)
		}
	})

	// 2 x 501 more entries than the map holds: the addresses are capture matcher entries.
	f.set(headlessMesh(f, maxHeadlessMap/2+1))
	t.Run("over the map limit: no NACK", f.wantNoRejections)
	t.Run("over the map limit: headless pod IP, HTTP, reaches that pod over mTLS", headlessHTTP)
	t.Run("over the map limit: headless pod IP, TCP, reaches that pod over mTLS", headlessTCP)
}
