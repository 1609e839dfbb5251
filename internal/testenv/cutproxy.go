package testenv

import (
	"io"
	"net"
	"sync"
	"testing"
)

// CutProxy forwards TCP connections from a loopback port to a target until Cut: then every open
// connection is dropped and new ones are closed at once, as in a network partition, until
// Restore. Tests put it between a client and a server (etcd, the API server) to simulate an
// outage without stopping the server.
type CutProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
}

// NewCutProxy listens on 127.0.0.1:0 and forwards to target ("host:port"); it closes when the
// test ends.
func NewCutProxy(t testing.TB, target string) *CutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: cut proxy: %v", err)
	}
	p := &CutProxy{l: l, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { l.Close(); p.Cut() })
	go p.serve()
	return p
}

// Addr returns the proxy's "127.0.0.1:port".
func (p *CutProxy) Addr() string { return p.l.Addr().String() }

// URL returns "http://127.0.0.1:port" (an etcd client URL).
func (p *CutProxy) URL() string { return "http://" + p.Addr() }

func (p *CutProxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			c.Close()
			continue
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			u.Close()
			continue
		}
		p.conns[c], p.conns[u] = true, true
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
		}
		go pipe(u, c)
		go pipe(c, u)
	}
}

// Cut drops every connection and refuses new ones until Restore.
func (p *CutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// Restore accepts connections again.
func (p *CutProxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}
