package xds

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/model"
)

var vipUDP = netip.MustParseAddr("10.96.0.50")

// udpMeshOf is the L4 fixture's model with web/dns (UDP 53 on vipUDP, no endpoints of its own)
// and web/dns-v1 and web/dns-v2 (UDP 53 to 5353 in pods v1 and v2) and, with route, a UDPRoute
// on web/dns:53 sending 3 of 4 sessions to dns-v1, 1 to dns-v2.
func (f *l4Fixture) udpMeshOf(t *testing.T, version uint64, route bool) *model.Mesh {
	t.Helper()
	base := f.mesh(t, version, nil)
	web := func(n string) model.ServiceKey { return model.ServiceKey{Namespace: "web", Name: n} }
	udp := model.ServicePort{Name: "dns", Port: 53, TargetPort: 5353, Protocol: model.ProtocolUDP}
	services := append(base.Services, &model.Service{Key: web("dns"), Local: true, VIPs: []netip.Addr{vipUDP}, Ports: []model.ServicePort{udp}})
	eps := base.Endpoints
	for i, name := range []string{"v1", "v2"} {
		k := web("dns-" + name)
		services = append(services, &model.Service{Key: k, Local: true, VIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(51 + i)})},
			Ports: []model.ServicePort{udp}})
		eps[k] = []model.Endpoint{{Service: k, Cluster: "c1", PodName: name, PodUID: "uid-" + name, IPs: []netip.Addr{f.ips[name]}, NodeName: "node-1",
			Ports: []model.EndpointPort{{Port: 5353, Protocol: model.ProtocolUDP}}, SPIFFEID: model.SPIFFEID(f.td, "web", name), Healthy: true}}
	}
	m := model.New(version, base.Cluster, base.MeshDomain, base.TrustDomain, base.Node, services, eps, base.Pods)
	if !route {
		return m
	}
	return withL4Routes(t, m, []model.Route{{RouteRef: model.RouteRef{Kind: model.KindUDPRoute, Namespace: "web", Name: "dns-split"},
		Parents: []model.ParentRef{{Kind: model.ParentService, Service: web("dns"), Port: 53}},
		Rules: []model.RouteRule{{Backends: []model.BackendRef{
			{Kind: model.BackendService, Service: web("dns-v1"), Port: 53, Weight: 3},
			{Kind: model.BackendService, Service: web("dns-v2"), Port: 53, Weight: 1},
		}}}}})
}

