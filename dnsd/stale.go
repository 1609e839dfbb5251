package dnsd

import (
	"fmt"
	"strings"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sync/singleflight"
)

// Serve-stale (RFC 8767) and prefetch: what the cache does around an entry's expiry, both off
// unless CacheOptions.ServeStale and CacheOptions.Prefetch turn them on (the agent's
// --dns-cache-serve-stale and --dns-cache-prefetch).
//
// How stale entries are bounded: serve-stale stores nothing the cache would not store without
// it. An expired entry already stays in the LRU until an answer replaces it or the LRU evicts
// it, and every lookup already moves its entry to the front; serve-stale only lets such an
// entry answer. So for the same queries the cache holds the same entries in the same order with
// serve-stale on or off (TestServeStaleHoldsTheSameEntries), and the share of
// CacheOptions.Size holding live answers does not shrink. Prefetch adds no key either: it
// replaces a live entry by a fresh one under the same key (the refresh counts as a use).

// Serve-stale timers and limits.
const (
	// StaleAnswerTTL is the TTL of every record of a stale answer (RFC 8767 section 4: "a value
	// greater than 0, with a RECOMMENDED value of 30 seconds"); a negative answer's is at most
	// the cache's MaxNegativeTTL, so a client keeps a stale denial no longer than a fresh one.
	StaleAnswerTTL = 30 * time.Second
	// ClientResponseTimer is how long a query whose entry has expired waits for the upstreams
	// before it is answered from the stale entry, the refresh going on and refilling the cache
	// when it succeeds (RFC 8767 section 5, "client response timer", 1.8 s).
	ClientResponseTimer = 1800 * time.Millisecond
	// MaxServeStale is the largest maximum stale age (CacheOptions.ServeStale): a week, the
	// longest RFC 8767 section 6 considers ("Longer values, as much as a week"); its section 5
	// suggests 1 to 3 days.
	MaxServeStale = 7 * 24 * time.Hour
	// failureRecheck is how long after a failed refresh an expired entry answers stale at once,
	// without asking the upstreams again (RFC 8767 section 5, "failure recheck timer", 30 s).
	failureRecheck = 30 * time.Second
	// prefetchPart: a popular entry is prefetched by a hit that finds less than 1/prefetchPart
	// of its lifetime left (CoreDNS cache's prefetch PERCENTAGE, 10%).
	prefetchPart = 10
	// prefetchShare: at most 1/prefetchShare of the resolver's forward limit (MaxForwards, at
	// least one query) is prefetches in flight, so prefetches waiting on upstreams that do not
	// answer never leave client queries without a forward slot.
	prefetchShare = 8
	// prefetchRetry is how long after a prefetch skipped for the budget (startPrefetch) the
	// entry's hits do not try again: a hot entry's hits meanwhile cost one atomic load more
	// than a hit outside the last tenth, not a compare-and-swap, a channel send and a counter
	// each. A TTL of 2 s or more leaves room for a try after a skip in its last tenth (at 1 s,
	// the retry time is the expiry).
	prefetchRetry = 100 * time.Millisecond
)

// Why a stale answer was served, the "reason" label of MetricCacheStaleAnswers.
const (
	staleFailed  = iota // the refresh failed: every upstream failed or timed out, or the forward limit
	staleSlow           // the client response timer fired before the upstreams answered
	staleRecheck        // within the failure recheck timer of a failed refresh: no refresh tried
	staleReasons
)

var staleReasonNames = [staleReasons]string{"failed", "slow", "recheck"}

// CheckServeStale returns an error unless d is a valid maximum stale age
// (CacheOptions.ServeStale, when not 0): a whole number of seconds from 1 s to MaxServeStale.
func CheckServeStale(d time.Duration) error {
	if err := CheckCacheTTL(d); err != nil {
		return err
	}
	if d > MaxServeStale {
		return fmt.Errorf("want at most %s (RFC 8767 section 6: as much as a week)", MaxServeStale)
	}
	return nil
}

// serveStale answers req, whose entry e under key expired at most the maximum stale age ago
// (clock reading now), as RFC 8767 section 5 describes:
//   - within e's failure recheck timer (a refresh failed less than 30 s ago), from e at once,
//     without asking the upstreams ("recheck");
//   - else it refreshes e (one flight per key and transport, as a miss does) and waits for it
//     at most ClientResponseTimer: an answer in time is the answer; when the timer fires first,
//     e answers ("slow") and the refresh goes on and refills the cache when it succeeds;
//   - when the refresh fails (every upstream failed, timed out or answered SERVFAIL or REFUSED,
//     RFC 8767 section 4; or the forward limit was reached), e answers ("failed").
//
// e never answers past the maximum stale age: the age is checked against the clock read when
// the stale answer is made, after any wait (a query that came just within the age waits up to
// ClientResponseTimer, or the forward timeout). Past it, a failed refresh returns its error, and
// a query whose client response timer fires goes on waiting for the refresh, as a miss does.
//
// A stale answer carries every record with StaleAnswerTTL (a negative one at most the cache's
// MaxNegativeTTL) and is counted in MetricCacheStaleAnswers.
func (c *cache) serveStale(buf []byte, req *dns.Msg, tcp bool, maxSize int, key string, e *cacheEntry, now int64) (wire []byte, resp *dns.Msg, src source, err error) {
	if now < e.recheckAt.Load() {
		return c.staleAnswer(buf, req, maxSize, e, now, staleRecheck)
	}
	// The refresh sends a copy of req, made in the flight's goroutine: packing a query writes
	// to its OPT (miekg/dns sets the extended rcode), and req may be read meanwhile by the
	// stale answer at the timer. sent is read only once the flight has ended.
	var sent *dns.Msg
	ch := c.flight.DoChan(flightKey(key, tcp), func() (any, error) {
		sent = req.Copy()
		return c.refresh(key, sent, tcp, e)
	})
	var r singleflight.Result
	select {
	case r = <-ch:
	case <-c.after(ClientResponseTimer):
		if now = c.clock(); now < e.expires+c.maxStale {
			return c.staleAnswer(buf, req, maxSize, e, now, staleSlow)
		}
		// e passed the maximum stale age while the query waited: it may no longer answer, so
		// the query waits for the refresh as a miss does.
		r = <-ch
	}
	if r.Err != nil {
		if now = c.clock(); now >= e.expires+c.maxStale {
			return nil, nil, fromUpstream, r.Err
		}
		return c.staleAnswer(buf, req, maxSize, e, now, staleFailed)
	}
	res := r.Val.(*flightResult)
	if sent != nil && res.leader == sent {
		// req's own refresh: the upstream's answer as it came, as a miss gets it (fromFlight).
		return nil, res.resp, fromUpstream, nil
	}
	wire, resp, err = c.fromFlight(buf, req, maxSize, res)
	return wire, resp, fromUpstream, err
}

