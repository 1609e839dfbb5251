package configexport

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

// Configs is the registry capability of the config projections; *registry.Registry implements it.
type Configs interface {
	// Origin is this cluster's own region and cluster (its registry partition).
	Origin() registry.Origin
	// PutConfig writes this cluster's projection of a service (registry.Registry.PutConfig).
	PutConfig(ctx context.Context, c *registryv1.ServiceConfigProjection) error
	// DeleteConfig deletes this cluster's projection of a service; a missing one is no error.
	DeleteConfig(ctx context.Context, namespace, name string) error
	// ListConfigs returns every origin's projections and the revision they were read at.
	ListConfigs(ctx context.Context) ([]registry.Record[*registryv1.ServiceConfigProjection], int64, error)
	// WatchConfigs delivers a snapshot of every origin's projections, then changes.
	WatchConfigs(ctx context.Context) <-chan registry.Batch[*registryv1.ServiceConfigProjection]
}

// ConfigEvents is one batch of projection changes (registry.Batch's events).
type ConfigEvents = []registry.Event[*registryv1.ServiceConfigProjection]

// ConfigView holds every origin's ServiceConfigProjections, kept current by one registry watch,
// as model.Projections (origin, region and service from the key path). When the registry is
// unreachable it keeps what it last saw (the watch resumes, or re-lists after a compaction). It
// is a manager Runnable that runs on the elected leader only.
//
// With a control cluster set, a projection whose origin is neither the control cluster nor this
// cluster (whose own projections the Exporter deletes) is one importers ignore: it is counted
// (aether_config_ignored_projections_total, reason not_control_cluster) and logged once per
// origin, service and version; so is a record that cannot be read as a projection (invalid).
type ConfigView struct {
	src     Configs
	own     registry.Origin
	control string
	log     *slog.Logger
	met     *Metrics

	mu       sync.RWMutex
	synced   bool
	syncedCh chan struct{}
	recs     map[string]model.Projection // registry key -> projection
	noted    map[string]uint64           // registry key -> version last counted as ignored
	subs     []func(ConfigEvents)
}

// NewConfigView returns a view fed by src.WatchConfigs; controlCluster is --control-cluster ("":
// none). Call Start (the manager does).
func NewConfigView(src Configs, controlCluster string, log *slog.Logger, met *Metrics) *ConfigView {
	return &ConfigView{src: src, own: src.Origin(), control: controlCluster, log: log, met: met,
		syncedCh: make(chan struct{}), recs: map[string]model.Projection{}, noted: map[string]uint64{}}
}

// NeedLeaderElection makes the view run on the elected leader only.
func (v *ConfigView) NeedLeaderElection() bool { return true }

// Start consumes the registry watch until ctx ends; it returns nil then.
func (v *ConfigView) Start(ctx context.Context) error {
	for b := range v.src.WatchConfigs(ctx) {
		v.apply(b)
	}
	return nil
}

func (v *ConfigView) apply(b registry.Batch[*registryv1.ServiceConfigProjection]) {
	v.mu.Lock()
	for _, e := range b.Events {
		if e.Type == registry.Deleted {
			delete(v.recs, e.Key)
			delete(v.noted, e.Key)
			continue
		}
		svc := model.ServiceKey{Namespace: e.Value.GetService().GetNamespace(), Name: e.Value.GetService().GetName()}
		p, err := model.ProjectionFromProto(e.Origin.Cluster, e.Origin.Region, svc, e.Value)
		if err != nil {
			delete(v.recs, e.Key)
			v.note(e.Key, e.Value.GetVersion(), ignoredInvalid, "config projection ignored: it cannot be read", "origin", e.Origin.String(), "service", svc.String(), "err", err)
			continue
		}
		v.recs[e.Key] = p
		if v.control != "" && e.Origin.Cluster != v.control && e.Origin != v.own {
			v.note(e.Key, p.Version, ignoredNotControl, "config projection ignored: its origin is not the control cluster (--control-cluster); importers here never apply it",
				"origin", e.Origin.String(), "service", svc.String(), "version", p.Version, "control_cluster", v.control)
		}
	}
	first := !v.synced
	if first {
		v.synced = true
		close(v.syncedCh)
	}
	subs := slices.Clone(v.subs)
	n := len(v.recs)
	v.mu.Unlock()
	if first {
		v.log.Info("config projections: view synced", "projections", n, "revision", b.Revision)
	}
	for _, fn := range subs {
		fn(b.Events)
	}
}

// note counts and logs (at warn) one ignored projection, once per key and version; v.mu is held.
func (v *ConfigView) note(key string, version uint64, reason, msg string, args ...any) {
	if last, ok := v.noted[key]; ok && last == version {
		return
	}
	v.noted[key] = version
	v.met.ignoredProjection(reason)
	v.log.Warn(msg, args...)
}

// Subscribe registers fn, called (from the view's goroutine) with the events of every batch the
// view applied, the first (the registry's snapshot) included. fn must not block for long.
func (v *ConfigView) Subscribe(fn func(ConfigEvents)) {
	v.mu.Lock()
	v.subs = append(v.subs, fn)
	v.mu.Unlock()
}

// Synced reports whether the view holds the registry's first snapshot.
func (v *ConfigView) Synced() bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.synced
}

// WaitSynced blocks until the view holds the registry's first snapshot, or ctx ends (its error).
func (v *ConfigView) WaitSynced(ctx context.Context) error {
	select {
	case <-v.syncedCh:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Projections returns every origin's projections, in registry key order. They are shared:
// callers must not change them.
func (v *ConfigView) Projections() []model.Projection {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make([]model.Projection, 0, len(v.recs))
	for _, k := range slices.Sorted(maps.Keys(v.recs)) {
		out = append(out, v.recs[k])
	}
	return out
}

// ControlCluster is the origin importers trust ("": every origin, the oldest export's applies).
func (v *ConfigView) ControlCluster() string { return v.control }
