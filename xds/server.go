package xds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/model"
)

// ServerOptions configure a Server.
type ServerOptions struct {
	// NodeID is the node id of the Envoy this server configures (its bootstrap's node.id).
	NodeID string
	// Identity gives the local pods' SVIDs and the trust bundle (identity.Rotator.Provider for the
	// development CA; SPIRE's Delegated Identity API).
	Identity identity.Provider
	// Build tunes the builders.
	Build Options
	// Logger receives build failures, NACKs and rotations (default slog.Default()).
	Logger *slog.Logger
	// Registerer, when set, receives the server's metrics.
	Registerer prometheus.Registerer
	// OnNACK, when set, is called on its own goroutine once per rejected response (type URL and
	// version), with the type URL and Envoy's error_detail. The agent runs its attachment repair
	// from it: a restarted Envoy rejects the listeners of a pod whose netns is gone ("failed to
	// open netns file"), and repair releases that pod.
	OnNACK func(typeURL, detail string)
}

// Server is the agent's xDS server for its node's Envoy: it builds snapshots from mesh models,
// serves them over ADS (state-of-the-world and delta, go-control-plane) and tracks which snapshot
// version Envoy has ACKed.
type Server struct {
	opts  ServerOptions
	log   *slog.Logger
	cache cache.SnapshotCache
	// builder keeps what it built for the next SetMesh (rebuilds only what changed); hashes keeps
	// the delta versions of the resources served, for the resources a new snapshot reuses.
	builder *Builder
	hashes  *hashMemo
	// warnings are the last build's Resources.Warnings, logged when they change.
	warnings []string
	// epoch prefixes every version this server instance hands out, so that a version an Envoy
	// ACKed for a previous agent process is never taken for one of ours.
	epoch string

	buildFailures prometheus.Counter
	nacks         *prometheus.CounterVec
	sent          *prometheus.CounterVec
	bytesSent     *prometheus.CounterVec
	snapVersion   prometheus.Gauge
	unservedPods  prometheus.Gauge
	panics        prometheus.Counter
	// testHook, when set (tests only), runs first for every request Envoy sends on a stream.
	testHook func(typeURL string)

	mu       sync.Mutex
	mesh     *model.Mesh
	seq      uint64
	last     *snapshot
	served   *snapshot   // what the cache holds: last, or the first step of a two-step push
	pending  *pendingEDS // the second step of a two-step push not taken yet
	lastL    uint64      // version at which listeners last changed
	lastC    uint64      // version at which clusters last changed
	need     map[uint64][2]uint64
	acked    map[string]uint64 // type URL -> highest ACKed version of this epoch
	nonces   map[string]uint64 // response nonce -> version (per stream nonces are unique enough)
	nackCnt  uint64
	lastNACK string
	nacked   map[nackKey]bool // NACKs already logged and counted; pruned with rejected
	snaps    map[uint64]*snapshot
	goodSeq  uint64 // highest version whose listeners and clusters Envoy ACKed
	// rolledBack is the version the last rollback served; when Envoy rejects that one too (a
	// restarted Envoy that cannot take the last ACKed snapshot either), it is not rolled back
	// again: that would loop, each rollback a new version and a new NACK.
	rolledBack uint64
	rejected   map[uint64]string // NACKed versions -> error_detail
	// servedPods are the UIDs of the local pods the snapshot served holds, unserved those it
	// leaves out (Resources.Unserved: no SVID, or none of their own), servedModel the version
	// of the model it was built from; servedCh is closed (and replaced) whenever a new snapshot
	// is served.
	servedPods  map[string]bool
	unserved    map[string]UnservedPod
	servedModel uint64
	servedCh    chan struct{}
	changed     chan struct{}
	// kick wakes the rotation loop after SetMesh (new identities change the next renewal).
	kick chan struct{}
}

// nackKey is one rejected response: type URL and snapshot version.
type nackKey struct {
	url     string
	version uint64
}

