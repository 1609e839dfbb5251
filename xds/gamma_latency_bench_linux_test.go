package xds

import (
	"bytes"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

var (
	vipRouted = netip.MustParseAddr("10.96.0.20")
	vipCanary = netip.MustParseAddr("10.96.0.21")
)

// gammaLatencyMesh is trafficMesh with two more HTTP services of the same shape as web/http (port
// 80 to the server pod's 8080): web/routed, which has benchRoute (stable web/routed, canary
// web/canary), and web/canary.
func gammaLatencyMesh(f *meshFixture, version uint64) *model.Mesh {
	base := trafficMesh(f, version)
	httpKey := model.ServiceKey{Namespace: "web", Name: "http"}
	services, eps := slices.Clone(base.Services), maps.Clone(base.Endpoints)
	keys := map[string]model.ServiceKey{}
	for name, vip := range map[string]netip.Addr{"routed": vipRouted, "canary": vipCanary} {
		k := model.ServiceKey{Namespace: "web", Name: name}
		keys[name] = k
		s := *base.Service(httpKey)
		s.Key, s.VIPs = k, []netip.Addr{vip}
		services = append(services, &s)
		e := base.Endpoints[httpKey][0]
		e.Service = k
		eps[k] = []model.Endpoint{e}
	}
	m := model.New(version, base.Cluster, base.MeshDomain, base.TrustDomain, base.Node, services, eps, base.Pods)
	return withRoutes(f.t, m, []model.Route{benchRoute("orders", keys["routed"], keys["routed"], keys["canary"])})
}

// threadsCPU reads the CPU time of a process's threads, summed, from
// /proc/<pid>/task/<tid>/schedstat (its first field: nanoseconds on a CPU), through descriptors
// opened once: a read costs a few microseconds, so the pacing thread can take one between two
// requests. Threads started after openThreadsCPU are not counted (Envoy starts its threads at
// start-up).
type threadsCPU struct {
	fds []int
	buf []byte
}

// openThreadsCPU opens the schedstat file of every thread of pid; the descriptors are closed
// when tb ends.
func openThreadsCPU(tb testing.TB, pid int) *threadsCPU {
	tb.Helper()
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatalf("list the threads of %d: %v", pid, err)
	}
	c := &threadsCPU{buf: make([]byte, 128)}
	for _, t := range tasks {
		fd, err := unix.Open(dir+"/"+t.Name()+"/schedstat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			tb.Fatalf("open schedstat of thread %s of %d: %v", t.Name(), pid, err)
		}
		c.fds = append(c.fds, fd)
	}
	tb.Cleanup(func() {
		for _, fd := range c.fds {
			unix.Close(fd)
		}
	})
	if c.read() == 0 {
		tb.Fatalf("no CPU time in %s/*/schedstat", dir)
	}
	return c
}

// read returns the threads' CPU time so far (0 when a thread's file cannot be read: it ended).
func (c *threadsCPU) read() time.Duration {
	var sum time.Duration
	for _, fd := range c.fds {
		n, err := unix.Pread(fd, c.buf, 0)
		if err != nil || n == 0 {
			return 0
		}
		end := bytes.IndexByte(c.buf[:n], ' ')
		if end < 0 {
			return 0
		}
		v, err := strconv.ParseInt(string(c.buf[:end]), 10, 64)
		if err != nil {
			return 0
		}
		sum += time.Duration(v)
	}
	return sum
}

// gammaLatencyRun is one interleaved measurement of BenchmarkGAMMARouteLatency: the paced
// result, Envoy's CPU time per path, and the paths' names in order.
type gammaLatencyRun struct {
	paths []string
	r     *paceResult
	cpu   []time.Duration
}

