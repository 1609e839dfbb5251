package xds

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/internal/xdsproto"
	"github.com/aethermesh/aether/model"
)

// plainEnvoyBootstrap is the reference of BenchmarkEdge: a plain Envoy with static resources and
// the same upstream TLS as the edge's (the SVID of id, the mesh's bundle, the server's SPIFFE ID
// pinned, SNI the target port) to the same backend pod's inbound listener: HTTP on :8080 to
// target port 8080, tcp_proxy on :9000 to target port 9100.
func plainEnvoyBootstrap(t testing.TB, f *meshFixture, adminSock, id string) []byte {
	t.Helper()
	sv, err := f.ca.Issue(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	cluster := func(name, sni string) *clusterv3.Cluster {
		ts, err := tlsSocket(&tlsv3.UpstreamTlsContext{Sni: sni, CommonTlsContext: &tlsv3.CommonTlsContext{
			TlsCertificates: []*tlsv3.TlsCertificate{{
				CertificateChain: &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: sv.CertChainPEM}},
				PrivateKey:       &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: sv.KeyPEM}},
			}},
			ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
				TrustedCa: &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: f.ca.BundlePEM()}},
				MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{SanType: tlsv3.SubjectAltNameMatcher_URI,
					Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: model.SPIFFEID(f.td, "web", "server")}}}},
			}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return &clusterv3.Cluster{
			Name: name, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
			ConnectTimeout: xdsproto.ConnectTimeout(0), TransportSocket: ts,
			LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
				LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: xdsproto.SocketAddress(f.ips["server"].String(), InboundPort, "")}}}},
			}}},
		}
	}
	hcm, err := hcmFilter(&hcmv3.HttpConnectionManager{StatPrefix: "plain", RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{
		RouteConfig: &routev3.RouteConfiguration{Name: "plain", VirtualHosts: []*routev3.VirtualHost{{Name: "all", Domains: []string{"*"}, Routes: []*routev3.Route{routeTo("http")}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	tp, err := xdsproto.TCPProxy("plain_tcp", "stream")
	if err != nil {
		t.Fatal(err)
	}
	b := &bootstrapv3.Bootstrap{
		Node:  &core.Node{Id: "plain", Cluster: "plain"},
		Admin: &bootstrapv3.Admin{Address: &core.Address{Address: &core.Address_Pipe{Pipe: &core.Pipe{Path: adminSock}}}},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Listeners: []*listenerv3.Listener{
				{Name: "http", Address: xdsproto.SocketAddress("0.0.0.0", 8080, ""), FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{hcm}}}},
				{Name: "tcp", Address: xdsproto.SocketAddress("0.0.0.0", 9000, ""), FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{tp}}}},
			},
			Clusters: []*clusterv3.Cluster{cluster("http", "8080"), cluster("stream", "9100")},
		},
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	out, err := protojson.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// BenchmarkEdge compares, in one run, the edge Envoy (programmed over xDS, routes from a Gateway's
// HTTPRoute and TCPRoute, the mesh's clusters with the edge's SVID) with a plain Envoy holding a
// static cluster and the same TLS to the same backend: HTTP latency at 1000 requests/s
// interleaved over three paths (direct to the pod, the plain Envoy, the edge; the added p99 of
// each against direct; half the samples with the two proxies' order swapped), then TCP throughput of one stream through each, alternating in rounds.
// AETHER_BENCH_SAMPLES sets the requests per path (default 20000).
func BenchmarkEdge(b *testing.B) {
	testenv.RequireRoot(b)
	samples := testenv.BenchEnv(b, "AETHER_BENCH_SAMPLES", 20000)
	e := startEdgeFixture(b)
	f := e.meshFixture
	serveStream(f.pods["server"].Listen(b, "0.0.0.0:9100"))
	web := model.ServiceKey{Namespace: "web", Name: "http"}
	rule := &model.RouteRule{Matches: []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/"}}},
		Backends: []model.BackendRef{{Kind: model.BackendService, Service: web, Port: 80, Weight: 1}}}
	g := &model.EdgeGateway{Key: gwKey, ServiceAccount: model.EdgeServiceAccountName(gwKey.Name), Ports: []model.EdgePort{
		{Port: 8080, Listeners: []model.EdgeListener{{Name: "http", Protocol: model.ListenerHTTP, Hosts: []model.EdgeHost{
			{Hostname: "*", Entries: []model.RouteEntry{{Route: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: "gw", Name: "all"}, Rule: rule, Match: rule.Matches[0]}}},
		}}}},
		{Port: 9000, Listeners: []model.EdgeListener{{Name: "tcp", Protocol: model.ListenerTCP, L4: []model.EdgeL4Route{
			{Route: model.RouteRef{Kind: model.KindTCPRoute, Namespace: "gw", Name: "stream"},
				Backends: []model.BackendRef{{Kind: model.BackendService, Service: model.ServiceKey{Namespace: "web", Name: "stream"}, Port: 9100, Weight: 1}}},
		}}}},
	}}
	m := edgeMesh(f, 2)
	f.set(m)
	e.set(b, m, g)

	plainNS, plainIP := f.addPod("plain", false)
	adminSock := filepath.Join(f.dir, "plain-admin.sock")
	tools := testenv.RequireTools(b, testenv.ToolEnvoy)
	logf, err := os.Create(filepath.Join(f.dir, "plain.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("ip", "netns", "exec", plainNS.Name, tools.Envoy, "--config-yaml",
		string(plainEnvoyBootstrap(b, f, adminSock, model.SPIFFEID(f.td, "gw", "plain"))), "--concurrency", "1", "--log-level", "info")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	outside := f.pods["outside"]
	testenv.Eventually(b, time.Minute, "plain Envoy up", func() error {
		c, err := outside.Dial(plainIP.String() + ":8080")
		if err == nil {
			c.Close()
		}
		return err
	})

	// TCP throughput first, unpinned (pinned, the proxies would share a core and the ratio would
	// compare CPU per byte).
	const rounds = 4
	buf := make([]byte, 256<<10)
	names := []string{"plain", "edge"}
	addrs := map[string]string{"plain": plainIP.String() + ":9000", "edge": e.edgeIP.String() + ":9000"}
	streams := map[string]net.Conn{}
	for _, n := range names {
		c, err := outside.Dial(addrs[n])
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		streams[n] = c
	}
	read, took := map[string]float64{}, map[string]time.Duration{}
	for range rounds {
		for _, n := range names {
			c := streams[n]
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatalf("%s stream: %v", n, err)
			}
			start := time.Now()
			for time.Since(start) < time.Second {
				k, err := c.Read(buf)
				if err != nil {
					b.Fatalf("%s stream: %v", n, err)
				}
				read[n] += float64(k)
			}
			took[n] += time.Since(start)
		}
	}
	mbs := map[string]float64{}
	for _, n := range names {
		mbs[n] = read[n] / took[n].Seconds() / 1e6
		b.ReportMetric(mbs[n], "tcp-"+n+"-MB/s")
	}
	b.ReportMetric(mbs["edge"]/mbs["plain"], "tcp-edge/plain")

	pin := pinBench(b, f.sup.PID(), e.sup.PID(), cmd.Process.Pid)
	fmt.Printf("BenchmarkEdge: TCP MB/s plain %.0f edge %.0f (%.2fx); HTTP %d samples per path at 1000/s, %s, loadavg %s\n",
		mbs["plain"], mbs["edge"], mbs["edge"]/mbs["plain"], samples, pin, loadavg())
	body := bytes.Repeat([]byte("x"), 1024)
	srvIP := f.ips["server"].String()
	direct, _ := f.addPod("direct", false)
	path := func(name string, ns *testenv.Netns, addr, host string) pacePath {
		c, err := ns.Dial(addr)
		if err != nil {
			b.Fatal(err)
		}
		rc, req := newRawConn(b, c), httpRequest(host, body)
		return pacePath{name, func() error { return rc.roundTrip(req, len(body)) }}
	}
	paths := []pacePath{
		path("direct", direct, srvIP+":8080", srvIP),
		path("plain", outside, plainIP.String()+":8080", "app.example"),
		path("edge", outside, e.edgeIP.String()+":8080", "app.example"),
	}
	if _, err := paceInterleaved(1000, 1000, 10, paths); err != nil {
		b.Fatalf("warm-up: %v", err)
	}
	// The tail of the path measured right after direct came out worse whichever proxy it was
	// (a first try: 0.65x one way, 1.7x the other): each half of the samples runs in one order,
	// and the halves are merged per path.
	r, err := paceInterleaved(1000, samples/2, 10, paths)
	if err != nil {
		b.Fatal(err)
	}
	r2, err := paceInterleaved(1000, samples/2, 10, []pacePath{paths[0], paths[2], paths[1]})
	if err != nil {
		b.Fatal(err)
	}
	for i, j := range []int{0, 2, 1} {
		r.sched[i] = append(r.sched[i], r2.sched[j]...)
		r.svc[i] = append(r.svc[i], r2.svc[j]...)
		slices.Sort(r.sched[i])
		slices.Sort(r.svc[i])
	}
	r.pacing = append(r.pacing, r2.pacing...)
	slices.Sort(r.pacing)
	r.elapsed += r2.elapsed
	reportPaced(b, "http-", paths, r)
	for _, q := range []float64{.5, .99} {
		plainAdded := pct(r.sched[1], q) - pct(r.sched[0], q)
		edgeAdded := pct(r.sched[2], q) - pct(r.sched[0], q)
		fmt.Printf("  added p%g over direct (from schedule): plain %s us, edge %s us (edge/plain %s)\n", q*100, us(plainAdded), us(edgeAdded),
			strconv.FormatFloat(float64(edgeAdded)/float64(plainAdded), 'f', 2, 64))
	}
}
