package dnsd

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/miekg/dns"
	"golang.org/x/sync/singleflight"
)

// Cache defaults, those of NodeLocal DNSCache (its CoreDNS cache plugin: `cache 30`, denial
// TTL 5 s, 9984 entries in each of its two caches).
const (
	// DefaultCacheSize is how many forwarded answers the agent caches (the default of its
	// --dns-cache-size).
	DefaultCacheSize = 10000
	// DefaultCacheMaxTTL caps how long a positive answer is cached.
	DefaultCacheMaxTTL = 30 * time.Second
	// DefaultCacheMaxNegativeTTL caps how long a negative answer (NXDOMAIN, NODATA) is cached.
	DefaultCacheMaxNegativeTTL = 5 * time.Second
)

// maxCacheEntry is the longest answer the cache keeps, in bytes (its records, without OPT):
// longer ones are forwarded every time. It bounds the cache's memory to about
// size x (maxCacheEntry + the entry's overhead), about 45 MiB at DefaultCacheSize.
const maxCacheEntry = 4096

// CacheOptions configure the cache of forwarded answers (ResolverOptions.Cache). The zero value
// disables it.
type CacheOptions struct {
	// Size is how many answers are kept (least recently used evicted first); 0 disables the
	// cache and the coalescing of identical queries.
	Size int
	// MaxTTL caps how long a positive answer is kept (0: DefaultCacheMaxTTL); whole seconds,
	// as DNS TTLs are.
	MaxTTL time.Duration
	// MaxNegativeTTL caps how long a negative answer is kept (0: DefaultCacheMaxNegativeTTL);
	// whole seconds.
	MaxNegativeTTL time.Duration
	// ServeStale is the maximum stale age (RFC 8767 section 5, "maximum stale timer"): how long
	// past its expiry an entry may still answer, with TTL StaleAnswerTTL, when no fresh answer
	// can be had (serve-stale, stale.go). 0 turns serve-stale off; otherwise whole seconds, from
	// 1 s to MaxServeStale (CheckServeStale).
	ServeStale time.Duration
	// Prefetch is how many hits on an entry make it popular: an entry answered from at least
	// Prefetch times is refreshed in the background by the hit that finds less than a tenth of
	// its lifetime left (prefetch, stale.go). 0 turns prefetch off.
	Prefetch int

	// clock returns monotonic nanoseconds (nil: since the cache's creation); tests set it.
	clock func() int64
	// after is the client response timer's timer (nil: time.After); tests set it.
	after func(time.Duration) <-chan time.Time
}

// cache holds forwarded answers in wire form, keyed by cacheKey, and coalesces identical
// queries in flight. It is safe for concurrent use.
type cache struct {
	lru            *lru.Cache[string, *cacheEntry]
	maxTTL, maxNeg uint32 // seconds
	// maxStale is CacheOptions.ServeStale in nanoseconds (0: no serve-stale); prefetch is
	// CacheOptions.Prefetch (0: no prefetch).
	maxStale int64
	prefetch uint32
	clock    func() int64
	after    func(time.Duration) <-chan time.Time
	flight   singleflight.Group
	m        *metrics
	// forward sends a query upstream (Resolver.forward); set by NewResolver.
	forward func(req *dns.Msg, tcp bool) (*dns.Msg, error)
	// prefetchSlots holds one token per prefetch in flight (startPrefetch), at most
	// MaxForwards/prefetchShare; set by NewResolver.
	prefetchSlots chan struct{}
}

