//go:build linux

package xds

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// podAddrMesh is the model of TestPrivilegedPodAddressAbsent: a client pod "alpha" and the
// server pods named in servers, each backing a TCP echo service "<name>" on port 9000 whose VIP
// is vips[name].
func podAddrMesh(f *meshFixture, version uint64, vips map[string]netip.Addr, servers ...string) *model.Mesh {
	pod := func(name string) *model.LocalPod {
		return &model.LocalPod{UID: "uid-" + name, Namespace: "web", Name: name, ServiceAccount: name,
			NetnsPath: f.pods[name].Path, IPs: []netip.Addr{f.ips[name]}, Ready: true}
	}
	pods := []*model.LocalPod{pod("alpha")}
	var services []*model.Service
	eps := map[model.ServiceKey][]model.Endpoint{}
	for _, name := range servers {
		p := pod(name)
		p.Ports = []model.PodPort{{Port: 9000, Protocol: model.ProtocolTCP}}
		pods = append(pods, p)
		k := model.ServiceKey{Namespace: "web", Name: name}
		services = append(services, &model.Service{Key: k, Local: true, VIPs: []netip.Addr{vips[name]},
			Ports: []model.ServicePort{{Name: "tcp", Port: 9000, TargetPort: 9000, Protocol: model.ProtocolTCP}}})
		eps[k] = []model.Endpoint{{Service: k, Cluster: "c1", PodName: name, PodUID: p.UID, IPs: p.IPs, NodeName: "node-1",
			Ports: []model.EndpointPort{{Port: 9000, Protocol: model.ProtocolTCP}}, SPIFFEID: model.SPIFFEID(f.td, "web", name), Healthy: true}}
	}
	return model.New(version, "c1", "mesh", f.td, model.Node{Name: "node-1", IP: netip.MustParseAddr("10.44.0.1")}, services, eps, pods)
}

// TestPrivilegedPodAddressAbsent serves a real Envoy the listeners of a pod whose IP is not an
// address of its netns (a pod with NET_ADMIN that removed it, an IPv6 address still tentative, a
// wrong prevResult): Envoy must accept the snapshot (the pod listeners bind with IP_FREEBIND),
// the next snapshot, which adds another pod, must be ACKed and that pod served, and the first
// pod's inbound listener must serve once its address appears. Before, Envoy could not bind the
// inbound listener on pod_ip:15008 and rejected the LDS update, and every later one since each
// snapshot holds that listener: no pod listener on the node changed again and every CNI ADD on
// the node failed waiting for the ACK.
func TestPrivilegedPodAddressAbsent(t *testing.T) {
	for _, c := range []struct {
		name  string
		delta bool
	}{{"sotw", false}, {"delta", true}} {
		t.Run(c.name, func(t *testing.T) { testPodAddressAbsent(t, c.delta) })
	}
}

func testPodAddressAbsent(t *testing.T, delta bool) {
	f := newMeshFixture(t, time.Hour, delta, Options{})
	vips := map[string]netip.Addr{"ghost": netip.MustParseAddr("10.96.0.30"), "late": netip.MustParseAddr("10.96.0.31")}
	alpha, _ := f.addPod("alpha", true)
	ghost, ghostIP := f.addPod("ghost", false)
	serveEcho(ghost.Listen(t, "0.0.0.0:9000"))
	run(t, ghost, "ip", "addr", "del", ghostIP.String()+"/24", "dev", "eth0")

	f.set(podAddrMesh(f, 1, vips, "ghost")) // fails on a NACK
	noRejects := func(when string) {
		t.Helper()
		if n, last := f.srv.NACKs(); n != 0 {
			t.Fatalf("%s: NACKs = %d (last %q), want 0", when, n, last)
		}
		for name, v := range f.stats() {
			if strings.HasSuffix(name, "update_rejected") && v != 0 {
				t.Fatalf("%s: %s = %d, want 0", when, name, v)
			}
		}
	}
	noRejects("pod without its address")
	ls, err := f.admin("/listeners")
	if err != nil {
		t.Fatal(err)
	}
	if want := ghostIP.String() + ":15008"; !strings.Contains(ls, want) {
		t.Fatalf("/listeners has no listener on %s:\n%s", want, ls)
	}

	// Other pods' listeners keep changing: a new pod is ACKed and served while the first pod
	// still lacks its address.
	late, _ := f.addPod("late", false)
	serveEcho(late.Listen(t, "0.0.0.0:9000"))
	f.set(podAddrMesh(f, 2, vips, "ghost", "late"))
	noRejects("a pod added beside it")
	testenv.Eventually(t, time.Minute, "the new pod reached through its VIP", func() error {
		return echoVia(alpha, vips["late"].String()+":9000", "to the pod added later")
	})

	// The control: without its address the pod is not reached.
	if err := echoVia(alpha, vips["ghost"].String()+":9000", "to the pod without its address"); err == nil {
		t.Fatal("the pod without its address was reached")
	}
	// The address appears: the listener bound with freebind serves it, with no new snapshot.
	run(t, ghost, "ip", "addr", "add", ghostIP.String()+"/24", "dev", "eth0")
	testenv.Eventually(t, time.Minute, "the pod reached once its address is back", func() error {
		if err := echoVia(alpha, vips["ghost"].String()+":9000", "to the pod whose address came back"); err != nil {
			return fmt.Errorf("echo via %s: %w", vips["ghost"], err)
		}
		return nil
	})
	noRejects("after the address came back")
}
