//go:build (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm) && linux

package capture

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/aethermesh/aether/internal/testenv"
)

// The test binary is also the processes that must sit in a cgroup of their own: with
// childEnv=client it connects once and prints what it got, with childEnv=forwarder it is the
// capture listener, with childEnv=bench it is BenchmarkConnect's client, with childEnv=burst
// it opens many connections at once. Each reads the netns to
// enter from netnsEnv.
const (
	childEnv  = "AETHER_BPF_TEST_CHILD"
	netnsEnv  = "AETHER_BPF_TEST_NETNS"
	targetEnv = "AETHER_BPF_TEST_TARGET" // client: "addr:port" to connect to
	markEnv   = "AETHER_BPF_TEST_MARK"   // client: SO_MARK to set first (decimal), optional
	portEnv   = "AETHER_BPF_TEST_PORT"   // forwarder: the port of 127.0.0.1 and ::1 to listen on
	countEnv  = "AETHER_BPF_TEST_COUNT"  // bench: how many connections
	floorEnv  = "AETHER_BPF_TEST_FLOOR"  // bench: set when the client dials the listener itself (no original destination)
	udpEnv    = "AETHER_BPF_TEST_UDP"    // client: "sendto" or "connect" for one UDP exchange
)

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "client":
		os.Exit(runClient())
	case "forwarder":
		os.Exit(runForwarder())
	case "bench":
		os.Exit(runBenchClient())
	case "burst":
		os.Exit(runBurstClient())
	}
	os.Exit(m.Run())
}

// enterNetns moves the calling goroutine, locked to its thread for good, into the netns at path.
func enterNetns(path string) error {
	runtime.LockOSThread()
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
}

// runClient connects to $targetEnv from $netnsEnv (with SO_MARK $markEnv when set) and prints
// one line: "got <first line the server sent>", "error <connect or read error>", or "peer
// <address>" when getpeername does not give back the target (an application always sees the
// destination it dialled as its peer, redirected or not).
func runClient() int {
	if err := enterNetns(os.Getenv(netnsEnv)); err != nil {
		fmt.Println("error enter netns:", err)
		return 1
	}
	ap, err := netip.ParseAddrPort(os.Getenv(targetEnv))
	if err != nil {
		fmt.Println("error target:", err)
		return 1
	}
	// A raw socket, not net.Dial: an IPv4-mapped target must stay on an AF_INET6 socket.
	family, sa := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()})
	if ap.Addr().Is4() {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	if mode := os.Getenv(udpEnv); mode != "" {
		return udpExchange(family, sa, ap, mode == "connect")
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		fmt.Println("error socket:", err)
		return 1
	}
	if m := os.Getenv(markEnv); m != "" {
		mark, _ := strconv.Atoi(m)
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, mark); err != nil {
			fmt.Println("error SO_MARK:", err)
			return 1
		}
	}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
	if !connectTo(fd, sa, ap) {
		return 0
	}
	f := os.NewFile(uintptr(fd), "client")
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		fmt.Println("error read:", err)
		return 0
	}
	fmt.Println("got", strings.TrimSpace(line))
	return 0
}

// sockaddrAddrPort is the address and port of a socket address.
func sockaddrAddrPort(sa unix.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
	}
	return netip.AddrPort{}
}

// connectTo connects fd to sa and checks that getpeername gives ap (the target as dialled)
// back; on failure it prints "error <connect error>" or "peer <what getpeername gave>".
func connectTo(fd int, sa unix.Sockaddr, ap netip.AddrPort) bool {
	if err := unix.Connect(fd, sa); err != nil {
		fmt.Println("error", err)
		return false
	}
	peer, err := unix.Getpeername(fd)
	if err != nil || sockaddrAddrPort(peer) != ap {
		fmt.Println("peer", sockaddrAddrPort(peer), err)
		return false
	}
	return true
}

