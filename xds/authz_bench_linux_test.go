package xds

import (
	"bytes"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

var vipGuarded = netip.MustParseAddr("10.96.0.30")

// authzBenchPolicies are the 20 rules of BenchmarkAuthzLatency's policy on the guarded pod: one
// DENY rule and 18 ALLOW rules that the benchmark's request does not match (other callers,
// methods and paths), then the ALLOW rule it matches last.
func authzBenchPolicies() []*model.AuthzPolicy {
	var allow []model.AuthzRule
	for i := range 18 {
		allow = append(allow, model.AuthzRule{
			Sources: []model.AuthzSource{{ServiceAccount: &model.AuthzServiceAccount{Namespace: "other", Name: "sa" + strconv.Itoa(i)}}},
			Methods: []string{"GET", "PUT"}, Paths: []model.PathMatch{{Type: model.MatchPathPrefix, Value: "/v" + strconv.Itoa(i)}},
		})
	}
	allow = append(allow, model.AuthzRule{
		Sources: []model.AuthzSource{{ServiceAccount: &model.AuthzServiceAccount{Namespace: "shop", Name: "alpha"}}},
		Methods: []string{"POST"}, Paths: []model.PathMatch{{Type: model.MatchPathPrefix, Value: "/"}},
	})
	return []*model.AuthzPolicy{
		{Namespace: "web", Name: "bench-deny", Action: model.AuthzDeny, Rules: []model.AuthzRule{{AnySource: true, Paths: []model.PathMatch{{Type: model.MatchPathPrefix, Value: "/admin"}}}}},
		{Namespace: "web", Name: "bench-allow", Action: model.AuthzAllow, Rules: allow},
	}
}

// BenchmarkAuthzLatency compares a request to a pod with a 20-rule AuthorizationPolicy
// (authzBenchPolicies: both RBAC filters run, the request matches the last ALLOW rule) with the
// same request to a pod of the same shape without policies, on the mesh path of
// BenchmarkMeshLatency, interleaved every 10 requests at 1000 requests/s, 1 KB POST bodies
// answered with 1 KB, AETHER_BENCH_SAMPLES per path (default 20000). Reported as
// BenchmarkGAMMARouteLatency does (path=plain or guarded; p50-us, p99-us, envoy-us/req: Envoy
// CPU microseconds per request, 1000 being one core at 1000 requests/s). Goal (issue #32): no
// difference benchstat can see beyond 5%.
//
//	go test ./xds/ -run '^$' -bench '^BenchmarkAuthzLatency$' -benchtime 1x -count 5 -v
func BenchmarkAuthzLatency(b *testing.B) {
	testenv.RequireRoot(b)
	runInterleaved(b, []string{"plain", "guarded"}, measureAuthzLatency, nil)
}

// measureAuthzLatency starts the traffic fixture with a second server pod, guarded (its own
// HTTP echo on 8080, service web/guarded 10.96.0.30:80, the 20-rule policy), checks that the
// policy is enforced there, and measures the paths names interleaved.
func measureAuthzLatency(b *testing.B, names []string) *gammaLatencyRun {
	samples := testenv.BenchEnv(b, "AETHER_BENCH_SAMPLES", 20000)
	f := startTrafficFixture(b, time.Hour, false, Options{})
	guarded, gip := f.addPod("guarded", false)
	guarded.ServeHTTP(b, "0.0.0.0:8080", http.HandlerFunc(echoPost))
	base := trafficMesh(f, 2)
	k := model.ServiceKey{Namespace: "web", Name: "guarded"}
	services := append(slices.Clone(base.Services), &model.Service{Key: k, Local: true, VIPs: []netip.Addr{vipGuarded},
		Ports: []model.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: model.ProtocolHTTP}}})
	eps := maps.Clone(base.Endpoints)
	eps[k] = []model.Endpoint{{Service: k, Cluster: "c1", PodName: "guarded", PodUID: "uid-guarded", IPs: []netip.Addr{gip}, NodeName: "node-1",
		Ports: []model.EndpointPort{{Port: 8080, Protocol: model.ProtocolHTTP}}, SPIFFEID: model.SPIFFEID(f.td, "web", "guarded"), Healthy: true}}
	pods := append(base.Pods, &model.LocalPod{UID: "uid-guarded", Namespace: "web", Name: "guarded", ServiceAccount: "guarded",
		NetnsPath: guarded.Path, IPs: []netip.Addr{gip}, Ready: true, Ports: []model.PodPort{{Port: 8080, Protocol: model.ProtocolHTTP}}})
	m := model.New(2, base.Cluster, base.MeshDomain, base.TrustDomain, base.Node, services, eps, pods)
	m.Authz = map[string][]*model.AuthzPolicy{"uid-guarded": authzBenchPolicies()}
	f.set(m)
	pin := pinBench(b, f.sup.PID())
	alpha := f.pods["alpha"]
	if code, _, _, err := getBody(alpha.HTTPClient(false), "http://"+vipGuarded.String()+"/", nil); err != nil || code != 403 {
		b.Fatalf("GET on the guarded service: %d %v, want 403 (only POST is allowed)", code, err)
	}

	body := bytes.Repeat([]byte("x"), 1024)
	path := func(name string, vip netip.Addr) pacePath {
		c, err := alpha.Dial(vip.String() + ":80")
		if err != nil {
			b.Fatal(err)
		}
		rc := newRawConn(b, c)
		req := httpRequest(vip.String(), body)
		return pacePath{name, func() error { return rc.roundTrip(req, len(body)) }}
	}
	byName := map[string]pacePath{"plain": path("plain", vipHTTP), "guarded": path("guarded", vipGuarded)}
	var paths []pacePath
	for _, n := range names {
		paths = append(paths, byName[n])
	}
	fmt.Printf("authorization latency: %d samples per path at 1000/s, %s, loadavg %s\n", samples, pin, loadavg())
	if _, err := paceInterleaved(1000, 1000, 10, paths); err != nil {
		b.Fatalf("warm-up: %v", err)
	}
	cpu := openThreadsCPU(b, f.sup.PID())
	perPath := make([]time.Duration, len(paths))
	cur, last := -1, time.Duration(0)
	r, err := paceInterleavedWith(1000, samples, 10, paths, func(next int) {
		now := cpu.read()
		if cur >= 0 {
			perPath[cur] += now - last
		}
		cur, last = next, now
	})
	if err != nil {
		b.Fatal(err)
	}
	reportPaced(nil, "http-", paths, r)
	if err := wantStat(f, "http.inbound_http.rbac.authz.web.guarded.8080.allow.allowed", samples); err != nil {
		b.Error(err)
	}
	return &gammaLatencyRun{paths: names, r: r, cpu: perPath}
}