// Type URLs whose ACK WaitForAck waits for: the listeners hold the pods, the clusters are what
// they route to. Not the extension config HeadlessFilterName (ECDS): Envoy asks for it by name,
// and a reconnecting Envoy that already holds its version (delta's initial_resource_versions, as
// after an agent restart) is sent nothing, so no ACK would come (a first try hung
// TestPrivilegedEnvoySupervision). A CNI ADD therefore does not wait for its pod to become
// reachable as a headless endpoint; the pod is not ready yet then.
var waitTypes = [2]string{resource.ListenerType, resource.ClusterType}

// NewServer returns a Server with an empty configuration.
func NewServer(opts ServerOptions) (*Server, error) {
	if opts.NodeID == "" {
		return nil, errors.New("new xds server: empty NodeID")
	}
	if opts.Identity == nil {
		return nil, errors.New("new xds server: nil Identity")
	}
	if err := opts.Build.check(); err != nil {
		return nil, fmt.Errorf("new xds server: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{
		opts:  opts,
		log:   opts.Logger,
		epoch: strconv.FormatInt(time.Now().UnixNano(), 36),
		buildFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aether_xds_build_failures_total", Help: "Snapshot builds that failed; the last good snapshot stays served."}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aether_xds_nacks_total", Help: "xDS responses Envoy rejected (NACK), by type URL."}, []string{"type_url"}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aether_xds_resources_sent_total", Help: "Resources sent to Envoy in xDS responses, by type URL (delta sends only changed ones)."}, []string{"type_url"}),
		bytesSent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aether_xds_bytes_sent_total", Help: "Encoded size of the xDS responses sent to Envoy, by type URL."}, []string{"type_url"}),
		snapVersion: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "aether_xds_snapshot_sequence", Help: "Sequence number of the snapshot being served."}),
		unservedPods: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "aether_xds_pods_unserved", Help: "Local pods the snapshot served leaves out because the identity provider has no SVID for them (yet, or any more)."}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aether_xds_stream_panics_total", Help: "Panics recovered in an xDS stream's handler; that stream ended with an Internal error (Envoy reconnects) and the server kept serving."}),
		need:     map[uint64][2]uint64{},
		acked:    map[string]uint64{},
		nonces:   map[string]uint64{},
		nacked:   map[nackKey]bool{},
		rejected: map[uint64]string{},
		snaps:    map[uint64]*snapshot{},
		builder:  NewBuilder(opts.Build),
		hashes:   &hashMemo{},
		changed:  make(chan struct{}),
		kick:     make(chan struct{}, 1),
		servedCh: make(chan struct{}),
	}
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{s.buildFailures, s.nacks, s.sent, s.bytesSent, s.snapVersion, s.unservedPods, s.panics} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("new xds server: register metrics: %w", err)
			}
		}
	}
	// ads=false: in ADS mode the cache answers a request only when it names every resource of
	// the type in the snapshot, but Envoy asks for secrets piecemeal (the trust bundle with the
	// clusters, each pod's SVID with its inbound listener), which would stall the first SDS
	// response until its 15 s initial-fetch timeout. Every snapshot is still Consistent().
	s.cache = cache.NewSnapshotCache(false, cache.IDHash{}, nil)
	return s, nil
}

// Serve serves ADS (SotW and delta) on l until ctx ends, and rotates SVIDs at their half-life,
// pushing a new snapshot each time. It returns nil when ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	go s.rotate(ctx)
	if err := serveADS(ctx, l, s.cache, s.callbacks(), recoverStream(s.log, s.panics.Inc)); err != nil {
		return fmt.Errorf("serve xds: %w", err)
	}
	return nil
}

// serveADS serves ADS (SotW and delta) from c with callbacks cb on l, every stream through
// interceptor rec, until ctx ends (then it returns nil) or the listener fails.
func serveADS(ctx context.Context, l net.Listener, c cache.Cache, cb server.Callbacks, rec grpc.StreamServerInterceptor) error {
	g := grpc.NewServer(grpc.ChainStreamInterceptor(rec))
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(g, server.NewServer(ctx, c, cb))
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(l) }()
	select {
	case <-ctx.Done():
		g.Stop()
		<-errc
		return nil
	case err := <-errc:
		return err
	}
}