// BenchmarkGAMMARouteLatency compares a request through a service that has a ten-rule GAMMA
// HTTPRoute (benchRoute: the request is checked against every rule and matches the last, a
// regex path with a 90/10 canary split, a request header modifier and a retry policy) with the
// same request through the same kind of service without routes, on the mesh path of
// BenchmarkMeshLatency (capture listener, mTLS, inbound listener, one node Envoy), with a direct
// connection from another pod to the same server pod as the floor. The three paths alternate
// every 10 requests at 1000 requests/s in one run (paceInterleavedWith: latency from the
// scheduled send), 1 KB POST bodies for benchRoutePath answered with 1 KB, AETHER_BENCH_SAMPLES
// per path (default 20000). Envoy's CPU is read from its threads' schedstat each time the path
// changes and charged to the path that just ran (the direct path's share is Envoy's idle work:
// the floor of that attribution).
//
// Each run is reported as one result per path (sub-benchmark key path=direct, plain or routed,
// ns/op suppressed) with the metrics p50-us, p90-us, p99-us (from the schedule), svc-p50-us,
// svc-p99-us (service time), envoy-us/req (Envoy CPU microseconds per request; at 1000
// requests/s, 1000 us/req is one core) and pacing-err-p99-us (the run's, on every path), so that
// `-count 5` output goes to `benchstat -col /path`. The first path's sub-benchmark measures (all
// three paths, interleaved); the others report that run, so each count is one interleaved run
// (a sub-benchmark run alone measures for itself). Goal (issue #23): no difference benchstat can
// see beyond 5% between plain and routed. bench/gamma.sh runs it pinned, with benchstat.
//
//	go test ./xds/ -run '^$' -bench '^BenchmarkGAMMARouteLatency$' -benchtime 1x -count 5 -v
func BenchmarkGAMMARouteLatency(b *testing.B) {
	testenv.RequireRoot(b)
	runInterleaved(b, []string{"direct", "plain", "routed"}, measureGAMMALatency, func(b *testing.B, run *gammaLatencyRun, i int) {
		sched, svc := run.r.sched[i], run.r.svc[i]
		b.ReportMetric(float64(pct(sched, .9))/1e3, "p90-us")
		b.ReportMetric(float64(pct(svc, .5))/1e3, "svc-p50-us")
		b.ReportMetric(float64(pct(svc, .99))/1e3, "svc-p99-us")
	})
}

// runInterleaved runs one sub-benchmark "path=<name>" per name: the first of each count calls
// measure, which measures every path interleaved, and each reports its path of that run (ns/op
// suppressed; p50-us and p99-us from the schedule, envoy-us/req: Envoy CPU microseconds per
// request, pacing-err-p99-us: the run's), plus what extra adds.
func runInterleaved(b *testing.B, names []string, measure func(*testing.B, []string) *gammaLatencyRun, extra func(*testing.B, *gammaLatencyRun, int)) {
	var runs []*gammaLatencyRun
	used := map[string]int{}
	for _, name := range names {
		b.Run("path="+name, func(b *testing.B) {
			if used[name] == len(runs) {
				runs = append(runs, measure(b, names))
			}
			run := runs[used[name]]
			used[name]++
			i := slices.Index(run.paths, name)
			sched := run.r.sched[i]
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(pct(sched, .5))/1e3, "p50-us")
			b.ReportMetric(float64(pct(sched, .99))/1e3, "p99-us")
			b.ReportMetric(float64(run.cpu[i])/1e3/float64(len(sched)), "envoy-us/req")
			b.ReportMetric(float64(pct(run.r.pacing, .99))/1e3, "pacing-err-p99-us")
			if extra != nil {
				extra(b, run, i)
			}
		})
	}
}

