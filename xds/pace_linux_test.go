package xds

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/aethermesh/aether/internal/testenv"
)

// The latency benchmarks' harness. The first versions paced requests with time.Sleep and
// measured from the scheduled send time, so every sample carried the Go timer's overshoot: the
// runtime's netpoller sleeps in whole milliseconds (epoll_wait timeouts, runtime/netpoll_epoll.go),
// which put a 0.5-1 ms floor under both paths. This harness sends from one locked OS thread that
// sleeps with clock_nanosleep (timer slack 1 ns) until spinMargin before the scheduled time and
// spins the rest, does the request itself with blocking system calls on a dedicated keep-alive
// connection per path (no Go scheduler hand-offs between send and receive), and alternates the
// paths in short slices so that both see the same machine state.

// spinMargin is how long before a scheduled send the pacing thread stops sleeping and spins.
const spinMargin = 80 * time.Microsecond

// parseCPUs parses a CPU list such as "1", "1,3" or "2-3".
func parseCPUs(v string) (unix.CPUSet, error) {
	var set unix.CPUSet
	for _, part := range strings.Split(v, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		c, err2 := a, error(nil)
		if isRange {
			c, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a < 0 || c < a {
			return set, fmt.Errorf("parse CPU list %q: want e.g. 1 or 1,3 or 2-3", v)
		}
		for i := a; i <= c; i++ {
			set.Set(i)
		}
	}
	return set, nil
}

// pinPID sets the CPU affinity of every thread of process pid (sched_setaffinity(2) acts on one
// thread; threads created later inherit their creator's affinity), and with nice also the
// nice value -20 (setpriority(2), per thread on Linux; inherited the same way).
func pinPID(pid int, set *unix.CPUSet, nice bool) error {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return fmt.Errorf("pin process %d: %w", pid, err)
	}
	for _, t := range tasks {
		tid, _ := strconv.Atoi(t.Name())
		err := unix.SchedSetaffinity(tid, set)
		if err == nil && nice {
			err = unix.Setpriority(unix.PRIO_PROCESS, tid, -20)
		}
		if err != nil && err != unix.ESRCH {
			return fmt.Errorf("pin thread %d of %d: %w", tid, pid, err)
		}
	}
	return nil
}

// pinBench pins the Envoy processes envoys to the CPU list in AETHER_BENCH_ENVOY_CPUS and this
// test process (the load generator and the test's applications) to AETHER_BENCH_LOAD_CPUS,
// each when set, and returns a description for the report. AETHER_BENCH_NICE=1 also gives
// both nice -20, so that other work on a shared machine rarely delays them. (Real-time
// priority is no option: a Go runtime thread spinning with sched_yield for a lower-priority
// thread on the same core, e.g. in casgstatus, livelocks the process; seen with SCHED_RR.)
// A bad value fails the benchmark.
func pinBench(b *testing.B, envoys ...int) string {
	b.Helper()
	nice := os.Getenv("AETHER_BENCH_NICE") == "1"
	ds := []string{fmt.Sprintf("GOMAXPROCS %d", runtime.GOMAXPROCS(0))}
	if nice {
		ds = append(ds, "AETHER_BENCH_NICE=1 (nice -20)")
	}
	for _, x := range []struct {
		env  string
		pids []int
	}{{"AETHER_BENCH_ENVOY_CPUS", envoys}, {"AETHER_BENCH_LOAD_CPUS", []int{os.Getpid()}}} {
		v := os.Getenv(x.env)
		if v == "" {
			ds = append(ds, x.env+" unset (not pinned)")
			continue
		}
		set, err := parseCPUs(v)
		if err != nil {
			b.Fatalf("%s: %v", x.env, err)
		}
		for _, pid := range x.pids {
			if err := pinPID(pid, &set, nice); err != nil {
				b.Fatalf("%s: %v", x.env, err)
			}
		}
		ds = append(ds, fmt.Sprintf("%s=%s (pids %v)", x.env, v, x.pids))
	}
	return strings.Join(ds, ", ")
}

// loadavg is /proc/loadavg without its newline.
func loadavg() string {
	s, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(s))
}

// rawConn is a TCP connection driven with blocking system calls from the calling thread.
type rawConn struct {
	fd  int
	buf []byte
}