// recoverStream is an ADS server's stream interceptor: a panic in a stream's handler (the
// go-control-plane server and the server's callbacks, which run on the stream's goroutine) is
// counted (counted: the node server's aether_xds_stream_panics_total), logged with its stack and ends that
// stream with codes.Internal; Envoy reconnects and gets the current snapshot, and every other
// stream and the process go on (grpc-go does not recover handler panics: one would end the
// agent).
func recoverStream(log *slog.Logger, counted func()) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if v := recover(); v != nil {
				counted()
				log.Error("xds: panic in a stream handler (recovered, stream ended)", "method", info.FullMethod, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				err = status.Errorf(codes.Internal, "xds: internal error in %s", info.FullMethod)
			}
		}()
		return handler(srv, ss)
	}
}

// renewalWait waits until due, the earliest renewal or expiry of rot's SVIDs when it started
// (zero when none; a minute at most), and returns with fired set; or returns when rot signals a
// change of its own (changed: Provider.Changed); both are false when kick woke it first (new
// SVIDs may change the next renewal); done is true when ctx ended. The caller compares the time
// with due, not with a fresh NextRenewal: an expired SVID the provider dropped no longer counts
// in it.
func renewalWait(ctx context.Context, rot identity.Provider, kick <-chan struct{}) (due time.Time, fired, changed, done bool) {
	next := rot.NextRenewal()
	wait := time.Until(next)
	if next.IsZero() || wait > time.Minute {
		wait = time.Minute
	}
	due = next
	timer := time.NewTimer(max(wait, 0))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return due, false, false, true
	case <-kick:
		return due, false, false, false
	case <-timer.C:
		return due, true, false, false
	case <-rot.Changed():
		return due, false, true, false
	}
}

// rotate rebuilds the snapshot from the latest model when an SVID reaches its renewal or expiry,
// and when the identity provider has new SVIDs or a new bundle of its own.
func (s *Server) rotate(ctx context.Context) {
	for {
		due, fired, changed, done := renewalWait(ctx, s.opts.Identity, s.kick)
		if done {
			return
		}
		if !changed && (!fired || due.IsZero() || time.Now().Before(due)) {
			continue
		}
		s.mu.Lock()
		m := s.mesh
		var v string
		var err error
		if m != nil {
			// Under the lock, from the model held now: a SetMesh between reading the model
			// and building from it would otherwise be rolled back to the older model.
			v, err = s.setMeshLocked(ctx, m)
		}
		s.mu.Unlock()
		switch {
		case m == nil:
		case err != nil:
			s.log.Error("rotate SVIDs", "err", err)
		default:
			s.log.Info("rotated SVIDs", "version", v)
		}
	}
}

// SetMesh builds a snapshot from m, validates every resource (ValidateAll) and the snapshot's
// consistency, and serves it. It returns the new snapshot's version, to pass to WaitForAck. When
// the build or a check fails, the last good snapshot stays served, the failure is logged and
// counted (aether_xds_build_failures_total), and the error is returned.
func (s *Server) SetMesh(ctx context.Context, m *model.Mesh) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.setMeshLocked(ctx, m)
}

