//go:build linux

package cni

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/aethermesh/aether/cni/plugin"

	"golang.org/x/sys/unix"

	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// pluginBinary builds cmd/aether-cni once per test binary into a temporary directory and returns
// that directory.
func pluginBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "aether-cni-bin-")
		if err != nil {
			buildErr = err
			return
		}
		root, err := testenv.RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, plugin.PluginName), "./cmd/aether-cni")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build aether-cni: %v\n%s", err, out)
			return
		}
		builtBin = dir
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// staticLookup answers every pod as meshed unless listed otherwise (a fake at the API boundary;
// KubePods is tested against a real kube-apiserver separately).
type staticLookup struct {
	mu       sync.Mutex
	notMesh  map[string]bool
	calls    int
	failWith error
}

// set replaces the pods outside the mesh and the error every lookup fails with.
func (l *staticLookup) set(notMesh map[string]bool, fail error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.notMesh, l.failWith = notMesh, fail
}

func (l *staticLookup) LookupPod(_ context.Context, ns, name string) (PodInfo, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	if l.failWith != nil {
		return PodInfo{}, l.failWith
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	// Every pod serves 8080 and is probed by the kubelet on 8081.
	info := PodInfo{UID: "", ServiceAccount: "sa-" + name, Ports: []model.PodPort{{Name: "http", Port: 8080, Protocol: model.ProtocolHTTP}},
		ProbePorts: []uint16{8081}}
	info.InMesh, info.NotMeshedReason = model.PodMeshed(pod, !l.notMesh[ns+"/"+name])
	return info, nil
}

// recordingDataplane records the pods the server announces (a fake at the xDS boundary).
type recordingDataplane struct {
	mu      sync.Mutex
	live    map[string]model.LocalPod
	added   int
	removed int
	fail    error
	hang    bool
	// hold, when set, holds PodAdded of the container IDs it names until their channel is
	// closed; events records "start <id>" and "end <id>" of every PodAdded.
	hold   map[string]chan struct{}
	events []string
}

func (d *recordingDataplane) PodAdded(ctx context.Context, p model.LocalPod) error {
	d.mu.Lock()
	d.events = append(d.events, "start "+p.ContainerID)
	gate := d.hold[p.ContainerID]
	d.mu.Unlock()
	if gate != nil {
		<-gate
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	defer func() { d.events = append(d.events, "end "+p.ContainerID) }()
	if d.hang {
		<-ctx.Done() // Envoy never ACKs: the server's bound must end the wait
		return ctx.Err()
	}
	if d.fail != nil {
		return d.fail
	}
	if d.live == nil {
		d.live = map[string]model.LocalPod{}
	}
	d.live[p.ContainerID] = p
	d.added++
	return nil
}

func (d *recordingDataplane) PodRemoved(_ context.Context, p model.LocalPod) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.live, p.ContainerID)
	d.removed++
	return nil
}

func (d *recordingDataplane) liveCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.live)
}

// agent is a running Server for a test.
type agent struct {
	srv    *Server
	socket string
	state  string
	cancel context.CancelFunc
	done   chan error
	lookup *staticLookup
	dp     *recordingDataplane
}

// sockDir returns a short temporary directory (unix socket paths are limited to 108 bytes).
func sockDir(t testing.TB) string {
	d, err := os.MkdirTemp("", "aet")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// startAgent runs a Server on socket with its state in stateDir and waits until it is ready.
func startAgent(t testing.TB, socket, stateDir string, cfg ServerConfig, lookup *staticLookup, dp *recordingDataplane) *agent {
	t.Helper()
	return startAgentGuarded(t, socket, stateDir, cfg, lookup, dp, nil)
}

// startAgentGuarded is startAgent with a node source guard.
func startAgentGuarded(t testing.TB, socket, stateDir string, cfg ServerConfig, lookup *staticLookup, dp *recordingDataplane, guard NodeGuard) *agent {
	t.Helper()
	return startAgentBackend(t, socket, stateDir, cfg, lookup, dp, guard, capture.NFTables{})
}

// startAgentBackend is startAgentGuarded with a capture backend.
func startAgentBackend(t testing.TB, socket, stateDir string, cfg ServerConfig, lookup *staticLookup, dp *recordingDataplane, guard NodeGuard, backend capture.Backend) *agent {
	t.Helper()
	return startAgentServer(t, socket, stateDir, cfg, lookup, dp, func(s *Server) { s.Guard, s.Backend = guard, backend })
}

// startAgentServer is startAgent with the Server's other fields set by with (before Serve).
func startAgentServer(t testing.TB, socket, stateDir string, cfg ServerConfig, lookup *staticLookup, dp *recordingDataplane, with func(*Server)) *agent {
	t.Helper()
	cfg.Socket, cfg.StateDir = socket, stateDir
	if !cfg.HostIP.IsValid() {
		cfg.HostIP = netip.MustParseAddr(hostIP)
		cfg.ClusterDNS = []netip.Addr{netip.MustParseAddr(clusterDNS)}
	}
	a := &agent{socket: socket, state: stateDir, lookup: lookup, dp: dp, done: make(chan error, 1)}
	a.srv = &Server{Config: cfg, Lookup: lookup, Dataplane: dp, Backend: capture.NFTables{},
		Log: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	with(a.srv)
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go func() { a.done <- a.srv.Serve(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for !a.srv.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("agent not ready after 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Cleanup(a.stop)
	return a
}

func (a *agent) stop() {
	if a.cancel == nil {
		return
	}
	a.cancel()
	<-a.done
	a.cancel = nil
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) { w.t.Log(string(b)); return len(b), nil }

const (
	hostIP     = "198.18.0.1"
	clusterDNS = "10.96.0.10"
)

// tableIn reports whether the aether nftables table exists in the netns.
func tableIn(t testing.TB, ns *testenv.Netns) bool {
	t.Helper()
	out, err := ns.Command("nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables in %s: %v\n%s", ns.Name, err, out)
	}
	return strings.Contains(string(out), "inet "+capture.TableName)
}

// records returns the attachment records in a state dir.
func records(t testing.TB, dir string) []*Record {
	t.Helper()
	rs, err := (&Store{Dir: dir}).List()
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// originalDst returns SO_ORIGINAL_DST of an accepted IPv4 TCP connection.
func originalDst(c net.Conn) (netip.AddrPort, error) {
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		var m *unix.IPv6Mreq
		m, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if serr == nil {
			b := m.Multiaddr
			ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), uint16(b[2])<<8|uint16(b[3]))
		}
	})
	if err != nil {
		return ap, err
	}
	return ap, serr
}

func runIP(args ...string) ([]byte, error) { return exec.Command("ip", args...).CombinedOutput() }

// TestMain removes the plugin binary built for this test binary (pluginBinary).
func TestMain(m *testing.M) {
	code := m.Run()
	if builtBin != "" {
		os.RemoveAll(builtBin)
	}
	os.Exit(code)
}