// udpExchange sends "q" to target sa (ap) on a UDP socket of family, unconnected (sendto) or
// connected first (then getpeername must give ap back), and prints "got <answer> from <source>"
// or "error ...".
func udpExchange(family int, sa unix.Sockaddr, ap netip.AddrPort, connect bool) int {
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		fmt.Println("error socket:", err)
		return 1
	}
	defer unix.Close(fd)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2})
	if connect {
		if !connectTo(fd, sa, ap) {
			return 0
		}
		_, err = unix.Write(fd, []byte("q"))
	} else {
		err = unix.Sendto(fd, []byte("q"), 0, sa)
	}
	if err != nil {
		fmt.Println("error send:", err)
		return 0
	}
	buf := make([]byte, 512)
	n, from, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		fmt.Println("error recv:", err)
		return 0
	}
	fmt.Printf("got %s from %v\n", buf[:n], sockaddrAddrPort(from))
	return 0
}

// runBurstClient opens $countEnv connections at once from $netnsEnv, the i-th to port 20000+i
// of the address $targetEnv, and prints "ok <count>" when every one was answered with its own
// destination ("captured <address>:<20000+i>"), else the first wrong answer.
func runBurstClient() int {
	if err := enterNetns(os.Getenv(netnsEnv)); err != nil {
		fmt.Println("error enter netns:", err)
		return 1
	}
	n, _ := strconv.Atoi(os.Getenv(countEnv))
	addr := netip.MustParseAddr(os.Getenv(targetEnv))
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", netip.AddrPortFrom(addr, uint16(20000+i)).String())
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		conns[i] = c
	}
	for i, c := range conns {
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if want := fmt.Sprintf("captured %v\n", netip.AddrPortFrom(addr, uint16(20000+i))); line != want || err != nil {
			fmt.Printf("connection %d: %q %v, want %q\n", i, line, err, want)
			return 0
		}
	}
	fmt.Println("ok", n)
	return 0
}

// runForwarder stands in for Envoy's capture listener: it listens on 127.0.0.1 and ::1 at
// $portEnv in $netnsEnv, prints "ready", and answers each accepted connection with one line,
// "captured <SO_ORIGINAL_DST>" or "captured error <err>", then closes it.
func runForwarder() int {
	if err := enterNetns(os.Getenv(netnsEnv)); err != nil {
		fmt.Println("error enter netns:", err)
		return 1
	}
	port := os.Getenv(portEnv)
	var ls []net.Listener
	for _, host := range []string{"127.0.0.1", "::1"} {
		l, err := net.Listen("tcp", net.JoinHostPort(host, port))
		if err != nil {
			fmt.Println("error listen:", err)
			return 1
		}
		ls = append(ls, l)
	}
	fmt.Println("ready")
	errc := make(chan error, len(ls))
	for _, l := range ls {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					errc <- err
					return
				}
				dst, err := originalDst(c.(*net.TCPConn))
				if err != nil {
					fmt.Fprintf(c, "captured error %v\n", err)
				} else {
					fmt.Fprintf(c, "captured %v\n", dst)
				}
				c.Close()
			}
		}()
	}
	fmt.Println("error accept:", <-errc)
	return 1
}

// originalDst asks the accepted socket c for its original destination as Envoy's original_dst
// listener filter does: getsockopt(SOL_IP, SO_ORIGINAL_DST) giving a struct sockaddr_in on an
// IPv4 socket, (SOL_IPV6, IP6T_SO_ORIGINAL_DST) giving a struct sockaddr_in6 on an IPv6 one.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	level, size := unix.SOL_IP, unix.SizeofSockaddrInet4
	if c.LocalAddr().(*net.TCPAddr).IP.To4() == nil {
		level, size = unix.SOL_IPV6, unix.SizeofSockaddrInet6
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	buf := make([]byte, size)
	n := uint32(size)
	var errno syscall.Errno
	if err := raw.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), 80,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
	}); err != nil {
		return netip.AddrPort{}, err
	}
	if errno != 0 {
		return netip.AddrPort{}, errno
	}
	port := binary.BigEndian.Uint16(buf[2:4])
	switch fam := binary.NativeEndian.Uint16(buf[0:2]); {
	case fam == unix.AF_INET && n == unix.SizeofSockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(buf[4:8])), port), nil
	case fam == unix.AF_INET6 && n == unix.SizeofSockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(buf[8:24])).Unmap(), port), nil
	default:
		return netip.AddrPort{}, fmt.Errorf("family %d, %d bytes", fam, n)
	}
}