// newCache returns the cache o describes (its metrics, m, and forward function still to set),
// or nil when o.Size is 0. It returns an error naming the field and value for a negative size or
// Prefetch, a TTL cap that is not a positive whole number of seconds, or a ServeStale that
// CheckServeStale refuses.
func newCache(o CacheOptions) (*cache, error) {
	if o.Size < 0 {
		return nil, fmt.Errorf("new dns cache: Size %d: want 0 (no cache) or more", o.Size)
	}
	if o.Prefetch < 0 || int64(o.Prefetch) > 1<<32-1 {
		return nil, fmt.Errorf("new dns cache: Prefetch %d: want 0 (no prefetch) or a number of hits", o.Prefetch)
	}
	if o.ServeStale != 0 {
		if err := CheckServeStale(o.ServeStale); err != nil {
			return nil, fmt.Errorf("new dns cache: ServeStale %s: %w", o.ServeStale, err)
		}
	}
	if o.Size == 0 {
		return nil, nil
	}
	if o.MaxTTL == 0 {
		o.MaxTTL = DefaultCacheMaxTTL
	}
	if o.MaxNegativeTTL == 0 {
		o.MaxNegativeTTL = DefaultCacheMaxNegativeTTL
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"MaxTTL", o.MaxTTL}, {"MaxNegativeTTL", o.MaxNegativeTTL}} {
		if err := CheckCacheTTL(d.v); err != nil {
			return nil, fmt.Errorf("new dns cache: %s %s: %w", d.field, d.v, err)
		}
	}
	l, err := lru.New[string, *cacheEntry](o.Size)
	if err != nil {
		return nil, fmt.Errorf("new dns cache: %w", err)
	}
	if o.clock == nil {
		epoch := time.Now()
		o.clock = func() int64 { return int64(time.Since(epoch)) }
	}
	if o.after == nil {
		o.after = time.After
	}
	return &cache{lru: l, maxTTL: uint32(o.MaxTTL / time.Second), maxNeg: uint32(o.MaxNegativeTTL / time.Second),
		maxStale: int64(o.ServeStale), prefetch: uint32(o.Prefetch), clock: o.clock, after: o.after}, nil
}

// CheckCacheTTL returns an error unless d is a valid cap of the cache's TTLs (CacheOptions
// MaxTTL, MaxNegativeTTL): a whole number of seconds from 1 s to 2^31-1 s (the largest TTL, RFC
// 2181 section 8).
func CheckCacheTTL(d time.Duration) error {
	if d < time.Second || d%time.Second != 0 || d/time.Second > 1<<31-1 {
		return errors.New("want a whole number of seconds, at least 1s")
	}
	return nil
}

// The cache key: the question name lower-cased in presentation form, then cacheKeySuffix bytes:
// QTYPE, QCLASS (big endian) and the flags below.
const cacheKeySuffix = 5

// Flags of the cache key: answers differ with them (RFC 4035 section 3.2: DO asks for DNSSEC
// records, CD for unvalidated data, AD for the validation status, RFC 6840 section 5.7).
const (
	keyDO = 1 << iota
	keyCD
	keyAD
)

// putKeySuffix writes the key suffix for qtype, qclass and flags into b (cacheKeySuffix bytes).
func putKeySuffix(b []byte, qtype, qclass uint16, flags byte) {
	b[0], b[1], b[2], b[3], b[4] = byte(qtype>>8), byte(qtype), byte(qclass>>8), byte(qclass), flags
}

// appendCacheKey appends the cache key of req to buf and returns it, or false when req is not
// cached: opcode other than QUERY, not exactly one question, a response, TSIG, several OPT
// records or an EDNS version other than 0, or an EDNS Client Subnet option (RFC 7871: the
// answer depends on the client's subnet).
func appendCacheKey(buf []byte, req *dns.Msg) ([]byte, bool) {
	if req.Opcode != dns.OpcodeQuery || req.Response || len(req.Question) != 1 || req.IsTsig() != nil {
		return buf, false
	}
	var flags byte
	if opt := req.IsEdns0(); opt != nil {
		if countOPT(req.Extra) > 1 || opt.Version() != 0 {
			return buf, false
		}
		for _, o := range opt.Option {
			if o.Option() == dns.EDNS0SUBNET {
				return buf, false
			}
		}
		if opt.Do() {
			flags |= keyDO
		}
	}
	if req.CheckingDisabled {
		flags |= keyCD
	}
	if req.AuthenticatedData {
		flags |= keyAD
	}
	q := req.Question[0]
	// Lower-case ASCII: presentation form escapes every other byte (\DDD).
	for i := 0; i < len(q.Name); i++ {
		buf = append(buf, lowerASCII(q.Name[i]))
	}
	buf = append(buf, make([]byte, cacheKeySuffix)...)
	putKeySuffix(buf[len(buf)-cacheKeySuffix:], q.Qtype, q.Qclass, flags)
	return buf, true
}

