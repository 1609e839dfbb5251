//go:build linux

package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Netns is a named network namespace (/var/run/netns/<Name>) created for one test.
type Netns struct {
	Name string
	// Path is the bind-mounted namespace file, usable as a CNI netns path or as Envoy's
	// SocketAddress.network_namespace_filepath.
	Path string
}

// netnsDir is where named network namespaces are bind-mounted (iproute2's NETNS_RUN_DIR).
const netnsDir = "/var/run/netns"

// netnsName matches the names NewNetns gives: aet-<pid of the creating test process>-<hex>.
var netnsName = regexp.MustCompile(`^aet-([0-9]+)-[0-9a-f]+$`)

var sweepOnce sync.Once

// NewNetns creates a fresh named network namespace with its loopback up and deletes it when the
// test ends. It needs root (see RequireRoot). The caller's OS thread never changes namespace: the
// work happens on a fresh goroutine locked to its own thread, which is discarded afterwards.
//
// The name, aet-<pid>-<hex>, carries the test process's pid. A test binary killed before its
// cleanups ran (go test's -timeout panic, SIGKILL) leaves its namespaces behind; the first
// NewNetns of each process deletes those whose process is gone (SweepNetns).
func NewNetns(t testing.TB) *Netns {
	t.Helper()
	RequireRoot(t)
	sweepOnce.Do(func() {
		if err := shareNetnsDir(); err != nil {
			t.Logf("testenv: %v", err)
		}
		if err := SweepNetns(); err != nil {
			t.Logf("testenv: %v", err)
		}
	})
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	n := &Netns{Name: fmt.Sprintf("aet-%d-%s", os.Getpid(), hex.EncodeToString(b))}
	n.Path = netnsDir + "/" + n.Name
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

// shareNetnsDir makes netnsDir a shared mount point, as iproute2's `ip netns add` does the first
// time it runs on a machine (netns_add: make it shared, and when it is no mount point yet, bind
// it onto itself first). Done before the first namespace: one bind-mounted into the plain
// directory would otherwise end up beneath the bind mount the first `ip netns add` makes (a test
// or the substrate may run one), where no unmount of its path reaches it and its deletion fails
// with EBUSY.
func shareNetnsDir() error {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return fmt.Errorf("share %s: %w", netnsDir, err)
	}
	// Test binaries run in parallel: one lock, so that two first calls never both find the
	// directory unmounted and stack two bind mounts.
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "aether-testenv-netns.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("share %s: %w", netnsDir, err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("share %s: lock: %w", netnsDir, err)
	}
	err = unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err := unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mount %s onto itself: %w", netnsDir, err)
		}
		err = unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("make %s a shared mount: %w", netnsDir, err)
	}
	return nil
}

// SweepNetns deletes the namespaces NewNetns made in test processes that no longer run (names
// aet-<pid>-<hex> whose pid has no /proc entry). Namespaces of live processes, and every other
// name, are left alone. It returns the errors of deletions that failed, joined.
func SweepNetns() error {
	ents, err := os.ReadDir(netnsDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("sweep netns: %w", err)
	}
	var errs []error
	for _, e := range ents {
		m := netnsName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat("/proc/" + m[1]); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := netns.DeleteNamed(e.Name()); err != nil {
			errs = append(errs, fmt.Errorf("sweep netns %s: %w", e.Name(), err))
		}
	}
	return errors.Join(errs...)
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
