package xds

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/aethermesh/aether/model"
)

var (
	vipNamedSet   = netip.MustParseAddr("10.96.1.50") // a's clusterset VIP of web/named
	vipNamedLocal = netip.MustParseAddr("10.96.1.51") // the VIP of a's own Service web/named (namedPortLocalA)
)

// namedPods are web/named's pods: node and the number its container port "who" has.
func (w *waypointTopo) namedPods() map[string]struct {
	f    *meshFixture
	port uint32
} {
	return map[string]struct {
		f    *meshFixture
		port uint32
	}{"srv1": {w.b1, 7000}, "srv2": {w.b2, 7000}, "srv3": {w.b1, 7002}, "srv4": {w.b1, 7002}}
}

// namedPortMeshes returns the models of a, b1 and b2 for web/named: b's TCP Service port 7000
// whose targetPort is the name "who" (namedPods: 7000 in srv1 on b1 and srv2 on b2, 7002 in srv3
// and srv4 on b1); exported by b, imported by a as Assemble makes it
// (model.ServicePort.FromImport; TargetPort 7000: two pods serve 7000, two 7002, a tie goes to
// the lowest).
func (w *waypointTopo) namedPortMeshes() (a, b1, b2 *model.Mesh) {
	td := w.a.td
	named := model.ServiceKey{Namespace: "web", Name: "named"}
	pods := w.namedPods()
	var eps []model.Endpoint
	for _, name := range []string{"srv1", "srv2", "srv3", "srv4"} {
		p := pods[name]
		eps = append(eps, model.Endpoint{Service: named, Cluster: "b", PodName: name, PodUID: "uid-" + name, IPs: []netip.Addr{p.f.ips[name]},
			NodeName: p.f.node.Name, NodeIP: w.nodeIP[p.f], Ports: []model.EndpointPort{{Name: "who", Port: p.port, Protocol: model.ProtocolTCP}},
			SPIFFEID: model.SPIFFEID(td, "web", "named-"+name), Healthy: true})
	}
	pod := func(f *meshFixture, name, ns, sa string, port uint32) *model.LocalPod {
		p := &model.LocalPod{UID: "uid-" + name, Namespace: ns, Name: name, ServiceAccount: sa,
			NetnsPath: f.pods[name].Path, IPs: []netip.Addr{f.ips[name]}, Ready: true}
		if port != 0 {
			p.Ports = []model.PodPort{{Name: "who", Port: port, Protocol: model.ProtocolTCP}}
		}
		return p
	}
	bModel := func(f *meshFixture, pods ...*model.LocalPod) *model.Mesh {
		svc := &model.Service{Key: named, Local: true, Exported: true, VIPs: []netip.Addr{netip.MustParseAddr("10.96.0.50")},
			Ports: []model.ServicePort{{Name: "who", Port: 7000, TargetPort: 7000, TargetPortName: "who", Protocol: model.ProtocolTCP}}}
		return model.New(1, "b", "mesh", td, model.Node{Name: f.node.Name, IP: w.nodeIP[f]}, []*model.Service{svc},
			map[model.ServiceKey][]model.Endpoint{named: append([]model.Endpoint(nil), eps...)}, pods)
	}
	b1 = bModel(w.b1, pod(w.b1, "srv1", "web", "named-srv1", 7000), pod(w.b1, "srv3", "web", "named-srv3", 7002),
		pod(w.b1, "srv4", "web", "named-srv4", 7002), pod(w.b1, "bclient", "shop", "bclient", 0))
	b2 = bModel(w.b2, pod(w.b2, "srv2", "web", "named-srv2", 7000))
	imported := &model.Service{Key: named, Imported: true, ClustersetVIPs: []netip.Addr{vipNamedSet},
		Ports: []model.ServicePort{{Name: "who", Port: 7000, TargetPort: 7000, Protocol: model.ProtocolTCP, FromImport: true}}}
	a = model.New(1, "a", "mesh", td, model.Node{Name: w.a.node.Name, IP: w.nodeIP[w.a]}, []*model.Service{imported},
		map[model.ServiceKey][]model.Endpoint{named: append([]model.Endpoint(nil), eps...)}, []*model.LocalPod{pod(w.a, "client", "shop", "client", 0)})
	return a, b1, b2
}

// namedPortLocalA returns a's model of web/named (namedPortMeshes) for a cluster a that also has
// the Service itself, with the number 7000 as targetPort (a ServicePort without TargetPortName or
// FromImport), its own VIP and no pod: b's pods serve the port on their own numbers.
func namedPortLocalA(a *model.Mesh) *model.Mesh {
	s := *a.Services[0]
	s.Local, s.VIPs = true, []netip.Addr{vipNamedLocal}
	s.Ports = []model.ServicePort{{Name: "who", Port: 7000, TargetPort: 7000, Protocol: model.ProtocolTCP, AppProtocol: true}}
	return model.New(a.Version+1, a.Cluster, a.MeshDomain, a.TrustDomain, a.Node, []*model.Service{&s}, maps.Clone(a.Endpoints), slices.Clone(a.Pods))
}

