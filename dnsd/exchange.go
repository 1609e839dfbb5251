package dnsd

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// Transports, the "transport" label of MetricUpstreamConnections.
const (
	transportUDP = "udp"
	transportTCP = "tcp"
)

// upstreamMetrics are one upstream's counters (see metrics.go for their names).
type upstreamMetrics struct {
	openedUDP, openedTCP prometheus.Counter
	// strays counts UDP datagrams dropped for not answering the query in flight; strayFallbacks
	// the UDP exchanges abandoned for TCP after more than maxStrays of them.
	strays, strayFallbacks prometheus.Counter
	// oversized counts UDP answers larger than the client's size, asked again over TCP.
	oversized prometheus.Counter
}

func (u *upstream) count(pick func(*upstreamMetrics) prometheus.Counter) {
	if m := u.m.Load(); m != nil {
		pick(m).Inc()
	}
}

// fwdQuery is a query in wire form, packed once and sent to each upstream in turn with its own
// ID.
type fwdQuery struct {
	req *dns.Msg
	buf *[]byte // from getWireBuf; holds frame
	// frame is the TCP frame: a 2-byte length then the message (RFC 1035 section 4.2.2); the
	// UDP datagram is frame[2:], and frame[2:4] the ID of the upstream query in flight.
	frame []byte
	// qend is the offset just past the message's question section.
	qend int
	// limit is the largest UDP answer req's sender accepts, in bytes (MaxUDPSize).
	limit int
}

func (q *fwdQuery) msg() []byte { return q.frame[2:] }
func (q *fwdQuery) id() uint16  { return binary.BigEndian.Uint16(q.frame[2:]) }

// pack packs req into a pooled buffer (q.buf, for putWireBuf once q is done with), leaving room
// for the TCP length prefix. It returns an error when req does not pack, or packs to more than
// 65535 bytes or to a question section that does not parse.
func (q *fwdQuery) pack(req *dns.Msg) error {
	bp := getWireBuf(minWireBuf)
	msg, err := req.PackBuffer((*bp)[2:])
	if err != nil {
		putWireBuf(bp)
		return fmt.Errorf("pack query: %w", err)
	}
	if len(msg) > dns.MaxMsgSize {
		putWireBuf(bp)
		return fmt.Errorf("pack query: %d bytes, more than %d", len(msg), dns.MaxMsgSize)
	}
	if &msg[0] != &(*bp)[2] { // too large for the buffer: PackBuffer allocated another
		putWireBuf(bp)
		bp = getWireBuf(len(msg) + 2)
		copy((*bp)[2:], msg)
	}
	frame := (*bp)[:2+len(msg)]
	binary.BigEndian.PutUint16(frame, uint16(len(msg)))
	qend, ok := questionEnd(frame[2:])
	if !ok {
		putWireBuf(bp)
		return errors.New("pack query: question section does not parse")
	}
	*q = fwdQuery{req: req, buf: bp, frame: frame, qend: qend, limit: MaxUDPSize(req)}
	return nil
}

// randomID returns a random query ID from crypto/rand. With a source port reused across queries
// (rather than one drawn per query, RFC 5452 section 9.2) the ID and the question are what tell
// an answer from a forged one (RFC 5452 section 9.1).
//
// What stops an attacker from trying many IDs against one fixed port is the stray guard of
// exchangeUDP: a socket that read a stray datagram is closed after its exchange (the next one
// gets a new source port), and an exchange that reads more than maxStrays of them asks over TCP
// instead, as RFC 5452 section 9 suggests on detecting a spoofing attempt.
func randomID() uint16 {
	var b [2]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand.Read)
	return binary.BigEndian.Uint16(b[:])
}

// maxStrays is how many stray datagrams (another ID, or QR clear) one UDP exchange reads before
// it gives up on UDP and asks the same upstream over TCP. A late or duplicated answer to an
// earlier query on a reused socket is one or two; a flood of forged answers guessing the ID is
// thousands.
const maxStrays = 3

// reasonStrays is exchangeUDP's reason for giving up after more than maxStrays stray
// datagrams; exchangeWith then asks over TCP (it is never a failure reason).
const reasonStrays = "strays"

