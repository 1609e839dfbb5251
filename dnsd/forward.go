package dnsd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// Forwarder defaults.
const (
	// DefaultUpstreamTimeout bounds one exchange with one upstream (dial, write, read).
	DefaultUpstreamTimeout = 2 * time.Second
	// DefaultUpstreamBackoff is how long an upstream that failed is tried only after the
	// healthy ones.
	DefaultUpstreamBackoff = 5 * time.Second
	// DefaultUpstreamIdleTimeout is how long a connection to an upstream is kept for reuse
	// after its last exchange (CoreDNS forward's "expire" default).
	DefaultUpstreamIdleTimeout = 10 * time.Second
	// DefaultUpstreamMaxIdleConns is how many idle connections are kept per upstream and
	// transport (UDP, TCP); more may be open at once while queries are in flight.
	DefaultUpstreamMaxIdleConns = 64
)

// ErrAllUpstreamsFailed is returned by Forwarder.Exchange when no upstream gave a usable answer.
var ErrAllUpstreamsFailed = errors.New("all upstreams failed")

// Forwarder sends queries to the upstream resolvers (kube-dns, from the agent's resolv.conf) in
// order, healthy ones first, with a timeout per upstream, and fails over on a timeout, a network
// error, a mismatched or malformed answer, SERVFAIL or REFUSED. Like CoreDNS's forward plugin it
// reuses its connections to each upstream (UDP sockets and TCP connections, RFC 7766 section
// 6.2.1), closing them once idle for ForwarderOptions.IdleTimeout; Close closes the idle ones.
// It is safe for concurrent use.
type Forwarder struct {
	upstreams []*upstream
	log       *slog.Logger
	backoff   time.Duration
	timeout   time.Duration
	onFailure func(upstream, reason string)
	// newID returns the ID of one upstream query (randomID; tests set their own).
	newID func() uint16
}

// upstream is one upstream resolver and its idle connections.
type upstream struct {
	addr      string
	udpAddr   *net.UDPAddr
	udp, tcp  connPool
	downUntil atomic.Int64 // unix nanoseconds; 0 when healthy
	// m holds the upstream's counters once a Resolver has hooked its metrics (nil before).
	m atomic.Pointer[upstreamMetrics]
}

// ForwarderOptions configure NewForwarder.
type ForwarderOptions struct {
	// Timeout bounds one exchange with one upstream (0: DefaultUpstreamTimeout).
	Timeout time.Duration
	// Backoff is how long a failed upstream is demoted behind the healthy ones
	// (0: DefaultUpstreamBackoff).
	Backoff time.Duration
	// IdleTimeout is how long a connection to an upstream is kept for reuse after its last
	// exchange (0 or less: DefaultUpstreamIdleTimeout).
	IdleTimeout time.Duration
	// MaxIdleConns is how many idle connections are kept per upstream and transport
	// (0: DefaultUpstreamMaxIdleConns; negative: none, every exchange opens and closes its
	// own socket).
	MaxIdleConns int
	// OnFailure, when set, is called for every failed exchange with the upstream's address
	// and a reason ("timeout", "network", "servfail", "refused", "mismatch", "malformed").
	OnFailure func(upstream, reason string)
	// Logger receives debug records of failed exchanges (nil: discard).
	Logger *slog.Logger
}