// requireEBPF is testenv.RequireRoot plus Probe: where the kernel or the host lacks what eBPF
// capture needs (a cgroup2 mount, a program type, a helper) the test skips saying what, except
// in CI (CI set), where it fails.
func requireEBPF(t testing.TB) {
	t.Helper()
	testenv.RequireRoot(t)
	if err := Probe().Err(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("probe: %v (CI must run the eBPF tests)", err)
		}
		t.Skipf("probe: %v", err)
	}
}

// testCgroup creates a cgroup v2 directory under the host's cgroup2 mount with sub-cgroups
// "pod" (the clients) and "proxy" (the forwarder), and removes them when the test ends (after
// the test's processes in them have exited). It returns the directory.
func testCgroup(t testing.TB) string {
	t.Helper()
	root, _ := mounts("/proc/self/mountinfo")
	if root == "" {
		t.Fatal("no cgroup2 mount in /proc/self/mountinfo (needed to attach cgroup programs)")
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	dir := filepath.Join(root, fmt.Sprintf("aether-bpf-test-%d-%s", os.Getpid(), hex.EncodeToString(b)))
	for _, d := range []string{dir, filepath.Join(dir, "pod"), filepath.Join(dir, "proxy")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatalf("create cgroup: %v", err)
		}
	}
	t.Cleanup(func() {
		for _, d := range []string{filepath.Join(dir, "pod"), filepath.Join(dir, "proxy"), dir} {
			if err := os.Remove(d); err != nil {
				t.Errorf("remove cgroup %s: %v", d, err)
			}
		}
	})
	return dir
}

// testBPFFS returns a bpffs directory to pin under: a fresh directory in the host's bpffs when
// one is mounted, else a bpffs the test mounts (and unmounts when it ends).
func testBPFFS(t testing.TB) string {
	t.Helper()
	if _, fs := mounts("/proc/self/mountinfo"); fs != "" {
		d, err := os.MkdirTemp(fs, "aether-bpf-test-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		return d
	}
	d := t.TempDir()
	if err := unix.Mount("bpf", d, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs at %s: %v", d, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(d, 0); err != nil {
			t.Errorf("unmount bpffs %s: %v", d, err)
		}
	})
	return d
}

// startChild starts the test binary with env (childEnv and its settings) in cgroup, born there,
// so nothing it does precedes its move. It returns the command, its stderr and its stdout.
func startChild(t testing.TB, cgroup string, env ...string) (*exec.Cmd, *bytes.Buffer, io.ReadCloser) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := testenv.StartCmdInCgroup(cmd, cgroup); err != nil {
		t.Fatalf("start %v child: %v", env, err)
	}
	return cmd, &stderr, stdout
}

// startForwarder starts the forwarder (runForwarder) on port 15001 in ns, born in cgroup ("":
// the test's own), waits until it listens, and kills it when the test ends.
func startForwarder(t testing.TB, cgroup string, ns *testenv.Netns) {
	t.Helper()
	fwd, stderr, stdout := startChild(t, cgroup, childEnv+"=forwarder", netnsEnv+"="+ns.Path, portEnv+"=15001")
	t.Cleanup(func() { _ = fwd.Process.Kill(); _ = fwd.Wait() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("forwarder: %q %v: %s", line, err, stderr)
	}
}

// dial runs a client in cgroup (in netns) that connects to target with SO_MARK mark (0: none)
// and returns its line.
func dial(t testing.TB, cgroup string, ns *testenv.Netns, target string, mark uint32) string {
	t.Helper()
	return exchange(t, cgroup, ns, target, mark, "")
}

// exchange is dial over TCP (udp ""), or one UDP exchange (udp "sendto" or "connect").
func exchange(t testing.TB, cgroup string, ns *testenv.Netns, target string, mark uint32, udp string) string {
	t.Helper()
	env := []string{childEnv + "=client", netnsEnv + "=" + ns.Path, targetEnv + "=" + target, udpEnv + "=" + udp}
	if mark != 0 {
		env = append(env, markEnv+"="+strconv.FormatUint(uint64(mark), 10))
	}
	cmd, stderr, stdout := startChild(t, cgroup, env...)
	out, _ := io.ReadAll(stdout)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("client to %s: %v: %s%s", target, err, out, stderr)
	}
	return strings.TrimSpace(string(out))
}