// exchangeWith runs q against one upstream within f's timeout, the overall deadline (zero:
// none) and ctx: over TCP when tcp is set, else over UDP, then over TCP when the UDP answer was
// larger than the client's size or the UDP socket read more than maxStrays stray datagrams. It
// returns the answer with req's ID, or the reason of the failure ("timeout", "network",
// "mismatch", "malformed", "servfail", "refused") and an error naming the upstream.
func (f *Forwarder) exchangeWith(ctx context.Context, overall time.Time, u *upstream, q *fwdQuery, tcp bool) (*dns.Msg, string, error) {
	binary.BigEndian.PutUint16(q.frame[2:], f.newID())
	deadline := time.Now().Add(f.timeout)
	if !overall.IsZero() && overall.Before(deadline) {
		deadline = overall
	}
	if tcp {
		return u.exchangeTCP(ctx, q, deadline)
	}
	resp, cut, reason, err := u.exchangeUDP(ctx, q, deadline)
	if reason == reasonStrays {
		// A possible forgery attempt on this socket's port (RFC 5452 section 9): TCP, whose
		// handshake an off-path attacker cannot complete, within what is left of the deadline.
		u.count(func(m *upstreamMetrics) prometheus.Counter { return m.strayFallbacks })
		f.log.Debug("stray datagrams on a UDP exchange; asking over TCP", "upstream", u.addr, "name", qname(q.req), "strays", maxStrays+1)
		return u.exchangeTCP(ctx, q, deadline)
	}
	if cut == nil {
		return resp, reason, err
	}
	defer putWireBuf(cut)
	// The datagram did not fit the client's size (an upstream that ignores it, or a 512-byte
	// limit without EDNS): the whole answer over TCP, as a client would on TC.
	u.count(func(m *upstreamMetrics) prometheus.Counter { return m.oversized })
	resp, reason, err = u.exchangeTCP(ctx, q, deadline)
	if err == nil || reason == "servfail" || reason == "refused" {
		return resp, reason, err
	}
	f.log.Debug("TCP retry of an oversized UDP answer failed; answering with its records that fit",
		"upstream", u.addr, "name", qname(q.req), "reason", reason, "err", err)
	opt := q.req.IsEdns0()
	wire := cutAnswer((*cut)[:q.limit], q.qend, opt != nil, opt != nil && opt.Do())
	resp, _, reason, err = u.parse(wire, q)
	return resp, reason, err
}

// refusalError is an upstream's SERVFAIL or REFUSED answer, with the Extended DNS Errors it
// carried (RFC 8914), which the resolver passes on when no upstream answers.
type refusalError struct {
	upstream string
	rcode    int
	ede      []*dns.EDNS0_EDE
}

func (e *refusalError) Error() string {
	return fmt.Sprintf("exchange with %s: %s", e.upstream, dns.RcodeToString[e.rcode])
}

// answerEDE returns the Extended DNS Error options of m's OPT (RFC 8914 section 2), or nil.
func answerEDE(m *dns.Msg) []*dns.EDNS0_EDE {
	var out []*dns.EDNS0_EDE
	if opt := m.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if e, ok := o.(*dns.EDNS0_EDE); ok {
				out = append(out, e)
			}
		}
	}
	return out
}

