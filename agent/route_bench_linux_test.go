//go:build linux

package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"
	"github.com/aethermesh/aether/cni/plugin"
	"github.com/aethermesh/aether/internal/testenv"
)

// benchHTTPRoute is a producer HTTPRoute on Service parent port 80 with the ten rules of the xDS
// benchmarks' route (xds benchRoute: exact, prefix and regex paths, header, method and query
// matches, a 90/10 canary split, header modifiers, a rewrite, a timeout, retries), sending to
// the Services stable and canary (port 80).
func benchHTTPRoute(ns, name, parent, stable, canary string) *gwv1.HTTPRoute {
	to := func(svc string, w int32) gwv1.HTTPBackendRef {
		return gwv1.HTTPBackendRef{BackendRef: gwv1.BackendRef{Weight: new(w), BackendObjectReference: gwv1.BackendObjectReference{
			Name: gwv1.ObjectName(svc), Port: new(gwv1.PortNumber(80))}}}
	}
	path := func(t gwv1.PathMatchType, v string) *gwv1.HTTPPathMatch {
		return &gwv1.HTTPPathMatch{Type: new(t), Value: new(v)}
	}
	header := func(t gwv1.HeaderMatchType, name, v string) []gwv1.HTTPHeaderMatch {
		return []gwv1.HTTPHeaderMatch{{Type: new(t), Name: gwv1.HTTPHeaderName(name), Value: v}}
	}
	rule := func(m gwv1.HTTPRouteMatch, backends ...gwv1.HTTPBackendRef) gwv1.HTTPRouteRule {
		return gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{m}, BackendRefs: backends}
	}
	prefix := gwv1.PathMatchPathPrefix
	r := &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	r.Spec.ParentRefs = []gwv1.ParentReference{{Group: new(gwv1.Group("")), Kind: new(gwv1.Kind("Service")), Name: gwv1.ObjectName(parent), Port: new(gwv1.PortNumber(80))}}
	r.Spec.Rules = []gwv1.HTTPRouteRule{
		rule(gwv1.HTTPRouteMatch{Path: path(gwv1.PathMatchExact, "/healthz")}, to(stable, 1)),
		rule(gwv1.HTTPRouteMatch{Path: path(prefix, "/api/v2"), Headers: header(gwv1.HeaderMatchExact, "x-version", "v2")}, to(canary, 1)),
		rule(gwv1.HTTPRouteMatch{Path: path(prefix, "/api"), Headers: header(gwv1.HeaderMatchRegularExpression, "x-user", "test-.*")}, to(canary, 1)),
		rule(gwv1.HTTPRouteMatch{Path: path(prefix, "/orders"), Method: new(gwv1.HTTPMethodGet)}, to(stable, 1)),
		rule(gwv1.HTTPRouteMatch{Path: path(prefix, "/static")}, to(stable, 1)),
		rule(gwv1.HTTPRouteMatch{Path: path(prefix, "/admin"), Headers: header(gwv1.HeaderMatchExact, "x-admin", "true")}, to(stable, 1)),
		rule(gwv1.HTTPRouteMatch{Path: path(prefix, "/legacy")}, to(stable, 1)),
		rule(gwv1.HTTPRouteMatch{Path: path(prefix, "/"), QueryParams: []gwv1.HTTPQueryParamMatch{{Type: new(gwv1.QueryParamMatchExact), Name: "debug", Value: "1"}}}, to(canary, 1)),
		rule(gwv1.HTTPRouteMatch{Path: path(prefix, "/"), Headers: header(gwv1.HeaderMatchExact, "x-canary", "true")}, to(canary, 1)),
		rule(gwv1.HTTPRouteMatch{Path: path(gwv1.PathMatchRegularExpression, "/orders/[a-z0-9]+")}, to(stable, 90), to(canary, 10)),
	}
	r.Spec.Rules[2].Filters = []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestHeaderModifier,
		RequestHeaderModifier: &gwv1.HTTPHeaderFilter{Set: []gwv1.HTTPHeader{{Name: "x-tester", Value: "1"}}}}}
	r.Spec.Rules[4].Filters = []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterResponseHeaderModifier,
		ResponseHeaderModifier: &gwv1.HTTPHeaderFilter{Set: []gwv1.HTTPHeader{{Name: "cache-control", Value: "max-age=60"}}}}}
	r.Spec.Rules[5].Timeouts = &gwv1.HTTPRouteTimeouts{Request: new(gwv1.Duration("5s"))}
	r.Spec.Rules[6].Filters = []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterURLRewrite,
		URLRewrite: &gwv1.HTTPURLRewriteFilter{Path: &gwv1.HTTPPathModifier{Type: gwv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: new("/v1")}}}}
	r.Spec.Rules[9].Filters = []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gwv1.HTTPHeaderFilter{
		Set: []gwv1.HTTPHeader{{Name: "x-route", Value: "orders"}}, Add: []gwv1.HTTPHeader{{Name: "x-mesh", Value: "gamma"}}}}}
	r.Spec.Rules[9].Retry = &gwv1.HTTPRouteRetry{Attempts: new(2), Codes: []gwv1.HTTPRouteRetryStatusCode{503}}
	return r
}

