package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

// registryView folds the registry's endpoint and export watches into what the model assembler
// reads (model.RegistryView). It keeps its last view while the registry is unreachable: the
// watches resume, or re-list after a compaction, and deliver exactly the difference.
//
// Endpoint deletions are held back ("self-preservation", as lease-based registries such as
// Eureka do): the registry deletes an endpoint when its writer's lease expires, and a lease also
// expires when the writer is alive but cut off from the registry. When every node is cut off
// (a registry partition longer than about two thirds of the lease TTL), the registry deletes
// every node's endpoints at once; a reader receives those deletions during the cut when the
// partition is one-way (it can still read what etcd sends) and, in any case, as soon as its
// watch resumes, before the writers have re-registered. Applying them would empty every
// cluster's EDS ("no healthy upstream") although every endpoint still serves. So a deletion is
// applied only when (a) a linearizable registry read started after it arrived succeeded (the
// reader is connected, so the deletion is not an artefact of its own partition) and (b) no
// round trip to the registry failed for the last hold (the writers, cut off with it, had time
// to come back and re-register; a re-registration cancels the held deletion). The round trips
// of (b) are this node's reads and the keepalives of its own endpoint lease (keepAlive,
// registry.KeepAliveStatus): a keepalive answered later than a third of the TTL plus 1 s is a
// failed round trip. A dead node's endpoints therefore leave the model one read after their
// lease expired while the registry is healthy, and at most hold after the registry came back
// when the node died during an outage.
//
// The node reads the registry only when a read is needed (probeRegistry, readDue): when a
// deletion is held (at once, at most one read per readTiming.gap, and again when the hold
// after a failure ends), and, while it holds no lease (no endpoint registered, so no keepalive
// runs), every readTiming.interval (a third of the lease TTL) to know it is connected. While it
// holds a lease and nothing is deleted it sends the registry no read: the keepalives, which it
// sends anyway, are its round trips.
type registryView struct {
	log      *slog.Logger
	onChange func()
	hold     time.Duration
	kick     chan struct{} // a deletion is waiting for a read
	// keepAlive reports the keepalives of this node's endpoint lease at a given time
	// (registry.Registry.KeepAliveStatus). Set before run and probeRegistry start; the default
	// reports no lease, ever.
	keepAlive func(now time.Time) registry.KeepAliveStatus
	// trustDomains, when set, are the mesh's trust domain and the clusterset's others
	// (--clusterset-trust-domains): an endpoint record whose spiffe_id is of none of them is left
	// out (logged), since its identity could never pass the inbound listeners' trust-domain
	// check and a writer must not make this node pin a foreign identity. Set before run starts.
	trustDomains []string

	mu sync.Mutex
	// eps holds each valid endpoint record converted once, when its event arrives: a change
	// costs the conversion of what changed, not of every endpoint in the clusterset.
	eps       map[string]model.Endpoint
	exps      map[string]registry.Record[*registryv1.ExportMark]
	pending   map[string]time.Time // endpoint key -> when its deletion arrived (still in eps)
	epsRev    int64                // revision of the last endpoint batch
	readErr   error                // result of the last registry read
	readStart time.Time            // start of the last registry read (zero: none yet)
	readEnd   time.Time            // its end
	failed    time.Time            // end of the last failed read
	cacheOK   bool
	// epsOut is the last endpoint slice handed out, ordered by endpointOrder, and epsKeys the
	// registry key of each entry; dirty holds the keys changed in eps since. Records merges the
	// changes into a new slice (earlier slices are never written again), so the model's
	// per-service endpoint lists arrive sorted and a change costs one copy, not a sort.
	epsOut  []model.Endpoint
	epsKeys []string
	dirty   map[string]struct{}
	expOut  []model.ExportMark
	synced  chan struct{} // closed once both watches delivered their snapshot
	epsSeen bool
	expSeen bool
	// raw holds the record of each endpoint in eps, as the watch delivered it (shared with the
	// watcher, never modified): what the view persists (storedRecords).
	raw map[string]*registryv1.ServiceEndpoint
	// changed is signalled (one slot) after every change of the records (persistView).
	changed chan struct{}
	// seed describes the persisted state the view serves until both watches delivered their
	// snapshot (seedFrom); nil when it serves none.
	seed *seedInfo
}

