package testenv

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

func TestReservePortHoldsUntilRelease(t *testing.T) {
	lo, hi := reserveRange()
	if hi-lo < 1000 {
		t.Skipf("ip_local_port_range starts at %d: ReservePort falls back to ephemeral ports here", hi)
	}
	seen := map[int]bool{}
	var releases []func()
	for i := 0; i < 50; i++ {
		p, release, err := ReservePort()
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
		if p < lo || p >= hi {
			t.Fatalf("port %d outside [%d, %d)", p, lo, hi)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice while reserved", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("reserved port %d not bindable: %v", p, err)
		}
		l.Close()
	}
	// Another open of a reserved port's lock file (as another test process makes) cannot take it
	// until the reservation is released.
	var p0 int
	for p := range seen {
		p0 = p
		break
	}
	f, err := os.OpenFile(filepath.Join(portLockDir, strconv.Itoa(p0)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		t.Fatalf("lock of reserved port %d taken by a second open", p0)
	}
	for _, r := range releases {
		r()
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("lock of released port %d: %v", p0, err)
	}
}