// cacheKey completes the cache key of the parsed UDP query q (wq.key) and returns it, without
// copying: valid while wq is. The fast path's queries are class IN.
func (wq *wireQuery) cacheKey(q []byte) string {
	var flags byte
	if wq.do {
		flags |= keyDO
	}
	if q[3]&0x10 != 0 {
		flags |= keyCD
	}
	if q[3]&0x20 != 0 {
		flags |= keyAD
	}
	putKeySuffix(wq.key[wq.n:], wq.qtype, dns.ClassINET, flags)
	return unsafe.String(&wq.key[0], wq.n+cacheKeySuffix)
}

// cacheEntry is a cached answer: the upstream's answer packed without its ID and OPT record,
// with where its TTLs are.
type cacheEntry struct {
	// wire is the answer: header (ID 0; the upstream's flags and rcode), the question, and the
	// answer, authority and additional records (no OPT), compressed.
	wire []byte
	// qend is the offset just past the question in wire.
	qend int
	// ttls are the offsets of the records' TTL fields in wire and their values when stored.
	ttls []ttlField
	// stored and expires are clock readings, in nanoseconds: when the upstream answered, and
	// when the entry stops being served fresh.
	stored, expires int64
	// negative is whether the answer is NXDOMAIN or NODATA (RFC 2308 section 2).
	negative bool
	// prefetchAt is the clock reading from which a hit may prefetch the entry: a tenth of its
	// lifetime before expires.
	prefetchAt int64
	// hits counts the hits answered from the entry, up to the cache's prefetch threshold (only
	// counted with prefetch on); prefetched is set by the hit that starts its prefetch (and
	// cleared again when the prefetch budget made it skip, retryAt then being the clock reading
	// from which a hit may try again).
	hits       atomic.Uint32
	prefetched atomic.Bool
	retryAt    atomic.Int64
	// recheckAt is a clock reading: until then the expired entry answers stale at once, without
	// a refresh (RFC 8767 section 5, failure recheck timer; set when a refresh failed).
	recheckAt atomic.Int64
}

type ttlField struct {
	off uint16
	ttl uint32
}

// lifetime returns how long answer resp to a query of type qtype may be cached, in seconds
// (0: not at all), and whether it is negative:
//   - only NOERROR and NXDOMAIN answers without TC are cached (not SERVFAIL, REFUSED, FORMERR,
//     ...; a truncated answer is incomplete);
//   - a positive answer lives the smallest TTL of its answer and authority records, capped by
//     maxTTL (RFC 2181 section 5.2: an RRset's TTL; RFC 1035 section 7.4: a TTL of 0 is not
//     cached);
//   - a negative answer (NXDOMAIN, or NODATA: NOERROR with no record of qtype in the answer,
//     RFC 2308 section 2.2) lives min(SOA TTL, SOA MINIMUM) of the SOA in its authority
//     section, or less when another of its records' TTL is smaller, capped by maxNeg (RFC 2308
//     section 5); without an SOA it is not cached (RFC 2308 section 5: "Negative responses
//     without SOA records SHOULD NOT be cached").
func lifetime(resp *dns.Msg, qtype uint16, maxTTL, maxNeg uint32) (ttl uint32, negative bool) {
	if resp.Truncated || (resp.Rcode != dns.RcodeSuccess && resp.Rcode != dns.RcodeNameError) {
		return 0, false
	}
	negative = resp.Rcode == dns.RcodeNameError || !answersType(resp.Answer, qtype)
	ttl = ^uint32(0)
	var soa *dns.SOA
	for _, sec := range [][]dns.RR{resp.Answer, resp.Ns} {
		for _, rr := range sec {
			if rr.Header().Rrtype != dns.TypeOPT {
				ttl = min(ttl, rr.Header().Ttl)
			}
		}
	}
	for _, rr := range resp.Ns {
		if s, ok := rr.(*dns.SOA); ok && soa == nil {
			soa = s
		}
	}
	if !negative {
		return min(ttl, maxTTL), false
	}
	if soa == nil {
		return 0, true
	}
	return min(ttl, soa.Minttl, maxNeg), true
}

