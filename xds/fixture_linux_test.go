package xds

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/aethermesh/aether/envoy"
	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// meshFixture is a one-node mesh built from namespaces: a "node" netns where Envoy runs (as the
// host netns would), a bridge in it, pod namespaces attached to the bridge, the agent's xDS server
// in the test process (ADS and admin over unix sockets, so nothing binds in the root netns).
type meshFixture struct {
	t     testing.TB
	td    string
	node  *testenv.Netns
	pods  map[string]*testenv.Netns
	ips   map[string]netip.Addr
	ca    *identity.DevCA
	caPEM *testenv.CA // ca's certificate and key
	rot   *identity.Rotator
	// idp, when set before startAgent, replaces rot's Provider as the server's identity.
	idp                identity.Provider
	srv                *Server
	sup                *envoy.Supervisor
	dir                string
	xdsSock, adminSock string
	nextIP             byte
	log                *slog.Logger
	delta              bool
	build              Options
	// podNet is the second octet of the pod subnet 10.<podNet>.0.0/24 (0: 44); the waypoint
	// tests give clusters distinct or identical pod subnets with usePodNet.
	podNet byte
	// stopAgent stops the xDS server and the supervisor (not Envoy), as an agent crash would.
	stopAgent func()
	// envoyArgs are extra Envoy command-line arguments (e.g. a short --drain-time-s).
	envoyArgs []string
}

// newMeshFixture starts the fixture; envoyArgs are appended to Envoy's command line.
func newMeshFixture(t testing.TB, svidLifetime time.Duration, delta bool, build Options, envoyArgs ...string) *meshFixture {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireTools(t, testenv.ToolEnvoy)
	f := &meshFixture{t: t, td: "aether.test", pods: map[string]*testenv.Netns{}, ips: map[string]netip.Addr{}, nextIP: 10}
	f.node = testenv.NewNetns(t)
	h, err := f.node.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := h.LinkAdd(br); err != nil {
		t.Fatalf("add bridge: %v", err)
	}
	addr, _ := netlink.ParseAddr("10.44.0.1/24")
	if err := h.AddrAdd(br, addr); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	f.ca, f.caPEM = testCA(t, f.td, svidLifetime)
	f.rot = identity.NewRotator(f.ca)
	// Unix socket paths are limited to 108 bytes: keep them short.
	f.dir, err = os.MkdirTemp("", "aetx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(f.dir) })
	f.xdsSock = filepath.Join(f.dir, "xds.sock")
	f.adminSock = filepath.Join(f.dir, "admin.sock")
	f.log = slog.New(slog.NewTextHandler(testenv.LogWriter(t), &slog.HandlerOptions{Level: slog.LevelInfo}))
	f.delta, f.build, f.envoyArgs = delta, build, envoyArgs
	if f.build.UpstreamNetns == fixtureNodeNetns {
		f.build.UpstreamNetns = f.node.Path
	}
	f.startAgent()
	t.Cleanup(func() {
		f.stopAgent()
		// Envoy outlives the agent by design; the test ends it through its pid file.
		if sup, err := envoy.NewSupervisor(f.supConfig()); err == nil {
			_ = sup.Stop()
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(f.dir, "envoy", "envoy.log"))
			o, _ := os.ReadFile(filepath.Join(f.dir, "envoy", "envoy.out"))
			t.Logf("envoy output:\n%s\nenvoy log (tail):\n%s", testenv.Tail(string(o), 3000), testenv.Tail(string(b), 6000))
		}
	})
	return f
}

// fixtureNodeNetns as Options.UpstreamNetns of newMeshFixture stands for the fixture's node
// netns (the bridge's, 10.44.0.1), made only when the fixture starts.
const fixtureNodeNetns = "<node>"

func (f *meshFixture) supConfig() envoy.SupervisorConfig {
	tools := testenv.RequireTools(f.t, testenv.ToolEnvoy)
	return envoy.SupervisorConfig{
		EnvoyPath: tools.Envoy,
		Bootstrap: envoy.BootstrapConfig{NodeID: "node-1", XDSAddress: "unix://" + f.xdsSock, AdminAddress: "unix://" + f.adminSock, StateOfTheWorld: !f.delta,
			RuntimeLayer: f.runtimeLayer()},
		StateDir:  filepath.Join(f.dir, "envoy"),
		Prefix:    f.prefix(),
		ExtraArgs: append([]string{"--concurrency", "1", "--log-level", "info"}, f.envoyArgs...),
		Logger:    f.log,
	}
}

// runtimeLayer is the bootstrap's RTDS layer: RuntimeLayerName when the build serves it.
func (f *meshFixture) runtimeLayer() string {
	if f.build.PodMaxConnections > 0 {
		return RuntimeLayerName
	}
	return ""
}

func (f *meshFixture) prefix() []string {
	return []string{"ip", "netns", "exec", f.node.Name}
}

