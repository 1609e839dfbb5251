package xds

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
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
// p50/p99 latency of 1 KB HTTP requests at 1000 per second. Reported: each path's numbers,
// the ratios waypoint/direct and the added p99 in microseconds. bench/waypoint.sh runs it.
func BenchmarkWaypoint(b *testing.B) {
	testenv.RequireRoot(b)
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

	// Each measurement alternates the two paths in rounds, so that both see the same noise from
	// whatever else runs on the machine.
	const rounds = 4
	streams := map[string]net.Conn{}
	for _, p := range paths {
		c, err := dialIn(client, p.vip+":9100")
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

	body := bytes.Repeat([]byte("x"), 1024)
	ops := map[string]func(int) error{}
	for _, p := range paths {
		const workers = 16
		tr := &http.Transport{MaxIdleConnsPerHost: workers, DialContext: httpClientIn(client, true).Transport.(*http.Transport).DialContext}
		defer tr.CloseIdleConnections()
		hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		ops[p.name] = func(int) error {
			resp, err := hc.Post("http://"+p.vip+"/", "application/octet-stream", bytes.NewReader(body))
			if err != nil {
				return err
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("%s: status %d", p.name, resp.StatusCode)
			}
			return err
		}
		if _, err := paced(200, time.Second, workers, ops[p.name]); err != nil {
			b.Fatalf("%s warm-up: %v", p.name, err)
		}
	}
	lats := map[string][]time.Duration{}
	for r := 0; r < rounds; r++ {
		for _, p := range paths {
			lat, err := paced(1000, 2*time.Second, 16, ops[p.name])
			if err != nil {
				b.Fatal(err)
			}
			lats[p.name] = append(lats[p.name], lat...)
		}
	}
	for _, p := range paths {
		slices.Sort(lats[p.name])
		report(p.name+"-p50-us", float64(pct(lats[p.name], 0.5).Microseconds()))
		report(p.name+"-p99-us", float64(pct(lats[p.name], 0.99).Microseconds()))
	}
	b.ReportMetric(res["waypoint-MB/s"]/res["direct-MB/s"], "throughput-ratio")
	b.ReportMetric(res["waypoint-conn/s"]/res["direct-conn/s"], "conn-rate-ratio")
	b.ReportMetric(res["waypoint-p99-us"]-res["direct-p99-us"], "added-p99-us")
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
				c, err := dialIn(ns, addr)
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
