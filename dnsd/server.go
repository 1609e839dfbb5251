package dnsd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// DefaultPort is the agent resolver's port on the node IP (DESIGN.md, ports).
const DefaultPort = 18054

// Server timeouts (miekg/dns server fields).
const (
	DefaultReadTimeout  = 2 * time.Second // a TCP query's bytes, once the connection is open
	DefaultWriteTimeout = 2 * time.Second
	DefaultIdleTimeout  = 8 * time.Second // an idle TCP connection between queries
)

// DefaultMaxTCPConns is how many TCP connections the server holds open at once. miekg/dns reads
// a TCP query into a buffer of the length its 2-byte prefix claims (up to 64 KiB) and holds it
// until the read timeout, so this bounds the memory clients that stall after the prefix can pin
// (64 MiB at most).
const DefaultMaxTCPConns = 1024

// udpReadSize is the buffer a UDP query is read into, in bytes: queries are small, but EDNS0
// options (cookies, padding) make some longer than 512.
const udpReadSize = 4096

// ServerConfig configures a Server.
type ServerConfig struct {
	// Addr is "host:port" for both UDP and TCP (normally HOST_IP:18054). With port 0 both
	// transports get the same free port.
	Addr string
	// PacketConn and Listener, when both set, are used instead of binding Addr (the tests
	// open them inside a network namespace). The server closes them on Shutdown.
	PacketConn net.PacketConn
	Listener   net.Listener
	// ReadTimeout, WriteTimeout and IdleTimeout: zero means the Default* values above.
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// MaxTCPConns is how many TCP connections are served at once (0: DefaultMaxTCPConns); a
	// connection beyond it is closed at once (RFC 7766 section 6.2.2 lets a server close
	// connections to free resources) and the client retries or uses UDP.
	MaxTCPConns int
	// Logger receives the listening addresses (nil: discard).
	Logger *slog.Logger
}

// Server serves a Resolver over UDP and TCP: two miekg/dns servers, each with its own
// dns.ServeMux (never the global one).
type Server struct {
	cfg      ServerConfig
	res      *Resolver
	udp, tcp *dns.Server
	errs     chan error
	once     sync.Once

	mu      sync.Mutex
	started map[*dns.Server]bool
}

// NewServer returns a server for res; Start makes it listen.
func NewServer(res *Resolver, cfg ServerConfig) *Server {
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxTCPConns <= 0 {
		cfg.MaxTCPConns = DefaultMaxTCPConns
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, res: res, errs: make(chan error, 2), started: map[*dns.Server]bool{}}
}

// Start binds (unless given sockets), starts both servers and returns once both listen
// (NotifyStartedFunc), or the first error: a bind error, a server error, or ctx's.
func (s *Server) Start(ctx context.Context) error {
	pc, l := s.cfg.PacketConn, s.cfg.Listener
	if pc == nil || l == nil {
		var err error
		pc, l, err = listenBoth(s.cfg.Addr)
		if err != nil {
			return fmt.Errorf("start dns server: %w", err)
		}
	}
	idle := s.cfg.IdleTimeout
	started := make(chan *dns.Server, 2)
	mk := func(udp bool) *dns.Server {
		mux := dns.NewServeMux()
		mux.Handle(".", s.res)
		srv := &dns.Server{
			Handler:      mux,
			ReadTimeout:  s.cfg.ReadTimeout,
			WriteTimeout: s.cfg.WriteTimeout,
			IdleTimeout:  func() time.Duration { return idle },
			UDPSize:      udpReadSize,
		}
		if udp {
			srv.DecorateReader = s.fastReader
		}
		srv.NotifyStartedFunc = func() { started <- srv }
		return srv
	}
	s.udp, s.tcp = mk(true), mk(false)
	s.udp.PacketConn = plainIfBound(pc)
	s.tcp.Listener = &limitListener{Listener: l, slots: make(chan struct{}, s.cfg.MaxTCPConns)}
	for _, srv := range []*dns.Server{s.udp, s.tcp} {
		go func() {
			if err := srv.ActivateAndServe(); err != nil {
				s.errs <- err
			}
		}()
	}
	for n := 0; n < 2; {
		select {
		case srv := <-started:
			s.mu.Lock()
			s.started[srv] = true
			s.mu.Unlock()
			n++
		case err := <-s.errs:
			_ = s.Shutdown(context.Background())
			return fmt.Errorf("start dns server: %w", err)
		case <-ctx.Done():
			_ = s.Shutdown(context.Background())
			return fmt.Errorf("start dns server: %w", ctx.Err())
		}
	}
	s.cfg.Logger.Info("dns server listening", "udp", pc.LocalAddr().String(), "tcp", l.Addr().String())
	return nil
}