// startAgent starts what the agent runs for Envoy: a new xDS server (a new process would have a
// new epoch) on the unix socket, and a supervisor that adopts or starts Envoy.
func (f *meshFixture) startAgent() {
	t := f.t
	t.Helper()
	var err error
	idp := f.idp
	if idp == nil {
		idp = f.rot.Provider()
	}
	f.srv, err = NewServer(ServerOptions{NodeID: "node-1", Identity: idp, Logger: f.log, Build: f.build})
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(f.xdsSock)
	l, err := net.Listen("unix", f.xdsSock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = f.srv.Serve(ctx, l); done <- struct{}{} }()
	f.sup, err = envoy.NewSupervisor(f.supConfig())
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = f.sup.Run(ctx); done <- struct{}{} }()
	f.stopAgent = func() {
		if cancel != nil {
			cancel()
			<-done
			<-done
			cancel = nil
		}
	}
}

// addPod creates a pod netns attached to the node bridge and returns it with its IP. capture
// installs the test's stand-in for the capture rules: every outbound TCP connection not to
// loopback and not carrying the bypass mark (capture.DefaultBypassMark, Envoy's passthrough
// sockets) is redirected to 127.0.0.1:15001.
func (f *meshFixture) addPod(name string, capture bool) (*testenv.Netns, netip.Addr) {
	t := f.t
	t.Helper()
	ns := testenv.NewNetns(t)
	sub := cmp.Or(f.podNet, 44)
	ip := netip.AddrFrom4([4]byte{10, sub, 0, f.nextIP})
	f.nextIP++
	nh, err := f.node.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	hostName := "v" + ns.Name[len(ns.Name)-8:] // the random part of the name: a link name has at most 15 bytes
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostName}, PeerName: "eth0"}
	if err := nh.LinkAdd(veth); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	br, _ := nh.LinkByName("br0")
	host, _ := nh.LinkByName(hostName)
	if err := nh.LinkSetMaster(host, br); err != nil {
		t.Fatal(err)
	}
	if err := nh.LinkSetUp(host); err != nil {
		t.Fatal(err)
	}
	peer, err := nh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	fd, err := os.Open(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	if err := nh.LinkSetNsFd(peer, int(fd.Fd())); err != nil {
		t.Fatal(err)
	}
	ph, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer ph.Close()
	eth, _ := ph.LinkByName("eth0")
	a, _ := netlink.ParseAddr(ip.String() + "/24")
	if err := ph.AddrAdd(eth, a); err != nil {
		t.Fatal(err)
	}
	if err := ph.LinkSetUp(eth); err != nil {
		t.Fatal(err)
	}
	gw := net.IPv4(10, sub, 0, 1)
	if err := ph.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw}); err != nil {
		t.Fatal(err)
	}
	if capture {
		rules := `table ip aethertest {
  chain out {
    type nat hook output priority -100; policy accept;
    ip daddr 127.0.0.0/8 return
    meta mark 0x4145 return
    meta l4proto tcp redirect to :15001
  }
}
`
		cmd := ns.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(rules)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nft in %s: %v: %s", ns.Name, err, out)
		}
	}
	f.pods[name] = ns
	f.ips[name] = ip
	return ns, ip
}

// set serves m and waits until Envoy ACKed it.
func (f *meshFixture) set(m *model.Mesh) string {
	f.t.Helper()
	v, err := f.srv.SetMesh(context.Background(), m)
	if err != nil {
		f.t.Fatalf("SetMesh: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := f.srv.WaitForAck(ctx, v); err != nil {
		n, last := f.srv.NACKs()
		f.t.Fatalf("WaitForAck(%s): %v (NACKs %d, last %q)", v, err, n, last)
	}
	// An ACKed listener may still be warming (waiting for its routes and secrets) for a moment,
	// and a just-started Envoy accepts connections only once it is LIVE.
	testenv.Eventually(f.t, time.Minute, "listeners warm and Envoy live", func() error {
		s, err := f.admin("/stats?filter=^listener_manager.total_listeners_warming$")
		if err != nil {
			return err
		}
		if !strings.Contains(s, ": 0") {
			return fmt.Errorf("%s", strings.TrimSpace(s))
		}
		if r, err := f.admin("/ready"); err != nil || strings.TrimSpace(r) != "LIVE" {
			return fmt.Errorf("envoy /ready: %q %v", r, err)
		}
		return nil
	})
	return v
}

// wantNoRejections checks that Envoy rejected nothing the server sent: no NACK, and every
// update_rejected stat of the admin API is 0 (there must be some).
func (f *meshFixture) wantNoRejections(t *testing.T) {
	t.Helper()
	if n, last := f.srv.NACKs(); n != 0 {
		t.Errorf("NACKs = %d (last %q), want 0", n, last)
	}
	stats, err := f.admin("/stats?filter=update_rejected")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(stats) == "" {
		t.Fatal("no update_rejected stats")
	}
	for _, line := range strings.Split(strings.TrimSpace(stats), "\n") {
		if !strings.HasSuffix(line, ": 0") {
			t.Errorf("admin stat %q, want 0", line)
		}
	}
}

// admin GETs an Envoy admin path.
func (f *meshFixture) admin(path string) (string, error) { return adminGet(f.adminSock, path) }

// adminGet GETs path from the Envoy admin API on the unix socket sock; a status other than 200 is
// an error.
func adminGet(sock, path string) (string, error) {
	c, base := envoy.AdminClient("unix://" + sock)
	resp, err := c.Get(base + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("admin %s: %s", path, resp.Status)
	}
	return string(b), err
}
