package dnsd

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"
)

// SourcePolicy says who may query the resolver (ResolverOptions.Sources). The zero value admits
// everyone at any rate, as a library resolver would; the agent restricts it (docs/dns.md).
type SourcePolicy struct {
	// Restrict answers only the loopback addresses, the local pods of the current model (the
	// pod IPs its Index maps to namespaces) and Allow; any other source gets REFUSED, counted
	// (MetricRefused, reason "source"). Before the first model only loopback and Allow are
	// admitted.
	Restrict bool
	// Allow are further sources admitted under Restrict: the node's own addresses, and e.g. a
	// cluster DNS server that forwards clusterset.local here. IPv4 prefixes in their IPv4 form
	// (sources are compared unmapped); NewResolver refuses an IPv4-mapped one, which would match
	// nothing.
	Allow []netip.Prefix
	// RateLimit is the queries per second one source address may send (0: no limit); a query
	// over it gets REFUSED, counted (MetricRefused, reason "rate"). Sources share a table of
	// rateSlots counters by hash, so two sources that collide share one limit (never a higher
	// one). The count restarts each wall-clock second, so a source may send up to twice the
	// limit across a second boundary.
	RateLimit int
}

// rateSlots is the size of the per-source rate table (a power of two).
const rateSlots = 4096

// sourceGate enforces a SourcePolicy. Its check is lock-free: one atomic word per table slot
// holding the current second and its count.
type sourceGate struct {
	restrict bool
	allow    []netip.Prefix
	limit    uint64
	slots    [rateSlots]atomic.Uint64
}

// newSourceGate returns the gate of p, nil when p admits everyone at any rate.
func newSourceGate(p SourcePolicy) *sourceGate {
	if !p.Restrict && p.RateLimit <= 0 {
		return nil
	}
	g := &sourceGate{restrict: p.Restrict, limit: uint64(max(p.RateLimit, 0))}
	for _, a := range p.Allow {
		g.allow = append(g.allow, a.Masked())
	}
	return g
}

// check returns an error naming the first Allow prefix that is invalid or IPv4-mapped.
func (p SourcePolicy) check() error {
	for i, a := range p.Allow {
		if !a.IsValid() || a.Addr().Is4In6() {
			return fmt.Errorf("sources.allow[%d]: %v: want a prefix, IPv4 as a.b.c.d/n", i, a)
		}
	}
	return nil
}

// Refusal reasons (the "reason" label of MetricRefused).
const (
	refusedSource = iota
	refusedRate
	admitted
)

// admit decides on one query from src (unmapped) at now: admitted, or the reason to refuse it.
// idx is the current index (nil before the first model).
func (g *sourceGate) admit(src netip.Addr, idx *Index, now time.Time) int {
	if g.restrict && !g.known(src, idx) {
		return refusedSource
	}
	if g.limit == 0 || !src.IsValid() || src.IsLoopback() {
		return admitted
	}
	b := src.As16()
	var h uint64 = 14695981039346656037
	for _, c := range b {
		h = (h ^ uint64(c)) * 1099511628211
	}
	slot := &g.slots[h&(rateSlots-1)]
	sec := uint64(now.Unix()) & 0xffffffff
	for {
		cur := slot.Load()
		n := cur & 0xffffffff
		if cur>>32 != sec {
			n = 0
		}
		if n >= g.limit {
			return refusedRate
		}
		if slot.CompareAndSwap(cur, sec<<32|(n+1)) {
			return admitted
		}
	}
}

// known reports whether src is admitted under Restrict: loopback, an Allow prefix, or a local pod
// of idx.
func (g *sourceGate) known(src netip.Addr, idx *Index) bool {
	if src.IsLoopback() {
		return true
	}
	for _, p := range g.allow {
		if p.Contains(src) {
			return true
		}
	}
	if idx != nil {
		_, ok := idx.podNamespace[src]
		return ok
	}
	return false
}
