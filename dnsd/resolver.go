package dnsd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/aethermesh/aether/model"
)

// Resolver is the DNS handler: it answers from the current Index and forwards the rest. It has
// no sockets (Server gives it some). Update swaps the index atomically; ServeDNS loads it once
// per query and never waits for an update.
type Resolver struct {
	index   atomic.Pointer[Index]
	opts    IndexOptions
	fwd     *Forwarder
	metrics *metrics
	// cache holds forwarded answers (nil: no cache).
	cache *cache
	log   *slog.Logger
	// forwardTimeout bounds a whole forwarded query (all upstreams).
	forwardTimeout time.Duration
	// forwards holds one token per query being forwarded (at most MaxForwards).
	forwards chan struct{}
	// meshZone, csZone and csuffix ("mesh.", "svc.clusterset.local.", ".svc.cluster.local.")
	// tell, before the first index, which names could be mesh names (preModelForward).
	meshZone, csZone, csuffix string
	// gate enforces ResolverOptions.Sources (nil: everyone admitted).
	gate *sourceGate
	// testHook, when set (tests only), runs first for every query ServeDNS or answerWire sees,
	// so a test can make a handler panic.
	testHook func(q []byte)
}

// DefaultMaxForwards is how many queries a Resolver forwards at once. Each holds a goroutine
// and an upstream socket for up to the forward timeout, so a flood of queries for names an
// upstream is slow to answer would otherwise pin memory and file descriptors without bound.
const DefaultMaxForwards = 1024

// errForwardLimit is why a query that found MaxForwards queries in flight was not forwarded.
var errForwardLimit = errors.New("too many queries being forwarded")

// ResolverOptions configure NewResolver.
type ResolverOptions struct {
	// Index tunes the index built by Update.
	Index IndexOptions
	// Registerer receives the resolver's metrics (MetricQueries, MetricUpstreamFailures,
	// MetricUpstreamConnections, MetricUpstreamStrayAnswers, MetricUpstreamStrayFallbacks,
	// MetricUpstreamOversized,
	// MetricDuration, MetricCache*); nil registers nothing.
	Registerer prometheus.Registerer
	// Logger receives debug records of failed writes and forwards (nil: discard).
	Logger *slog.Logger
	// MaxForwards is how many queries are forwarded at once (0: DefaultMaxForwards); a query
	// beyond it is answered SERVFAIL at once, without asking an upstream. Cache prefetches
	// count in it but may take at most an eighth of it (at least 1); a prefetch beyond that is
	// skipped.
	MaxForwards int
	// MeshDomain is the mesh domain before the first model gives it ("": model's default,
	// "mesh"), for telling which names to forward until then.
	MeshDomain string
	// Cache configures the cache of forwarded answers (zero value: no cache; the agent's
	// default is Size DefaultCacheSize).
	Cache CacheOptions
	// Sources says who may query and how often (zero value: anyone, no limit).
	Sources SourcePolicy
}

// NewResolver returns a resolver forwarding to fwd (nil: no upstreams, every forwarded query
// answers SERVFAIL); it hooks fwd's failures and connection counts into its metrics. Until the first Update it
// forwards every query that cannot concern a mesh name, so the node's pods keep resolving
// cluster and external names while the agent waits for the API server or the registry, and
// answers SERVFAIL to the rest (names in the mesh domain or in svc.clusterset.local, and search-
// list expansions holding one): it cannot answer those yet, and a negative answer would be
// cached by clients. It returns an error when the cache options are invalid (newCache), an
// Allow prefix of the source policy is invalid or IPv4-mapped (naming it), or the metrics cannot
// be registered.
func NewResolver(fwd *Forwarder, o ResolverOptions) (*Resolver, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if err := o.Sources.check(); err != nil {
		return nil, fmt.Errorf("new dns resolver: %w", err)
	}
	c, err := newCache(o.Cache)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(o.Registerer, func() float64 {
		if c == nil {
			return 0
		}
		return float64(c.lru.Len())
	})
	if err != nil {
		return nil, fmt.Errorf("register dns metrics: %w", err)
	}
	if c != nil {
		c.m = m
	}
	if fwd == nil {
		fwd = &Forwarder{log: o.Logger}
	}
	prev := fwd.onFailure
	fwd.onFailure = func(up, reason string) {
		m.upstreamFailures.WithLabelValues(up, reason).Inc()
		if prev != nil {
			prev(up, reason)
		}
	}
	for _, u := range fwd.upstreams {
		u.m.Store(m.forwarderMetrics(u.addr))
	}
	timeout := time.Duration(len(fwd.upstreams)) * fwd.timeout
	if o.MaxForwards <= 0 {
		o.MaxForwards = DefaultMaxForwards
	}
	meshDomain, clusterDomain := o.MeshDomain, o.Index.ClusterDomain
	if meshDomain == "" {
		meshDomain = model.DefaultMeshDomain
	}
	if clusterDomain == "" {
		clusterDomain = DefaultClusterDomain
	}
	r := &Resolver{opts: o.Index, fwd: fwd, metrics: m, cache: c, log: o.Logger, forwardTimeout: timeout,
		forwards: make(chan struct{}, o.MaxForwards), meshZone: strings.ToLower(dns.CanonicalName(meshDomain)),
		csZone: dns.CanonicalName(model.ClustersetDomain), csuffix: ".svc." + strings.ToLower(dns.CanonicalName(clusterDomain)),
		gate: newSourceGate(o.Sources)}
	if c != nil {
		c.forward = r.forward
		c.prefetchSlots = make(chan struct{}, max(1, o.MaxForwards/prefetchShare))
	}
	return r, nil
}