// setMeshLocked is SetMesh with s.mu held.
func (s *Server) setMeshLocked(ctx context.Context, m *model.Mesh) (string, error) {
	// What rotate builds again, served or not: a build that failed for want of the identity
	// provider's bundle is tried again when the provider has it.
	s.mesh = m
	res, served, unserved, err := s.build(ctx, m)
	if err != nil {
		s.buildFailures.Inc()
		s.log.Error("build xds snapshot; keeping the last good one", "mesh_version", m.Version, "err", err)
		return "", err
	}
	s.seq++
	v := s.seq
	version := s.epoch + "." + strconv.FormatUint(v, 10)
	snap, err := newSnapshot(version, res, s.hashes)
	if err != nil {
		s.seq--
		s.buildFailures.Inc()
		s.log.Error("check xds snapshot; keeping the last good one", "mesh_version", m.Version, "err", err)
		return "", fmt.Errorf("check snapshot: %w", err)
	}
	prevL, prevC := s.lastL, s.lastC
	s.noteChanges(snap, v)
	if err := s.setSnapshot(ctx, snap); err != nil {
		s.lastL, s.lastC = prevL, prevC
		s.seq--
		s.buildFailures.Inc()
		return "", fmt.Errorf("set snapshot: %w", err)
	}
	s.need[v] = [2]uint64{s.lastL, s.lastC}
	s.snaps[v] = snap
	for old := range s.need {
		if old+64 < v {
			delete(s.need, old)
		}
	}
	for old := range s.rejected {
		if old+64 < v {
			delete(s.rejected, old)
		}
	}
	for k := range s.nacked {
		if k.version+64 < v {
			delete(s.nacked, k)
		}
	}
	for old := range s.snaps {
		if old+8 < v && old != s.goodSeq {
			delete(s.snaps, old)
		}
	}
	s.last = snap
	s.servedPods, s.unserved, s.servedModel = served, unserved, m.Version
	s.unservedPods.Set(float64(len(unserved)))
	s.snapVersion.Set(float64(v))
	close(s.servedCh)
	s.servedCh = make(chan struct{})
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return version, nil
}

// noteChanges records v as the version at which listeners or clusters last changed, when they
// differ from the snapshot served before (delta ADS sends nothing for an unchanged type, so no
// ACK for v would come). Called with s.mu held.
func (s *Server) noteChanges(snap *snapshot, v uint64) {
	if s.last == nil || !sameResources(s.last, snap, resource.ListenerType) {
		s.lastL = v
	}
	if s.last == nil || !sameResources(s.last, snap, resource.ClusterType) {
		s.lastC = v
	}
}

// build runs the builders and validates every resource. Called with s.mu held.
func (s *Server) build(ctx context.Context, m *model.Mesh) (map[resource.Type][]types.Resource, map[string]bool, map[string]UnservedPod, error) {
	pods := make([]identity.Workload, len(m.Pods))
	for i, p := range m.Pods {
		pods[i] = identity.Workload{UID: p.UID, SPIFFEID: p.SPIFFEID(m.TrustDomain)}
	}
	byID, _, err := s.opts.Identity.SVIDs(ctx, pods)
	if err != nil {
		return nil, nil, nil, err
	}
	// Lacks answers as of the SVIDs call just made.
	r, err := s.builder.build(m, byID, s.opts.Identity.Lacks, s.opts.Identity.Bundles())
	if err != nil {
		return nil, nil, nil, err
	}
	if err := r.ValidateAll(); err != nil {
		return nil, nil, nil, err
	}
	unserved := make(map[string]UnservedPod, len(r.Unserved))
	for _, u := range r.Unserved {
		unserved[u.UID] = u
		if old, ok := s.unserved[u.UID]; !ok || old != u {
			s.log.Warn("pod left out of the node proxy until the identity provider has its SVID", "pod", u.Namespace+"/"+u.Name, "reason", u.Reason)
		}
	}
	served := make(map[string]bool, len(m.Pods))
	for _, p := range m.Pods {
		if _, left := unserved[p.UID]; !left {
			served[p.UID] = true
		}
	}
	if !slices.Equal(r.Warnings, s.warnings) {
		for _, w := range r.Warnings {
			s.log.Warn("xds build: " + w)
		}
		s.warnings = r.Warnings
	}
	return r.typed(), served, unserved, nil
}

// sameResources reports whether two snapshots hold the same resources of type t. Resources the
// Builder reused are the same values, so most comparisons end at the pointer.
func sameResources(a, b *snapshot, t resource.Type) bool {
	ra, rb := a.GetResources(t), b.GetResources(t)
	if len(ra) != len(rb) {
		return false
	}
	for name, x := range ra {
		y, ok := rb[name]
		if !ok || (x != y && !proto.Equal(x, y)) {
			return false
		}
	}
	return true
}