// serveLine answers every connection to addr in ns with line ("direct" where a connect lands
// when it is not redirected).
func serveLine(t testing.TB, ns *testenv.Netns, addr, line string) {
	l := ns.Listen(t, addr)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, line)
			c.Close()
		}
	}()
}

// podNetns is a netns standing in for a pod: its lo holds the pod's address and every
// destination address of the cases, so a connect that is not redirected reaches "direct" on
// [::]:8080, [::]:9090 or [::]:53 in the netns itself; the node's resolver stands at
// 10.1.0.1:18054 and [fd00:99::1]:18054 (TCP "resolver", UDP echo prefixed "resolver:").
func podNetns(t testing.TB) *testenv.Netns {
	t.Helper()
	ns := testenv.NewNetns(t)
	var addrs []netip.Prefix
	for _, a := range []string{"10.0.0.2/24", "10.96.0.10/32", "10.96.0.53/32", "10.96.0.54/32", "10.200.0.5/32",
		"169.254.169.254/32", "10.1.0.1/32", "fd00:1::2/64", "fd00::10/128", "fd00::53/128", "fd00:200::5/128", "fd00:99::1/128"} {
		addrs = append(addrs, netip.MustParsePrefix(a))
	}
	ns.AddAddrs(t, "lo", addrs...)
	for _, a := range []string{"[::]:8080", "[::]:9090", "[::]:53"} {
		serveLine(t, ns, a, "direct")
	}
	for _, a := range []string{"10.1.0.1:18054", "[fd00:99::1]:18054"} {
		serveLine(t, ns, a, "resolver")
		ns.ServeUDPEcho(t, a, "resolver:")
	}
	return ns
}