// Addrs returns the UDP and TCP addresses the server listens on (valid after Start).
func (s *Server) Addrs() (udp, tcp net.Addr) {
	return s.udp.PacketConn.LocalAddr(), s.tcp.Listener.Addr()
}

// Shutdown stops both servers (dns.Server.ShutdownContext: stop reading, wait for handlers in
// flight until ctx ends) and returns their errors joined. Calling it again does nothing.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, srv := range []*dns.Server{s.udp, s.tcp} {
			if srv == nil {
				continue
			}
			if !s.started[srv] {
				// Never started (Start failed first): close its socket ourselves.
				if srv.PacketConn != nil {
					_ = srv.PacketConn.Close()
				}
				if srv.Listener != nil {
					_ = srv.Listener.Close()
				}
				continue
			}
			if e := srv.ShutdownContext(ctx); e != nil {
				err = errors.Join(err, fmt.Errorf("shut down dns server: %w", e))
			}
		}
	})
	return err
}

// boundUDPConn hides a *net.UDPConn's type from miekg/dns, which then serves it as a generic
// net.PacketConn (ReadFrom/WriteTo) instead of reading and writing IP_PKTINFO control messages
// for every packet. Those only matter on a wildcard address, where the answer must leave from
// the address the query arrived at; on a socket bound to one address (HOST_IP:18054) the kernel
// picks that address anyway, and skipping them saves CPU on every query.
type boundUDPConn struct{ *net.UDPConn }

// plainIfBound wraps pc in boundUDPConn when it is a UDP socket bound to a specific address.
func plainIfBound(pc net.PacketConn) net.PacketConn {
	u, ok := pc.(*net.UDPConn)
	if !ok {
		return pc
	}
	if a, ok := u.LocalAddr().(*net.UDPAddr); ok && a.IP != nil && !a.IP.IsUnspecified() {
		return boundUDPConn{u}
	}
	return pc
}

// fastReader is the UDP server's DecorateReader: it wraps miekg/dns's reader r in a
// fastUDPReader for the resolver.
func (s *Server) fastReader(r dns.Reader) dns.Reader {
	pcr, ok := r.(dns.PacketConnReader)
	if !ok {
		return r // miekg/dns's own reader always is one; keep it as it is otherwise
	}
	return &fastUDPReader{PacketConnReader: pcr, res: s.res, in: make([]byte, udpReadSize), out: make([]byte, 0, 1024)}
}

// fastUDPReader reads the UDP socket for miekg/dns's server and answers, inside its read loop,
// the queries the index answers alone (Resolver.answerWire): no goroutine, no dns.Msg and no
// allocation per query, and no read deadline per packet (ShutdownContext's past deadline still
// ends the read). On Linux it reads and writes batchSize datagrams per system call
// (recvmmsg/sendmmsg). Every other packet is returned to the server, which unpacks it and calls
// the resolver's ServeDNS in a goroutine as usual (forwarded names, truncation, errors). Only a
// boundUDPConn is read this way; a wildcard socket, which needs IP_PKTINFO, goes through the
// wrapped reader unchanged. The server calls it from one goroutine, so its buffers are its own.
type fastUDPReader struct {
	dns.PacketConnReader
	res     *Resolver
	in, out []byte
	// batch is the batched I/O of the socket (nil until the first read; never on other OSes).
	batch *udpBatch
	// slow are the packets of the last batch that need the slow path, not yet returned.
	slow []slowPacket
}