// NewForwarder returns a forwarder to the upstreams, each "host:port" or a bare IP address
// (port 53). It returns an error naming the address when one does not parse.
func NewForwarder(upstreams []string, o ForwarderOptions) (*Forwarder, error) {
	if o.Timeout <= 0 {
		o.Timeout = DefaultUpstreamTimeout
	}
	if o.Backoff <= 0 {
		o.Backoff = DefaultUpstreamBackoff
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultUpstreamIdleTimeout
	}
	switch {
	case o.MaxIdleConns == 0:
		o.MaxIdleConns = DefaultUpstreamMaxIdleConns
	case o.MaxIdleConns < 0:
		o.MaxIdleConns = 0
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	f := &Forwarder{log: o.Logger, backoff: o.Backoff, timeout: o.Timeout, onFailure: o.OnFailure, newID: randomID}
	for _, a := range upstreams {
		addr, err := normalizeUpstream(a)
		if err != nil {
			return nil, err
		}
		ua, err := net.ResolveUDPAddr("udp", addr) // an IP literal: no lookup
		if err != nil {
			return nil, fmt.Errorf("parse upstream %q: %w", a, err)
		}
		u := &upstream{addr: addr, udpAddr: ua}
		u.udp = connPool{max: o.MaxIdleConns, expire: o.IdleTimeout}
		u.tcp = connPool{max: o.MaxIdleConns, expire: o.IdleTimeout}
		f.upstreams = append(f.upstreams, u)
	}
	return f, nil
}

func normalizeUpstream(a string) (string, error) {
	if ip := net.ParseIP(strings.Trim(a, "[]")); ip != nil {
		return net.JoinHostPort(ip.String(), "53"), nil
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return "", fmt.Errorf("parse upstream %q: %w", a, err)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return "", fmt.Errorf("parse upstream %q: port %q is not a port number", a, port)
	}
	if net.ParseIP(strings.SplitN(host, "%", 2)[0]) == nil {
		return "", fmt.Errorf("parse upstream %q: host %q is not an IP address", a, host)
	}
	return a, nil
}

// Upstreams returns the upstream addresses in configured order.
func (f *Forwarder) Upstreams() []string {
	out := make([]string, len(f.upstreams))
	for i, u := range f.upstreams {
		out[i] = u.addr
	}
	return out
}

// Close closes the idle connections to every upstream; a connection in use by an exchange is
// closed when the exchange ends. Exchange still works after Close, without keeping connections.
// It returns nil.
func (f *Forwarder) Close() error {
	for _, u := range f.upstreams {
		u.udp.close()
		u.tcp.close()
	}
	return nil
}

// Exchange forwards req unchanged except for its ID (a fresh random ID per upstream query), so
// its EDNS0 options (UDP size, DO, cookies, client subnet, ...) reach the upstream, over TCP
// when tcp is set and over UDP otherwise. The answer carries req's ID.
//
// Over UDP the answer is read into a buffer of the size req's sender accepts (MaxUDPSize: 512
// bytes without EDNS, RFC 1035 section 4.2.1; the EDNS UDP payload size otherwise, RFC 6891
// section 6.2.3). A datagram that does not fit is not an error: the query is asked again over
// TCP and that answer returned (the caller truncates it to the client's size, RFC 2181 section
// 9); if the TCP exchange fails, the records of the datagram that fit are returned with TC set,
// and with the resolver's OPT when req has one (cutAnswer; RFC 6891 section 7).
// A truncated UDP answer is returned as is (TC set, so the client retries over TCP). A
// datagram with another ID, or without the QR bit, is dropped and reading goes on (a late answer
// to an earlier query on a reused socket, or a forgery), but the socket is closed after the
// exchange rather than reused, and after more than 3 such datagrams the query is asked over TCP
// of the same upstream instead (RFC 5452 section 9: a spoofing attempt met by a switch to TCP).
// One with the query's ID and another question is a mismatch, and the next upstream is asked.
//
// It returns ErrAllUpstreamsFailed (wrapped, with the last cause) when every upstream failed,
// the context's error, or an error when req does not pack.
func (f *Forwarder) Exchange(ctx context.Context, req *dns.Msg, tcp bool) (*dns.Msg, error) {
	deadline, _ := ctx.Deadline()
	return f.exchange(ctx, deadline, req, tcp)
}

// exchange is Exchange with an overall deadline besides ctx's (zero: none). The resolver passes
// a context that is never cancelled (context.Background) and its forward timeout as deadline:
// then no goroutine or timer watches the context, the sockets' deadlines do all the work.
func (f *Forwarder) exchange(ctx context.Context, deadline time.Time, req *dns.Msg, tcp bool) (*dns.Msg, error) {
	if len(f.upstreams) == 0 {
		return nil, fmt.Errorf("forward %s: no upstreams: %w", qname(req), ErrAllUpstreamsFailed)
	}
	var q fwdQuery
	if err := q.pack(req); err != nil {
		return nil, fmt.Errorf("forward %s: %w", qname(req), err)
	}
	defer putWireBuf(q.buf)
	// done returns the error that ends the query early: ctx's, or the deadline's.
	done := func() error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return context.DeadlineExceeded
		}
		return nil
	}
	now := time.Now().UnixNano()
	var last error
	var ede []*dns.EDNS0_EDE
	try := func(u *upstream) (*dns.Msg, bool) {
		resp, reason, err := f.exchangeWith(ctx, deadline, u, &q, tcp)
		if err == nil {
			u.downUntil.Store(0)
			return resp, true
		}
		last = err
		if r := (*refusalError)(nil); errors.As(err, &r) {
			ede = append(ede, r.ede...)
		}
		if done() == nil {
			u.downUntil.Store(time.Now().Add(f.backoff).UnixNano())
		}
		if f.onFailure != nil {
			f.onFailure(u.addr, reason)
		}
		f.log.Debug("upstream failed", "upstream", u.addr, "name", qname(req), "reason", reason, "err", err)
		return nil, false
	}
	// Healthy upstreams first, in order; then the demoted ones, so that with every upstream
	// demoted the query is still tried everywhere. Each upstream is tried once per query: which
	// pass it belongs to is decided before the first, so an upstream that fails in the first
	// pass (and is demoted by it) is not asked again in the second.
	var small [8]bool
	demoted := small[:0]
	for _, u := range f.upstreams {
		demoted = append(demoted, u.downUntil.Load() > now)
	}
	for pass := 0; pass < 2; pass++ {
		for i, u := range f.upstreams {
			if demoted[i] != (pass == 1) {
				continue
			}
			if resp, ok := try(u); ok {
				return resp, nil
			}
			if err := done(); err != nil {
				return nil, fmt.Errorf("forward %s: %w", qname(req), err)
			}
		}
	}
	return nil, &allFailedError{name: qname(req), last: last, ede: ede}
}