// BenchmarkRouteApplyToTraffic measures, end to end through the real agent binary, how long a
// GAMMA route change takes to reach traffic with 1000 HTTPRoutes in the cluster, and with the
// measured route alone (the floor of the whole path); the sub-benchmark key routes=1000 or
// routes=1 sets which, for `benchstat -col /routes`. A real kube-apiserver with the Gateway API
// CRDs holds the routes, all but the measured one ten-rule routes (benchHTTPRoute) each on a
// Service of its own; the measured route has one rule on Service web sending everything to web-v1
// or web-v2. The agent and its Envoy run in a node namespace, and a client pod, a v1 pod and a v2
// pod (each in its own netns, captured through CNI ADD) call and serve. AETHER_BENCH_CHANGES
// times (default 60) the route's backend flips between web-v1 and web-v2 (an Update of the
// HTTPRoute), and the client, polling web's VIP every millisecond on one keep-alive connection,
// times from the start of the API write to the first answer from the new backend; then 20 more
// answers must all come from it (no flapping back), and the next change waits 200 ms (isolated
// changes, as a person or a rollout controller makes them, not a burst the agent coalesces).
//
// Metrics: p50-ms, p99-ms and max-ms of those times (the goal of issue #23: p99 under 1 s), two
// floors measured in the same run: write-p50-ms (the API write itself) and poll-p50-ms (one
// polling request; polls are 1 ms apart, so the resolution is about 1.3 ms), and where the time
// goes: agent-cpu-ms/change and envoy-cpu-ms/change (their CPU over the changes, polls and
// pauses included, per change). With fewer than 100 changes the p99 is the second largest
// sample or the largest. The setup (2000 objects, the agent building its first model) is not
// timed. AETHER_BENCH_PPROF=<file> writes <file>.<routes>, a 10 s CPU profile of the agent taken
// while the changes run.
//
//	go test ./agent/ -run '^$' -bench '^BenchmarkRouteApplyToTraffic$' -benchtime 1x -timeout 60m -v
func BenchmarkRouteApplyToTraffic(b *testing.B) {
	testenv.RequireRoot(b)
	for _, n := range []int{1, 1000} {
		b.Run(fmt.Sprintf("routes=%d", n), func(b *testing.B) { benchRouteApply(b, n) })
	}
}