// Update builds an index from m and swaps it in. Queries in flight finish with the index they
// loaded. It returns NewIndex's error (or one for a nil model) and keeps the previous index then.
func (r *Resolver) Update(m *model.Mesh) error {
	if m == nil {
		return fmt.Errorf("update dns index: nil mesh model")
	}
	idx, err := NewIndex(m, r.opts)
	if err != nil {
		return fmt.Errorf("update dns index to model version %d: %w", m.Version, err)
	}
	r.index.Store(idx)
	return nil
}

// Index returns the index queries are answered from (nil before the first Update).
func (r *Resolver) Index() *Index { return r.index.Load() }

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// ServeDNS answers one query (dns.Handler). The metrics are updated just before the answer is
// written, so MetricDuration is the time from the query's arrival to the answer being handed to
// the socket, and a client that has its answer sees the query counted.
func (r *Resolver) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	defer r.recoverServe(w, req)
	if r.testHook != nil {
		b, _ := req.Pack()
		r.testHook(b)
	}
	start := time.Now()
	tcp := isTCP(w.LocalAddr())
	maxSize := dns.MaxMsgSize
	if !tcp {
		maxSize = MaxUDPSize(req)
	}
	var qtype uint16
	if len(req.Question) > 0 {
		qtype = req.Question[0].Qtype
	}
	idx := r.index.Load()
	if r.gate != nil {
		if why := r.gate.admit(addrOf(w.RemoteAddr()), idx, start); why != admitted {
			r.metrics.refused[why].Inc()
			r.metrics.count(qtype, dns.RcodeRefused)
			m := new(dns.Msg)
			m.SetRcode(req, dns.RcodeRefused)
			r.write(w, m, maxSize)
			return
		}
	}
	if idx == nil && r.preModelForward(req) {
		r.serveForwarded(w, req, tcp, maxSize, qtype, start, nil)
		return
	}
	if idx == nil {
		m := notReady(req)
		r.metrics.count(qtype, dns.RcodeServerFailure)
		r.metrics.local.Observe(time.Since(start).Seconds())
		r.write(w, m, maxSize)
		return
	}
	bp := bufPool.Get().(*[]byte)
	wire, rcode, act := idx.Respond((*bp)[:0], req, addrOf(w.RemoteAddr()), maxSize)
	if act == Answered {
		r.metrics.count(qtype, rcode)
		r.metrics.local.Observe(time.Since(start).Seconds())
		if _, err := w.Write(wire); err != nil {
			r.log.Debug("write dns answer", "err", err)
		}
		*bp = wire[:0]
		bufPool.Put(bp)
		return
	}
	bufPool.Put(bp)
	if act != ForwardClusterset {
		idx = nil
	}
	r.serveForwarded(w, req, tcp, maxSize, qtype, start, idx)
}

