package testenv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// Ports handed out by ReservePort lie below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), so the local end of an outgoing connection (an etcd
// client's, an Envoy upstream's) can never take a port between its reservation and its bind: that
// race made "free" ports from 127.0.0.1:0 clash under a loaded CI run.
const (
	reserveLow  = 20000
	reserveHigh = 32000 // exclusive; lowered to the ephemeral range's start when that is lower
	portLockDir = "/tmp/aether-testenv-ports"
)

var (
	rangeOnce sync.Once
	rangeHigh int
)

func reserveRange() (lo, hi int) {
	rangeOnce.Do(func() {
		rangeHigh = reserveHigh
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
		if err != nil {
			return
		}
		f := strings.Fields(string(b))
		if len(f) == 2 {
			if start, err := strconv.Atoi(f[0]); err == nil && start < rangeHigh {
				rangeHigh = start
			}
		}
	})
	return reserveLow, rangeHigh
}

// ReservePort returns a loopback port that is free for both TCP and UDP and reserved for this
// process until release is called: a lock file under /tmp/aether-testenv-ports (flock, so a
// crashed process's reservations end with it) keeps every other test process that uses
// ReservePort off it. The port lies below the ephemeral range (see reserveRange), so only a
// process that binds fixed ports can still take it. When the range is too small (an
// ip_local_port_range starting below 21000) it falls back to a kernel-chosen ephemeral port.
func ReservePort() (port int, release func(), err error) {
	lo, hi := reserveRange()
	if hi-lo < 1000 {
		return ephemeralPort()
	}
	if err := os.MkdirAll(portLockDir, 0o777); err != nil {
		return 0, nil, fmt.Errorf("testenv: reserve port: %w", err)
	}
	n := hi - lo
	start := rand.IntN(n)
	for i := 0; i < n; i++ {
		p := lo + (start+i)%n
		f, err := os.OpenFile(filepath.Join(portLockDir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return 0, nil, fmt.Errorf("testenv: reserve port: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				continue
			}
			return 0, nil, fmt.Errorf("testenv: reserve port %d: flock: %w", p, err)
		}
		if !bindable(p) {
			f.Close()
			continue
		}
		var once sync.Once
		return p, func() { once.Do(func() { f.Close() }) }, nil
	}
	return 0, nil, fmt.Errorf("testenv: reserve port: no free port in [%d, %d)", lo, hi)
}

// bindable reports whether 127.0.0.1:p can be bound for TCP and for UDP right now.
func bindable(p int) bool {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	u.Close()
	return true
}

func ephemeralPort() (int, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, nil, fmt.Errorf("testenv: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, func() {}, nil
}

// FreePort returns a loopback port free for TCP and UDP, reserved (ReservePort) until the test
// ends. The caller binds it soon; only a process outside the tests that binds fixed ports below
// the ephemeral range can still take it.
func FreePort(t testing.TB) int {
	t.Helper()
	p, release, err := ReservePort()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return p
}