// seedInfo is where a view's last-known state came from.
type seedInfo struct {
	file    string
	written time.Time
}

// newRegistryView returns a view that calls onChange after every change of its records and holds
// endpoint deletions for hold after the registry was last unreachable (see registryView).
func newRegistryView(log *slog.Logger, hold time.Duration, onChange func()) *registryView {
	return &registryView{log: log, onChange: onChange, hold: hold, synced: make(chan struct{}),
		kick: make(chan struct{}, 1), readErr: errors.New("registry not read yet"),
		keepAlive: func(time.Time) registry.KeepAliveStatus { return registry.KeepAliveStatus{} },
		eps:       map[string]model.Endpoint{}, dirty: map[string]struct{}{}, pending: map[string]time.Time{},
		exps: map[string]registry.Record[*registryv1.ExportMark]{},
		raw:  map[string]*registryv1.ServiceEndpoint{}, changed: make(chan struct{}, 1)}
}

// run consumes both watches until ctx ends.
func (v *registryView) run(ctx context.Context, r *registry.Registry) {
	epc, exc := r.WatchEndpoints(ctx), r.WatchExports(ctx)
	for epc != nil || exc != nil {
		select {
		case b, ok := <-epc:
			if !ok {
				epc = nil
				continue
			}
			v.mu.Lock()
			now := time.Now()
			held := v.applyEndpoints(b, now)
			if b.Snapshot && !v.epsSeen && v.seed != nil {
				held = v.holdUnlisted(b, now) || held
			}
			v.cacheOK = false
			v.epsSeen = true
			v.markSynced()
			v.mu.Unlock()
			if held {
				select {
				case v.kick <- struct{}{}:
				default:
				}
			}
			signal(v.changed)
			v.onChange()
		case b, ok := <-exc:
			if !ok {
				exc = nil
				continue
			}
			v.mu.Lock()
			if b.Snapshot && !v.expSeen && v.seed != nil {
				clear(v.exps) // the persisted marks: the live snapshot is the whole truth
			}
			b.Apply(v.exps)
			v.cacheOK = false
			v.expSeen = true
			v.markSynced()
			v.mu.Unlock()
			signal(v.changed)
			v.onChange()
		}
	}
}

// applyEndpoints folds an endpoint batch into the view, converting each added or updated record
// once: additions and updates at once (they cancel a held deletion of the same key); a record
// that does not convert is logged and left out at once (its writer is alive and wrote it);
// deletions of known endpoints are held until a probe confirms them (confirmDeletions). It
// reports whether a deletion is now held. Callers hold mu.
func (v *registryView) applyEndpoints(b registry.Batch[*registryv1.ServiceEndpoint], now time.Time) (held bool) {
	for _, e := range b.Events {
		if e.Type != registry.Deleted {
			delete(v.pending, e.Key)
			v.setEndpoint(e.Record)
			continue
		}
		if _, known := v.eps[e.Key]; known {
			if _, ok := v.pending[e.Key]; !ok {
				v.pending[e.Key] = now
			}
			held = true
		}
	}
	v.epsRev = max(v.epsRev, b.Revision)
	return held
}