// recoverServe is ServeDNS's deferred guard: a panic while answering req is counted
// (MetricHandlerPanics, path "serve"), logged with its stack and answered SERVFAIL, and the
// server goes on serving (miekg/dns runs ServeDNS without a recover, so a panic would end the
// agent). A panic after the answer was written gets a second, harmless write.
func (r *Resolver) recoverServe(w dns.ResponseWriter, req *dns.Msg) {
	v := recover()
	if v == nil {
		return
	}
	r.metrics.panicsServe.Inc()
	r.log.Error("dns: panic answering a query (recovered, answered SERVFAIL)", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	m := new(dns.Msg)
	m.SetRcode(req, dns.RcodeServerFailure)
	_ = w.WriteMsg(m)
}

// answerWireGuarded is answerWire with a panic recovered, counted (MetricHandlerPanics, path
// "fast") and logged: the query then takes the slow path (ok false), the UDP read loop goes on.
func (r *Resolver) answerWireGuarded(buf, q []byte, src netip.Addr) (wire []byte, ok bool) {
	defer func() {
		if v := recover(); v != nil {
			r.metrics.panicsFast.Inc()
			r.log.Error("dns: panic in the fast path (recovered, query sent to the slow path)", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			wire, ok = buf, false
		}
	}()
	return r.answerWire(buf, q, src)
}

// serveForwarded answers a query the upstreams answer: from the cache when it holds a live
// answer, else from the upstreams (through the cache when there is one, which coalesces
// identical queries and keeps the answer, and with serve-stale on answers from an expired entry
// when the upstreams fail or are slow). When no upstream answers, it answers SERVFAIL, or
// for a clusterset name (cs, the index, not nil) cs's NXDOMAIN.
func (r *Resolver) serveForwarded(w dns.ResponseWriter, req *dns.Msg, tcp bool, maxSize int, qtype uint16, start time.Time, cs *Index) {
	var (
		wire []byte
		resp *dns.Msg
		src  source
		err  error
	)
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	if r.cache != nil {
		wire, resp, src, err = r.cache.exchange((*bp)[:0], req, tcp, maxSize)
	} else {
		resp, err = r.forward(req, tcp)
	}
	obs := r.metrics.forward
	switch src {
	case fromCache:
		obs = r.metrics.cached
	case fromStale:
		obs = r.metrics.stale
	}
	if wire != nil {
		r.metrics.count(qtype, int(wire[3]&0x0F))
		obs.Observe(time.Since(start).Seconds())
		if _, err := w.Write(wire); err != nil {
			r.log.Debug("write dns answer", "err", err)
		}
		*bp = wire[:0]
		return
	}
	if err != nil {
		// Only an answer from no upstream means the clusterset name does not exist; too many
		// forwards in flight says nothing about the name.
		if cs != nil && !errors.Is(err, errForwardLimit) {
			resp = cs.ClustersetNXDOMAIN(req)
		} else {
			r.log.Debug("forward failed", "err", err)
			resp = servfail(req, err)
		}
	}
	r.metrics.count(qtype, resp.Rcode)
	obs.Observe(time.Since(start).Seconds())
	r.write(w, resp, maxSize)
}

// servfail is the SERVFAIL answer to a forwarded query that got no answer, err being why (RA
// set; an OPT when the query had one). When every upstream failed (noUpstreamAnswered) that OPT
// carries Extended DNS Errors (RFC 8914): those of the upstreams' own SERVFAIL or REFUSED
// answers, passed on, each code once (a validating upstream's "DNSSEC Bogus", 6, tells the
// client more than anything this resolver knows); when they carried none, 22, "No Reachable
// Authority" (section 4.23: "The resolver could not reach any of the authoritative name servers
// (or they potentially refused to reply)"; the upstreams are this resolver's authorities), as
// Unbound and BIND add it when their servers time out.
func servfail(req *dns.Msg, err error) *dns.Msg {
	if !noUpstreamAnswered(err) {
		return servfailEDE(req)
	}
	var ede []*dns.EDNS0_EDE
	seen := map[uint16]bool{}
	for _, e := range upstreamEDE(err) {
		if !seen[e.InfoCode] {
			seen[e.InfoCode] = true
			ede = append(ede, &dns.EDNS0_EDE{InfoCode: e.InfoCode, ExtraText: e.ExtraText})
		}
	}
	if len(ede) == 0 {
		ede = append(ede, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeNoReachableAuthority})
	}
	return servfailEDE(req, ede...)
}

// notReady is the SERVFAIL answer to a query the resolver does not forward before its first
// model (preModelForward: a mesh name, a clusterset name, a search-list expansion of one, or a
// query that is not one IN question), carrying the Extended DNS Error 14, "Not Ready" (RFC 8914
// section 4.15: "The server is unable to answer the query, as it was not fully functional when
// the query was received"), so that a client can tell it from a failed upstream.
func notReady(req *dns.Msg) *dns.Msg {
	return servfailEDE(req, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeNotReady})
}

// servfailEDE is the resolver's own SERVFAIL answer to req: RA set and, when req had an OPT,
// the resolver's OPT with req's DO bit carrying the Extended DNS Error options ede (RFC 8914
// section 2); without one, no OPT and no error codes (RFC 6891 section 7).
func servfailEDE(req *dns.Msg, ede ...*dns.EDNS0_EDE) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetRcode(req, dns.RcodeServerFailure)
	resp.RecursionAvailable = true
	if opt := req.IsEdns0(); opt != nil {
		resp.SetEdns0(ednsUDPSize, opt.Do())
		o := resp.IsEdns0()
		for _, e := range ede {
			o.Option = append(o.Option, e)
		}
	}
	return resp
}

// noUpstreamAnswered reports whether err, from forwarding a query, says that no upstream gave
// a usable answer: each failed (ErrAllUpstreamsFailed: timeout, network error, SERVFAIL,
// REFUSED, a mismatched or malformed answer) or the forward timeout ran out. The forward limit
// (errForwardLimit) is not: no upstream was asked.
func noUpstreamAnswered(err error) bool {
	return errors.Is(err, ErrAllUpstreamsFailed) || errors.Is(err, context.DeadlineExceeded)
}