// parseVersion returns the sequence number of a version this server instance handed out.
func (s *Server) parseVersion(v string) (uint64, bool) {
	e, n, ok := strings.Cut(v, ".")
	if !ok || e != s.epoch {
		return 0, false
	}
	x, err := strconv.ParseUint(n, 10, 64)
	return x, err == nil
}

// WaitPodServed returns the version of the snapshot served now once it serves local pod uid
// (the model it was built from holds the pod and the identity provider had its SVID), or
// ctx's error with the reason the pod was last left out. Pass the version to WaitForAck. A pod
// not in the model is not served either: call it after the model holds the pod.
func (s *Server) WaitPodServed(ctx context.Context, uid string) (string, error) {
	for {
		s.mu.Lock()
		u, left := s.unserved[uid]
		ok := s.servedPods[uid]
		last, ch := s.last, s.servedCh
		s.mu.Unlock()
		if last != nil && ok {
			return last.version, nil
		}
		select {
		case <-ctx.Done():
			why := "no snapshot served yet"
			switch {
			case left:
				why = u.Reason
			case last != nil:
				why = "not in the model served"
			}
			return "", fmt.Errorf("pod %s not served by the node proxy: %s: %w", uid, why, context.Cause(ctx))
		case <-ch:
		}
	}
}

// ServedModel returns the version of the model the snapshot served now was built from (0
// before any), that snapshot's version, and a channel closed when another snapshot is served.
// The rotation loop serves models too (a model whose first build failed for want of the
// identity provider's bundle), so a caller waiting for a model's snapshot asks here.
func (s *Server) ServedModel() (model uint64, version string, changed <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last != nil {
		version = s.last.version
	}
	return s.servedModel, version, s.servedCh
}

// ErrRejected is returned (wrapped, with Envoy's error_detail) by WaitForAck when Envoy NACKed
// the snapshot.
var ErrRejected = errors.New("envoy rejected the snapshot")

// WaitForAck returns nil once Envoy has ACKed the listeners and clusters of the snapshot with the
// given version (or of a later one), an error wrapping ErrRejected when Envoy NACKed it, and ctx's
// error if neither happens before ctx ends.
func (s *Server) WaitForAck(ctx context.Context, version string) error {
	v, ok := s.parseVersion(version)
	if !ok {
		return fmt.Errorf("wait for ack: version %q is not one of this server's", version)
	}
	for {
		s.mu.Lock()
		if detail, bad := s.rejected[v]; bad {
			s.mu.Unlock()
			return fmt.Errorf("wait for ack of version %s: %w: %s", version, ErrRejected, detail)
		}
		need, known := s.need[v]
		switch {
		case v > s.seq:
			// Not served yet (or its number was given back by a failed SetMesh): wait for it.
			need = [2]uint64{v, v}
		case !known:
			// Older than the tracked window: each type's need at v was at most v and at most
			// the version of its last change since, which Envoy ACKs in the end (v itself may
			// never be ACKed for a type that has not changed since).
			need = [2]uint64{min(v, s.lastL), min(v, s.lastC)}
		}
		done := s.acked[waitTypes[0]] >= need[0] && s.acked[waitTypes[1]] >= need[1]
		ch := s.changed
		s.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			s.mu.Lock()
			acked := fmt.Sprintf("listeners %d/%d, clusters %d/%d", s.acked[waitTypes[0]], need[0], s.acked[waitTypes[1]], need[1])
			s.mu.Unlock()
			return fmt.Errorf("wait for ack of version %s (ACKed/needed: %s): %w", version, acked, ctx.Err())
		case <-ch:
		}
	}
}

// NACKs returns how many responses Envoy rejected and the error_detail of the last one.
func (s *Server) NACKs() (count uint64, last string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nackCnt, s.lastNACK
}