// slowPacket is a copy of a datagram for the slow path and its sender.
type slowPacket struct {
	q    []byte
	from netip.AddrPort
}

// ReadPacketConn implements dns.PacketConnReader: it returns the next packet that needs the
// slow path (a copy of it and its sender) or a read error.
func (f *fastUDPReader) ReadPacketConn(conn net.PacketConn, timeout time.Duration) ([]byte, net.Addr, error) {
	c, ok := conn.(boundUDPConn)
	if !ok {
		return f.PacketConnReader.ReadPacketConn(conn, timeout)
	}
	if f.batch == nil && batchIO {
		b, err := newUDPBatch(c.UDPConn, len(f.in))
		if err != nil {
			return nil, nil, err
		}
		f.batch = b
	}
	if f.batch != nil {
		return f.readBatches()
	}
	for {
		n, from, err := c.ReadFromUDPAddrPort(f.in)
		if err != nil {
			return nil, nil, err
		}
		if wire, ok := f.res.answerWireGuarded(f.out[:0], f.in[:n], from.Addr().Unmap()); ok {
			f.out = wire
			if _, err := c.WriteToUDPAddrPort(wire, from); err != nil {
				f.res.log.Debug("write dns answer", "err", err)
			}
			continue
		}
		return append([]byte(nil), f.in[:n]...), net.UDPAddrFromAddrPort(from), nil
	}
}

// readBatches answers batches of datagrams until one holds a packet for the slow path, and
// returns those packets one per call.
func (f *fastUDPReader) readBatches() ([]byte, net.Addr, error) {
	b := f.batch
	var idx [batchSize]int
	var answers [batchSize][]byte
	for len(f.slow) == 0 {
		n, err := b.read()
		if err != nil {
			return nil, nil, err
		}
		k := 0
		for i := range n {
			q, from := b.packet(i)
			if from.IsValid() {
				if wire, ok := f.res.answerWireGuarded(b.wire[i][:0], q, from.Addr()); ok {
					b.wire[i], idx[k], answers[k] = wire, i, wire
					k++
					continue
				}
			}
			f.slow = append(f.slow, slowPacket{q: append([]byte(nil), q...), from: from})
		}
		if k > 0 {
			if err := b.write(idx[:k], answers[:k]); err != nil {
				f.res.log.Debug("write dns answers", "err", err)
			}
		}
	}
	p := f.slow[0]
	f.slow = f.slow[1:]
	if len(f.slow) == 0 {
		f.slow = nil
	}
	return p.q, net.UDPAddrFromAddrPort(p.from), nil
}

// listenBoth binds UDP and TCP on the same address; with port 0 it binds UDP on a free port and
// TCP on the same one, retrying a few times when TCP's is taken.
func listenBoth(addr string) (net.PacketConn, net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("parse listen address %q: %w", addr, err)
	}
	var last error
	for i := 0; i < 10; i++ {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("listen udp %s: %w", addr, err)
		}
		p := port
		if p == "0" {
			p = strconv.Itoa(pc.LocalAddr().(*net.UDPAddr).Port)
		}
		l, err := net.Listen("tcp", net.JoinHostPort(host, p))
		if err == nil {
			return pc, l, nil
		}
		pc.Close()
		last = fmt.Errorf("listen tcp %s: %w", net.JoinHostPort(host, p), err)
		if port != "0" {
			break
		}
	}
	return nil, nil, last
}

// limitListener accepts at most cap(slots) connections open at once; one accepted beyond that
// is closed at once and Accept waits for the next.
type limitListener struct {
	net.Listener
	slots chan struct{}
}

// Accept returns the next connection while a slot is free; it closes the ones that find none.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &limitConn{Conn: c, slots: l.slots}, nil
		default:
			_ = c.Close()
		}
	}
}

// limitConn frees its slot of the limitListener on its first Close.
type limitConn struct {
	net.Conn
	slots chan struct{}
	once  sync.Once
}

// Close closes the connection and frees its slot.
func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.slots })
	return err
}