// newRawConn takes over c (a *net.TCPConn, which it closes) as a blocking socket with a
// 10 s receive timeout, so that a lost answer fails the benchmark instead of hanging it. Go
// sets TCP_NODELAY on every TCP connection; it stays set on the duplicated descriptor.
func newRawConn(t testing.TB, c net.Conn) *rawConn {
	t.Helper()
	sc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	if err := sc.Control(func(f uintptr) { fd, err = unix.Dup(int(f)) }); err != nil || fd < 0 {
		t.Fatalf("dup socket: %v", err)
	}
	c.Close()
	if err := unix.SetNonblock(fd, false); err != nil {
		t.Fatal(err)
	}
	tv := unix.Timeval{Sec: 10}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	if v, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY); err != nil || v == 0 {
		t.Fatalf("TCP_NODELAY off on the benchmark connection (%d, %v)", v, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return &rawConn{fd: fd, buf: make([]byte, 16<<10)}
}

func (r *rawConn) write(p []byte) error {
	for len(p) > 0 {
		n, err := unix.Write(r.fd, p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		p = p[n:]
	}
	return nil
}

// read reads at least once into p and returns the count; 0 bytes is io.ErrUnexpectedEOF.
func (r *rawConn) read(p []byte) (int, error) {
	for {
		n, err := unix.Read(r.fd, p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("read: %w", err)
		}
		if n == 0 {
			return 0, io.ErrUnexpectedEOF
		}
		return n, nil
	}
}

// echo writes msg and reads len(msg) bytes back.
func (r *rawConn) echo(msg []byte) error {
	if err := r.write(msg); err != nil {
		return err
	}
	for got := 0; got < len(msg); {
		n, err := r.read(r.buf[:len(msg)-got])
		if err != nil {
			return fmt.Errorf("echo: %w", err)
		}
		got += n
	}
	return nil
}

// httpRequest is a complete HTTP/1.1 POST of body to host (keep-alive).
func httpRequest(host string, body []byte) []byte {
	h := fmt.Sprintf("POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", host, len(body))
	return append([]byte(h), body...)
}

// roundTrip writes req and reads one HTTP/1.1 response, which must be 200 with a
// Content-Length body of wantLen bytes and nothing after it.
func (r *rawConn) roundTrip(req []byte, wantLen int) error {
	if err := r.write(req); err != nil {
		return err
	}
	have, total := 0, -1
	for total < 0 || have < total {
		if have == len(r.buf) {
			return fmt.Errorf("response larger than %d bytes", len(r.buf))
		}
		n, err := r.read(r.buf[have:])
		if err != nil {
			return err
		}
		have += n
		if total >= 0 {
			continue
		}
		end := bytes.Index(r.buf[:have], []byte("\r\n\r\n"))
		if end < 0 {
			continue
		}
		head := string(r.buf[:end])
		if !strings.HasPrefix(head, "HTTP/1.1 200 ") {
			line, _, _ := strings.Cut(head, "\r\n")
			return fmt.Errorf("response %q", line)
		}
		cl := -1
		for _, line := range strings.Split(head, "\r\n")[1:] {
			k, v, _ := strings.Cut(line, ":")
			if strings.EqualFold(k, "Content-Length") {
				cl, _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
		if cl != wantLen {
			return fmt.Errorf("response body length %d, want %d (head %q)", cl, wantLen, head)
		}
		total = end + 4 + cl
	}
	if have != total {
		return fmt.Errorf("%d bytes after the response", have-total)
	}
	return nil
}

// pacePath is one path of an interleaved measurement: op does one request on the path's own
// connection, synchronously on the calling thread.
type pacePath struct {
	name string
	op   func() error
}

// paceResult holds, per path (in the order given), latencies measured from the scheduled send
// time (coordinated-omission safe: a late send counts against the path it was late for) and from
// the actual send (service time); and the pacing error (actual - scheduled send) of all sends.
type paceResult struct {
	sched, svc [][]time.Duration
	pacing     []time.Duration
	elapsed    time.Duration
}

// paceInterleaved sends requests at rate per second from one locked OS thread, path after path
// in slices of slice requests (so each path runs at rate while it is measured, and the paths
// alternate every slice/rate seconds), until every path has perPath samples. It stops at the
// first error. The garbage collector is off while it runs (a collection would stall the test's
// applications, not the proxies; a 2 GiB soft memory limit still bounds the heap).
func paceInterleaved(rate, perPath, slice int, paths []pacePath) (*paceResult, error) {
	return paceInterleavedWith(rate, perPath, slice, paths, nil)
}

// paceInterleavedWith is paceInterleaved calling onSwitch (when not nil) on the pacing thread
// whenever the next request is on another path than the last one, before waiting for its
// scheduled time, with that path's index, and with -1 after the last request: what happened
// between two calls belongs to the path named by the first (Envoy's CPU per path,
// BenchmarkGAMMARouteLatency). It must take far less than a request interval.
func paceInterleavedWith(rate, perPath, slice int, paths []pacePath, onSwitch func(next int)) (*paceResult, error) {
	type out struct {
		r   *paceResult
		err error
	}
	runtime.GC()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(2 << 30))
	done := make(chan out, 1)
	go func() {
		// The thread is locked and not unlocked: Go ends it with the goroutine, so its timer
		// slack never leaks to other goroutines.
		runtime.LockOSThread()
		_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
		r := &paceResult{sched: make([][]time.Duration, len(paths)), svc: make([][]time.Duration, len(paths))}
		for i := range paths {
			r.sched[i] = make([]time.Duration, 0, perPath)
			r.svc[i] = make([]time.Duration, 0, perPath)
		}
		total := perPath * len(paths)
		r.pacing = make([]time.Duration, 0, total)
		interval := time.Second / time.Duration(rate)
		start := time.Now().Add(time.Millisecond)
		last := -1
		var i int
		for n := 0; n < total; i++ {
			p := (i / slice) % len(paths)
			if len(r.sched[p]) == perPath {
				continue // this path is complete; its slots stay empty
			}
			if p != last && onSwitch != nil {
				onSwitch(p)
			}
			last = p
			at := start.Add(time.Duration(i) * interval)
			if d := time.Until(at) - spinMargin; d > 0 {
				ts := unix.NsecToTimespec(int64(d))
				for unix.ClockNanosleep(unix.CLOCK_MONOTONIC, 0, &ts, &ts) == unix.EINTR {
				}
			}
			for time.Now().Before(at) {
			}
			sent := time.Now()
			if sent.Sub(at) > 30*time.Second {
				done <- out{nil, fmt.Errorf("%s request %d: sent %s behind schedule: the machine cannot keep the rate", paths[p].name, len(r.sched[p]), sent.Sub(at))}
				return
			}
			if err := paths[p].op(); err != nil {
				done <- out{nil, fmt.Errorf("%s request %d: %w", paths[p].name, len(r.sched[p]), err)}
				return
			}
			end := time.Now()
			r.sched[p] = append(r.sched[p], end.Sub(at))
			r.svc[p] = append(r.svc[p], end.Sub(sent))
			r.pacing = append(r.pacing, sent.Sub(at))
			n++
		}
		r.elapsed = time.Since(start)
		if onSwitch != nil {
			onSwitch(-1)
		}
		done <- out{r, nil}
	}()
	o := <-done
	if o.err != nil {
		return nil, o.err
	}
	for i := range paths {
		slices.Sort(o.r.sched[i])
		slices.Sort(o.r.svc[i])
	}
	slices.Sort(o.r.pacing)
	return o.r, nil
}

// pct is the q-quantile of sorted l (0 for an empty l).
func pct(l []time.Duration, q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	return l[int(float64(len(l)-1)*q)]
}

// us formats d in microseconds with one decimal.
func us(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e3, 'f', 1, 64) }

// reportPaced prints a table of r (every path's quantiles from the scheduled time and of the
// service time, and the added latency of every path against the first, both ways) and reports
// p50, p90 and p99 of each path and the added values against the first path as benchmark
// metrics named <prefix><path>-p99-us and <prefix>added-p99-us (with more than two paths
// <prefix>added-<path>-p99-us; service time: added-svc-). With b nil it only prints.
func reportPaced(b *testing.B, prefix string, paths []pacePath, r *paceResult) {
	metric := func(v float64, unit string) {
		if b != nil {
			b.ReportMetric(v, unit)
		}
	}
	qs := []struct {
		name string
		q    float64
	}{{"p50", .5}, {"p90", .9}, {"p99", .99}, {"p99.9", .999}}
	late := len(r.pacing) - sort.Search(len(r.pacing), func(i int) bool { return r.pacing[i] > time.Millisecond })
	fmt.Printf("%s%d paths interleaved in %s; pacing error (actual - scheduled send) p50 %s p99 %s max %s us, %d sends late by more than 1 ms; loadavg %s\n",
		prefix, len(paths), r.elapsed.Round(time.Millisecond), us(pct(r.pacing, .5)), us(pct(r.pacing, .99)), us(r.pacing[len(r.pacing)-1]), late, loadavg())
	row := func(name string, l []time.Duration) string {
		return fmt.Sprintf("%-16s %7d %8s %8s %8s %8s %8s", name, len(l), us(pct(l, .5)), us(pct(l, .9)), us(pct(l, .99)), us(pct(l, .999)), us(l[len(l)-1]))
	}
	fmt.Printf("  %-16s %7s %8s %8s %8s %8s %8s | %-16s %7s %8s %8s %8s %8s %8s\n", "from schedule", "n", "p50", "p90", "p99", "p99.9", "max",
		"service time", "n", "p50", "p90", "p99", "p99.9", "max")
	for i, p := range paths {
		fmt.Printf("  %s | %s\n", row(prefix+p.name, r.sched[i]), row(prefix+p.name, r.svc[i]))
		for _, q := range qs[:3] {
			metric(float64(pct(r.sched[i], q.q))/1e3, prefix+p.name+"-"+q.name+"-us")
		}
	}
	for i, p := range paths[1:] {
		for _, kind := range []struct {
			name       string
			l, base    []time.Duration
			metricPart string
		}{{"from schedule", r.sched[i+1], r.sched[0], ""}, {"service time", r.svc[i+1], r.svc[0], "svc-"}} {
			var cells []string
			for _, q := range qs {
				cells = append(cells, q.name+" "+us(pct(kind.l, q.q)-pct(kind.base, q.q)))
			}
			fmt.Printf("  added %s - %s (%s): %s us\n", p.name, paths[0].name, kind.name, strings.Join(cells, ", "))
			name := prefix + "added-" + kind.metricPart
			if len(paths) > 2 {
				name += p.name + "-"
			}
			for _, q := range qs[:3] {
				metric(float64(pct(kind.l, q.q)-pct(kind.base, q.q))/1e3, name+q.name+"-us")
			}
		}
	}
	metric(float64(pct(r.pacing, .99))/1e3, prefix+"pacing-err-p99-us")
}

// netCounters are kernel counters that explain latency tails which are not the proxies' doing.
type netCounters struct {
	// retrans is TCP RetransSegs (/proc/net/snmp) summed over the namespaces given: a
	// retransmitted segment costs at least the 200 ms minimum RTO.
	retrans int64
	// softnetDrops is the "dropped" column of /proc/net/softnet_stat summed over CPUs (all
	// namespaces): packets lost because a CPU's input backlog was full.
	softnetDrops int64
}

// readNetCounters reads netCounters in the namespaces nss.
func readNetCounters(nss ...*testenv.Netns) (netCounters, error) {
	var c netCounters
	for _, ns := range nss {
		err := ns.Do(func() error {
			b, err := os.ReadFile("/proc/thread-self/net/snmp")
			if err != nil {
				return err
			}
			var head []string
			for _, line := range strings.Split(string(b), "\n") {
				f := strings.Fields(line)
				if len(f) == 0 || f[0] != "Tcp:" {
					continue
				}
				if head == nil {
					head = f
					continue
				}
				if i := slices.Index(head, "RetransSegs"); i > 0 && i < len(f) {
					n, _ := strconv.ParseInt(f[i], 10, 64)
					c.retrans += n
				}
			}
			return nil
		})
		if err != nil {
			return c, fmt.Errorf("read TCP counters in %s: %w", ns.Name, err)
		}
	}
	b, err := os.ReadFile("/proc/net/softnet_stat")
	if err != nil {
		return c, fmt.Errorf("read softnet_stat: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			n, _ := strconv.ParseInt(f[1], 16, 64)
			c.softnetDrops += n
		}
	}
	return c, nil
}

// netDelta prints how the counters of nss moved since before (taken with readNetCounters), and
// how many upstream connections the fixtures' Envoys opened since conns0 (upstreamConns).
func netDelta(b *testing.B, before netCounters, nss []*testenv.Netns, conns0 int, fs ...*meshFixture) {
	b.Helper()
	after, err := readNetCounters(nss...)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Printf("  kernel: %d TCP segments retransmitted in the benchmark's namespaces, %d packets dropped from full CPU backlogs (whole machine); envoy: %d upstream connections opened\n",
		after.retrans-before.retrans, after.softnetDrops-before.softnetDrops, upstreamConns(fs...)-conns0)
}

// upstreamConns sums Envoy's cluster.*.upstream_cx_total over the fixtures' Envoys: the upstream
// connections opened so far. A keep-alive measurement should open none.
func upstreamConns(fs ...*meshFixture) int {
	n := 0
	for _, f := range fs {
		for k, v := range f.stats() {
			if strings.HasPrefix(k, "cluster.") && strings.HasSuffix(k, ".upstream_cx_total") {
				n += v
			}
		}
	}
	return n
}