// TestPrivilegedCapture attaches the programs to a cgroup the test makes (a subtree of the
// host's cgroup2 mount), pins and adopts them, and runs real clients in that cgroup inside pod
// netns, with a forwarder on 127.0.0.1:15001 and [::1]:15001 standing in for Envoy (in a sibling
// cgroup) that reports SO_ORIGINAL_DST of each connection it accepts.
func TestPrivilegedCapture(t *testing.T) {
	requireEBPF(t)
	cgroup := testCgroup(t)
	pins := filepath.Join(testBPFFS(t), "capture")

	// Load, attach, pin, and let go: the pinned links keep the programs attached; what the
	// test drives from here on is what a restarted agent adopts.
	loaded, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if err := loaded.Attach(cgroup); err != nil {
		loaded.Close()
		t.Fatal(err)
	}
	if err := loaded.Pin(pins); err != nil {
		loaded.Close()
		t.Fatal(err)
	}
	loaded.Close()
	c, err := OpenPinned(pins)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Unpin(); err != nil {
			t.Error(err)
		}
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	if got, want := c.Attached(), []string{"connect4", "connect6", "sockops", "getsockopt", "getpeername4", "getpeername6", "sendmsg4", "sendmsg6", "recvmsg4", "recvmsg6"}; !slices.Equal(got, want) {
		t.Fatalf("adopted attachments %v, want %v", got, want)
	}

	pod, v4only, stranger := podNetns(t), podNetns(t), podNetns(t)
	settings := map[*testenv.Netns]PodSettings{
		pod: {
			BypassMark:   0x4145,
			IPv6:         true,
			LocalAddrs:   []netip.Addr{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00:1::2")},
			ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16"), netip.MustParsePrefix("fd00:200::/64")},
			ExcludePorts: []uint16{9090},
			PassThrough:  []netip.AddrPort{netip.MustParseAddrPort("10.96.0.54:53")},
			DNS: []DNSRedirect{
				{From: netip.MustParseAddrPort("10.96.0.53:53"), To: netip.MustParseAddrPort("10.1.0.1:18054")},
				{From: netip.MustParseAddrPort("[fd00::53]:53"), To: netip.MustParseAddrPort("[fd00:99::1]:18054")},
			},
			DenyCIDRs: []netip.Prefix{netip.MustParsePrefix("169.254.169.254/32")},
		},
		// No IPv6, and its capture listener's port has no listener: its captured connects are
		// refused, which shows the handshake entry go with the client's close.
		v4only: {CapturePort: 15002, LocalAddrs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}},
	}
	cookies := map[*testenv.Netns]uint64{}
	for _, ns := range []*testenv.Netns{pod, v4only, stranger} {
		if cookies[ns], err = NetnsCookie(ns.Path); err != nil {
			t.Fatal(err)
		}
	}
	for ns, s := range settings {
		if err := c.SetPod(cookies[ns], s); err != nil {
			t.Fatal(err)
		}
	}

	startForwarder(t, filepath.Join(cgroup, "proxy"), pod)

	podCgroup := filepath.Join(cgroup, "pod")
	const eperm, refused = "error operation not permitted", "error connection refused"
	cases := []struct {
		name   string
		ns     *testenv.Netns
		target string
		mark   uint32
		want   string
		udp    string // "": TCP; "sendto" or "connect": one UDP exchange
	}{
		{"IPv4 VIP captured", pod, "10.96.0.10:8080", 0, "got captured 10.96.0.10:8080", ""},
		{"IPv6 VIP captured", pod, "[fd00::10]:8080", 0, "got captured [fd00::10]:8080", ""},
		{"IPv4-mapped on an IPv6 socket captured as IPv4", pod, "[::ffff:10.96.0.10]:8080", 0, "got captured 10.96.0.10:8080", ""},
		{"excluded IPv4 CIDR", pod, "10.200.0.5:8080", 0, "got direct", ""},
		{"excluded IPv6 CIDR", pod, "[fd00:200::5]:8080", 0, "got direct", ""},
		{"excluded port", pod, "10.96.0.10:9090", 0, "got direct", ""},
		{"pass-through address and port", pod, "10.96.0.54:53", 0, "got direct", ""},
		{"DNS over TCP to the resolver", pod, "10.96.0.53:53", 0, "got resolver", ""},
		{"DNS over TCP to the resolver, IPv6", pod, "[fd00::53]:53", 0, "got resolver", ""},
		{"the proxy's own DNS left alone", pod, "10.96.0.53:53", 0x4145, "got direct", ""},
		{"DNS over UDP, unconnected", pod, "10.96.0.53:53", 0, "got resolver:q from 10.96.0.53:53", "sendto"},
		{"DNS over UDP, connected", pod, "10.96.0.53:53", 0, "got resolver:q from 10.96.0.53:53", "connect"},
		{"DNS over UDP, IPv6", pod, "[fd00::53]:53", 0, "got resolver:q from [fd00::53]:53", "sendto"},
		{"DNS over UDP from a netns not in the map", stranger, "10.96.0.53:53", 0, "error recv: connection refused", "connect"},
		{"DNS address on another port captured", pod, "10.96.0.53:8080", 0, "got captured 10.96.0.53:8080", ""},
		{"IPv4 loopback", pod, "127.0.0.1:8080", 0, "got direct", ""},
		{"IPv6 loopback", pod, "[::1]:8080", 0, "got direct", ""},
		{"the pod's own address", pod, "10.0.0.2:8080", 0, "got direct", ""},
		{"the pod's own IPv6 address", pod, "[fd00:1::2]:8080", 0, "got direct", ""},
		{"cloud metadata refused", pod, "169.254.169.254:8080", 0, eperm, ""},
		{"proxy's own connect (bypass mark)", pod, "10.96.0.10:8080", 0x4145, "got direct", ""},
		{"cloud metadata refused with the bypass mark too", pod, "169.254.169.254:8080", 0x4145, eperm, ""},
		{"another mark is captured", pod, "10.96.0.10:8080", 0x1, "got captured 10.96.0.10:8080", ""},
		{"netns not in the map", stranger, "10.96.0.10:8080", 0, "got direct", ""},
		{"netns not in the map, IPv6", stranger, "[fd00::10]:8080", 0, "got direct", ""},
		{"IPv6 of a pod without IPv6 refused", v4only, "[fd00::10]:8080", 0, eperm, ""},
		{"capture port without a listener", v4only, "10.96.0.10:8080", 0, refused, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := exchange(t, podCgroup, tc.ns, tc.target, tc.mark, tc.udp); got != tc.want {
				t.Errorf("connect to %s from %s: got %q, want %q", tc.target, tc.ns.Name, got, tc.want)
			}
		})
	}

	t.Run("outside the cgroup nothing changes", func(t *testing.T) {
		// The test process sits outside the attached cgroup: even in a captured netns its
		// connect goes where it was sent.
		conn, err := pod.Dial("10.96.0.10:8080")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		line, _ := bufio.NewReader(conn).ReadString('\n')
		if line != "direct\n" {
			t.Errorf("got %q, want direct", line)
		}
	})

	t.Run("concurrent connections each get their own destination", func(t *testing.T) {
		// All connected before the forwarder answers any: 200 handshakes in flight at once.
		for _, host := range []string{"10.96.0.10", "fd00::10"} {
			cmd, stderr, stdout := startChild(t, podCgroup, childEnv+"=burst", netnsEnv+"="+pod.Path,
				targetEnv+"="+host, countEnv+"=100")
			out, _ := io.ReadAll(stdout)
			if err := cmd.Wait(); err != nil || string(out) != "ok 100\n" {
				t.Errorf("burst to %s: %v: %s%s", host, err, out, stderr)
			}
		}
	})

	t.Run("handshakes map empties", func(t *testing.T) {
		testenv.Eventually(t, 10*time.Second, "handshakes map empty", func() error {
			n, err := c.Handshakes()
			if err == nil && n != 0 {
				err = fmt.Errorf("%d entries", n)
			}
			return err
		})
	})

	t.Run("stats count the verdicts", func(t *testing.T) {
		st, err := c.Stats()
		if err != nil {
			t.Fatal(err)
		}
		// The table's cases in captured netns: 5 redirected to the forwarder (each answered
		// SO_ORIGINAL_DST) and 1 to a port without a listener, 3 refused, 10 TCP connects
		// passed, 5 TCP connects and UDP sends to the resolver; then the 200 concurrent
		// connections.
		want := Stats{Redirected: 206, Passed: 10, Refused: 3, OriginalDst: 205, DNS: 5}
		if st != want {
			t.Errorf("stats %+v, want %+v", st, want)
		}
	})

	t.Run("ListPods reads back SetPod", func(t *testing.T) {
		got, err := c.ListPods()
		if err != nil {
			t.Fatal(err)
		}
		want := map[uint64]PodSettings{}
		for ns, s := range settings {
			want[cookies[ns]] = s.normalized()
		}
		if d := cmp.Diff(want, got, equateNetip); d != "" {
			t.Errorf("ListPods (-want +got):\n%s", d)
		}
	})

	t.Run("SetPod replaces a pod's settings", func(t *testing.T) {
		s := settings[pod]
		s.ExcludePorts = []uint16{8080}
		s.ExcludeCIDRs = nil
		if err := c.SetPod(cookies[pod], s); err != nil {
			t.Fatal(err)
		}
		for target, want := range map[string]string{
			"10.96.0.10:8080": "got direct",                   // newly excluded port
			"10.200.0.5:9090": "got captured 10.200.0.5:9090", // exclusions gone
		} {
			if got := dial(t, podCgroup, pod, target, 0); got != want {
				t.Errorf("connect to %s: got %q, want %q", target, got, want)
			}
		}
		got, err := c.ListPods()
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(s.normalized(), got[cookies[pod]], equateNetip); d != "" {
			t.Errorf("ListPods after the change (-want +got):\n%s", d)
		}
	})

	t.Run("real Envoy sees the original destination", func(t *testing.T) {
		// Envoy, born in the proxy cgroup, listens on 127.0.0.1:15001 and [::1]:15001 in a pod
		// netns of its own (network_namespace_filepath, as the node Envoy does); its
		// original_dst listener filter restores the destination from SO_ORIGINAL_DST, and a
		// filter chain matched on that destination answers.
		ns := podNetns(t)
		cookie, err := NetnsCookie(ns.Path)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.SetPod(cookie, PodSettings{IPv6: true, LocalAddrs: addrs("10.0.0.2", "fd00:1::2")}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := c.DeletePod(cookie); err != nil {
				t.Error(err)
			}
		}()
		e := testenv.StartEnvoy(t, envoyBootstrap(ns.Path), testenv.EnvoyOptions{Cgroup: filepath.Join(cgroup, "proxy")})
		for target, want := range map[string]string{
			"10.96.0.10:8080":    "got envoy 10.96.0.10:8080",
			"[fd00::10]:8080":    "got envoy [fd00::10]:8080",
			"10.200.0.5:9090":    "got envoy other destination",
			"10.0.0.2:8080":      "got direct", // the pod's own address is not captured
			"[::1]:8080":         "got direct",
			"[fd00:1::2]:9090":   "got direct",
			"[fd00:200::5]:9090": "got envoy other destination",
		} {
			if got := dial(t, podCgroup, ns, target, 0); got != want {
				t.Errorf("connect to %s through Envoy: got %q, want %q", target, got, want)
			}
		}
		if t.Failed() {
			stats, _ := e.Admin(context.Background(), "/stats?filter=original_dst|downstream_cx_total")
			t.Logf("envoy stats:\n%s", stats)
		}
	})

	t.Run("DeletePod leaves the pod alone", func(t *testing.T) {
		for _, ns := range []*testenv.Netns{pod, v4only} {
			if err := c.DeletePod(cookies[ns]); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.DeletePod(cookies[pod]); err != nil {
			t.Fatalf("second DeletePod: %v", err)
		}
		for _, tc := range []struct {
			ns     *testenv.Netns
			target string
		}{
			{pod, "10.96.0.10:9090"}, {pod, "[fd00::10]:8080"}, {v4only, "[fd00::10]:8080"},
		} {
			if got := dial(t, podCgroup, tc.ns, tc.target, 0); got != "got direct" {
				t.Errorf("connect to %s from %s after DeletePod: got %q, want direct", tc.target, tc.ns.Name, got)
			}
		}
		got, err := c.ListPods()
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 0 {
			t.Errorf("ListPods after DeletePod: %v, want nothing (no settings, cidrs or ports entry left)", got)
		}
	})
}

