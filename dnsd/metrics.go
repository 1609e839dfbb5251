package dnsd

import (
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names (Prometheus).
const (
	MetricQueries          = "aether_dns_queries_total"
	MetricUpstreamFailures = "aether_dns_upstream_failures_total"
	MetricDuration         = "aether_dns_request_duration_seconds"
	MetricCacheHits        = "aether_dns_cache_hits_total"
	MetricCacheMisses      = "aether_dns_cache_misses_total"
	MetricCacheEntries     = "aether_dns_cache_entries"
	MetricCacheEvictions   = "aether_dns_cache_evictions_total"
	// MetricUpstreamConnections counts the sockets opened to each upstream, by upstream and
	// transport (udp, tcp); with connection reuse it grows with concurrency and idle expiry,
	// not with the number of queries.
	MetricUpstreamConnections = "aether_dns_upstream_connections_opened_total"
	// MetricUpstreamStrayAnswers counts UDP datagrams from an upstream dropped because they
	// answer no query in flight on their socket (another ID, QR clear).
	MetricUpstreamStrayAnswers = "aether_dns_upstream_stray_answers_total"
	// MetricUpstreamStrayFallbacks counts UDP exchanges with an upstream that read more than
	// maxStrays (3) stray datagrams and asked the same upstream over TCP instead (a possible
	// forgery attempt, RFC 5452 section 9).
	MetricUpstreamStrayFallbacks = "aether_dns_upstream_stray_tcp_fallbacks_total"
	// MetricUpstreamOversized counts UDP answers larger than the client's UDP size, asked
	// again over TCP.
	MetricUpstreamOversized = "aether_dns_upstream_oversized_answers_total"
	// MetricHandlerPanics counts panics recovered while answering a query, by path ("serve":
	// the resolver's ServeDNS, "fast": the UDP read loop's fast path); each is logged with its
	// stack, the query gets SERVFAIL and the server keeps serving.
	MetricHandlerPanics = "aether_dns_handler_panics_total"
	// MetricRefused counts queries answered REFUSED by the source policy
	// (ResolverOptions.Sources), by reason: "source" (not a local pod, the node or an allowed
	// prefix) or "rate" (over the per-source rate limit).
	MetricRefused = "aether_dns_refused_total"
)

// Answer paths, the "path" label of MetricDuration.
const (
	pathLocal   = "local"
	pathForward = "forward"
	pathCache   = "cache"
	pathStale   = "stale"
)

// Metric names of serve-stale and prefetch (stale.go).
const (
	// MetricCacheStaleAnswers counts answers from expired entries (serve-stale, RFC 8767), by
	// reason: failed, slow, recheck.
	MetricCacheStaleAnswers = "aether_dns_cache_stale_answers_total"
	// MetricCachePrefetches counts background refreshes of popular entries started by a hit.
	MetricCachePrefetches = "aether_dns_cache_prefetches_total"
	// MetricCachePrefetchesSkipped counts prefetches not started because the prefetch budget
	// (an eighth of the forward limit) was in flight already; a hit on the same entry 100 ms
	// (prefetchRetry) or more later tries again (and is counted again when skipped again).
	MetricCachePrefetchesSkipped = "aether_dns_cache_prefetches_skipped_total"
)

// metricTypes are the query types counted under their own name; any other is "other".
var metricTypes = []uint16{
	dns.TypeA, dns.TypeAAAA, dns.TypeCNAME, dns.TypeHTTPS, dns.TypeSVCB, dns.TypeMX, dns.TypeNS,
	dns.TypePTR, dns.TypeSOA, dns.TypeSRV, dns.TypeTXT, dns.TypeANY,
}

// metricRcodes are the rcodes counted under their own name; any other is "other".
var metricRcodes = []int{
	dns.RcodeSuccess, dns.RcodeFormatError, dns.RcodeServerFailure, dns.RcodeNameError,
	dns.RcodeNotImplemented, dns.RcodeRefused, dns.RcodeBadVers,
}

// metrics holds the resolver's collectors, with the (type, rcode) counters resolved once so the
// hot path never builds label values.
type metrics struct {
	queries          *prometheus.CounterVec
	upstreamFailures *prometheus.CounterVec
	// The forwarder's, per upstream (hooked by forwarderMetrics).
	upstreamConns, upstreamStrays, upstreamStrayFallbacks, upstreamOversized *prometheus.CounterVec

	duration       *prometheus.HistogramVec
	local, forward prometheus.Observer
	cached         prometheus.Observer

	// The cache's: hits and misses of cacheable forwarded queries, entries pushed out to make
	// room; its entry count is a gauge read at scrape time.
	cacheHits, cacheMisses, cacheEvictions prometheus.Counter
	cacheEntries                           prometheus.GaugeFunc
	// Serve-stale's answers by reason (staleFailed, ...) and their duration, prefetch's
	// refreshes.
	cacheStaleVec   *prometheus.CounterVec
	cacheStale      [staleReasons]prometheus.Counter
	stale           prometheus.Observer
	cachePrefetches prometheus.Counter
	// Prefetches skipped for want of a prefetch slot.
	cachePrefetchesSkipped prometheus.Counter
	// panics are the recovered handler panics by path (MetricHandlerPanics).
	panicsVec               *prometheus.CounterVec
	panicsServe, panicsFast prometheus.Counter
	// refused are the source policy's refusals, indexed by refusedSource and refusedRate.
	refusedVec *prometheus.CounterVec
	refused    [2]prometheus.Counter

	// byType and byRcode give the counter index of a query type below 256 and of an rcode
	// below 32 (arrays, not maps: count runs for every query); any other is "other".
	byType  [256]uint8
	byRcode [32]uint8
	counter [][]prometheus.Counter // [type index][rcode index]; the last index is "other"
}

// newMetrics returns the resolver's collectors, registered with reg when it is not nil;
// entries gives the cache's entry count (MetricCacheEntries).
func newMetrics(reg prometheus.Registerer, entries func() float64) (*metrics, error) {
	m := &metrics{
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricQueries,
			Help: "DNS queries answered by the agent's resolver, by query type and response code.",
		}, []string{"type", "rcode"}),
		upstreamFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricUpstreamFailures,
			Help: "Failed exchanges with an upstream resolver, by upstream and reason (timeout, network, servfail, refused, mismatch, malformed).",
		}, []string{"upstream", "reason"}),
		upstreamConns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricUpstreamConnections,
			Help: "Sockets opened to an upstream resolver, by upstream and transport (udp, tcp); idle ones are reused until they expire.",
		}, []string{"upstream", "transport"}),
		upstreamStrays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricUpstreamStrayAnswers,
			Help: "UDP datagrams from an upstream resolver dropped because they answer no query in flight on their socket (another ID, or not a response).",
		}, []string{"upstream"}),
		upstreamStrayFallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricUpstreamStrayFallbacks,
			Help: "UDP exchanges with an upstream resolver that read more than 3 stray datagrams (a possible forgery attempt) and asked the same upstream over TCP instead.",
		}, []string{"upstream"}),
		upstreamOversized: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricUpstreamOversized,
			Help: "UDP answers from an upstream resolver larger than the client's UDP size, asked again over TCP.",
		}, []string{"upstream"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: MetricDuration,
			Help: "Time from a query's arrival to its answer being written, in seconds, by path (local answer, forward, cache: a forwarded name answered from the cache, or stale: from an expired cache entry).",
			// 25 µs .. ~3.3 s.
			Buckets: prometheus.ExponentialBuckets(25e-6, 2.5, 14),
		}, []string{"path"}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricCacheHits,
			Help: "Forwarded queries answered from the cache.",
		}),
		cacheMisses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricCacheMisses,
			Help: "Cacheable forwarded queries the cache held no live answer for (sent upstream, or coalesced with an identical query in flight).",
		}),
		cacheEvictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricCacheEvictions,
			Help: "Cached answers evicted, least recently used first, to make room for new ones.",
		}),
		cacheEntries: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricCacheEntries,
			Help: "Answers held by the cache, expired ones included until replaced or evicted.",
		}, entries),
		cacheStaleVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricCacheStaleAnswers,
			Help: "Forwarded queries answered from an expired cache entry (serve-stale, RFC 8767), by reason: failed (the refresh failed), slow (no upstream answer within 1.8 s), recheck (a refresh failed less than 30 s before; none tried).",
		}, []string{"reason"}),
		cachePrefetches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricCachePrefetches,
			Help: "Popular cache entries refreshed in the background before they expire (prefetch).",
		}),
		cachePrefetchesSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricCachePrefetchesSkipped,
			Help: "Prefetches not started because an eighth of the forward limit was prefetches in flight already; a hit on the same entry 100 ms or more later tries again.",
		}),
		panicsVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricHandlerPanics,
			Help: "Panics recovered while answering a query, by path (serve, fast); the query got SERVFAIL and the server kept serving.",
		}, []string{"path"}),
	}
	m.panicsServe, m.panicsFast = m.panicsVec.WithLabelValues("serve"), m.panicsVec.WithLabelValues("fast")
	m.refusedVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricRefused,
		Help: "Queries answered REFUSED by the source policy, by reason: source (not a local pod, the node or an allowed prefix), rate (over the per-source limit).",
	}, []string{"reason"})
	m.refused[refusedSource], m.refused[refusedRate] = m.refusedVec.WithLabelValues("source"), m.refusedVec.WithLabelValues("rate")
	for i, r := range staleReasonNames {
		m.cacheStale[i] = m.cacheStaleVec.WithLabelValues(r)
	}
	m.local = m.duration.WithLabelValues(pathLocal)
	m.forward = m.duration.WithLabelValues(pathForward)
	m.cached = m.duration.WithLabelValues(pathCache)
	m.stale = m.duration.WithLabelValues(pathStale)
	for i := range m.byType {
		m.byType[i] = uint8(len(metricTypes))
	}
	for i, t := range metricTypes {
		m.byType[t] = uint8(i)
	}
	for i := range m.byRcode {
		m.byRcode[i] = uint8(len(metricRcodes))
	}
	for i, r := range metricRcodes {
		m.byRcode[r] = uint8(i)
	}
	typeName := func(i int) string {
		if i == len(metricTypes) {
			return "other"
		}
		return dns.TypeToString[metricTypes[i]]
	}
	rcodeName := func(i int) string {
		if i == len(metricRcodes) {
			return "other"
		}
		return dns.RcodeToString[metricRcodes[i]]
	}
	m.counter = make([][]prometheus.Counter, len(metricTypes)+1)
	for i := range m.counter {
		m.counter[i] = make([]prometheus.Counter, len(metricRcodes)+1)
		for j := range m.counter[i] {
			m.counter[i][j] = m.queries.WithLabelValues(typeName(i), rcodeName(j))
		}
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.queries, m.upstreamFailures, m.upstreamConns, m.upstreamStrays, m.upstreamStrayFallbacks, m.upstreamOversized, m.duration,
			m.cacheHits, m.cacheMisses, m.cacheEvictions, m.cacheEntries, m.cacheStaleVec, m.cachePrefetches, m.cachePrefetchesSkipped, m.panicsVec, m.refusedVec} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *metrics) count(qtype uint16, rcode int) {
	i, j := len(metricTypes), len(metricRcodes)
	if qtype < uint16(len(m.byType)) {
		i = int(m.byType[qtype])
	}
	if rcode >= 0 && rcode < len(m.byRcode) {
		j = int(m.byRcode[rcode])
	}
	m.counter[i][j].Inc()
}

// forwarderMetrics returns upstream addr's counters.
func (m *metrics) forwarderMetrics(addr string) *upstreamMetrics {
	return &upstreamMetrics{
		openedUDP:      m.upstreamConns.WithLabelValues(addr, transportUDP),
		openedTCP:      m.upstreamConns.WithLabelValues(addr, transportTCP),
		strays:         m.upstreamStrays.WithLabelValues(addr),
		strayFallbacks: m.upstreamStrayFallbacks.WithLabelValues(addr),
		oversized:      m.upstreamOversized.WithLabelValues(addr),
	}
}