// setEndpoint converts an added or updated endpoint record into eps (and keeps it in raw); a
// record that does not convert, or whose identity is not of the trust domain, is logged and
// left out. Callers hold mu.
func (v *registryView) setEndpoint(rec registry.Record[*registryv1.ServiceEndpoint]) {
	v.dirty[rec.Key] = struct{}{}
	m, err := registry.ToModelEndpoint(rec)
	if err == nil && len(v.trustDomains) > 0 && !slices.ContainsFunc(v.trustDomains, func(td string) bool {
		return strings.HasPrefix(m.SPIFFEID, "spiffe://"+td+"/")
	}) {
		err = fmt.Errorf("spiffe_id %q: not of the mesh's trust domains %q", m.SPIFFEID, v.trustDomains)
	}
	if err != nil {
		v.log.Warn("skip registry endpoint", "key", rec.Key, "err", err)
		delete(v.eps, rec.Key)
		delete(v.raw, rec.Key)
		return
	}
	v.eps[rec.Key] = m
	v.raw[rec.Key] = rec.Value
}

// holdUnlisted makes every endpoint the view holds from its persisted state that the live
// snapshot b does not list a held deletion, as if the watch had delivered it: while the registry
// was cut off the writers may have lost their leases, and they re-register once they are back
// (see registryView). It reports whether a deletion is now held. Callers hold mu.
func (v *registryView) holdUnlisted(b registry.Batch[*registryv1.ServiceEndpoint], now time.Time) bool {
	listed := make(map[string]bool, len(b.Events))
	for _, e := range b.Events {
		listed[e.Key] = true
	}
	held := false
	for k := range v.eps {
		if !listed[k] {
			if _, ok := v.pending[k]; !ok {
				v.pending[k] = now
			}
			held = true
		}
	}
	return held
}

// seedFrom loads a persisted registry state (persistView's file, named file) into a view whose
// watches have not both synced, for the watch that has not: the node serves it until the
// registry answers. Records that do not decode are logged and left out; endpoints pass the
// checks live ones pass (setEndpoint). It returns how many endpoints and export marks it
// loaded.
func (v *registryView) seedFrom(st *registryState, file string) (eps, exps int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.epsSeen && v.expSeen {
		return 0, 0
	}
	for _, r := range st.Records {
		k, err := registry.ParseKey(r.Key)
		if err == nil && k.Kind == registry.KindEndpoint && !v.epsSeen {
			var rec registry.Record[*registryv1.ServiceEndpoint]
			if rec, err = registry.DecodeEndpoint(r.Key, r.Value); err == nil {
				v.setEndpoint(rec)
				if _, ok := v.eps[r.Key]; ok {
					eps++
				}
			}
		} else if err == nil && k.Kind == registry.KindExport && !v.expSeen {
			var rec registry.Record[*registryv1.ExportMark]
			if rec, err = registry.DecodeExport(r.Key, r.Value); err == nil {
				v.exps[r.Key] = rec
				exps++
			}
		}
		if err != nil {
			v.log.Warn("persisted registry record ignored", "file", file, "key", r.Key, "err", err)
		}
	}
	v.seed = &seedInfo{file: file, written: st.Written}
	v.cacheOK = false
	return eps, exps
}

// storedRecords returns the records the view holds (endpoints, held deletions included, and
// export marks) as persistView writes them, or ok false while the view is not live (its
// watches have not both synced: it holds nothing, or what it loaded).
func (v *registryView) storedRecords() (recs []storedRecord, ok bool, err error) {
	v.mu.Lock()
	if !v.epsSeen || !v.expSeen {
		v.mu.Unlock()
		return nil, false, nil
	}
	eps := maps.Clone(v.raw)
	exps := make(map[string]*registryv1.ExportMark, len(v.exps))
	for k, r := range v.exps {
		exps[k] = r.Value
	}
	v.mu.Unlock()
	recs = make([]storedRecord, 0, len(eps)+len(exps))
	for k, m := range eps {
		r, err := storeRecord(k, m)
		if err != nil {
			return nil, false, err
		}
		recs = append(recs, r)
	}
	for k, m := range exps {
		r, err := storeRecord(k, m)
		if err != nil {
			return nil, false, err
		}
		recs = append(recs, r)
	}
	return recs, true, nil
}