// envoyBootstrap is a static Envoy config with the capture listener on 127.0.0.1:15001 and
// [::1]:15001 inside the netns at netnsPath: the original_dst listener filter, a filter chain
// per original destination (10.96.0.10:8080, [fd00::10]:8080) answering "envoy <destination>",
// and a default chain answering "envoy other destination" (direct_response, then close).
func envoyBootstrap(netnsPath string) string {
	listener := func(name, addr string) string {
		return fmt.Sprintf(`
  - name: %[1]s
    address:
      socket_address: { address: %[2]q, port_value: 15001, network_namespace_filepath: %[3]q }
    listener_filters:
    - name: envoy.filters.listener.original_dst
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst
    filter_chains:
    - filter_chain_match:
        destination_port: 8080
        prefix_ranges: [{ address_prefix: 10.96.0.10, prefix_len: 32 }]
      filters: [%[4]s]
    - filter_chain_match:
        destination_port: 8080
        prefix_ranges: [{ address_prefix: "fd00::10", prefix_len: 128 }]
      filters: [%[5]s]
    default_filter_chain:
      filters: [%[6]s]
`, name, addr, netnsPath, directResponse("envoy 10.96.0.10:8080"), directResponse("envoy [fd00::10]:8080"),
			directResponse("envoy other destination"))
	}
	return `
admin:
  address:
    socket_address: { address: 127.0.0.1, port_value: 0 }
static_resources:
  listeners:` + listener("capture4", "127.0.0.1") + listener("capture6", "::1")
}