// answersType reports whether answer holds a record of qtype (any record for ANY; RFC 2308
// section 2.2 calls an answer without one NODATA, a CNAME chain before it included).
func answersType(answer []dns.RR, qtype uint16) bool {
	for _, rr := range answer {
		if qtype == dns.TypeANY || rr.Header().Rrtype == qtype {
			return true
		}
	}
	return false
}

// newCacheEntry returns the entry for upstream answer resp to req, received at clock reading
// now, or nil when it is not cached (lifetime; also an answer with TSIG, with an OPT record
// outside the additional section, or longer than maxCacheEntry once packed). It packs resp's
// records (which sets their RDLENGTH fields): resp must not be in use elsewhere.
func (c *cache) newCacheEntry(req, resp *dns.Msg, now int64) *cacheEntry {
	q := req.Question[0]
	ttl, negative := lifetime(resp, q.Qtype, c.maxTTL, c.maxNeg)
	if ttl == 0 || resp.IsTsig() != nil {
		return nil
	}
	for _, sec := range [][]dns.RR{resp.Answer, resp.Ns} {
		for _, rr := range sec {
			if rr.Header().Rrtype == dns.TypeOPT {
				return nil // only in the additional section (RFC 6891 section 6.1.1)
			}
		}
	}
	m := &dns.Msg{MsgHdr: resp.MsgHdr, Compress: true, Question: []dns.Question{q}, Answer: resp.Answer, Ns: resp.Ns}
	m.Id = 0
	for _, rr := range resp.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			m.Extra = append(m.Extra, rr)
		}
	}
	wire, err := m.Pack()
	if err != nil || len(wire) > maxCacheEntry {
		return nil
	}
	qend, ttls, ok := walkTTLs(wire)
	if !ok {
		return nil
	}
	life := int64(ttl) * int64(time.Second)
	return &cacheEntry{wire: wire, qend: qend, ttls: ttls, stored: now, expires: now + life, negative: negative,
		prefetchAt: now + life - life/prefetchPart}
}

// walkTTLs returns the end of the question of the message in wire (one question) and the
// offsets and values of its records' TTL fields (RFC 1035 section 4.1.3); ok is false when the
// message does not parse.
func walkTTLs(wire []byte) (qend int, ttls []ttlField, ok bool) {
	if len(wire) < 12 || wire[4] != 0 || wire[5] != 1 {
		return 0, nil, false
	}
	// The question's name comes first in the message, so it is never compressed.
	if qend, ok = questionEnd(wire); !ok {
		return 0, nil, false
	}
	skipName := func(off int) int {
		for off < len(wire) {
			l := int(wire[off])
			switch {
			case l == 0:
				return off + 1
			case l&0xC0 == 0xC0:
				return off + 2
			case l&0xC0 != 0:
				return -1
			}
			off += 1 + l
		}
		return -1
	}
	off := qend
	n := (int(wire[6])<<8 | int(wire[7])) + (int(wire[8])<<8 | int(wire[9])) + (int(wire[10])<<8 | int(wire[11]))
	ttls = make([]ttlField, 0, n)
	for range n {
		off = skipName(off)
		if off < 0 || off+10 > len(wire) {
			return 0, nil, false
		}
		t := uint32(wire[off+4])<<24 | uint32(wire[off+5])<<16 | uint32(wire[off+6])<<8 | uint32(wire[off+7])
		ttls = append(ttls, ttlField{off: uint16(off + 4), ttl: t})
		off += 10 + (int(wire[off+8])<<8 | int(wire[off+9]))
	}
	if off != len(wire) {
		return 0, nil, false
	}
	return qend, ttls, true
}

// get returns the live entry under key (nil: a miss, or an expired entry) and the clock.
func (c *cache) get(key string) (*cacheEntry, int64) {
	now := c.clock()
	e, ok := c.lru.Get(key)
	if !ok || now >= e.expires {
		return nil, now
	}
	return e, now
}

// lookup returns the entry under key, expired or not (nil: none), and the clock.
func (c *cache) lookup(key string) (*cacheEntry, int64) {
	now := c.clock()
	e, _ := c.lru.Get(key)
	return e, now
}

// add stores e under key, counting an eviction when it pushed out the least recently used one.
func (c *cache) add(key string, e *cacheEntry) {
	if c.lru.Add(key, e) {
		c.m.cacheEvictions.Inc()
	}
}