// TestPrivilegedWaypointNamedTargetPort drives a named targetPort that remote pods resolve to
// different numbers through the east-west waypoint, with three real Envoys (the topology of
// TestPrivilegedWaypoint): web/named's TCP port "who" is 7000 in srv1 (on b1) and srv2 (on b2)
// and 7002 in srv3 and srv4 (on b1). a's EDS holds one waypoint entry per b node (Envoy keeps
// one host per address): b1's carries 7002, the number of most of its pods (weight 2), b2's
// 7000 (weight 1). Every one of 30 connections from a's client pod to the clusterset VIP is
// answered, by srv2, srv3 and srv4, never by srv1 (b1's entry does not carry its port); and
// through b1's tunnel the SNI of each port reaches only the pods serving it (the certificate a
// raw TLS client is shown). Before, a sent every connection with the SNI 7000.named.web.mesh
// and b1's tunnel forwarded it to any of its pods: the connections that reached srv3 or srv4
// failed the handshake. Then a gets its own Service web/named, with the number 7000 as
// targetPort and no pod (namedPortLocalA): b's pods keep their own numbers, and the same
// entries, weights and answers hold through a's local VIP and its clusterset VIP. Before, srv3
// and srv4 (on 7002) were left out of a's EDS: only srv1 and srv2 answered.
func TestPrivilegedWaypointNamedTargetPort(t *testing.T) {
	w := newWaypointTopo(t, false)
	for name, p := range w.namedPods() {
		ns := p.f.pods[name]
		if ns == nil {
			ns, _ = p.f.addPod(name, false)
		}
		serveWho(ns.Listen(t, fmt.Sprintf("0.0.0.0:%d", p.port)), name)
	}
	a, b1, b2 := w.namedPortMeshes()
	w.b1.set(b1)
	w.b2.set(b2)
	w.a.set(a)
	id := func(pod string) string { return model.SPIFFEID(w.a.td, "web", "named-"+pod) }
	b1IP, b2IP := w.nodeIP[w.b1].String(), w.nodeIP[w.b2].String()

	t.Run("no NACK", func(t *testing.T) {
		for _, f := range []*meshFixture{w.a, w.b1, w.b2} {
			f.wantNoRejections(t)
		}
	})

	wantWeights := func(t *testing.T) {
		s, err := w.a.admin("/clusters")
		if err != nil {
			t.Fatal(err)
		}
		weights := map[string]string{}
		for _, line := range strings.Split(s, "\n") {
			if rest, ok := strings.CutPrefix(line, "named.web.mesh:7000::"); ok {
				if host, w, ok := strings.Cut(rest, "::weight::"); ok {
					weights[host] = w
				}
			}
		}
		want := map[string]string{b1IP + ":15443": "2", b2IP + ":15443": "1"}
		if !maps.Equal(weights, want) {
			t.Errorf("a's named.web.mesh:7000 host weights %v, want %v", weights, want)
		}
	}
	wantAnswers := func(t *testing.T, vip netip.Addr) {
		seen := map[string]int{}
		for i := 0; i < 30; i++ {
			line, err := askWho(w.a.pods["client"], vip.String()+":7000")
			if err != nil {
				t.Errorf("connection %d to %s: %q %v", i, vip, line, err)
				continue
			}
			pod, _, _ := strings.Cut(line, " ")
			seen[pod]++
		}
		if seen["srv2"] == 0 || seen["srv3"] == 0 || seen["srv4"] == 0 || len(seen) != 3 {
			t.Errorf("answers through %s by %v: want srv2, srv3 and srv4 only (b1's entry carries 7002, srv1's is 7000)", vip, seen)
		}
	}

	t.Run("EDS holds one waypoint entry per node, weighted by its pods on the carried port", wantWeights)

	t.Run("every connection through the waypoint is answered", func(t *testing.T) { wantAnswers(t, vipNamedSet) })

	t.Run("through b1's tunnel each port's SNI reaches only its pods", func(t *testing.T) {
		for _, c := range []struct {
			sni  string
			pods []string
		}{{"7000.named.web.mesh", []string{"srv1"}}, {"7002.named.web.mesh", []string{"srv3", "srv4"}}} {
			seen := map[string]bool{}
			for i := 0; i < 12; i++ {
				seen[tunnelPeer(t, w.a.node, b1IP+":15443", c.sni)] = true
			}
			var want []string
			for _, p := range c.pods {
				want = append(want, id(p))
			}
			if got := slices.Sorted(maps.Keys(seen)); !slices.Equal(got, want) {
				t.Errorf("SNI %s through b1's tunnel: certificates %q, want %q", c.sni, got, want)
			}
		}
	})

	t.Run("a's own Service with a numeric targetPort, also imported: b's pods keep their numbers", func(t *testing.T) {
		w.a.set(namedPortLocalA(a))
		w.a.wantNoRejections(t)
		wantWeights(t)
		for _, vip := range []netip.Addr{vipNamedLocal, vipNamedSet} {
			wantAnswers(t, vip)
		}
	})
}