// setSnapshot serves snap. When clusters that already had endpoints changed, it serves snap in
// two steps (snapshot.holdEDS): first the changed clusters without their endpoints; then, once
// the clusters' response has gone to Envoy (or after edsReleaseTimeout), snap itself, which sends
// the endpoints after them. Called with s.mu held.
func (s *Server) setSnapshot(ctx context.Context, snap *snapshot) error {
	prev := s.served
	s.pending = nil // a newer snapshot replaces a second step not taken yet
	if prev != nil {
		if names := snap.changedEDSClusters(prev); len(names) > 0 {
			first := snap.holdEDS(prev, names)
			if err := s.cache.SetSnapshot(ctx, s.opts.NodeID, first); err != nil {
				return err
			}
			s.served = first
			p := &pendingEDS{snap: snap, sent: make(chan struct{})}
			s.pending = p
			go s.releaseEDS(p)
			return nil
		}
	}
	if err := s.cache.SetSnapshot(ctx, s.opts.NodeID, snap); err != nil {
		return err
	}
	s.served = snap
	return nil
}

// pendingEDS is the second step of a two-step push (setSnapshot): snap, to serve once sent is
// closed (the first step's clusters went to Envoy).
type pendingEDS struct {
	snap *snapshot
	sent chan struct{}
	once sync.Once
}

// edsReleaseTimeout bounds the wait for the first step's clusters to go out: with no Envoy
// connected, or one that does not ask, the second step is served anyway.
const edsReleaseTimeout = time.Second

// releaseEDS serves p's snapshot once its clusters were sent, unless a newer one replaced it.
func (s *Server) releaseEDS(p *pendingEDS) {
	select {
	case <-p.sent:
	case <-time.After(edsReleaseTimeout):
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending != p {
		return
	}
	s.pending = nil
	if err := s.cache.SetSnapshot(context.Background(), s.opts.NodeID, p.snap); err != nil {
		s.log.Error("serve endpoints after changed clusters", "version", p.snap.version, "err", err)
		return
	}
	s.served = p.snap
}

// clustersSent notes a clusters response of version v going to Envoy (called with s.mu held):
// it releases the second step of a two-step push of that version.
func (s *Server) clustersSent(typeURL, v string) {
	if p := s.pending; p != nil && typeURL == resource.ClusterType && v == p.snap.version {
		p.once.Do(func() { close(p.sent) })
	}
}

// Version returns the version of the snapshot being served ("" before the first SetMesh).
func (s *Server) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seq == 0 {
		return ""
	}
	return s.epoch + "." + strconv.FormatUint(s.seq, 10)
}

// ack records an ACK of version v for type url, or a NACK with its detail. Called with s.mu held.
//
// A NACK is logged and counted once per type and version. When Envoy rejects the snapshot being
// served, the server serves the last snapshot Envoy fully ACKed again under a new version: the
// state-of-the-world protocol would otherwise resend the rejected snapshot after every NACK, in a
// tight loop, and Envoy keeps its last accepted configuration anyway. WaitForAck of the rejected
// version then never succeeds.
func (s *Server) ack(url string, v uint64, ok bool, nack string) {
	if !ok {
		key := nackKey{url, v}
		if s.nacked[key] {
			return
		}
		s.nacked[key] = true
		s.nackCnt++
		s.lastNACK = nack
		s.nacks.WithLabelValues(url).Inc()
		s.log.Error("envoy rejected xds response (NACK)", "type_url", url, "version", v, "error_detail", nack)
		if s.opts.OnNACK != nil {
			go s.opts.OnNACK(url, nack)
		}
		s.rejected[v] = nack
		close(s.changed)
		s.changed = make(chan struct{})
		switch {
		case v != s.seq || s.goodSeq == 0 || s.snaps[s.goodSeq] == nil:
		case v == s.rolledBack:
			s.log.Warn("envoy rejected the last ACKed snapshot too (a restarted Envoy?); serving nothing new until the next change", "version", v)
		default:
			go s.rollback(s.snaps[s.goodSeq], v)
		}
		return
	}
	if v > s.acked[url] {
		s.acked[url] = v
		for seq, need := range s.need {
			if seq > s.goodSeq && s.acked[waitTypes[0]] >= need[0] && s.acked[waitTypes[1]] >= need[1] {
				s.goodSeq = seq
			}
		}
		close(s.changed)
		s.changed = make(chan struct{})
	}
}