// viewPersistInterval is the least time between two writes of the persisted registry view:
// the endpoints of a busy clusterset change all the time, and a restart during a registry cut
// loses at most this much of their history.
const viewPersistInterval = 10 * time.Second

// persistView writes the view's records to file (viewStateFile) whenever they changed, at most
// every interval, once the view is live, and once more when ctx ends. A failed write is logged
// once until one succeeds.
func persistView(ctx context.Context, v *registryView, file *stateFile, interval time.Duration, log *slog.Logger) {
	failing := false
	save := func() {
		recs, ok, err := v.storedRecords()
		if ok && err == nil {
			_, err = file.save(recs, time.Now())
		}
		switch {
		case err != nil && !failing:
			log.Error("registry view not persisted: an agent restart while the registry is cut off would wait for it", "err", err)
		case err == nil && failing:
			log.Info("registry view persisted again", "file", file.path)
		}
		failing = err != nil
	}
	select {
	case <-ctx.Done():
		return
	case <-v.synced:
	}
	for {
		save()
		select {
		case <-ctx.Done():
			save()
			return
		case <-v.changed:
		}
		select {
		case <-ctx.Done():
			save()
			return
		case <-time.After(interval):
		}
	}
}

// readTiming says when the agent reads the registry (probeRegistry, readDue).
type readTiming struct {
	// interval is the time between two reads while the node holds no lease (no keepalive
	// tells it whether the registry answers).
	interval time.Duration
	// timeout bounds each read.
	timeout time.Duration
	// gap is the least time between the starts of two reads for held deletions: a burst of
	// deletions costs one read per gap, not one per batch.
	gap time.Duration
}

// readTimingFor returns the agent's read timing for a lease TTL: every TTL/3 without a lease
// (as often as a writer's keepalives), reads bounded by 2 s (by TTL/3 when shorter), and at
// least 1 s between two reads for held deletions.
func readTimingFor(ttl time.Duration) readTiming {
	return readTiming{interval: ttl / 3, timeout: min(2*time.Second, ttl/3), gap: time.Second}
}

// followRegistry keeps view in step with reg until ctx ends: the watches (run) and the reads
// that confirm held deletions and, while reg holds no lease, tell whether the registry
// answers (probeRegistry, timed by readTimingFor(ttl), ttl being reg's lease TTL).
func followRegistry(ctx context.Context, view *registryView, reg *registry.Registry, ttl time.Duration) {
	view.keepAlive = reg.KeepAliveStatus
	go view.run(ctx, reg)
	go view.probeRegistry(ctx, func(ctx context.Context) error { return registryHealthy(ctx, reg) }, readTimingFor(ttl))
}

// probeRegistry runs read whenever one is due (readDue: a deletion is held, or no lease
// keepalive tells whether the registry answers), each bounded by t.timeout, records its result
// and applies the held deletions it confirms, until ctx ends. read must need a round trip to
// the registry's quorum (a linearizable read). Between reads it re-checks what is due every
// t.interval, and at once when a deletion arrives (kick); the checks send nothing.
func (v *registryView) probeRegistry(ctx context.Context, read func(context.Context) error, t readTiming) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-v.kick:
		}
		due := v.nextRead(time.Now(), t)
		if !due.IsZero() && !due.After(time.Now()) {
			start := time.Now()
			rctx, cancel := context.WithTimeout(ctx, t.timeout)
			err := read(rctx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if v.confirmDeletions(start, time.Now(), err) {
				v.onChange()
			}
			due = v.nextRead(time.Now(), t)
		}
		wait := t.interval
		if !due.IsZero() {
			wait = min(wait, max(time.Until(due), 0))
		}
		timer.Reset(wait)
	}
}

// nextRead returns when the next registry read is due at now (readDue with the lease's
// keepalive status at now).
func (v *registryView) nextRead(now time.Time, t readTiming) time.Time {
	ka := v.keepAlive(now)
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.readDue(ka, t)
}