// exchangeUDP sends q over a UDP socket connected to u (an idle one when the pool holds one)
// and reads datagrams until the answer or the deadline. It returns the parsed answer, or cut, a
// pooled buffer holding the first q.limit+1 bytes of an answer longer than q.limit bytes (its
// ID and question checked), or a failure reason and error.
//
// A datagram with another ID or without QR (a stray) is dropped and counted; after more than
// maxStrays of them it gives up and returns reasonStrays (exchangeWith then asks over TCP). The
// socket goes back to the pool only after an answer to q that no stray came before; after a
// stray (the port may be under attack: the next exchange gets a new one), a timeout, a network
// error or a malformed answer it is closed, so that nothing sent for this query is ever read by
// a later one.
func (u *upstream) exchangeUDP(ctx context.Context, q *fwdQuery, deadline time.Time) (resp *dns.Msg, cut *[]byte, reason string, err error) {
	c := u.udp.get(time.Now().UnixNano())
	if c == nil {
		uc, err := net.DialUDP("udp", nil, u.udpAddr)
		if err != nil {
			return nil, nil, "network", fmt.Errorf("exchange with %s over udp: %w", u.addr, err)
		}
		c = uc
		u.count(func(m *upstreamMetrics) prometheus.Counter { return m.openedUDP })
	}
	answered, strays := false, 0
	// The deadline before the watch: a cancellation that comes first must not be overwritten.
	if err := c.SetDeadline(deadline); err != nil {
		c.Close()
		return nil, nil, "network", fmt.Errorf("exchange with %s over udp: %w", u.addr, err)
	}
	stop := watch(ctx, c)
	defer func() { u.release(&u.udp, c, answered && strays == 0, stop) }()
	if _, err := c.Write(q.msg()); err != nil {
		reason, err := netFailure(u.addr, transportUDP, err)
		return nil, nil, reason, err
	}
	bp := getWireBuf(q.limit + 1)
	buf := (*bp)[:q.limit+1]
	id := q.id()
	for {
		n, err := c.Read(buf)
		if err != nil {
			putWireBuf(bp)
			reason, err := netFailure(u.addr, transportUDP, err)
			return nil, nil, reason, err
		}
		b := buf[:n]
		if n < 3 || binary.BigEndian.Uint16(b) != id || b[2]&0x80 == 0 {
			// Not an answer to this query (QR clear, or another ID): drop it.
			u.count(func(m *upstreamMetrics) prometheus.Counter { return m.strays })
			if strays++; strays > maxStrays {
				putWireBuf(bp)
				return nil, nil, reasonStrays, fmt.Errorf("exchange with %s over udp: %d datagrams answering no query in flight", u.addr, strays)
			}
			continue
		}
		if n > q.limit {
			if !sameQuestion(b, q.msg(), q.qend) {
				putWireBuf(bp)
				return nil, nil, "mismatch", fmt.Errorf("exchange with %s over udp: answer does not match the question", u.addr)
			}
			answered = true
			return nil, bp, "", nil
		}
		resp, answered, reason, err = u.parse(b, q)
		putWireBuf(bp)
		return resp, nil, reason, err
	}
}

// exchangeTCP sends q over a TCP connection to u and reads its answer (RFC 1035 section 4.2.2),
// one query at a time per connection. An idle connection from the pool is used first (RFC 7766
// section 6.2.1); when the upstream has closed it (EOF where the answer's length should be, a
// reset or a broken pipe), the query is sent once more on a fresh connection. The connection goes back to the
// pool after an answer.
func (u *upstream) exchangeTCP(ctx context.Context, q *fwdQuery, deadline time.Time) (*dns.Msg, string, error) {
	for fresh := false; ; fresh = true {
		var c net.Conn
		if !fresh {
			c = u.tcp.get(time.Now().UnixNano())
		}
		reused := c != nil
		if c == nil {
			d := net.Dialer{Deadline: deadline}
			var err error
			if c, err = d.DialContext(ctx, "tcp", u.addr); err != nil {
				return nil, netFailureReason(err), fmt.Errorf("exchange with %s over tcp: %w", u.addr, err)
			}
			u.count(func(m *upstreamMetrics) prometheus.Counter { return m.openedTCP })
		}
		resp, answered, reason, err := u.roundTripTCP(ctx, c, q, deadline)
		if reused && !answered && closedByPeer(err) {
			continue
		}
		return resp, reason, err
	}
}

// roundTripTCP writes q's frame on c and reads one answer; answered reports whether c answered
// q (c then goes back to the pool, else it is closed).
func (u *upstream) roundTripTCP(ctx context.Context, c net.Conn, q *fwdQuery, deadline time.Time) (resp *dns.Msg, answered bool, reason string, err error) {
	// The deadline before the watch: a cancellation that comes first must not be overwritten.
	if err := c.SetDeadline(deadline); err != nil {
		c.Close()
		return nil, false, "network", fmt.Errorf("exchange with %s over tcp: %w", u.addr, err)
	}
	stop := watch(ctx, c)
	defer func() { u.release(&u.tcp, c, answered, stop) }()
	if _, err := c.Write(q.frame); err != nil {
		reason, err := netFailure(u.addr, transportTCP, err)
		return nil, false, reason, err
	}
	bp := getWireBuf(minWireBuf)
	defer func() { putWireBuf(bp) }()
	if _, err := io.ReadFull(c, (*bp)[:2]); err != nil {
		reason, err := netFailure(u.addr, transportTCP, err)
		return nil, false, reason, err
	}
	n := int(binary.BigEndian.Uint16(*bp))
	if n > len(*bp) {
		putWireBuf(bp)
		bp = getWireBuf(n)
	}
	b := (*bp)[:n]
	if _, err := io.ReadFull(c, b); err != nil {
		reason, err := netFailure(u.addr, transportTCP, err)
		return nil, false, reason, err
	}
	if n < 2 || binary.BigEndian.Uint16(b) != q.id() {
		return nil, false, "mismatch", fmt.Errorf("exchange with %s over tcp: answer does not match the question", u.addr)
	}
	return u.parse(b, q)
}

