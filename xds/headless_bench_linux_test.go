package xds

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	dto "github.com/prometheus/client_model/go"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// headlessBenchMesh is the model of BenchmarkHeadlessChange: services VIP services like
// BenchmarkSnapshotBuild's (one port 80, every fifth TCP, two endpoints each in this cluster on
// addresses nothing dials), the headless service web/peers (TCP 7000 "raft", HTTP 80 to 8080
// "web") whose endpoints are the local pods h0, h1, h2 and, with member, h3, and every pod of
// pods as a local pod (h0..h3 serving 7000 and 8080). With vipEndpoint, svc0 has a third
// endpoint; with h0Unready, h0's endpoint of peers is not healthy (not ready). peers has
// headlessExtra more endpoints in this cluster on other nodes (10.120.0.0/16).
func headlessBenchMesh(f *meshFixture, version uint64, services, headlessExtra int, pods []string, member, vipEndpoint, h0Unready bool) *model.Mesh {
	td := f.td
	svcs := make([]*model.Service, 0, services+1)
	eps := map[model.ServiceKey][]model.Endpoint{}
	for i := 0; i < services; i++ {
		k := model.ServiceKey{Namespace: fmt.Sprintf("ns%d", i%50), Name: fmt.Sprintf("svc%d", i)}
		proto := model.ProtocolHTTP
		if i%5 == 4 {
			proto = model.ProtocolTCP
		}
		svcs = append(svcs, &model.Service{Key: k, Local: true, VIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
			Ports: []model.ServicePort{{Port: 80, TargetPort: 8080, Protocol: proto}}})
		n := 2
		if i == 0 && vipEndpoint {
			n = 3
		}
		for e := 0; e < n; e++ {
			eps[k] = append(eps[k], model.Endpoint{Service: k, Cluster: "c1", PodName: fmt.Sprintf("p%d-%d", i, e), PodUID: fmt.Sprintf("u%d-%d", i, e),
				IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 100 + byte(e), byte(i >> 8), byte(i)})}, Ports: []model.EndpointPort{{Port: 8080, Protocol: proto}},
				SPIFFEID: model.SPIFFEID(td, k.Namespace, "sa"), Healthy: true})
		}
	}
	peers := model.ServiceKey{Namespace: "web", Name: "peers"}
	svcs = append(svcs, &model.Service{Key: peers, Local: true, Headless: true, Ports: []model.ServicePort{
		{Name: "http", Port: 80, TargetPort: 8080, TargetPortName: "web", Protocol: model.ProtocolHTTP},
		{Name: "raft", Port: 7000, TargetPort: 7000, TargetPortName: "raft", Protocol: model.ProtocolTCP},
	}})
	members := []string{"h0", "h1", "h2"}
	if member {
		members = append(members, "h3")
	}
	for i := 0; i < headlessExtra; i++ {
		eps[peers] = append(eps[peers], model.Endpoint{Service: peers, Cluster: "c1", PodName: fmt.Sprintf("x%d", i), PodUID: fmt.Sprintf("ux%d", i),
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 120, byte(i >> 8), byte(i)})}, NodeName: "node-2", SPIFFEID: model.SPIFFEID(td, "web", "server"), Healthy: true,
			Ports: []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.ProtocolHTTP}, {Name: "raft", Port: 7000, Protocol: model.ProtocolTCP}}})
	}
	for _, h := range members {
		eps[peers] = append(eps[peers], model.Endpoint{Service: peers, Cluster: "c1", PodName: h, PodUID: "uid-" + h, IPs: []netip.Addr{f.ips[h]},
			NodeName: "node-1", SPIFFEID: model.SPIFFEID(td, "web", "server"), Healthy: h != "h0" || !h0Unready, Ports: []model.EndpointPort{
				{Name: "http", Port: 8080, Protocol: model.ProtocolHTTP}, {Name: "raft", Port: 7000, Protocol: model.ProtocolTCP}}})
	}
	var local []*model.LocalPod
	for _, name := range pods {
		p := &model.LocalPod{UID: "uid-" + name, Namespace: "bench", Name: name, ServiceAccount: name,
			NetnsPath: f.pods[name].Path, IPs: []netip.Addr{f.ips[name]}, Ready: true}
		if name[0] == 'h' {
			p.Namespace, p.ServiceAccount = "web", "server"
			p.Ports = []model.PodPort{{Name: "web", Port: 8080, Protocol: model.ProtocolHTTP}, {Name: "raft", Port: 7000, Protocol: model.ProtocolTCP}}
		}
		local = append(local, p)
	}
	return model.New(version, "c1", "mesh", td, model.Node{Name: "node-1", IP: netip.MustParseAddr("10.44.0.1")}, svcs, eps, local)
}