// readDue returns when the next registry read is due (zero: none is), given the lease's
// keepalive status: while no lease is held, t.interval after the last read started; while a
// deletion is held, t.gap after the last read started, and not before the hold after the last
// failed round trip (a failed read or a missed keepalive, now while one is overdue) has
// passed, since no read could confirm it earlier. Callers hold mu.
func (v *registryView) readDue(ka registry.KeepAliveStatus, t readTiming) time.Time {
	var due time.Time
	if ka.Lease == 0 {
		due = v.readStart.Add(t.interval)
	}
	if len(v.pending) > 0 {
		d := v.readStart.Add(t.gap)
		if f := latest(v.failed, ka.Missed); !f.IsZero() {
			d = latest(d, f.Add(v.hold))
		}
		if due.IsZero() || d.Before(due) {
			due = d
		}
	}
	return due
}

// latest returns the later of two times.
func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// confirmDeletions records the result of a registry read that ran from start to end and, when it
// succeeded and no round trip failed for the last hold (no read failed, no lease keepalive was
// missed), deletes the held endpoints whose deletion arrived before start. It reports whether
// the records changed.
func (v *registryView) confirmDeletions(start, end time.Time, readErr error) (changed bool) {
	ka := v.keepAlive(end)
	v.mu.Lock()
	defer v.mu.Unlock()
	wasOK := v.readErr == nil
	v.readErr, v.readStart, v.readEnd = readErr, start, end
	if readErr != nil {
		v.failed = end
		if wasOK {
			v.log.Warn("registry unreachable: serving the last-known endpoints; their deletions wait until it is back",
				"held_deletions", len(v.pending), "hold", v.hold, "err", readErr)
		}
		return false
	}
	if f := latest(v.failed, ka.Missed); !f.IsZero() && end.Sub(f) < v.hold {
		if len(v.pending) > 0 {
			v.log.Debug("registry: deletions held for the hold after the last failed round trip",
				"held_deletions", len(v.pending), "failed", f, "hold", v.hold)
		}
		return false
	}
	n := 0
	for k, at := range v.pending {
		if at.Before(start) {
			delete(v.eps, k)
			delete(v.raw, k)
			v.dirty[k] = struct{}{}
			delete(v.pending, k)
			n++
		}
	}
	if n > 0 {
		v.cacheOK = false
		v.log.Debug("registry: endpoint deletions confirmed", "deleted", n, "still_held", len(v.pending))
		signal(v.changed)
	}
	return n > 0
}

// health is readiness "registry": an error while the view serves its persisted state (seedFrom)
// rather than the registry's, naming the file and when it was written, else reachable's.
func (v *registryView) health(context.Context) error {
	err := v.reachable()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.seed != nil && !(v.epsSeen && v.expSeen) {
		msg := fmt.Sprintf("serving the last-known registry state from %s written at %s until the registry's watches sync",
			v.seed.file, v.seed.written.UTC().Format(time.RFC3339))
		if err != nil {
			return fmt.Errorf("%s: %w", msg, err)
		}
		return errors.New(msg)
	}
	return err
}

// reachable reports whether the registry answers (nil: it does), from the newest evidence: while
// the node holds a lease, an overdue keepalive fails it, and otherwise the newer of the last
// keepalive answer and the last read decides; without a lease, the last read.
func (v *registryView) reachable() error {
	now := time.Now()
	ka := v.keepAlive(now)
	v.mu.Lock()
	defer v.mu.Unlock()
	if ka.Lease != 0 {
		if ka.Missing {
			return fmt.Errorf("registry unreachable: no answer to this node's lease keepalive for %s (expected within %s)",
				now.Sub(ka.Answered).Round(time.Millisecond), ka.Period)
		}
		if v.readErr == nil || v.readEnd.Before(ka.Answered) {
			return nil
		}
	}
	return v.readErr
}