// parse checks that b, an upstream's answer in wire form with q's ID, answers q's question
// (RFC 5452 section 9.1: same name ignoring case, type and class) and unpacks it. answered is
// false when b does not match or unpack ("mismatch", "malformed"); a SERVFAIL or REFUSED answer
// is answered but returned as a failure ("servfail", "refused"), for the next upstream to be
// asked. The answer gets req's ID.
func (u *upstream) parse(b []byte, q *fwdQuery) (resp *dns.Msg, answered bool, reason string, err error) {
	if questionlessRefusal(b) {
		// The upstream's verdict on this very query (its ID matched): passed on as the answer,
		// with the question restored, and the upstream is not at fault. Its OPT is passed on
		// or left out as the upstream sent it: an answer without one tells an EDNS client to
		// ask again without EDNS (RFC 6891 section 7).
		resp = new(dns.Msg)
		resp.SetRcode(q.req, int(b[3]&0x0F))
		resp.RecursionAvailable = b[3]&0x80 != 0
		if b[10]|b[11] != 0 && q.req.IsEdns0() != nil {
			// Never an OPT to a client that sent none (RFC 6891 section 7), whatever the
			// upstream wrote.
			var m dns.Msg
			if m.Unpack(b) == nil {
				if opt := m.IsEdns0(); opt != nil && opt.ExtendedRcode() == 0 {
					resp.Extra = append(resp.Extra, opt)
				}
			}
		}
		return resp, true, "", nil
	}
	if !sameQuestion(b, q.msg(), q.qend) {
		return nil, false, "mismatch", fmt.Errorf("exchange with %s: answer does not match the question", u.addr)
	}
	resp = new(dns.Msg)
	if err := resp.Unpack(b); err != nil {
		return nil, false, "malformed", fmt.Errorf("exchange with %s: unpack answer: %w", u.addr, err)
	}
	switch resp.Rcode {
	case dns.RcodeServerFailure:
		return nil, true, "servfail", &refusalError{upstream: u.addr, rcode: resp.Rcode, ede: answerEDE(resp)}
	case dns.RcodeRefused:
		return nil, true, "refused", &refusalError{upstream: u.addr, rcode: resp.Rcode, ede: answerEDE(resp)}
	}
	resp.Id = q.req.Id
	return resp, true, "", nil
}

// release gives c back to pool after an exchange that answered, or closes it. A connection whose
// context was cancelled while it was in use (stop, from watch, returns false) is closed too: the
// cancellation may still move its deadline.
func (u *upstream) release(pool *connPool, c net.Conn, answered bool, stop func() bool) {
	if stop != nil && !stop() {
		answered = false
	}
	if !answered {
		c.Close()
		return
	}
	pool.put(c, time.Now().UnixNano())
}

// watch makes c's pending reads and writes fail when ctx is cancelled before its deadline; the
// returned function (nil for a context that is never cancelled) stops watching and reports
// whether it did so before the cancellation.
func watch(ctx context.Context, c net.Conn) func() bool {
	if ctx.Done() == nil {
		return nil
	}
	return context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
}

// netFailure classifies an I/O error with an upstream: "timeout" or "network".
func netFailure(addr, transport string, err error) (string, error) {
	return netFailureReason(err), fmt.Errorf("exchange with %s over %s: %w", addr, transport, err)
}

func netFailureReason(err error) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	return "network"
}