func directResponse(line string) string {
	return fmt.Sprintf(`{ name: envoy.filters.network.direct_response, typed_config: { "@type": type.googleapis.com/envoy.extensions.filters.network.direct_response.v3.Config, response: { inline_string: %q } } }`, line+"\n")
}

// TestPrivilegedEnsureAdoptsAndUpgrades is an agent's restart: Ensure attaches and pins, the
// process lets go (pods stay captured by the pins alone), a second Ensure adopts the maps with
// their pods and switches every pinned link to its freshly loaded program in place, a lost link
// pin is attached again, and removing the pins leaves nothing attached.
func TestPrivilegedEnsureAdoptsAndUpgrades(t *testing.T) {
	requireEBPF(t)
	cgroup := testCgroup(t)
	dir := filepath.Join(testBPFFS(t), "capture")
	ns := podNetns(t)
	cookie, err := NetnsCookie(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	settings := PodSettings{LocalAddrs: addrs("10.0.0.2"), ExcludePorts: []uint16{9090}}
	startForwarder(t, filepath.Join(cgroup, "proxy"), ns)
	podCgroup := filepath.Join(cgroup, "pod")
	expect := func(when, want string) {
		t.Helper()
		if got := dial(t, podCgroup, ns, "10.96.0.10:8080", 0); got != want {
			t.Fatalf("%s: connect to 10.96.0.10:8080: got %q, want %q", when, got, want)
		}
	}
	programs := func(c *Capture) map[string]ebpf.ProgramID {
		t.Helper()
		ids := map[string]ebpf.ProgramID{}
		for name, l := range c.links {
			info, err := l.Info()
			if err != nil {
				t.Fatal(err)
			}
			ids[name] = info.Program
		}
		return ids
	}

	first, err := Ensure(dir, cgroup)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.SetPod(cookie, settings); err != nil {
		t.Fatal(err)
	}
	before := programs(first)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	expect("after the first process let go", "got captured 10.96.0.10:8080")

	second, err := Ensure(dir, cgroup)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := second.ListPods()
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(map[uint64]PodSettings{cookie: settings.normalized()}, pods, equateNetip); d != "" {
		t.Errorf("adopted pods (-want +got):\n%s", d)
	}
	after := programs(second)
	if len(after) != len(attachments) {
		t.Fatalf("adopted links %v, want all %d", after, len(attachments))
	}
	for name, id := range after {
		if id == before[name] {
			t.Errorf("link %s still runs program %d: not switched to the new load", name, id)
		}
	}
	expect("after adoption", "got captured 10.96.0.10:8080")

	// A lost link pin: its program detaches with the last handle.
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "link_getsockopt")); err != nil {
		t.Fatal(err)
	}
	expect("without the getsockopt link", "got captured error no such file or directory")
	third, err := Ensure(dir, cgroup)
	if err != nil {
		t.Fatal(err)
	}
	expect("after Ensure attached it again", "got captured 10.96.0.10:8080")

	if err := RemovePins(dir); err != nil {
		t.Fatal(err)
	}
	if err := third.Close(); err != nil {
		t.Fatal(err)
	}
	expect("after RemovePins and Close", "got direct")
}