// TestPrivilegedUDPRoute runs a UDPRoute on a Service through a real Envoy and the real capture
// rules (nftables) in a pod: the pod's datagrams to the VIP and port are DNAT'ed to the node's
// listener on HOST_IP and reach the route's backends' pods 3:1 (each new socket a new udp_proxy
// session), and the replies come back as from the VIP. A pod holding the frontend's local port
// in its own netns changes nothing (the listener is the node's). A host that is not one of the
// node's pods gets nothing relayed when it sends to the node's listener directly. With the
// route removed (the redirect first, then the listener), the pod's datagrams to the VIP are no
// longer redirected (nothing answers: the VIP has no kube-proxy here) and Envoy has no UDP
// listener left.
func TestPrivilegedUDPRoute(t *testing.T) {
	hostIP := netip.MustParseAddr("10.44.0.1") // the fixture node's bridge
	f := startL4Fixture(t, false, Options{UpstreamNetns: fixtureNodeNetns, HostIP: hostIP})
	got := map[string]interface{ Load() int32 }{}
	for _, name := range []string{"v1", "v2"} {
		got[name] = f.pods[name].ServeUDPEcho(t, "0.0.0.0:5353", name+" ")
	}
	alpha := f.pods["alpha"]
	rules := func(m *model.Mesh) {
		t.Helper()
		var rs []capture.UDPRedirect
		for _, fe := range m.UDPFrontends() {
			rs = append(rs, capture.UDPRedirect{VIP: fe.VIP, Port: fe.Port, LocalPort: fe.LocalPort})
		}
		set, err := capture.Build(capture.Config{PodIPs: []netip.Addr{f.ips["alpha"]}, HostIP: hostIP, BypassMark: capture.DefaultBypassMark,
			Mode: capture.ModePermissive, UDPRedirects: rs})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := (capture.NFTables{}).Apply(alpha.Path, set); err != nil {
			t.Fatal(err)
		}
	}

	routed := f.udpMeshOf(t, 1, true)
	local := routed.UDPFrontends()[0].LocalPort
	// The pod takes the frontend's local port in its own netns first: a listener there (the
	// design before) could then not bind, and Envoy would refuse every later update.
	squat := alpha.ServeUDPEcho(t, fmt.Sprintf("0.0.0.0:%d", local), "squatter ")
	// Listeners first, then the redirect.
	f.set(routed)
	rules(routed)
	vip := netip.AddrPortFrom(vipUDP, 53).String()
	const n = 200
	counts := map[string]int{}
	for i := range n {
		reply, err := alpha.AskUDP(vip, fmt.Sprint("q", i), 5*time.Second)
		if err != nil {
			t.Fatalf("datagram %d to %s: %v", i, vip, err)
		}
		name, rest, _ := strings.Cut(reply, " ")
		if rest != fmt.Sprint("q", i) {
			t.Fatalf("reply %q to q%d", reply, i)
		}
		counts[name]++
	}
	t.Logf("%d sessions: %v", n, counts)
	if counts["v1"]+counts["v2"] != n || counts["v1"] < n*6/10 || counts["v1"] > n*9/10 {
		t.Errorf("sessions %v, want about 3:1 between v1 and v2", counts)
	}
	if int(got["v1"].Load())+int(got["v2"].Load()) != n {
		t.Errorf("backends received %d and %d datagrams, want %d in all", got["v1"].Load(), got["v2"].Load(), n)
	}
	if squat.Load() != 0 {
		t.Errorf("the pod's own socket on the local port received %d datagrams", squat.Load())
	}
	f.wantNoRejections(t)

	// Not one of the node's pods: straight to the node's listener, nothing is relayed.
	before := got["v1"].Load() + got["v2"].Load()
	direct := netip.AddrPortFrom(hostIP, local).String()
	for i := range 3 {
		if reply, err := f.pods["outside"].AskUDP(direct, fmt.Sprint("outside ", i), time.Second); err == nil {
			t.Errorf("datagram from a host outside the node's pods to %s: reply %q, want none", direct, reply)
		}
	}
	if after := got["v1"].Load() + got["v2"].Load(); after != before {
		t.Errorf("backends received %d datagrams from a host outside the node's pods", after-before)
	}
	noRoute, err := f.admin("/stats?filter=^udp.mesh_udp.downstream_sess_no_route$")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(noRoute, "downstream_sess_no_route: 3") {
		t.Errorf("udp_proxy no-route count %q, want 3 (the outside host's datagrams)", noRoute)
	}

	// A socket that keeps sending: its flow's conntrack entry holds the DNAT to the node's
	// listener, past any change of the rules.
	var live net.Conn
	if err := alpha.Do(func() (err error) { live, err = net.Dial("udp", vip); return err }); err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	askLive := func(msg string) (string, error) {
		_ = live.SetDeadline(time.Now().Add(time.Second))
		if _, err := live.Write([]byte(msg)); err != nil {
			return "", err
		}
		buf := make([]byte, 512)
		n, err := live.Read(buf)
		return string(buf[:n]), err
	}
	if reply, err := askLive("live 1"); err != nil || !strings.HasSuffix(reply, " live 1") {
		t.Fatalf("the live socket through the route: %q %v", reply, err)
	}

	// The redirect first, then the listeners; the flows to the VIP and port are forgotten
	// once the redirect is gone (cni.Server.SetUDPRedirects), so the live socket's next
	// datagram is not relayed by the listener still there.
	plain := f.udpMeshOf(t, 2, false)
	rules(plain)
	if n, err := capture.ForgetUDPFlows(alpha.Path, []netip.AddrPort{netip.AddrPortFrom(vipUDP, 53)}); err != nil || n == 0 {
		t.Fatalf("ForgetUDPFlows: %d flows, %v; want the live socket's (and the others') forgotten", n, err)
	}
	before = got["v1"].Load() + got["v2"].Load()
	if reply, err := askLive("live 2"); err == nil {
		t.Errorf("the live socket after its redirect was removed: reply %q, want none", reply)
	}
	if after := got["v1"].Load() + got["v2"].Load(); after != before {
		t.Errorf("backends received %d datagrams of the live socket after its redirect was removed", after-before)
	}
	f.set(plain)
	before = got["v1"].Load() + got["v2"].Load()
	if reply, err := alpha.AskUDP(vip, "after", time.Second); err == nil {
		t.Errorf("datagram to %s after the route was removed: reply %q, want none", vip, reply)
	}
	if after := got["v1"].Load() + got["v2"].Load(); after != before {
		t.Errorf("backends received %d datagrams after the route was removed", after-before)
	}
	ls, err := f.admin("/listeners")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(ls, "udp|") {
		t.Errorf("UDP listeners left after the route was removed:\n%s", ls)
	}
}
