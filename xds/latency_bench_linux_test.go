package xds

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
)

// envoyCPUSeconds reads utime+stime of pid from /proc (clock ticks of 10 ms).
func envoyCPUSeconds(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100
}

// paced runs op at rate per second for d, open loop (each op in its own goroutine from a pool of
// workers fed by a ticker), and returns the latencies.
func paced(rate int, d time.Duration, workers int, op func(w int) error) ([]time.Duration, error) {
	n := int(d.Seconds() * float64(rate))
	jobs := make(chan time.Time, n)
	out := make(chan time.Duration, n)
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func() {
			for sched := range jobs {
				if err := op(w); err != nil {
					errc <- err
					return
				}
				out <- time.Since(sched)
			}
			errc <- nil
		}()
	}
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := 0; i < n; i++ {
		at := start.Add(time.Duration(i) * interval)
		time.Sleep(time.Until(at))
		jobs <- at
	}
	close(jobs)
	var firstErr error
	for w := 0; w < workers; w++ {
		if err := <-errc; err != nil && firstErr == nil {
			firstErr = err
		}
	}
	close(out)
	var lat []time.Duration
	for l := range out {
		lat = append(lat, l)
	}
	slices.Sort(lat)
	return lat, firstErr
}

func pct(l []time.Duration, p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	return l[int(float64(len(l)-1)*p)]
}

// BenchmarkMeshLatency measures, in one run, the latency of 1 KB HTTP requests (1 KB answers)
// and 1 KB TCP echoes at 1000 per second from a client pod: through the mesh (capture listener,
// mTLS between Envoy's two legs, inbound listener) and directly to the server pod. It reports
// p50/p99 of both and Envoy's CPU per 1000 requests per second. Pin the load generator and
// Envoy to separate cores:
//
//	AETHER_BENCH_ENVOY_CPUS=0 taskset -c 1 go test ./xds/ -run '^$' -bench BenchmarkMeshLatency -benchtime 1x
func BenchmarkMeshLatency(b *testing.B) {
	testenv.RequireRoot(b)
	f := startTrafficFixture(b, time.Hour, false, Options{})
	direct, _ := f.addPod("direct", false)
	body := bytes.Repeat([]byte("x"), 1024)
	const rate, dur, workers = 1000, 5 * time.Second, 16
	httpOp := func(ns *testenv.Netns, url string) func(int) error {
		tr := &http.Transport{MaxIdleConnsPerHost: workers}
		tr.DialContext = httpClientIn(ns, true).Transport.(*http.Transport).DialContext
		c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		return func(int) error {
			resp, err := c.Post(url, "application/octet-stream", bytes.NewReader(body))
			if err != nil {
				return err
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			return err
		}
	}
	tcpOp := func(ns *testenv.Netns, addr string) func(int) error {
		conns := make([]net.Conn, workers)
		buf := make([][]byte, workers)
		return func(w int) error {
			if conns[w] == nil {
				c, err := dialIn(ns, addr)
				if err != nil {
					return err
				}
				conns[w], buf[w] = c, make([]byte, len(body))
			}
			if _, err := conns[w].Write(body); err != nil {
				return err
			}
			_, err := io.ReadFull(conns[w], buf[w])
			return err
		}
	}
	srvIP := f.ips["server"].String()
	cases := []struct {
		name string
		op   func(int) error
	}{
		{"http-direct", httpOp(direct, "http://"+srvIP+":8080/")},
		{"http-mesh", httpOp(f.pods["alpha"], "http://"+vipHTTP.String()+"/")},
		{"tcp-direct", tcpOp(direct, srvIP+":9000")},
		{"tcp-mesh", tcpOp(f.pods["alpha"], vipTCP.String()+":9000")},
	}
	for _, c := range cases {
		// Warm connections and pools.
		if _, err := paced(200, time.Second, workers, c.op); err != nil {
			b.Fatalf("%s warm-up: %v", c.name, err)
		}
		cpu0 := envoyCPUSeconds(f.sup.PID())
		lat, err := paced(rate, dur, workers, c.op)
		if err != nil {
			b.Fatalf("%s: %v", c.name, err)
		}
		cpu := envoyCPUSeconds(f.sup.PID()) - cpu0
		b.ReportMetric(float64(pct(lat, 0.5).Microseconds()), c.name+"-p50-us")
		b.ReportMetric(float64(pct(lat, 0.99).Microseconds()), c.name+"-p99-us")
		if strings.HasSuffix(c.name, "mesh") {
			b.ReportMetric(cpu/dur.Seconds(), c.name+"-envoy-cores")
		}
	}
}