func (v *registryView) markSynced() {
	if v.epsSeen && v.expSeen {
		select {
		case <-v.synced:
		default:
			close(v.synced)
			if v.seed != nil {
				v.log.Info("registry synced: serving its live state instead of the last-known one", "file", v.seed.file,
					"held_deletions", len(v.pending))
			}
		}
	}
}

// Records implements model.RegistryView. The slices are cached until the next batch.
func (v *registryView) Records() ([]model.Endpoint, []model.ExportMark) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cacheOK {
		return v.epsOut, v.expOut
	}
	eps := v.mergeEndpoints()
	exps := make([]model.ExportMark, 0, len(v.exps))
	for _, rec := range v.exps {
		exps = append(exps, registry.ToModelExport(rec))
	}
	v.epsOut, v.expOut, v.cacheOK = eps, exps, true
	return eps, exps
}

// keyedEndpoint is an endpoint with its registry key.
type keyedEndpoint struct {
	key string
	ep  *model.Endpoint
}

// endpointOrder orders endpoints by service, then as model.New orders a service's endpoints
// (cluster, pod UID), then by registry key so that the order is total.
func endpointOrder(a, b keyedEndpoint) int {
	return cmp.Or(a.ep.Service.Compare(b.ep.Service), strings.Compare(a.ep.Cluster, b.ep.Cluster),
		strings.Compare(a.ep.PodUID, b.ep.PodUID), strings.Compare(a.key, b.key))
}

// mergeEndpoints returns a new slice of every endpoint in eps ordered by endpointOrder: the last
// slice handed out with the dirty keys merged in (their current values, or left out when
// deleted), or a full sort when most keys changed. Called with v.mu held; it clears dirty.
func (v *registryView) mergeEndpoints() []model.Endpoint {
	defer clear(v.dirty)
	var changed []keyedEndpoint
	full := len(v.dirty) > len(v.epsOut)/4
	if full {
		changed = make([]keyedEndpoint, 0, len(v.eps))
		for k := range v.eps {
			e := v.eps[k]
			changed = append(changed, keyedEndpoint{k, &e})
		}
	} else {
		for k := range v.dirty {
			if e, ok := v.eps[k]; ok {
				changed = append(changed, keyedEndpoint{k, &e})
			}
		}
	}
	slices.SortFunc(changed, endpointOrder)
	out := make([]model.Endpoint, 0, len(v.eps))
	keys := make([]string, 0, len(v.eps))
	i := 0
	if !full {
		for j := range v.epsOut {
			if _, gone := v.dirty[v.epsKeys[j]]; gone {
				continue // its current value, if any, is in changed
			}
			old := keyedEndpoint{v.epsKeys[j], &v.epsOut[j]}
			for ; i < len(changed) && endpointOrder(changed[i], old) < 0; i++ {
				out, keys = append(out, *changed[i].ep), append(keys, changed[i].key)
			}
			out, keys = append(out, *old.ep), append(keys, old.key)
		}
	}
	for ; i < len(changed); i++ {
		out, keys = append(out, *changed[i].ep), append(keys, changed[i].key)
	}
	v.epsOut, v.epsKeys = out, keys
	return out
}

// endpointRegistrar keeps this node's endpoints in the registry equal to what the model says:
// one ServiceEndpoint per (local pod, local service selecting it), healthy while the pod is Ready,
// with each Service port mapped to its container port.
type endpointRegistrar struct {
	reg  *registry.Registry
	log  *slog.Logger
	mu   sync.Mutex
	have map[string]*registryv1.ServiceEndpoint // ns/svc/podUID -> registered value
	// resync asks syncEndpointsLoop to sync the last model again (requestResync).
	resync chan struct{}
}

func newEndpointRegistrar(reg *registry.Registry, log *slog.Logger) *endpointRegistrar {
	return &endpointRegistrar{reg: reg, log: log, have: map[string]*registryv1.ServiceEndpoint{}, resync: make(chan struct{}, 1)}
}