// measureGAMMALatency starts the traffic fixture with gammaLatencyMesh, checks that the route is
// served, and measures the paths names (direct, plain, routed) interleaved.
func measureGAMMALatency(b *testing.B, names []string) *gammaLatencyRun {
	samples := testenv.BenchEnv(b, "AETHER_BENCH_SAMPLES", 20000)
	f := startTrafficFixture(b, time.Hour, false, Options{})
	m := gammaLatencyMesh(f, 2)
	f.set(m)
	pin := pinBench(b, f.sup.PID())
	direct, _ := f.addPod("direct", false)
	alpha := f.pods["alpha"]

	// The route is served: a rule's response header modifier shows on the routed service only.
	for _, c := range []struct {
		vip  netip.Addr
		want string
	}{{vipRouted, "max-age=60"}, {vipHTTP, ""}} {
		code, body, hdr, err := getBody(alpha.HTTPClient(false), "http://"+c.vip.String()+"/static/x", nil)
		if err != nil || code != 200 || hdr.Get("Cache-Control") != c.want {
			b.Fatalf("GET %s/static/x: %d %q %v, Cache-Control %q, want 200 with %q", c.vip, code, body, err, hdr.Get("Cache-Control"), c.want)
		}
	}

	body := bytes.Repeat([]byte("x"), 1024)
	srvIP := f.ips["server"].String()
	path := func(name string, ns *testenv.Netns, addr, host string) pacePath {
		c, err := ns.Dial(addr)
		if err != nil {
			b.Fatal(err)
		}
		rc := newRawConn(b, c)
		req := bytes.Replace(httpRequest(host, body), []byte("POST / "), []byte("POST "+benchRoutePath+" "), 1)
		return pacePath{name, func() error { return rc.roundTrip(req, len(body)) }}
	}
	byName := map[string]pacePath{
		"direct": path("direct", direct, srvIP+":8080", srvIP+":8080"),
		"plain":  path("plain", alpha, vipHTTP.String()+":80", vipHTTP.String()),
		"routed": path("routed", alpha, vipRouted.String()+":80", vipRouted.String()),
	}
	var paths []pacePath
	for _, n := range names {
		paths = append(paths, byName[n])
	}
	fmt.Printf("GAMMA route latency: %d samples per path at 1000/s, %s, loadavg %s\n", samples, pin, loadavg())
	// Warm the connections, Envoy's upstream pools and the caches.
	if _, err := paceInterleaved(1000, 1000, 10, paths); err != nil {
		b.Fatalf("warm-up: %v", err)
	}
	canary0 := canaryRequests(f, m)
	nss := append([]*testenv.Netns{f.node}, slices.Collect(maps.Values(f.pods))...)
	conns0 := upstreamConns(f)
	net0, err := readNetCounters(nss...)
	if err != nil {
		b.Fatal(err)
	}
	cpu := openThreadsCPU(b, f.sup.PID())
	u0, s0 := envoyCPUSeconds(f.sup.PID())
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
	u1, s1 := envoyCPUSeconds(f.sup.PID())
	reportPaced(nil, "http-", paths, r) // printed only: the metrics are per path (BenchmarkGAMMARouteLatency)
	netDelta(b, net0, nss, conns0, f)
	var attributed time.Duration
	for _, c := range perPath {
		attributed += c
	}
	fmt.Printf("  envoy CPU: %.3f s by schedstat, attributed to the paths; %.2f s by /proc/<pid>/stat over the same run (10 ms ticks)\n",
		attributed.Seconds(), u1-u0+s1-s0)
	for i, p := range paths {
		fmt.Printf("  envoy CPU on the %s path: %.1f us per request (%.3f cores at 1000 requests/s)\n", p.name, float64(perPath[i])/1e3/float64(samples), float64(perPath[i])/1e9/(float64(samples)/1000))
	}
	// The routed requests matched the last rule: about a tenth of them went to the canary.
	if i := slices.Index(names, "routed"); i >= 0 {
		got := canaryRequests(f, m) - canary0
		fmt.Printf("  canary: %d of %d routed requests (90/10 split)\n", got, samples)
		if got < samples/20 || got > samples/5 {
			b.Errorf("canary got %d of %d routed requests, want about a tenth (the last rule's 90/10 split)", got, samples)
		}
	}
	return &gammaLatencyRun{paths: names, r: r, cpu: perPath}
}

// canaryRequests is Envoy's count of requests sent to web/canary's cluster so far.
func canaryRequests(f *meshFixture, m *model.Mesh) int {
	name := "cluster." + strings.ReplaceAll(ClusterName(m, model.ServiceKey{Namespace: "web", Name: "canary"}, 80), ":", "_") + ".upstream_rq_total"
	return f.stats()[name]
}
