//go:build linux

package cni

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"
	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/internal/testenv"
)

// failingGuard is a node source guard whose every write fails (a kernel without nf_tables for
// the bridge family).
type failingGuard struct{}

func (failingGuard) Apply([]netip.Addr) (bool, error) {
	return false, errors.New("operation not supported")
}

// TestPrivilegedCNIGuardsNodeAddresses runs the real chain (bridge, host-local, aether-cni) with
// the node source guard on: the first repair guards HOST_IP, an ADD adds the pod's gateway before
// the pod runs (a pod outside the mesh too), and then a non-meshed pod that forges the gateway
// (as an ARP claim and as a datagram's source) toward a meshed neighbour is dropped while its
// own datagram passes; a flushed guard is put back by repair; an ADD whose guard cannot be
// written fails, naming the guard, and records nothing; a server whose guard cannot be written at
// all stops with its error instead of reporting ready.
func TestPrivilegedCNIGuardsNodeAddresses(t *testing.T) {
	testenv.RequireRoot(t)
	sock := filepath.Join(sockDir(t), "cni.sock")
	n := newNode(t, "1.1.0", "10.244.40.0/24", sock, nil)
	guard := capture.NFTGuard{NetnsPath: n.host.Path}
	lookup := &staticLookup{}
	lookup.set(map[string]bool{"plain/b": true}, nil)
	ag := startAgentGuarded(t, sock, t.TempDir(), ServerConfig{}, lookup, &recordingDataplane{}, guard)
	host, gw := netip.MustParseAddr(hostIP), netip.MustParseAddr("10.244.40.1")
	if err := guard.Check([]netip.Addr{host}); err != nil {
		t.Fatalf("after the first repair: %v", err)
	}

	podA, podB := testenv.NewNetns(t), testenv.NewNetns(t)
	resA, err := n.add(t, podRT(podA, "ctr-a", "mesh", "a"))
	if err != nil {
		t.Fatalf("ADD a: %v", err)
	}
	resB, err := n.add(t, podRT(podB, "ctr-b", "plain", "b"))
	if err != nil {
		t.Fatalf("ADD b: %v", err)
	}
	if err := guard.Check([]netip.Addr{gw, host}); err != nil {
		t.Fatalf("after the ADDs: %v", err)
	}
	ipA, ipB := netip.MustParseAddr(podIP(t, resA)), netip.MustParseAddr(podIP(t, resB))

	// b forges the gateway toward a (meshed, strict): an ARP claim and a datagram.
	var got net.PacketConn
	if err := podA.Do(func() (err error) { got, err = net.ListenPacket("udp", ":9999"); return err }); err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	macA, macB := podA.LinkMAC(t, "eth0"), podB.LinkMAC(t, "eth0")
	bridge := n.host.LinkMAC(t, "cni0").String()
	// a resolves the gateway first (a datagram to it), so it has an entry the claim would move.
	_ = podA.Do(func() error {
		c, err := net.Dial("udp", gw.String()+":9")
		if err == nil {
			_, _ = c.Write([]byte{0})
			c.Close()
		}
		return err
	})
	testenv.Eventually(t, 10*time.Second, "a's neighbour entry for the gateway", func() error {
		if got := podA.NeighMAC(t, "eth0", gw).String(); got != bridge {
			return errors.New("entry " + got + ", want the bridge's " + bridge)
		}
		return nil
	})
	testenv.SendFrame(t, podB, testenv.ARPRequest(macB, gw, ipA))
	testenv.SendFrame(t, podB, testenv.UDPFrame(macA, macB, gw, ipA, 9999))
	testenv.SendFrame(t, podB, testenv.UDPFrame(macA, macB, ipB, ipA, 9999))
	buf := make([]byte, 64)
	_ = got.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, from, err := got.ReadFrom(buf)
	if err != nil {
		t.Fatalf("b's own datagram did not arrive: %v", err)
	}
	if src := from.(*net.UDPAddr).AddrPort().Addr().Unmap(); src != ipB {
		t.Fatalf("a received a datagram from %s, want only b's own (%s)", src, ipB)
	}
	_ = got.SetReadDeadline(time.Now().Add(time.Second))
	if _, from, err := got.ReadFrom(buf); err == nil {
		t.Fatalf("a received a second datagram, from %s: the forged one passed", from)
	}
	if got := podA.NeighMAC(t, "eth0", gw).String(); got != bridge {
		t.Fatalf("a's entry for the gateway is %s after b's claim, want the bridge's %s", got, bridge)
	}

	// Drift: the guard's chain flushed by someone; repair puts it back.
	if out, err := n.host.Command("nft", "flush", "chain", "bridge", capture.GuardTable, "prerouting").CombinedOutput(); err != nil {
		t.Fatalf("nft flush: %v: %s", err, out)
	}
	if err := ag.srv.Repair(context.Background()); err != nil {
		t.Fatalf("repair: %v", err)
	}
	if err := guard.Check([]netip.Addr{gw, host}); err != nil {
		t.Fatalf("after repair: %v", err)
	}

	// A guard that cannot be written fails the ADD and leaves nothing behind.
	state := t.TempDir()
	srv := &Server{Config: ServerConfig{StateDir: state, HostIP: host}, Lookup: lookup, Dataplane: &recordingDataplane{},
		Backend: capture.NFTables{}, Guard: failingGuard{}, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))}
	podC := testenv.NewNetns(t)
	_, err = srv.Add(context.Background(), cniv1.Request{Network: "aethertest", Gateways: []netip.Addr{gw},
		Attachment: cniv1.PodAttachment{ContainerID: "ctr-c", Namespace: "mesh", Name: "c", NetnsPath: podC.Path,
			IPs: []netip.Addr{netip.MustParseAddr("10.244.40.99")}, Interface: "eth0"}})
	if err == nil || !strings.Contains(err.Error(), "install node source guard") || !strings.Contains(err.Error(), "operation not supported") {
		t.Fatalf("ADD with a failing guard: %v, want an error naming the guard and its cause", err)
	}
	if recs := records(t, state); len(recs) != 0 {
		t.Fatalf("a failed ADD left records: %+v", recs)
	}
	if tableIn(t, podC) {
		t.Fatal("a failed ADD left capture rules in the pod")
	}

	// A server whose guard cannot be written at all does not come up ready (it would fail every
	// ADD): Serve returns the guard's error.
	failing := &Server{Config: ServerConfig{Socket: filepath.Join(sockDir(t), "cni.sock"), StateDir: t.TempDir(), HostIP: host},
		Lookup: lookup, Dataplane: &recordingDataplane{}, Backend: capture.NFTables{}, Guard: failingGuard{},
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := failing.Serve(ctx); err == nil || !strings.Contains(err.Error(), "node source guard") || !strings.Contains(err.Error(), "operation not supported") {
		t.Fatalf("Serve with a guard that cannot be written: %v, want the guard's error", err)
	}
	if failing.Ready() {
		t.Fatal("a server without its guard reported ready")
	}
}
