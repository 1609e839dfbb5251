//go:build linux

package xds

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// TestPrivilegedPodNetnsGone pins what Envoy 1.40 does with the listeners of a pod whose netns
// path no longer exists (the sandbox is gone, its CNI DEL has not arrived yet). A running Envoy
// keeps them and ACKs every later snapshot, including ones that change that pod's listeners and
// clusters (an updated listener takes over the already-bound sockets; an upstream bind netns is
// only opened per connection). A new Envoy process (a restart) must open the netns to bind and
// rejects the snapshot, naming the path; the agent's repair releases a pod whose netns is gone
// (cni.Server.Repair, at start and every RepairInterval), and the snapshot without the pod is
// ACKed by that Envoy.
func TestPrivilegedPodNetnsGone(t *testing.T) {
	for _, c := range []struct {
		name  string
		delta bool
	}{{"sotw", false}, {"delta", true}} {
		t.Run(c.name, func(t *testing.T) { testPodNetnsGone(t, c.delta) })
	}
}

func testPodNetnsGone(t *testing.T, delta bool) {
	f := newMeshFixture(t, time.Hour, delta, Options{})
	vips := map[string]netip.Addr{"ghost": netip.MustParseAddr("10.96.0.30"), "late": netip.MustParseAddr("10.96.0.31"), "third": netip.MustParseAddr("10.96.0.32")}
	alpha, _ := f.addPod("alpha", true)
	ghost, _ := f.addPod("ghost", false)
	serveEcho(ghost.Listen(t, "0.0.0.0:9000"))
	// The pod's netns under a name of its own, as a runtime's sandbox has: a bind mount in the
	// shared /var/run/netns (so Envoy's mount namespace sees it come and go), removed when the
	// sandbox goes. The name matches testenv's sweep pattern, so a killed test's mount is swept.
	path := filepath.Join(filepath.Dir(ghost.Path), ghost.Name+"ff")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(ghost.Path, path, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(path, unix.MNT_DETACH); _ = os.Remove(path) })
	g := *ghost
	g.Path = path
	f.pods["ghost"] = &g
	f.set(podAddrMesh(f, 1, vips, "ghost"))

	// The sandbox goes.
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	// A new pod and TCP service: every capture listener changes, the gone pod's too.
	late, _ := f.addPod("late", false)
	serveEcho(late.Listen(t, "0.0.0.0:9000"))
	f.set(podAddrMesh(f, 2, vips, "ghost", "late"))
	// The gone pod's inbound listener changes and gains a cluster bound in its netns.
	m := podAddrMesh(f, 3, vips, "ghost", "late")
	for _, p := range m.Pods {
		if p.Name == "ghost" {
			p.Ports = append(p.Ports, model.PodPort{Port: 9001, Protocol: model.ProtocolTCP})
		}
	}
	f.set(m)
	if n, last := f.srv.NACKs(); n != 0 {
		t.Fatalf("a running Envoy rejected listeners of a pod whose netns is gone: %d NACKs, last %q", n, last)
	}
	ls, err := f.admin("/listeners")
	if err != nil || !strings.Contains(ls, inboundListenerName(m.Pods[slices.IndexFunc(m.Pods, func(p *model.LocalPod) bool { return p.Name == "ghost" })])) {
		t.Fatalf("/listeners %q (%v), want the gone pod's inbound listener kept", ls, err)
	}

	// Envoy restarts: it cannot open the netns and rejects the snapshot.
	pid := f.sup.PID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "the restarted Envoy rejects the gone pod's listeners", func() error {
		if n, last := f.srv.NACKs(); n == 0 || !strings.Contains(last, path) {
			return fmt.Errorf("NACKs %d, last %q; want one naming %s", n, last, path)
		}
		return nil
	})
	// State of the world: the server rolls back once to the last ACKed snapshot, which the new
	// Envoy rejects as well; it must not roll back again (each rollback is a new version, so
	// that looped at about 160 NACKs a second). Delta: one NACK.
	want := uint64(1)
	if !delta {
		want = 2
		testenv.Eventually(t, time.Minute, "the rolled-back snapshot rejected", func() error {
			if n, _ := f.srv.NACKs(); n < want {
				return fmt.Errorf("%d NACKs, want %d", n, want)
			}
			return nil
		})
	}
	time.Sleep(2 * time.Second) // a loop would add hundreds meanwhile
	if n, _ := f.srv.NACKs(); n != want {
		t.Errorf("%d NACKs after the restart, want %d (no rollback of a rejected rollback)", n, want)
	}
	// The snapshot without the pod (what the agent serves once repair released it) is ACKed,
	// and the restarted Envoy serves the other pods.
	f.set(podAddrMesh(f, 4, vips, "late"))
	testenv.Eventually(t, time.Minute, "a pod reached through the restarted Envoy", func() error {
		return echoVia(alpha, vips["late"].String()+":9000", "after the restart")
	})
}