// closedByPeer reports whether err says the upstream closed the connection: EOF before the
// answer's first byte, a reset or a broken pipe (a reused connection the upstream closed while
// it was idle, RFC 7766 section 6.2.3).
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// questionEnd returns the offset just past the question section of the DNS message m (RFC 1035
// section 4.1.2), whose names must be uncompressed (as in a query). ok is false when m is cut
// short or holds a compressed or malformed name there.
func questionEnd(m []byte) (end int, ok bool) {
	if len(m) < 12 {
		return 0, false
	}
	off := 12
	for range binary.BigEndian.Uint16(m[4:]) {
		for {
			if off >= len(m) {
				return 0, false
			}
			l := int(m[off])
			off++
			if l == 0 {
				break
			}
			if l > 63 {
				return 0, false // a compression pointer or an extended label type
			}
			off += l
		}
		off += 4
		if off > len(m) {
			return 0, false
		}
	}
	return off, true
}

// questionlessRefusal reports whether answer b is a FORMERR or NOTIMP without a question section
// (QDCOUNT 0) nor records: RFC 1035 section 4.1.1 leaves the question out of such errors to the
// server, and BIND and miekg/dns's SetRcodeFormatError (CoreDNS, kube-dns) leave it out. Such an
// answer cannot be matched by its question; its ID must match, as for any answer.
func questionlessRefusal(b []byte) bool {
	if len(b) < 12 || b[2]&0x80 == 0 {
		return false
	}
	rcode := b[3] & 0x0F
	return (rcode == dns.RcodeFormatError || rcode == dns.RcodeNotImplemented) &&
		binary.BigEndian.Uint16(b[4:]) == 0 && binary.BigEndian.Uint16(b[6:]) == 0 && binary.BigEndian.Uint16(b[8:]) == 0
}

// sameQuestion reports whether answer a holds the question section of query q, which ends at
// qend (questionEnd): the same number of questions, the same names ignoring ASCII case (RFC
// 4343), types and classes. Only the first qend bytes of a are read, so a may be cut after them.
func sameQuestion(a, q []byte, qend int) bool {
	if len(a) < qend || a[4] != q[4] || a[5] != q[5] {
		return false
	}
	off := 12
	for range binary.BigEndian.Uint16(q[4:]) {
		for {
			l := int(q[off])
			if a[off] != q[off] {
				return false
			}
			off++
			if l == 0 {
				break
			}
			for i := off; i < off+l; i++ {
				if lowerASCII(a[i]) != lowerASCII(q[i]) {
					return false
				}
			}
			off += l
		}
		if !bytes.Equal(a[off:off+4], q[off:off+4]) {
			return false
		}
		off += 4
	}
	return true
}

func lowerASCII(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}

// cutAnswer returns a copy of b, the first bytes of a longer DNS message whose question section
// ends at qend, that ends after the last of its resource records b holds whole, with the section
// counts changed to match and TC set (RFC 2181 section 9: the records that fit, the client may
// ask again over TCP). The answer, authority and additional sections are kept in order: once a
// record is cut, the ones after it are dropped.
//
// The upstream's OPT record is never kept (an OPT is not forwarded, RFC 6891 section 6.1.1),
// nor any record after it. When edns is set (the client's query had an OPT) the copy ends with
// the resolver's own OPT (putOPT, DO as given), records being dropped to make room for it: RFC
// 6891 section 7 wants an OPT in every answer to an EDNS query, a truncated one included. The
// copy is never longer than b (without room for even the header, the question and the OPT, it
// has no OPT).
func cutAnswer(b []byte, qend int, edns, do bool) []byte {
	room := len(b)
	if edns && qend+optLen <= len(b) {
		room -= optLen
	} else {
		edns = false
	}
	off := qend
	var counts [3]uint16
	cut := false
	for s := range 3 {
		n := binary.BigEndian.Uint16(b[6+2*s:])
		for i := uint16(0); i < n && !cut; i++ {
			rr, next, err := dns.UnpackRR(b, off)
			if err != nil || next <= off || next > room || rr.Header().Rrtype == dns.TypeOPT {
				cut = true
				break
			}
			off = next
			counts[s]++
		}
	}
	out := make([]byte, off, off+optLen)
	copy(out, b[:off])
	out[2] |= 0x02 // TC
	if edns {
		out = out[:off+optLen]
		putOPT(out[off:], do)
		counts[2]++
	}
	for s, n := range counts {
		binary.BigEndian.PutUint16(out[6+2*s:], n)
	}
	return out
}