// allFailedError is Exchange's error when no upstream gave a usable answer: it is
// ErrAllUpstreamsFailed and wraps the last upstream's error, and holds the Extended DNS Errors
// of the upstreams' SERVFAIL and REFUSED answers (RFC 8914), in the order they came.
type allFailedError struct {
	name string
	last error
	ede  []*dns.EDNS0_EDE
}

func (e *allFailedError) Error() string {
	return fmt.Sprintf("forward %s: %v: %v", e.name, ErrAllUpstreamsFailed, e.last)
}

func (e *allFailedError) Unwrap() []error { return []error{ErrAllUpstreamsFailed, e.last} }

// upstreamEDE returns the Extended DNS Errors the upstreams' refusals carried, when err is
// Exchange's error because every upstream failed, else nil.
func upstreamEDE(err error) []*dns.EDNS0_EDE {
	var all *allFailedError
	if errors.As(err, &all) {
		return all.ede
	}
	return nil
}

func qname(m *dns.Msg) string {
	if len(m.Question) == 0 {
		return "(no question)"
	}
	return m.Question[0].Name
}

// ClusterDomainFromResolvConf returns the Kubernetes cluster domain named by the search list of
// a resolv.conf file, lower case and without the trailing dot, or "" when the list names none.
// The kubelet writes the list of a ClusterFirst or ClusterFirstWithHostNet pod as
// "<ns>.svc.<domain> svc.<domain> <domain>" followed by the node's own (Kubernetes "DNS for
// Services and Pods"), so the domain is the first entry X such that "svc.X" is an entry too.
// As in glibc's res_init (resolv.conf(5)), the last search or domain line wins. It returns an
// error naming the file when it cannot be read.
func ClusterDomainFromResolvConf(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read resolv.conf %s: %w", path, err)
	}
	var search []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 && (f[0] == "search" || f[0] == "domain") {
			search = search[:0]
			for _, e := range f[1:] {
				search = append(search, strings.ToLower(strings.TrimSuffix(e, ".")))
			}
		}
	}
	for _, e := range search {
		if e != "" && slices.Contains(search, "svc."+e) {
			return e, nil
		}
	}
	return "", nil
}

// ReadResolvConf returns the nameservers of a resolv.conf file as "ip:53" (or "[ip]:53")
// addresses, in file order, dropping any in exclude (the resolver's own address, so it never
// forwards to itself).
//
// Like glibc's res_init (resolv.conf(5)), a nameserver line whose value is not an IPv4 address
// or an IPv6 address (with an optional %zone) is skipped and the others are used: "nameserver
// 10.0.0.10:53", a host name, "[fd00::10]" or an empty value. Each skipped line is logged once
// as a warning naming the file, the line number and the value. Text after the address on the
// line is ignored, as glibc does; so are every other keyword (search, domain, options) and
// comment lines. It returns an error naming the file when it cannot be read or when no usable
// nameserver is left.
func ReadResolvConf(path string, log *slog.Logger, exclude ...string) ([]string, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read resolv.conf %s: %w", path, err)
	}
	var out []string
	skipped, excluded := 0, 0
	for i, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "nameserver" {
			continue
		}
		value := ""
		if len(f) > 1 {
			value = f[1]
		}
		ip, err := netip.ParseAddr(value)
		if err != nil {
			skipped++
			log.Warn("resolv.conf nameserver line skipped: not an IP address (glibc skips it too)",
				"file", path, "line", i+1, "value", value)
			continue
		}
		a := net.JoinHostPort(ip.String(), "53")
		if slices.Contains(exclude, a) {
			excluded++
			continue
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("read resolv.conf %s: no usable nameserver (%d skipped as not IP addresses, %d excluded as the resolver's own address)", path, skipped, excluded)
	}
	return out, nil
}