// staleAnswer answers req from the expired entry e (answerMsg with the stale TTL) and counts it
// under reason.
func (c *cache) staleAnswer(buf []byte, req *dns.Msg, maxSize int, e *cacheEntry, now int64, reason int) (wire []byte, resp *dns.Msg, src source, err error) {
	ttl := uint32(StaleAnswerTTL / time.Second)
	if e.negative {
		ttl = min(ttl, c.maxNeg)
	}
	wire, ok := e.answerMsg(buf, req, maxSize, now, ttl)
	if !ok {
		return nil, nil, fromStale, fmt.Errorf("answer %s from a stale entry: question does not pack as the entry's", qname(req))
	}
	c.m.cacheStale[reason].Inc()
	return wire, nil, fromStale, nil
}

// wantPrefetch counts a hit on e at clock reading now and reports whether it is the one that
// starts e's prefetch: e has been hit at least n times (this hit included), less than a tenth of
// its lifetime is left, and no hit started one before (one prefetch per entry; the refresh
// stores a new entry, which counts its own hits), or the one that did found the prefetch budget
// taken at least prefetchRetry ago (startPrefetch gives the turn back). It does not allocate;
// once n is reached the counter is only read.
func (e *cacheEntry) wantPrefetch(now int64, n uint32) bool {
	h := e.hits.Load()
	if h < n {
		h = e.hits.Add(1)
	}
	return h >= n && now >= e.prefetchAt && !e.prefetched.Load() && now >= e.retryAt.Load() &&
		e.prefetched.CompareAndSwap(false, true)
}

// startPrefetch refreshes e, the entry under key (copied: the caller's may point into a
// buffer), in the background: a query made from the key (prefetchQuery) goes upstream in the
// key's flight, so a client query missing at the same time joins it rather than sending another,
// and the answer replaces e as a miss's would (refresh). It goes over TCP when e's answer would
// not fit a UDP answer of ednsUDPSize bytes (a truncated answer is not cached).
//
// Prefetches have their own budget within the forward limit (prefetchSlots, MaxForwards /
// prefetchShare): when that many are in flight, the prefetch is skipped rather than queued
// (counted in MetricCachePrefetchesSkipped) and the first hit on e that qualifies prefetchRetry
// or more later (clock reading now is this hit's) tries again (wantPrefetch), so e expires as it
// would without prefetch only when the budget stays taken until then. Each try is one
// non-blocking channel send, without allocation. With
// the upstreams down each prefetch holds its slot for the forward timeout (every upstream's
// timeout in turn), so without the budget a burst of popular entries entering their last tenth
// together could hold every forward slot and turn client misses into SERVFAIL.
func (c *cache) startPrefetch(key string, e *cacheEntry, now int64) {
	select {
	case c.prefetchSlots <- struct{}{}:
	default:
		c.m.cachePrefetchesSkipped.Inc()
		e.retryAt.Store(now + int64(prefetchRetry))
		e.prefetched.Store(false) // nothing in flight for e: a hit from retryAt on may try again
		return
	}
	k := strings.Clone(key)
	c.m.cachePrefetches.Inc()
	tcp := len(e.wire)+optLen > ednsUDPSize
	go func() {
		defer func() { <-c.prefetchSlots }()
		req := prefetchQuery(k)
		_, _, _ = c.flight.Do(flightKey(k, tcp), func() (any, error) { return c.refresh(k, req, tcp, e) })
	}()
}

// prefetchQuery returns the query a prefetch sends for the cache key key: its name, type and
// class, RD set, the CD and AD bits of the key, and an OPT (UDP size ednsUDPSize) with the key's
// DO bit.
func prefetchQuery(key string) *dns.Msg {
	n := len(key) - cacheKeySuffix
	s := key[n:]
	m := new(dns.Msg)
	m.SetQuestion(key[:n], uint16(s[0])<<8|uint16(s[1]))
	m.Question[0].Qclass = uint16(s[2])<<8 | uint16(s[3])
	m.CheckingDisabled = s[4]&keyCD != 0
	m.AuthenticatedData = s[4]&keyAD != 0
	m.SetEdns0(ednsUDPSize, s[4]&keyDO != 0)
	return m
}