// BenchmarkHeadlessChange measures one endpoint change of a headless Service (headless: its
// fourth member h3 joins or leaves, alternately; headless-ready: its member h0 becomes not ready
// or ready) against one endpoint change of a VIP service (vip: svc0 gains or loses a third
// endpoint), with P local pods (each with its own capture listener) and N VIP
// services, real Envoy 1.40 over delta ADS (--concurrency 1). Per change: SetMesh alone
// (setmesh-ms); until Envoy ACKed it (ack-ms: listeners, clusters and the ECDS resource for the
// headless change, the EDS response for the other two); until it is live (live-ms: for the headless change a
// connection from the client pod through capture to h3:7000 goes over mTLS to h3's inbound
// listener when h3 is a member and is passed through when it is not, and so does an HTTP request
// on a new connection to h3:8080, which h3's server sees with an XFCC header only through the
// mesh: the TCP port's membership is in the ECDS filter, the HTTP port's in it and in the headless
// route table; for the others the EDS ACK); Envoy's CPU time from SetMesh to live (envoy-cpu-ms, 10 ms ticks); and what the change
// sent over xDS: listeners (lds-res), clusters (cds-res), EDS resources (eds-res), route tables
// (rds-res), ECDS resources (ecds-res: the headless filter) and all bytes (xds-KB,
// aether_xds_bytes_sent_total).
//
//	go test ./xds/ -run '^$' -bench BenchmarkHeadlessChange -benchtime 10x -timeout 30m
//
// AETHER_BENCH_SERVICES sets N (default 1000); AETHER_BENCH_HEADLESS_EXTRA gives the headless
// Service that many more endpoints on other nodes (default 0; each is two entries of the
// headless map, one per port).
func BenchmarkHeadlessChange(b *testing.B) {
	services := testenv.BenchEnv(b, "AETHER_BENCH_SERVICES", 1000)
	extra := 0
	if os.Getenv("AETHER_BENCH_HEADLESS_EXTRA") != "" {
		extra = testenv.BenchEnv(b, "AETHER_BENCH_HEADLESS_EXTRA", 0)
	}
	for _, pods := range []int{10, 50} {
		for _, kind := range []string{"headless", "headless-ready", "vip"} {
			b.Run(fmt.Sprintf("pods=%d/services=%d/headless-endpoints=%d/%s", pods, services, 4+extra, kind), func(b *testing.B) {
				benchHeadlessChange(b, services, extra, pods, kind)
			})
		}
	}
}