// requestResync makes syncEndpointsLoop sync its last model again without waiting for a new
// one: watchClaim calls it when the claim lets this cluster write again, after a withdrawal
// emptied what the loop had registered.
func (e *endpointRegistrar) requestResync() {
	select {
	case e.resync <- struct{}{}:
	default:
	}
}

// desiredEndpoints builds the node's endpoints from a model (pure).
func desiredEndpoints(m *model.Mesh) map[string]*registryv1.ServiceEndpoint {
	out := map[string]*registryv1.ServiceEndpoint{}
	for _, p := range m.Pods {
		for _, k := range p.Services {
			s := m.Service(k)
			if s == nil || !s.Local {
				continue
			}
			ep := &registryv1.ServiceEndpoint{
				Service:  &registryv1.ServiceRef{Namespace: k.Namespace, Name: k.Name},
				Zone:     m.Node.Zone,
				SpiffeId: p.SPIFFEID(m.TrustDomain),
				Health:   registryv1.Health_HEALTH_UNHEALTHY,
				Kubernetes: &registryv1.KubernetesMetadata{
					NodeName: m.Node.Name, PodName: p.Name, PodUid: p.UID, ServiceAccount: p.ServiceAccount,
				},
			}
			if p.Ready {
				ep.Health = registryv1.Health_HEALTH_HEALTHY
			}
			if m.Node.IP.IsValid() {
				ep.Kubernetes.NodeIp = m.Node.IP.String()
			}
			for _, ip := range p.IPs {
				ep.Addresses = append(ep.Addresses, ip.String())
			}
			for _, sp := range s.Ports {
				proto := p.Protocol
				target, ok := p.TargetPort(sp)
				if !ok {
					continue // a named port this pod does not have: Kubernetes leaves it out too (Mesh.Skipped lists it)
				}
				if sp.AppProtocol {
					proto = sp.Protocol
				}
				rp, err := registry.ProtocolFromModel(proto)
				if err != nil {
					continue
				}
				ep.Ports = append(ep.Ports, &registryv1.EndpointPort{Name: sp.Name, Port: target, Protocol: rp})
			}
			if len(ep.Addresses) == 0 || len(ep.Ports) == 0 {
				continue
			}
			out[k.Namespace+"/"+k.Name+"/"+p.UID] = ep
		}
	}
	return out
}

// sync registers new and changed endpoints and deregisters gone ones. It returns the first error
// and leaves what it could not write for the next sync. When the registry partition is claimed
// by another cluster (registry.ErrPartitionClaimed) it stops, withdraws every endpoint of this
// node from the partition and returns that error; the next sync after a re-claim registers them
// again.
func (e *endpointRegistrar) sync(ctx context.Context, m *model.Mesh) error {
	want := desiredEndpoints(m)
	e.mu.Lock()
	defer e.mu.Unlock()
	var first error
	for key, ep := range want {
		if old, ok := e.have[key]; ok && proto.Equal(old, ep) {
			continue
		}
		if err := e.reg.RegisterEndpoint(ctx, ep); err != nil {
			if errors.Is(err, registry.ErrPartitionClaimed) {
				e.withdrawLocked(ctx)
				return fmt.Errorf("sync endpoints: %w", err)
			}
			e.log.Warn("register endpoint", "key", key, "err", err)
			if first == nil {
				first = err
			}
			continue
		}
		e.have[key] = ep
	}
	for key, old := range e.have {
		if _, ok := want[key]; ok {
			continue
		}
		err := e.reg.DeregisterEndpoint(ctx, old.Service.Namespace, old.Service.Name, old.Kubernetes.PodUid)
		if errors.Is(err, registry.ErrPartitionClaimed) {
			e.withdrawLocked(ctx)
			return fmt.Errorf("sync endpoints: %w", err)
		}
		if err != nil {
			e.log.Warn("deregister endpoint", "key", key, "err", err)
			if first == nil {
				first = err
			}
			continue
		}
		delete(e.have, key)
	}
	if first != nil {
		return fmt.Errorf("sync endpoints: %w", first)
	}
	return nil
}