// appendAnswer appends e's answer, at clock reading now, to the query with the given ID, header
// byte 2 and 3 (for RD and CD) and question (its wire form, the client's letter case) to buf:
// the upstream's header flags and rcode with the query's ID, RD and CD, every record's TTL
// less the entry's age in whole seconds (never below 0, RFC 2308 section 5, RFC 1035 section
// 7.4), or staleTTL when it is not 0 (a stale answer, RFC 8767 section 4), and, when edns, the
// resolver's OPT with DO as given (RFC 6891 section 7), which for a stale answer carries the
// Extended DNS Error staleEDE (RFC 8914 sections 4.4 and 4.20). ok is false when question is not
// the entry's (another length).
func (e *cacheEntry) appendAnswer(buf []byte, id uint16, flags2, flags3 byte, question []byte, edns, do bool, now int64, staleTTL uint32) (wire []byte, ok bool) {
	if len(question) != e.qend-12 {
		return buf, false
	}
	need := len(e.wire)
	if edns {
		need += optLen
		if staleTTL != 0 {
			need += edeLen
		}
	}
	if cap(buf) < need {
		buf = make([]byte, 0, need)
	}
	b := buf[:need]
	copy(b, e.wire)
	b[0], b[1] = byte(id>>8), byte(id)
	b[2] = b[2]&^0x01 | flags2&0x01 // RD
	b[3] = b[3]&^0x10 | flags3&0x10 // CD
	copy(b[12:], question)
	age := uint32((now - e.stored) / int64(time.Second))
	for _, f := range e.ttls {
		t := f.ttl - min(f.ttl, age)
		if staleTTL != 0 {
			t = staleTTL
		}
		b[f.off], b[f.off+1], b[f.off+2], b[f.off+3] = byte(t>>24), byte(t>>16), byte(t>>8), byte(t)
	}
	if edns {
		putOPT(b[len(e.wire):], do)
		if staleTTL != 0 {
			putEDE(b[len(e.wire):], e.staleEDE())
		}
		ar := (int(b[10])<<8 | int(b[11])) + 1
		b[10], b[11] = byte(ar>>8), byte(ar)
	}
	return b, true
}

// staleEDE returns the Extended DNS Error INFO-CODE of a stale answer from e: 19, "Stale NXDOMAIN
// Answer", for an NXDOMAIN (RFC 8914 section 4.20); else 3, "Stale Answer" (section 4.4: a NODATA
// answer's rcode is NOERROR).
func (e *cacheEntry) staleEDE() uint16 {
	if e.rcode() == dns.RcodeNameError {
		return dns.ExtendedErrorCodeStaleNXDOMAINAnswer
	}
	return dns.ExtendedErrorCodeStaleAnswer
}

// rcode returns the entry's response code (the header's 4 bits; only NOERROR and NXDOMAIN
// are cached).
func (e *cacheEntry) rcode() int { return int(e.wire[3] & 0x0F) }

// answerWire answers the parsed UDP query q from the cache, appending the answer to buf; ok is
// false on a miss (left to the slow path, which counts it) or when the answer does not fit the
// client's UDP size (truncation is the slow path's).
func (c *cache) answerWire(buf, q []byte, wq *wireQuery) (wire []byte, rcode int, ok bool) {
	e, now := c.get(wq.cacheKey(q))
	if e == nil {
		return buf, 0, false
	}
	need := len(e.wire)
	if wq.edns {
		need += optLen
	}
	if need > wq.maxSize {
		return buf, 0, false
	}
	wire, ok = e.appendAnswer(buf, uint16(q[0])<<8|uint16(q[1]), q[2], q[3], q[12:wq.qend], wq.edns, wq.do, now, 0)
	if !ok {
		return buf, 0, false
	}
	c.m.cacheHits.Inc()
	if c.prefetch != 0 && e.wantPrefetch(now, c.prefetch) {
		c.startPrefetch(wq.cacheKey(q), e, now)
	}
	return wire, e.rcode(), true
}