// rollback serves the resources of a fully ACKed snapshot under a new version, in place of the
// rejected snapshot nacked. It does nothing when a newer snapshot was set since (SetMesh won the
// lock first): that one replaces the rejected snapshot, and rolling back over it would serve the
// old configuration until the next SetMesh, and a version WaitForAck waits for would never come.
func (s *Server) rollback(good *snapshot, nacked uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seq != nacked {
		return
	}
	s.seq++
	v := s.seq
	version := s.epoch + "." + strconv.FormatUint(v, 10)
	snap, err := newSnapshot(version, good.resources(), s.hashes)
	if err == nil {
		err = s.setSnapshot(context.Background(), snap)
	}
	if err != nil {
		s.seq--
		s.log.Error("roll back to the last ACKed snapshot", "err", err)
		return
	}
	s.noteChanges(snap, v)
	s.need[v] = [2]uint64{s.lastL, s.lastC}
	s.snaps[v] = snap
	s.last = snap
	s.snapVersion.Set(float64(v))
	s.rolledBack = v
	s.log.Warn("served the last ACKed snapshot again after a NACK", "version", version)
}

// countSent counts a response of n resources of type url (aether_xds_resources_sent_total) and
// its encoded size (aether_xds_bytes_sent_total). The resources in a response are already
// encoded (Any), so proto.Size adds their lengths without walking them.
func (s *Server) countSent(url string, n int, resp proto.Message) {
	s.sent.WithLabelValues(url).Add(float64(n))
	s.bytesSent.WithLabelValues(url).Add(float64(proto.Size(resp)))
}

func (s *Server) callbacks() server.Callbacks {
	// When Envoy's ADS stream ends (Envoy restarted or lost), what it ACKed no longer tells what
	// a new Envoy holds: forget it, so WaitForAck waits for the new stream's ACKs.
	closed := func(int64, *core.Node) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.acked = map[string]uint64{}
	}
	return server.CallbackFuncs{
		StreamClosedFunc:      closed,
		DeltaStreamClosedFunc: closed,
		StreamResponseFunc: func(_ context.Context, _ int64, _ *discoverygrpc.DiscoveryRequest, resp *discoverygrpc.DiscoveryResponse) {
			s.countSent(resp.GetTypeUrl(), len(resp.GetResources()), resp)
			s.mu.Lock()
			defer s.mu.Unlock()
			if v, ok := s.parseVersion(resp.GetVersionInfo()); ok {
				s.nonces[resp.GetNonce()] = v
			}
			s.clustersSent(resp.GetTypeUrl(), resp.GetVersionInfo())
		},
		StreamRequestFunc: func(_ int64, req *discoverygrpc.DiscoveryRequest) error {
			if s.testHook != nil {
				s.testHook(req.GetTypeUrl())
			}
			s.onRequest(req.GetTypeUrl(), req.GetResponseNonce(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
			return nil
		},
		StreamDeltaResponseFunc: func(_ int64, _ *discoverygrpc.DeltaDiscoveryRequest, resp *discoverygrpc.DeltaDiscoveryResponse) {
			s.countSent(resp.GetTypeUrl(), len(resp.GetResources()), resp)
			s.mu.Lock()
			defer s.mu.Unlock()
			if v, ok := s.parseVersion(resp.GetSystemVersionInfo()); ok {
				s.nonces[resp.GetNonce()] = v
			}
			s.clustersSent(resp.GetTypeUrl(), resp.GetSystemVersionInfo())
		},
		StreamDeltaRequestFunc: func(_ int64, req *discoverygrpc.DeltaDiscoveryRequest) error {
			if s.testHook != nil {
				s.testHook(req.GetTypeUrl())
			}
			s.onRequest(req.GetTypeUrl(), req.GetResponseNonce(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
			return nil
		},
	}
}

// onRequest turns a request that answers one of our responses (by nonce) into an ACK or NACK.
func (s *Server) onRequest(url, nonce, detail string, isNACK bool) {
	if nonce == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.nonces[nonce]
	if !ok {
		return
	}
	delete(s.nonces, nonce)
	s.ack(url, v, !isNACK, detail)
}