// withdrawLocked removes every endpoint this node registered (revoking its lease) after its
// partition turned out to be claimed by another cluster. It reports whether none is left
// registered (false: the registry refused; try again). Callers hold mu.
func (e *endpointRegistrar) withdrawLocked(ctx context.Context) bool {
	if len(e.have) == 0 {
		return true
	}
	if err := e.reg.RevokeEndpoints(ctx); err != nil {
		e.log.Warn("withdraw endpoints from a partition claimed by another cluster", "err", err)
		return false
	}
	e.log.Warn("withdrew this node's endpoints from the registry partition claimed by another cluster", "endpoints", len(e.have))
	clear(e.have)
	return true
}

// partitionClaimPart is the readiness part that fails while another cluster holds the claim
// of this cluster's registry partition.
const partitionClaimPart = "partition-claim"

// claimSafetyInterval is how often the agent reads its partition's claim although it watches
// it (registry.Registry.WatchClaim): a safety net only, so that thousands of agents cost the
// registry a few reads a second at most (1000 nodes: 3.3 reads/s), not one per node every few
// seconds.
const claimSafetyInterval = 5 * time.Minute

// claimWithdrawRetry is how long the agent waits before withdrawing its endpoints again after
// the registry refused a withdrawal (a conflict is not a change it would be told of again).
const claimWithdrawRetry = 5 * time.Second

// watchClaim keeps readiness part "partition-claim" and the node's endpoints in line with the
// claim of this cluster's registry partition until ctx ends: it watches the claim
// (registry.Registry.WatchClaim: one read, then an etcd watch, re-read every safety interval
// and after a failed or compacted watch) and acts on every change of the writer's recorded
// claim state (registry.Registry.ClaimStatus, which also follows what a write's re-check
// found, newest etcd revision winning). This cluster may write into the partition while the
// claim names its ID or nobody (the registrar claims, the agent only checks). While another
// cluster holds the claim, the part fails with the claim and the fix, and the node's endpoints
// are withdrawn from the partition (again every claimWithdrawRetry while the registry refuses
// the withdrawal); once the claim is this cluster's again (re-claimed), the part passes and the
// endpoint sync loop is asked to register them again (requestResync), with no new model. A claim key holding no valid claim (registry.ErrClaimUnreadable)
// fails the part too, naming the key, but withdraws nothing. A registry that does not answer
// changes nothing here (readiness part "registry" reports it).
func watchClaim(ctx context.Context, reg *registry.Registry, e *endpointRegistrar, ready *readiness, safety time.Duration) {
	go func() {
		if err := reg.WatchClaim(ctx, safety); err != nil {
			ready.set(partitionClaimPart, err)
		}
	}()
	for {
		changed, err := reg.ClaimStatus()
		var retry <-chan time.Time
		switch {
		case errors.Is(err, registry.ErrPartitionClaimed):
			ready.set(partitionClaimPart, fmt.Errorf("%w: no endpoint of this node is registered; give this cluster its own --cluster (AETHER_CLUSTER) for its agents and registrar, or, if the claiming cluster was rebuilt into this one, run aether-registrar reclaim-partition (docs/registry.md, Partition claim)", err))
			e.mu.Lock()
			if !e.withdrawLocked(ctx) {
				retry = time.After(claimWithdrawRetry)
			}
			e.mu.Unlock()
		case errors.Is(err, registry.ErrClaimUnreadable):
			// Every write is refused until the key is deleted; the endpoints already
			// registered stay (whose the partition is cannot be told).
			ready.set(partitionClaimPart, err)
		case err == nil:
			ready.set(partitionClaimPart, nil)
			e.requestResync()
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-retry:
		}
	}
}
