package dnsd

import (
	"math/bits"
	"net"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// connPool keeps the idle connections of one upstream and one transport for reuse, as CoreDNS's
// forward plugin does (plugin/pkg/proxy/persistent.go): at most max of them, each closed once
// it has been idle for expire. A connection is either taken by one exchange (get) or idle in
// the pool, never both, so a socket serves one exchange at a time. Idle connections are a stack:
// the most recently used is taken first, so a light load keeps reusing one socket and the others
// age out. It is safe for concurrent use; its zero value keeps nothing (max 0).
type connPool struct {
	mu     sync.Mutex
	idle   []idleConn // oldest first; the last is the most recently used
	max    int
	expire time.Duration
	// timer closes expired idle connections (sweep) when nobody calls get or put; armed says
	// whether it is pending.
	timer  *time.Timer
	armed  bool
	closed bool
}

type idleConn struct {
	c    net.Conn
	used int64 // unix nanoseconds when it was put back
}

// get returns the most recently used idle connection, or nil when none is left whose idle time
// at now (unix nanoseconds) is below the pool's expiry. Expired ones are closed.
func (p *connPool) get(now int64) net.Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.idle)
	if n == 0 {
		return nil
	}
	top := p.idle[n-1]
	p.idle[n-1] = idleConn{}
	p.idle = p.idle[:n-1]
	if now-top.used < int64(p.expire) {
		return top.c
	}
	// The most recently used one has expired: so have all the others.
	top.c.Close()
	p.closeExpiredLocked(now)
	return nil
}

// put gives c back to the pool, idle from now (unix nanoseconds), or closes it when the pool is
// full or closed.
func (p *connPool) put(c net.Conn, now int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) >= p.max {
		c.Close()
		return
	}
	p.idle = append(p.idle, idleConn{c: c, used: now})
	if !p.armed {
		p.armed = true
		if p.timer == nil {
			p.timer = time.AfterFunc(p.expire, p.sweep)
		} else {
			p.timer.Reset(p.expire)
		}
	}
}

// sweep closes the idle connections that have expired and schedules itself again for the
// oldest one left.
func (p *connPool) sweep() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = false
	if p.closed {
		return
	}
	now := time.Now().UnixNano()
	p.closeExpiredLocked(now)
	if len(p.idle) > 0 {
		p.armed = true
		p.timer.Reset(time.Duration(p.idle[0].used + int64(p.expire) - now))
	}
}

// closeExpiredLocked closes the idle connections idle for expire or more at now.
func (p *connPool) closeExpiredLocked(now int64) {
	i := 0
	for i < len(p.idle) && now-p.idle[i].used >= int64(p.expire) {
		p.idle[i].c.Close()
		p.idle[i] = idleConn{}
		i++
	}
	if i > 0 {
		p.idle = append(p.idle[:0], p.idle[i:]...)
	}
}

// len returns how many idle connections the pool holds.
func (p *connPool) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// close closes every idle connection and makes put close the connections given back from now on.
func (p *connPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.timer != nil {
		p.timer.Stop()
	}
	for i := range p.idle {
		p.idle[i].c.Close()
		p.idle[i] = idleConn{}
	}
	p.idle = p.idle[:0]
}

// wireBufs pools the buffers a forwarded exchange packs its query into and reads its answer
// into, by size class: class i holds buffers of minWireBuf<<i bytes, from 512 (a UDP answer
// without EDNS, RFC 1035 section 4.2.1) to 64 KiB (the largest DNS message with its TCP length
// prefix, RFC 1035 section 4.2.2).
var wireBufs [8]sync.Pool

const minWireBuf = dns.MinMsgSize

// wireBufClass returns the class of the smallest buffer of at least n bytes (n at most 64 KiB).
func wireBufClass(n int) int {
	if n <= minWireBuf {
		return 0
	}
	return bits.Len(uint((n - 1) / minWireBuf)) // 513..1024 → 1, 1025..2048 → 2, ...
}

// getWireBuf returns a buffer whose length is at least n bytes (n at most 64 KiB), from the
// pool when it holds one. Its content is unspecified.
func getWireBuf(n int) *[]byte {
	i := wireBufClass(n)
	if bp, ok := wireBufs[i].Get().(*[]byte); ok {
		return bp
	}
	b := make([]byte, minWireBuf<<i)
	return &b
}

// putWireBuf gives a buffer from getWireBuf back to its pool.
func putWireBuf(bp *[]byte) {
	i := wireBufClass(len(*bp))
	if i < len(wireBufs) && minWireBuf<<i == len(*bp) {
		wireBufs[i].Put(bp)
	}
}