// answerMsg answers req from entry e at clock reading now (every TTL staleTTL when that is not
// 0, appendAnswer), appending the answer to buf and truncating it to maxSize as Index.Respond
// does (truncateWire, RFC 2181 section 9). ok is false when req's question does not pack
// as the entry's.
func (e *cacheEntry) answerMsg(buf []byte, req *dns.Msg, maxSize int, now int64, staleTTL uint32) (wire []byte, ok bool) {
	q := req.Question[0]
	var qb [maxNameWire + 4]byte
	off, err := dns.PackDomainName(q.Name, qb[:], 0, nil, false)
	if err != nil || off+4 > len(qb) {
		return buf, false
	}
	qb[off], qb[off+1], qb[off+2], qb[off+3] = byte(q.Qtype>>8), byte(q.Qtype), byte(q.Qclass>>8), byte(q.Qclass)
	var f2, f3 byte
	if req.RecursionDesired {
		f2 = 0x01
	}
	if req.CheckingDisabled {
		f3 = 0x10
	}
	opt := req.IsEdns0()
	wire, ok = e.appendAnswer(buf, req.Id, f2, f3, qb[:off+4], opt != nil, opt != nil && opt.Do(), now, staleTTL)
	if ok && len(wire) > maxSize {
		wire = truncateWire(wire[:0], wire, maxSize)
	}
	return wire, ok
}

// flightResult is what one upstream exchange gives every query coalesced on it.
type flightResult struct {
	// leader is the query that was sent upstream, resp its answer as the upstream gave it.
	leader, resp *dns.Msg
	// entry is the answer's cache entry (nil: not cached); packed is the answer in wire form
	// when there is no entry, for the other queries (they must not share resp).
	entry  *cacheEntry
	packed []byte
}

// source says where a forwarded query's answer came from (the "path" of MetricDuration).
type source int

const (
	fromUpstream source = iota // sent upstream (or coalesced with a query that was)
	fromCache                  // a live cache entry: a hit
	fromStale                  // an expired entry, served stale (RFC 8767)
)

// exchange answers forwarded query req through the cache: a live entry answers at once (hit);
// otherwise the query is sent upstream (c.forward), once for all identical queries in flight
// (same key and transport), and a cacheable answer is stored. With serve-stale on, an expired
// entry within the maximum stale age answers instead when no fresh answer comes (serveStale).
// A query that is not cached (cacheKey) is simply sent upstream. It returns either wire, the
// complete answer appended to buf (truncated to maxSize), or resp, the answer to write
// (truncated by the caller); where the answer came from; or the forwarding error.
func (c *cache) exchange(buf []byte, req *dns.Msg, tcp bool, maxSize int) (wire []byte, resp *dns.Msg, src source, err error) {
	var kb [maxNameWire + 32]byte
	k, ok := appendCacheKey(kb[:0], req)
	if !ok {
		resp, err := c.forward(req, tcp)
		return nil, resp, fromUpstream, err
	}
	// k does not escape on a hit: the LRU keeps no reference to the key it is asked for.
	e, now := c.lookup(unsafe.String(unsafe.SliceData(k), len(k)))
	if e != nil && now < e.expires {
		if wire, ok := e.answerMsg(buf, req, maxSize, now, 0); ok {
			c.m.cacheHits.Inc()
			if c.prefetch != 0 && e.wantPrefetch(now, c.prefetch) {
				c.startPrefetch(unsafe.String(unsafe.SliceData(k), len(k)), e, now)
			}
			return wire, nil, fromCache, nil
		}
	}
	c.m.cacheMisses.Inc()
	key := string(k)
	if c.maxStale != 0 && e != nil && now < e.expires+c.maxStale {
		return c.serveStale(buf, req, tcp, maxSize, key, e, now)
	}
	v, err, _ := c.flight.Do(flightKey(key, tcp), func() (any, error) { return c.refresh(key, req, tcp, e) })
	if err != nil {
		return nil, nil, fromUpstream, err
	}
	wire, resp, err = c.fromFlight(buf, req, maxSize, v.(*flightResult))
	return wire, resp, fromUpstream, err
}

// flightKey is the singleflight key of key's queries over one transport.
func flightKey(key string, tcp bool) string {
	if tcp {
		return key + "t"
	}
	return key + "u"
}

