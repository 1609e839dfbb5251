package xds

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
)

// envoyCPUSeconds reads the user and system CPU time of pid from /proc (utime and stime, clock
// ticks of 10 ms).
func envoyCPUSeconds(pid int) (user, sys float64) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return ut / 100, st / 100
}

// BenchmarkMeshLatency measures the latency the mesh adds: 1 KB HTTP requests (1 KB answers)
// and 1 KB TCP echoes at 1000 per second from a client pod, through the mesh (capture listener,
// mTLS between Envoy's two legs, inbound listener, one node Envoy) against a direct connection
// from another pod to the same server pod, the two paths alternating every 10 requests in one
// run (paceInterleaved: precise pacing from a locked thread, latency from the scheduled send
// time, one keep-alive connection per path). It prints per path p50/p90/p99/p99.9, the added
// values, the pacing error, the load average and Envoy's CPU per 1000 requests per second, and
// reports them as metrics. AETHER_BENCH_SAMPLES sets the samples per path (default 20000);
// AETHER_BENCH_ENVOY_CPUS and AETHER_BENCH_LOAD_CPUS pin Envoy and this process (the load
// generator and the applications) to separate cores. bench/latency.sh runs it pinned.
func BenchmarkMeshLatency(b *testing.B) {
	testenv.RequireRoot(b)
	samples := testenv.BenchEnv(b, "AETHER_BENCH_SAMPLES", 20000)
	f := startTrafficFixture(b, time.Hour, false, Options{})
	pin := pinBench(b, f.sup.PID())
	direct, _ := f.addPod("direct", false)
	body := bytes.Repeat([]byte("x"), 1024)
	srvIP := f.ips["server"].String()
	conn := func(ns *testenv.Netns, addr string) *rawConn {
		c, err := ns.Dial(addr)
		if err != nil {
			b.Fatal(err)
		}
		return newRawConn(b, c)
	}
	httpPath := func(name string, ns *testenv.Netns, addr, host string) pacePath {
		c, req := conn(ns, addr), httpRequest(host, body)
		return pacePath{name, func() error { return c.roundTrip(req, len(body)) }}
	}
	tcpPath := func(name string, ns *testenv.Netns, addr string) pacePath {
		c := conn(ns, addr)
		return pacePath{name, func() error { return c.echo(body) }}
	}
	fmt.Printf("BenchmarkMeshLatency: %d samples per path at 1000/s, %s, loadavg %s\n", samples, pin, loadavg())
	for _, c := range []struct {
		name  string
		paths []pacePath
	}{
		{"http-", []pacePath{
			httpPath("direct", direct, srvIP+":8080", srvIP+":8080"),
			httpPath("mesh", f.pods["alpha"], vipHTTP.String()+":80", vipHTTP.String()),
		}},
		{"tcp-", []pacePath{
			tcpPath("direct", direct, srvIP+":9000"),
			tcpPath("mesh", f.pods["alpha"], vipTCP.String()+":9000"),
		}},
	} {
		// Warm the connections, Envoy's upstream pool and the caches.
		if _, err := paceInterleaved(1000, 1000, 10, c.paths); err != nil {
			b.Fatalf("%swarm-up: %v", c.name, err)
		}
		nss := append([]*testenv.Netns{f.node}, slices.Collect(maps.Values(f.pods))...)
		conns0 := upstreamConns(f)
		net0, err := readNetCounters(nss...)
		if err != nil {
			b.Fatal(err)
		}
		u0, s0 := envoyCPUSeconds(f.sup.PID())
		r, err := paceInterleaved(1000, samples, 10, c.paths)
		if err != nil {
			b.Fatalf("%s: %v", c.name, err)
		}
		u1, s1 := envoyCPUSeconds(f.sup.PID())
		reportPaced(b, c.name, c.paths, r)
		netDelta(b, net0, nss, conns0, f)
		// Envoy serves only the mesh path: its CPU over the mesh requests, per 1000 requests/s.
		per := float64(samples) / 1000
		user, sys := (u1-u0)/per, (s1-s0)/per
		fmt.Printf("  envoy CPU: %.3f cores at 1000 %srequests/s (user %.3f, system %.3f)\n", user+sys, c.name, user, sys)
		b.ReportMetric(user+sys, c.name+"mesh-envoy-cores")
	}
}
