//go:build linux

package substrate

import (
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
)

// forwarder copies TCP connections accepted in a namespace to an address in the root namespace:
// node processes reach the API servers and the registry on loopback through it.
type forwarder struct {
	mu    sync.Mutex
	ls    []net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func (f *forwarder) listen(ns *testenv.Netns, addr, target string) error {
	l, err := listenIn(ns, addr)
	if err != nil {
		return fmt.Errorf("listen on %s in %s: %w", addr, ns.Name, err)
	}
	f.mu.Lock()
	f.ls = append(f.ls, l)
	if f.conns == nil {
		f.conns = map[net.Conn]struct{}{}
	}
	f.mu.Unlock()
	f.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			f.wg.Go(func() { f.pipe(c, target) })
		}
	})
	return nil
}

func (f *forwarder) track(c net.Conn, add bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if add {
		if f.ls == nil {
			return false
		}
		f.conns[c] = struct{}{}
	} else {
		delete(f.conns, c)
	}
	return true
}

func (f *forwarder) pipe(down net.Conn, target string) {
	defer down.Close()
	up, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	if !f.track(down, true) || !f.track(up, true) {
		return
	}
	defer f.track(down, false)
	defer f.track(up, false)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, down); done <- struct{}{} }()
	go func() { _, _ = io.Copy(down, up); done <- struct{}{} }()
	<-done
}

// close stops accepting and cuts every forwarded connection.
func (f *forwarder) close() {
	f.mu.Lock()
	for _, l := range f.ls {
		l.Close()
	}
	f.ls = nil
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