// refresh is the body of a flight: it sends req upstream and stores a cacheable answer under
// key. old is the entry the flight was started for (expired, or due for prefetch; nil: none):
// when another live entry is found, a flight that ended since stored it, and it is the result
// without asking upstream. An answer that is not cached replaces old all the same (it is
// removed: RFC 8767 section 4, a NOERROR or NXDOMAIN answer refreshes the data, so old must not
// be served stale afterwards), unless it is truncated (incomplete: a TCP query may get it
// whole). A failed refresh of an expired entry starts its failure recheck
// timer (RFC 8767 section 5, failureRecheck) when the upstreams failed (not when the forward
// limit was reached).
func (c *cache) refresh(key string, req *dns.Msg, tcp bool, old *cacheEntry) (*flightResult, error) {
	if e, now := c.lookup(key); e != nil && e != old && now < e.expires {
		return &flightResult{entry: e}, nil
	}
	resp, err := c.forward(req, tcp)
	now := c.clock()
	if err != nil {
		if c.maxStale != 0 && !errors.Is(err, errForwardLimit) {
			if e, ok := c.lru.Peek(key); ok && now >= e.expires {
				e.recheckAt.Store(now + int64(failureRecheck))
			}
		}
		return nil, err
	}
	res := &flightResult{leader: req, resp: resp}
	if res.entry = c.newCacheEntry(req, resp, now); res.entry != nil {
		c.add(key, res.entry)
		return res, nil
	}
	if e, ok := c.lru.Peek(key); ok && !resp.Truncated && (e == old || now >= e.expires) {
		c.lru.Remove(key)
	}
	if res.packed, err = resp.Pack(); err != nil {
		return nil, fmt.Errorf("pack upstream answer to %s: %w", qname(req), err)
	}
	return res, nil
}

// fromFlight turns a flight's result into req's answer: the upstream's answer as it came for
// the query that was sent (resp), else the stored entry's answer (wire, truncated to maxSize),
// else the upstream's answer re-addressed to req (reanswer).
func (c *cache) fromFlight(buf []byte, req *dns.Msg, maxSize int, res *flightResult) (wire []byte, resp *dns.Msg, err error) {
	switch {
	case res.leader == req:
		return nil, res.resp, nil
	case res.entry != nil:
		if wire, ok := res.entry.answerMsg(buf, req, maxSize, c.clock(), 0); ok {
			return wire, nil, nil
		}
		return nil, nil, fmt.Errorf("answer %s from the cache: question does not pack as the entry's", qname(req))
	}
	m := new(dns.Msg)
	if err := m.Unpack(res.packed); err != nil {
		return nil, nil, fmt.Errorf("unpack upstream answer to %s: %w", qname(req), err)
	}
	return nil, reanswer(m, req, noEDNS(res.leader, m)), nil
}

// noEDNS reports whether m, the upstream's answer to the query leader, says that the upstream
// refused leader's EDNS: a FORMERR or NOTIMP without an OPT although leader had one (RFC 6891
// section 7: the requester then asks again without EDNS). leader's client gets that answer as it
// came, without an OPT (upstream.parse); the other queries of its flight must get it the same way.
func noEDNS(leader, m *dns.Msg) bool {
	return (m.Rcode == dns.RcodeFormatError || m.Rcode == dns.RcodeNotImplemented) &&
		m.IsEdns0() == nil && leader.IsEdns0() != nil
}

// reanswer turns m, the upstream's answer to another query with the same key, into the answer to
// req: req's ID, question (letter case), RD, and an OPT per req's (RFC 6891 section 7; the
// upstream's options, such as a cookie, were for the other query), unless noOPT (noEDNS: the
// upstream refused the other query's EDNS, and req's answer says so as the other's did).
func reanswer(m, req *dns.Msg, noOPT bool) *dns.Msg {
	m.Id = req.Id
	m.Question = req.Question
	m.RecursionDesired = req.RecursionDesired
	extra := m.Extra[:0]
	for _, rr := range m.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			extra = append(extra, rr)
		}
	}
	m.Extra = extra
	if opt := req.IsEdns0(); opt != nil && !noOPT {
		m.SetEdns0(ednsUDPSize, opt.Do())
	}
	return m
}