// preModelForward reports whether a query may be forwarded before the first index: one IN
// question whose name is neither in the mesh zone nor in svc.clusterset.local, nor a name the
// first index may answer as a search-list expansion: <target>.<ns>.svc.<clusterDomain> with
// target a name below either zone's apex (Index.lookup; the apexes are not expandable). A
// cluster name that merely holds the zone's labels elsewhere (Service cart in a namespace named
// like the mesh domain, cart.mesh.svc.cluster.local, or a Service named like it) is forwarded,
// as the first index forwards it.
func (r *Resolver) preModelForward(req *dns.Msg) bool {
	if len(req.Question) != 1 || req.Question[0].Qclass != dns.ClassINET {
		return false
	}
	name := strings.ToLower(dns.CanonicalName(req.Question[0].Name))
	if inZone(name, r.meshZone) || inZone(name, r.csZone) {
		return false
	}
	if rest, ok := strings.CutSuffix(name, r.csuffix); ok {
		i := strings.LastIndexByte(rest, '.')
		if i < 0 {
			return true // <ns>.svc.<clusterDomain>: no target
		}
		target := rest[:i+1] // without the namespace label, as an FQDN
		below := func(apex string) bool { return target != apex && inZone(target, apex) }
		return !below(r.meshZone) && !below(r.csZone)
	}
	return true
}

// forward sends req to the upstreams (Forwarder.Exchange) within the forward timeout, unless
// MaxForwards queries are being forwarded already: then it returns errForwardLimit at once.
func (r *Resolver) forward(req *dns.Msg, tcp bool) (*dns.Msg, error) {
	select {
	case r.forwards <- struct{}{}:
		defer func() { <-r.forwards }()
	default:
		return nil, fmt.Errorf("forward %s: %w", qname(req), errForwardLimit)
	}
	// A deadline rather than a context with a timeout: nothing cancels a forwarded query
	// early, and the sockets' deadlines bound it without a timer per query.
	return r.fwd.exchange(context.Background(), time.Now().Add(r.forwardTimeout), req, tcp)
}

// answerWire is ServeDNS's fast path for a UDP query in wire form q from src: it answers from
// the current index as Index.RespondWire does, or for a forwarded name from the cache (a live
// entry whose answer fits the client's UDP size), counts the query in the metrics as ServeDNS
// would, and returns the answer appended to buf. ok is false when the query needs the slow path
// (unpacking and ServeDNS): no index yet, a query RespondWire does not take, an answer to
// truncate, or a forwarded name the cache does not hold (a miss, counted by ServeDNS).
func (r *Resolver) answerWire(buf, q []byte, src netip.Addr) (wire []byte, ok bool) {
	if r.testHook != nil {
		r.testHook(q)
	}
	start := time.Now()
	idx := r.index.Load()
	if idx == nil {
		return buf, false
	}
	var wq wireQuery
	if !wq.parse(q) {
		return buf, false
	}
	if r.gate != nil {
		if why := r.gate.admit(src, idx, start); why != admitted {
			r.metrics.refused[why].Inc()
			r.metrics.count(wq.qtype, dns.RcodeRefused)
			// REFUSED (RFC 1035 section 4.1.1): the query's header and question, QR set, RD
			// kept, no records (the OPT dropped).
			out := append(buf, q[:wq.qend]...)
			out[2], out[3] = 0x80|q[2]&0x01, dns.RcodeRefused
			out[10], out[11] = 0, 0
			return out, true
		}
	}
	wire, rcode, act, ok := idx.respondWire(buf, q, &wq, src)
	if ok {
		r.metrics.count(wq.qtype, rcode)
		r.metrics.local.Observe(time.Since(start).Seconds())
		return wire, true
	}
	if act == Answered || r.cache == nil {
		return buf, false
	}
	if wire, rcode, ok = r.cache.answerWire(buf, q, &wq); !ok {
		return buf, false
	}
	r.metrics.count(wq.qtype, rcode)
	r.metrics.cached.Observe(time.Since(start).Seconds())
	return wire, true
}

// write sends m, truncated to maxSize (truncate: RFC 2181 section 9).
func (r *Resolver) write(w dns.ResponseWriter, m *dns.Msg, maxSize int) {
	m.Compress = true
	if m.Len() > maxSize {
		truncate(m, maxSize)
	}
	if err := w.WriteMsg(m); err != nil {
		r.log.Debug("write dns answer", "err", err)
	}
}

func isTCP(a net.Addr) bool {
	_, ok := a.(*net.TCPAddr)
	return ok
}

// addrOf returns the IP of a UDP or TCP address (invalid for anything else).
func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}