// benchRouteApply is BenchmarkRouteApplyToTraffic with nRoutes HTTPRoutes in the cluster.
func benchRouteApply(b *testing.B, nRoutes int) {
	changes := testenv.BenchEnv(b, "AETHER_BENCH_CHANGES", 60)
	api, etcd, cs := startSources(b)
	gw := gwclient.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	createNodeAndMeshNamespace(b, ctx, cs, "client", "v1", "v2")
	vips := map[string]string{}
	for name, app := range map[string]string{"web": "v1", "web-v1": "v1", "web-v2": "v2"} {
		s := benchService(b, ctx, cs, name, map[string]string{"app": app})
		vips[name] = s.Spec.ClusterIP
	}
	pods := map[string]*corev1.Pod{}
	for _, app := range []string{"client", "v1", "v2"} {
		pods[app] = createReadyPod(b, ctx, cs, app+"-1", app)
	}

	// The other routes: bg-<i> on Service bg-<i>, canary bg-<i+1>; created 8 at a time.
	start := time.Now()
	bg := nRoutes - 1
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < bg; i += 8 {
				name := fmt.Sprintf("bg-%d", i)
				if _, err := cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
					Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("create Service %s: %w", name, err)
					return
				}
				r := benchHTTPRoute("shop", name, name, name, fmt.Sprintf("bg-%d", (i+1)%bg))
				if _, err := gw.GatewayV1().HTTPRoutes("shop").Create(ctx, r, metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("create HTTPRoute %s: %w", name, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	probe := &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"}}
	probe.Spec.ParentRefs = []gwv1.ParentReference{{Group: new(gwv1.Group("")), Kind: new(gwv1.Kind("Service")), Name: "web", Port: new(gwv1.PortNumber(80))}}
	probe.Spec.Rules = []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{
		BackendObjectReference: gwv1.BackendObjectReference{Name: "web-v1", Port: new(gwv1.PortNumber(80))}}}}}}
	probe, err := gw.GatewayV1().HTTPRoutes("shop").Create(ctx, probe, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	fmt.Printf("route apply: %d Services and HTTPRoutes created in %s\n", nRoutes, time.Since(start).Round(time.Millisecond))

	// The node namespace holds the agent and its Envoy; the pods hang off it on veth pairs, and
	// the API server and the registry are forwarded into it at their loopback addresses.
	node := testenv.NewNetns(b)
	podNS := map[string]*testenv.Netns{}
	for i, app := range []string{"client", "v1", "v2"} {
		ns := testenv.NewNetns(b)
		podNS[app] = ns
		gwIP := netip.AddrFrom4([4]byte{10, 250, byte(i + 1), 1})
		testenv.Veth(b, node, "v"+app, netip.PrefixFrom(gwIP, 24), ns, "eth0", netip.PrefixFrom(gwIP.Next(), 24))
		ns.DefaultRoute(b, gwIP)
	}
	apiAddr := strings.TrimPrefix(api.Config.Host, "https://")
	regAddr := strings.TrimPrefix(etcd.Endpoints[0], "http://")
	node.Forward(b, apiAddr, apiAddr)
	node.Forward(b, regAddr, regAddr)
	start = time.Now()
	a := startAgentWith(b, agentOpts{wrap: []string{"ip", "netns", "exec", node.Name}, client: node.HTTPClient(false)},
		"--kubeconfig", api.Kubeconfig, "--registry-endpoints", etcd.Endpoints[0], "--log-level", "warn")
	a.waitReady(b, 5*time.Minute, "agent ready")
	for _, app := range []string{"v1", "v2"} {
		podNS[app].ServeHTTP(b, "0.0.0.0:8080", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, app) }))
	}
	cl := plugin.NewClient(a.cniSocket)
	for i, app := range []string{"client", "v1", "v2"} {
		p := pods[app]
		if _, err := cl.Add(ctx, cniv1.Request{Network: "test", Attachment: cniv1.PodAttachment{
			ContainerID: "ctr-" + app, PodUID: string(p.UID), Namespace: "shop", Name: p.Name, NetnsPath: podNS[app].Path,
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 250, byte(i + 1), 2})}, Interface: "eth0"}}); err != nil {
			b.Fatalf("CNI ADD %s: %v", p.Name, err)
		}
	}
	client := podNS["client"].HTTPClient(true)
	get := func(vip string) (string, error) {
		resp, err := client.Get("http://" + vip + "/")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("GET %s: %s %q", vip, resp.Status, body)
		}
		return string(body), err
	}
	b.Cleanup(func() {
		if b.Failed() {
			b.Logf("envoy clusters:\n%s", grepLines(a.envoy("/clusters"), "web"))
		}
	})
	// Both backends answer (their endpoints went through the registry to EDS) and web goes to v1
	// through the route, before anything is timed.
	for vip, want := range map[string]string{vips["web-v1"]: "v1", vips["web-v2"]: "v2", vips["web"]: "v1"} {
		testenv.Eventually(b, 2*time.Minute, "the client reaches "+want+" at "+vip, func() error {
			got, err := get(vip)
			if err == nil && got != want {
				err = fmt.Errorf("answer %q", got)
			}
			return err
		})
	}
	// Every rule of every route is in Envoy's capture route table (an Envoy route per rule, named
	// "HTTPRoute shop/<name> rule <i> match 0"; a rule aether did not accept would be missing).
	dump := a.envoy("/config_dump?resource=dynamic_route_configs")
	for rule := 0; rule < 10; rule++ {
		want := bg
		if rule == 0 {
			want++ // the measured route's one rule
		}
		if got := strings.Count(dump, fmt.Sprintf(" rule %d match 0\"", rule)); got != want {
			b.Fatalf("Envoy's route tables hold rule %d of %d routes, want %d", rule, got, want)
		}
	}
	fmt.Printf("route apply: agent ready with %d routes in Envoy %s after its start\n", nRoutes, time.Since(start).Round(time.Millisecond))

	// AETHER_BENCH_PPROF=<file>: a CPU profile of the agent over the first 10 s of the changes.
	profiled := make(chan error, 1)
	if out := os.Getenv("AETHER_BENCH_PPROF"); out == "" {
		profiled <- nil
	} else {
		go func() {
			_, prof := a.debug("/debug/pprof/profile?seconds=10")
			profiled <- os.WriteFile(fmt.Sprintf("%s.%d", out, nRoutes), []byte(prof), 0o644)
		}()
	}
	agentPID, envoyPID := a.cmd.Process.Pid, a.envoyPID()
	agent0, envoy0 := procCPU(agentPID), procCPU(envoyPID)
	var lat, writes, polls []time.Duration
	for i := 0; i < changes; i++ {
		target := []string{"v2", "v1"}[i%2]
		probe.Spec.Rules[0].BackendRefs[0].Name = gwv1.ObjectName("web-" + target)
		t0 := time.Now()
		probe, err = gw.GatewayV1().HTTPRoutes("shop").Update(ctx, probe, metav1.UpdateOptions{})
		if err != nil {
			b.Fatalf("change %d: update the route: %v", i, err)
		}
		writes = append(writes, time.Since(t0))
		for {
			p0 := time.Now()
			got, err := get(vips["web"])
			if err != nil {
				b.Fatalf("change %d: %v", i, err)
			}
			polls = append(polls, time.Since(p0))
			if got == target {
				break
			}
			if time.Since(t0) > 30*time.Second {
				b.Fatalf("change %d: still answered by %s 30 s after the route was sent to %s", i, got, target)
			}
			// A short pause: back-to-back polls would load Envoy's worker beside the route
			// update it is applying.
			time.Sleep(time.Millisecond)
		}
		lat = append(lat, time.Since(t0))
		for j := 0; j < 20; j++ {
			if got, err := get(vips["web"]); err != nil || got != target {
				b.Fatalf("change %d: request %d after the switch answered %q (%v), want %s", i, j, got, err, target)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	agentCPU, envoyCPU := (procCPU(agentPID)-agent0)/time.Duration(changes), (procCPU(envoyPID)-envoy0)/time.Duration(changes)
	if err := <-profiled; err != nil {
		b.Error(err)
	}
	ms := func(l []time.Duration, q float64) float64 {
		s := slices.Sorted(slices.Values(l))
		return float64(s[int(float64(len(s)-1)*q)].Microseconds()) / 1e3
	}
	fmt.Printf("route apply: %d changes with %d routes: p50 %.1f ms, p99 %.1f ms, max %.1f ms; API write p50 %.1f ms; poll request p50 %.2f ms (%d polls); CPU per change: agent %.0f ms, envoy %.0f ms (with the polls); loadavg %s\n",
		changes, nRoutes, ms(lat, .5), ms(lat, .99), ms(lat, 1), ms(writes, .5), ms(polls, .5), len(polls),
		float64(agentCPU.Microseconds())/1e3, float64(envoyCPU.Microseconds())/1e3, loadavgLine())
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ms(lat, .5), "p50-ms")
	b.ReportMetric(ms(lat, .99), "p99-ms")
	b.ReportMetric(ms(lat, 1), "max-ms")
	b.ReportMetric(ms(writes, .5), "write-p50-ms")
	b.ReportMetric(ms(polls, .5), "poll-p50-ms")
	b.ReportMetric(float64(agentCPU.Microseconds())/1e3, "agent-cpu-ms/change")
	b.ReportMetric(float64(envoyCPU.Microseconds())/1e3, "envoy-cpu-ms/change")
}

// procCPU is the user and system CPU time of process pid so far, every thread together
// (/proc/<pid>/stat utime and stime, in clock ticks of 10 ms); 0 when it cannot be read.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.Atoi(f[11])
	st, _ := strconv.Atoi(f[12])
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// benchService creates the Service shop/<name>: port 80 (http) to target port 8080 of the pods
// that selector selects.
func benchService(b *testing.B, ctx context.Context, cs kubernetes.Interface, name string, selector map[string]string) *corev1.Service {
	b.Helper()
	s, err := cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Selector: selector, Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// loadavgLine is /proc/loadavg without its newline.
func loadavgLine() string {
	s, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(s))
}
