//go:build linux

package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Netns is a named network namespace (/var/run/netns/<Name>) created for one test.
type Netns struct {
	Name string
	// Path is the bind-mounted namespace file, usable as a CNI netns path or as Envoy's
	// SocketAddress.network_namespace_filepath.
	Path string
}

// NewNetns creates a fresh named network namespace with its loopback up and deletes it when the
// test ends. It needs root (see RequireRoot). The caller's OS thread never changes namespace: the
// work happens on a fresh goroutine locked to its own thread, which is discarded afterwards.
func NewNetns(t testing.TB) *Netns {
	t.Helper()
	RequireRoot(t)
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	n := &Netns{Name: "aet-" + hex.EncodeToString(b)}
	n.Path = "/var/run/netns/" + n.Name
	err := onLockedThread(func() error {
		h, err := netns.NewNamed(n.Name)
		if err != nil {
			return fmt.Errorf("create netns %s: %w", n.Name, err)
		}
		defer h.Close()
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("find lo in %s: %w", n.Name, err)
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		if err := netns.DeleteNamed(n.Name); err != nil {
			t.Errorf("testenv: delete netns %s: %v", n.Name, err)
		}
	})
	return n
}

// Do runs fn inside the namespace on a fresh goroutine locked to its own OS thread, and returns
// fn's error. The thread is discarded afterwards, so no other goroutine ever runs in the
// namespace by accident (cilium/ebpf's testutils pattern).
func (n *Netns) Do(fn func() error) error {
	return onLockedThread(func() error {
		h, err := netns.GetFromPath(n.Path)
		if err != nil {
			return fmt.Errorf("open netns %s: %w", n.Path, err)
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			return fmt.Errorf("enter netns %s: %w", n.Path, err)
		}
		return fn()
	})
}

// Command returns a command that runs name with args inside the namespace (ip netns exec).
func (n *Netns) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// Netlink returns a netlink handle bound to the namespace; the caller closes it.
func (n *Netns) Netlink() (*netlink.Handle, error) {
	h, err := netns.GetFromPath(n.Path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", n.Path, err)
	}
	defer h.Close()
	return netlink.NewHandleAt(h)
}

// onLockedThread runs fn on a new goroutine locked to its OS thread and never unlocks it: when
// the goroutine returns, the Go runtime terminates the thread with whatever namespace it holds.
func onLockedThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- fn()
	}()
	return <-errc
}
