//go:build (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm) && linux

package capture

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	nft "github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/internal/testenv"
)

// runBenchClient makes $countEnv connections, one after the other, from $netnsEnv to
// $targetEnv, each timed from before connect to its first line, and prints
// "<count> <total ns> <p50 ns> <p99 ns>".
func runBenchClient() int {
	if err := enterNetns(os.Getenv(netnsEnv)); err != nil {
		fmt.Println("error enter netns:", err)
		return 1
	}
	n, _ := strconv.Atoi(os.Getenv(countEnv))
	target := os.Getenv(targetEnv)
	lat := make([]time.Duration, 0, n)
	start := time.Now()
	for range n {
		t0 := time.Now()
		c, err := net.Dial("tcp", target)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		// The floor dials the listener itself: its answer says SO_ORIGINAL_DST found nothing.
		if err != nil || !strings.HasPrefix(line, "captured ") || (strings.Contains(line, "error") && os.Getenv(floorEnv) == "") {
			fmt.Printf("error answer %q %v\n", line, err)
			return 1
		}
		lat = append(lat, time.Since(t0))
	}
	total := time.Since(start)
	slices.Sort(lat)
	fmt.Println(n, total.Nanoseconds(), lat[len(lat)/2].Nanoseconds(), lat[len(lat)*99/100].Nanoseconds())
	return 0
}

// benchPod is a pod netns as a node gives one: 10.0.0.2/24 on eth0, a veth to a node netns
// (10.0.0.1), and a default route there, so the VIP 10.96.0.10 is remote (nft's REDIRECT needs a
// route; a local VIP would leave through lo, which nft never captures).
func benchPod(t testing.TB) *testenv.Netns {
	pod, node := testenv.NewNetns(t), testenv.NewNetns(t)
	testenv.Veth(t, pod, "eth0", netip.MustParsePrefix("10.0.0.2/24"), node, "vpod", netip.MustParsePrefix("10.0.0.1/24"))
	pod.DefaultRoute(t, netip.MustParseAddr("10.0.0.1"))
	return pod
}

// BenchmarkConnect measures what capture costs a pod's connection, eBPF against nft REDIRECT, on
// the same kind of pod netns with the same trivial capture listener (runForwarder: accept, read
// SO_ORIGINAL_DST, answer one line, close), so the redirect's own cost shows apart from Envoy's.
// Each iteration is one connection to a VIP, sequential, timed from before connect to the first
// line; it reports p50 and p99 of that (us) and connections per second. The floor ("direct")
// is a pod without capture dialling the listener itself (127.0.0.1:15001): what the client, the
// forwarder and loopback cost with no redirect at all, measured in the same run.
//
// Run as root: go test -run '^$' -bench BenchmarkConnect -benchtime 2000x ./bpf/capture/
func BenchmarkConnect(b *testing.B) {
	requireEBPF(b)
	cgroup := testCgroup(b)
	c, err := Ensure(filepath.Join(testBPFFS(b), "capture"), cgroup)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })

	ebpfPod := benchPod(b)
	cookie, err := NetnsCookie(ebpfPod.Path)
	if err != nil {
		b.Fatal(err)
	}
	cfg := nft.Config{PodIPs: addrs("10.0.0.2"), BypassMark: nft.DefaultBypassMark}
	s, err := FromConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.SetPod(cookie, s); err != nil {
		b.Fatal(err)
	}
	startForwarder(b, filepath.Join(cgroup, "proxy"), ebpfPod)

	// The nft pod lives outside the attached cgroup: its connections meet no eBPF program.
	nftPod := benchPod(b)
	rs, err := nft.Build(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := (nft.NFTables{}).Apply(nftPod.Path, rs); err != nil {
		b.Fatal(err)
	}
	startForwarder(b, "", nftPod)

	// The floor: no capture, no eBPF program on the way; the client dials the listener.
	directPod := benchPod(b)
	startForwarder(b, "", directPod)

	for _, m := range []struct {
		name, target string
		ns           *testenv.Netns
		cgroup       string
		floor        bool
	}{{"ebpf", "10.96.0.10:8080", ebpfPod, filepath.Join(cgroup, "pod"), false},
		{"nft", "10.96.0.10:8080", nftPod, "", false},
		{"direct", "127.0.0.1:" + strconv.Itoa(int(nft.DefaultCapturePort)), directPod, "", true}} {
		b.Run(m.name, func(b *testing.B) {
			env := []string{childEnv + "=bench", netnsEnv + "=" + m.ns.Path, targetEnv + "=" + m.target, countEnv + "=" + strconv.Itoa(b.N)}
			if m.floor {
				env = append(env, floorEnv+"=1")
			}
			cmd, stderr, stdout := startChild(b, m.cgroup, env...)
			out, _ := io.ReadAll(stdout)
			if err := cmd.Wait(); err != nil {
				b.Fatalf("bench client: %v: %s%s", err, out, stderr)
			}
			var n, total, p50, p99 float64
			if _, err := fmt.Sscan(string(out), &n, &total, &p50, &p99); err != nil {
				b.Fatalf("bench client output %q: %v", out, err)
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(p50/1e3, "p50-us")
			b.ReportMetric(p99/1e3, "p99-us")
			b.ReportMetric(n/(total/1e9), "conn/s")
		})
	}
}
