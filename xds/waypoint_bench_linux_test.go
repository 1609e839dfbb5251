package xds

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
)

// BenchmarkWaypoint measures, side by side in one run and between the same two pods' namespaces
// (a's client pod and b2's srv2), the east-west waypoint path (a's Envoy -> b2's tunnel listener
// -> srv2's inbound listener) against the direct mesh path (a's Envoy -> srv2's inbound listener;
// for this the benchmark routes the two clusters' pod CIDRs to each other and registers srv2 in a
// as a local endpoint of web/direct): single-stream throughput (MB/s, a server streaming to the
// client through the TCP floor), new connections per second (4 workers, each connection a
// 1-byte TCP echo through the floor, so every one is a fresh mTLS handshake end to end) and the
// latency of 1 KB HTTP requests at 1000 per second, the two paths alternating every 10 requests
// (paceInterleaved: precise pacing from a locked thread, latency from the scheduled send time,
// one keep-alive connection per path). Reported: each path's numbers, the ratios
// waypoint/direct and the added p50/p90/p99 in microseconds (http-added-p99-us), with the pacing
// error and the load average. AETHER_BENCH_SAMPLES sets the latency samples per path (default
// 20000); AETHER_BENCH_ENVOY_CPUS and AETHER_BENCH_LOAD_CPUS pin the three Envoys and this
// process (load generator and applications) for the latency part; throughput and connection
// rate run unpinned. bench/waypoint.sh runs it.
func BenchmarkWaypoint(b *testing.B) {
	testenv.RequireRoot(b)
	samples := testenv.BenchEnv(b, "AETHER_BENCH_SAMPLES", 20000)
	w := newWaypointTopo(b, false)
	// Pod routes between the clusters, for the direct path only.
	aIP, b1IP, b2IP := w.nodeIP[w.a].String(), w.nodeIP[w.b1].String(), w.nodeIP[w.b2].String()
	run(b, w.a.node, "ip", "route", "add", "10.46.0.0/24", "via", b1IP)
	run(b, w.a.node, "ip", "route", "add", "10.47.0.0/24", "via", b2IP)
	run(b, w.b1.node, "ip", "route", "add", "10.44.0.0/24", "via", aIP)
	run(b, w.b2.node, "ip", "route", "add", "10.44.0.0/24", "via", aIP)
	w.set(1, false, true) // echo (waypoint) and direct both end at srv2 only
	client := w.a.pods["client"]
	paths := []struct{ name, vip string }{{"direct", vipDirect.String()}, {"waypoint", vipEchoSet.String()}}
	res := map[string]float64{}
	report := func(name string, v float64) { res[name] = v; b.ReportMetric(v, name) }
	fmt.Printf("BenchmarkWaypoint: loadavg %s\n", loadavg())

	// Each measurement alternates the two paths in rounds, so that both see the same noise from
	// whatever else runs on the machine.
	const rounds = 4
	streams := map[string]net.Conn{}
	for _, p := range paths {
		c, err := client.Dial(p.vip + ":9100")
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		streams[p.name] = c
	}
	buf := make([]byte, 256<<10)
	bytesRead, elapsed := map[string]float64{}, map[string]time.Duration{}
	for r := 0; r < rounds; r++ {
		for _, p := range paths {
			c := streams[p.name]
			if _, err := io.ReadFull(c, buf); err != nil { // drain what queued meanwhile
				b.Fatal(err)
			}
			start := time.Now()
			for time.Since(start) < time.Second {
				k, err := c.Read(buf)
				if err != nil {
					b.Fatalf("%s stream: %v", p.name, err)
				}
				bytesRead[p.name] += float64(k)
			}
			elapsed[p.name] += time.Since(start)
		}
	}
	for _, p := range paths {
		report(p.name+"-MB/s", bytesRead[p.name]/elapsed[p.name].Seconds()/1e6)
	}

	conns, connTime := map[string]float64{}, map[string]time.Duration{}
	for r := 0; r < rounds; r++ {
		for _, p := range paths {
			n, d, err := connRate(client, p.vip+":9000", 4, time.Second)
			if err != nil {
				b.Fatalf("%s: %v", p.name, err)
			}
			conns[p.name] += float64(n)
			connTime[p.name] += d
		}
	}
	for _, p := range paths {
		report(p.name+"-conn/s", conns[p.name]/connTime[p.name].Seconds())
	}

	// The latency part runs pinned: the three Envoys on AETHER_BENCH_ENVOY_CPUS, this process on
	// AETHER_BENCH_LOAD_CPUS. Throughput and connection rate ran unpinned: pinned, the three
	// "nodes" would share one core and the ratios would compare CPU per byte instead.
	pin := pinBench(b, w.a.sup.PID(), w.b1.sup.PID(), w.b2.sup.PID())
	fmt.Printf("latency: %d samples per path at 1000/s, %s\n", samples, pin)
	body := bytes.Repeat([]byte("x"), 1024)
	var lpaths []pacePath
	for _, p := range paths {
		c, err := client.Dial(p.vip + ":80")
		if err != nil {
			b.Fatal(err)
		}
		rc, req := newRawConn(b, c), httpRequest(p.vip, body)
		lpaths = append(lpaths, pacePath{p.name, func() error { return rc.roundTrip(req, len(body)) }})
	}
	// Warm the connections and the Envoys' upstream pools, then measure.
	if _, err := paceInterleaved(1000, 1000, 10, lpaths); err != nil {
		b.Fatalf("warm-up: %v", err)
	}
	nss := []*testenv.Netns{w.ul}
	for _, f := range []*meshFixture{w.a, w.b1, w.b2} {
		nss = append(append(nss, f.node), slices.Collect(maps.Values(f.pods))...)
	}
	conns0 := upstreamConns(w.a, w.b1, w.b2)
	net0, err := readNetCounters(nss...)
	if err != nil {
		b.Fatal(err)
	}
	r, err := paceInterleaved(1000, samples, 10, lpaths)
	if err != nil {
		b.Fatal(err)
	}
	reportPaced(b, "http-", lpaths, r)
	netDelta(b, net0, nss, conns0, w.a, w.b1, w.b2)
	fmt.Printf("  throughput MB/s direct %.0f waypoint %.0f, conn/s direct %.0f waypoint %.0f\n",
		res["direct-MB/s"], res["waypoint-MB/s"], res["direct-conn/s"], res["waypoint-conn/s"])
	b.ReportMetric(res["waypoint-MB/s"]/res["direct-MB/s"], "throughput-ratio")
	b.ReportMetric(res["waypoint-conn/s"]/res["direct-conn/s"], "conn-rate-ratio")
}

// connRate opens connections to addr from ns with the given number of workers for d, each a
// 1-byte echo, and returns how many completed and the time taken.
func connRate(ns *testenv.Netns, addr string, workers int, d time.Duration) (int64, time.Duration, error) {
	var done atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			one := make([]byte, 1)
			for time.Since(start) < d {
				c, err := ns.Dial(addr)
				if err != nil {
					errc <- err
					return
				}
				_, err = c.Write([]byte{'x'})
				if err == nil {
					_, err = io.ReadFull(c, one)
				}
				c.Close()
				if err != nil {
					errc <- fmt.Errorf("echo: %w", err)
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errc)
	return done.Load(), time.Since(start), <-errc
}
