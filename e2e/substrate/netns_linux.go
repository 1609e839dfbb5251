//go:build linux

package substrate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// sharedMount bind-mounts dir onto itself with shared propagation, so namespace files bound
// under it later also appear in the node mount namespaces (created as its slaves). The root
// filesystem on these machines is a private mount, where they would not.
func sharedMount(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create netns dir: %w", err)
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind netns dir %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return fmt.Errorf("share netns dir %s: %w", dir, err)
	}
	return nil
}

// createNetns creates a network namespace bound at dir/name with its loopback up. The work runs
// on a goroutine locked to a fresh OS thread that is discarded afterwards.
func createNetns(dir, name string) (*testenv.Netns, error) {
	path := filepath.Join(dir, name)
	err := onLockedThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare netns: %w", err)
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL, 0o444)
		if err != nil {
			return fmt.Errorf("create netns file: %w", err)
		}
		f.Close()
		self := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err := unix.Mount(self, path, "", unix.MS_BIND, ""); err != nil {
			_ = os.Remove(path)
			return fmt.Errorf("bind netns %s: %w", path, err)
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("find lo: %w", err)
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	return &testenv.Netns{Name: name, Path: path}, nil
}

// deleteNetns unmounts and removes a namespace file; a missing file is not an error. The
// namespace itself goes away with its last process.
func deleteNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}

// onLockedThread runs fn on a new goroutine locked to its OS thread and never unlocks it, so the
// runtime ends the thread (and whatever namespace it entered) when fn returns.
func onLockedThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- fn()
	}()
	return <-errc
}

// dialIn opens a connection from inside ns. The socket is created in the namespace and keeps it.
func dialIn(ctx context.Context, ns *testenv.Netns, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// listenIn opens a TCP listener inside ns.
func listenIn(ns *testenv.Netns, addr string) (net.Listener, error) {
	var l net.Listener
	err := ns.Do(func() (err error) { l, err = net.Listen("tcp", addr); return err })
	return l, err
}

// listenPacketIn opens a UDP socket inside ns.
func listenPacketIn(ns *testenv.Netns, addr string) (net.PacketConn, error) {
	var l net.PacketConn
	err := ns.Do(func() (err error) { l, err = net.ListenPacket("udp", addr); return err })
	return l, err
}

// sysctlIn writes a sysctl (path under /proc/sys) inside ns.
func sysctlIn(ns *testenv.Netns, key, value string) error {
	return ns.Do(func() error {
		if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644); err != nil {
			return fmt.Errorf("set sysctl %s in %s: %w", key, ns.Name, err)
		}
		return nil
	})
}
