//go:build linux

package xds

import (
	"context"
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

// TestPrivilegedPodAddressTentativeIPv6: a pod whose only address is an IPv6 one still in
// duplicate address detection (tentative: the kernel refuses to bind it) gets its listeners from
// a real Envoy (IPV6_FREEBIND), and its inbound listener serves an mTLS client once the address is
// usable. Before, Envoy rejected the update ("Cannot assign requested address").
func TestPrivilegedPodAddressTentativeIPv6(t *testing.T) {
	f := newMeshFixture(t, time.Hour, true, Options{})
	f.addPod("alpha", false)
	v6, _ := f.addPod("v6", false)
	serveEcho(v6.Listen(t, "127.0.0.1:9000"))
	ip := netip.MustParseAddr("fd00:44::5")
	// A hundred DAD probes a second apart keep the address tentative for the test's length.
	run(t, v6, "sysctl", "-qw", "net.ipv6.conf.eth0.accept_dad=1", "net.ipv6.conf.eth0.dad_transmits=100")
	run(t, v6, "ip", "-6", "addr", "add", ip.String()+"/64", "dev", "eth0")
	f.ips["v6"] = ip
	f.set(podAddrMesh(f, 1, map[string]netip.Addr{"v6": netip.MustParseAddr("10.96.0.50")}, "v6"))
	out, err := v6.Command("ip", "-6", "addr", "show", "dev", "eth0").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "tentative") {
		t.Fatalf("the address is no longer tentative, the test shows nothing: %s %v", out, err)
	}
	if n, last := f.srv.NACKs(); n != 0 {
		t.Fatalf("NACKs = %d (last %q), want 0", n, last)
	}
	// The address becomes usable: a client in the pod's netns reaches the application through
	// the inbound listener on [ip]:15008.
	run(t, v6, "ip", "-6", "addr", "del", ip.String()+"/64", "dev", "eth0")
	run(t, v6, "ip", "-6", "addr", "add", ip.String()+"/64", "dev", "eth0", "nodad")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(f.ca.BundlePEM())
	svid, err := f.ca.Issue(context.Background(), model.SPIFFEID(f.td, "web", "alpha"))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(svid.CertChainPEM, svid.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "mTLS to the inbound listener on the IPv6 address", func() error {
		raw, err := v6.Dial(net.JoinHostPort(ip.String(), "15008"))
		if err != nil {
			return err
		}
		defer raw.Close()
		c := tls.Client(raw, &tls.Config{ServerName: "9000", RootCAs: pool, Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true})
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		return testenv.EchoOnce(c, "over IPv6")
	})
}