func benchHeadlessChange(b *testing.B, services, extra, npods int, kind string) {
	headless := kind == "headless"
	f := newMeshFixture(b, time.Hour, true, Options{})
	alpha, _ := f.addPod("alpha", true)
	names := []string{"alpha"}
	for i := 0; i < 4; i++ {
		name := fmt.Sprintf("h%d", i)
		ns, _ := f.addPod(name, false)
		serveWho(ns.Listen(b, "0.0.0.0:7000"), name)
		ns.ServeHTTP(b, "0.0.0.0:8080", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "pod=%s xfcc=%s", name, r.Header.Get("X-Forwarded-Client-Cert"))
		}))
		names = append(names, name)
	}
	for i := len(names); i < npods; i++ {
		name := fmt.Sprintf("p%d", i)
		f.addPod(name, false)
		names = append(names, name)
	}
	version := uint64(2)
	member, vipEndpoint, unready := false, false, false
	f.set(headlessBenchMesh(f, version, services, extra, names, member, vipEndpoint, unready))
	read := func(url string) (res, bytes float64) {
		var m dto.Metric
		if err := f.srv.sent.WithLabelValues(url).Write(&m); err != nil {
			b.Fatal(err)
		}
		res = m.GetCounter().GetValue()
		if err := f.srv.bytesSent.WithLabelValues(url).Write(&m); err != nil {
			b.Fatal(err)
		}
		return res, m.GetCounter().GetValue()
	}
	types := []string{resource.ListenerType, resource.ClusterType, resource.EndpointType, resource.RouteType, resource.SecretType, resource.ExtensionConfigType}
	snapshot := func() (res map[string]float64, bytes float64) {
		res = map[string]float64{}
		for _, u := range types {
			r, by := read(u)
			res[u] += r
			bytes += by
		}
		return res, bytes
	}
	h3 := f.ips["h3"].String() + ":7000"
	h3HTTP := "http://" + f.ips["h3"].String() + ":8080/"
	client := alpha.HTTPClient(false) // a new connection per request: each takes the current chain
	var setT, ackT, liveT, cpuT []time.Duration
	res0, bytes0 := snapshot()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		version++
		switch kind {
		case "headless":
			member = !member
		case "headless-ready":
			unready = !unready
		default:
			vipEndpoint = !vipEndpoint
		}
		m := headlessBenchMesh(f, version, services, extra, names, member, vipEndpoint, unready)
		ecds0 := headlessFilterVersion(f.srv)
		u0, s0 := envoyCPUSeconds(f.sup.PID())
		start := time.Now()
		v, err := f.srv.SetMesh(context.Background(), m)
		if err != nil {
			b.Fatal(err)
		}
		setT = append(setT, time.Since(start))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		if headless {
			// The capture listeners' ECDS filter carries the membership (unless it is over
			// maxHeadlessMap: then the capture listeners do); a joining member's inbound
			// listener comes over LDS.
			if err = f.srv.WaitForAck(ctx, v); err == nil && headlessFilterVersion(f.srv) != ecds0 {
				err = waitTypeAck(ctx, f.srv, resource.ExtensionConfigType, v)
			}
		} else {
			err = waitTypeAck(ctx, f.srv, resource.EndpointType, v)
		}
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		ackT = append(ackT, time.Since(start))
		if headless {
			want := "h3 " + f.ips["alpha"].String() // passed through, from alpha's own address
			if member {
				want = "h3 127.0.0.1" // through h3's inbound listener
			}
			for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(time.Millisecond) {
				got, err := askWho(alpha, h3)
				if err == nil && got == want {
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("h3 member=%v: %q %v, want %q", member, got, err, want)
				}
			}
			for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(time.Millisecond) {
				code, body, _, err := getBody(client, h3HTTP, nil)
				if err == nil && code == 200 && strings.HasPrefix(body, "pod=h3 ") && (xfccURI(body) != "") == member {
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("GET %s member=%v: %d %q %v, want 200 from h3 with an XFCC header only through the mesh", h3HTTP, member, code, body, err)
				}
			}
		}
		liveT = append(liveT, time.Since(start))
		u1, s1 := envoyCPUSeconds(f.sup.PID())
		cpuT = append(cpuT, time.Duration((u1+s1-u0-s0)*float64(time.Second)))
	}
	b.StopTimer()
	res1, bytes1 := snapshot()
	if n, last := f.srv.NACKs(); n != 0 {
		b.Fatalf("%d NACKs, last %q", n, last)
	}
	mean := func(ds []time.Duration) float64 {
		var t time.Duration
		for _, d := range ds {
			t += d
		}
		return float64(t.Microseconds()) / 1000 / float64(len(ds))
	}
	med := func(ds []time.Duration) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds()) / 1000
	}
	n := float64(b.N)
	b.ReportMetric(mean(setT), "setmesh-ms")
	b.ReportMetric(mean(ackT), "ack-ms")
	b.ReportMetric(mean(liveT), "live-ms")
	b.ReportMetric(med(liveT), "live-p50-ms")
	b.ReportMetric(mean(cpuT), "envoy-cpu-ms")
	b.ReportMetric((res1[resource.ListenerType]-res0[resource.ListenerType])/n, "lds-res")
	b.ReportMetric((res1[resource.ClusterType]-res0[resource.ClusterType])/n, "cds-res")
	b.ReportMetric((res1[resource.EndpointType]-res0[resource.EndpointType])/n, "eds-res")
	b.ReportMetric((res1[resource.RouteType]-res0[resource.RouteType])/n, "rds-res")
	b.ReportMetric((res1[resource.ExtensionConfigType]-res0[resource.ExtensionConfigType])/n, "ecds-res")
	b.ReportMetric((bytes1-bytes0)/n/1000, "xds-KB")
}

// headlessFilterVersion is the delta version of the ECDS filter HeadlessFilterName in the
// snapshot s serves.
func headlessFilterVersion(s *Server) string {
	return servedVersion(s, resource.ExtensionConfigType, HeadlessFilterName)
}

// servedVersion is the delta version of the resource of type url named name in the snapshot s
// serves ("" when it has none).
func servedVersion(s *Server, url, name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		return ""
	}
	return s.last.GetVersionMap(url)[name]
}

// waitTypeAck waits until Envoy ACKed a response of type url at version v or later.
func waitTypeAck(ctx context.Context, s *Server, url, v string) error {
	seq, ok := s.parseVersion(v)
	if !ok {
		return fmt.Errorf("wait for %s ack: version %q is not the server's", url, v)
	}
	for {
		s.mu.Lock()
		done, ch := s.acked[url] >= seq, s.changed
		s.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s ack of %s: %w", url, v, ctx.Err())
		case <-ch:
		}
	}
}
