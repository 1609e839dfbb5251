package mcs

import (
	"context"
	"log/slog"
	"slices"
	"sync"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

// Exports is the registry capability the MCS controllers use; *registry.Registry implements it.
type Exports interface {
	// Origin is this cluster's own region and cluster (its registry partition).
	Origin() registry.Origin
	// Export writes this cluster's export mark (registry.Registry.Export).
	Export(ctx context.Context, m *registryv1.ExportMark) error
	// Unexport deletes this cluster's export mark; a missing one is not an error.
	Unexport(ctx context.Context, namespace, name string) error
	// WatchExports delivers a snapshot of every cluster's export marks, then changes.
	WatchExports(ctx context.Context) <-chan registry.Batch[*registryv1.ExportMark]
}

// ExportView is the clusterset-wide export view: every cluster's export marks, kept current by
// one registry watch and indexed by service. When the registry is unreachable it keeps the last
// state it saw (the watch resumes, or re-lists after a compaction, when the registry returns), so
// nothing is ever removed from it because of an outage.
//
// It is a manager Runnable that runs on the elected leader only. Subscribers get the services
// every batch touched (for the first batch: every service).
type ExportView struct {
	src Exports
	log *slog.Logger

	mu       sync.RWMutex
	synced   bool
	syncedCh chan struct{}
	marks    map[string]Mark                      // registry key -> mark
	byKey    map[model.ServiceKey]map[string]Mark // service -> registry key -> mark
	subs     []func([]model.ServiceKey)
}

// NewExportView returns a view fed by src.WatchExports; call Start (the manager does).
func NewExportView(src Exports, log *slog.Logger) *ExportView {
	return &ExportView{
		src: src, log: log, syncedCh: make(chan struct{}),
		marks: map[string]Mark{}, byKey: map[model.ServiceKey]map[string]Mark{},
	}
}

// Subscribe registers fn to be called (from the view's goroutine, after the view changed) with
// the services a batch touched; when the view has its first snapshot already, fn is also called
// at once, from the caller's goroutine, with every service the view holds. fn must not block for
// long.
func (v *ExportView) Subscribe(fn func([]model.ServiceKey)) {
	v.mu.Lock()
	v.subs = append(v.subs, fn)
	synced := v.synced
	v.mu.Unlock()
	// A subscriber that comes after the first snapshot (the view and the controllers start
	// side by side once elected) is given every service the view holds: otherwise a mark of
	// this cluster without a ServiceExport, left by an earlier owner of the partition, would be
	// removed only when something else touched its service.
	if synced {
		if keys := v.Services(""); len(keys) > 0 {
			fn(keys)
		}
	}
}

// NeedLeaderElection makes the view run on the elected leader only.
func (v *ExportView) NeedLeaderElection() bool { return true }

// Start consumes the registry watch until ctx ends. It returns nil when ctx ends.
func (v *ExportView) Start(ctx context.Context) error {
	for b := range v.src.WatchExports(ctx) {
		v.apply(b)
	}
	return nil
}

func (v *ExportView) apply(b registry.Batch[*registryv1.ExportMark]) {
	v.mu.Lock()
	touched := map[model.ServiceKey]bool{}
	for _, e := range b.Events {
		k := serviceKey(e.Record)
		touched[k] = true
		if e.Type == registry.Deleted {
			delete(v.marks, e.Key)
			if m := v.byKey[k]; m != nil {
				delete(m, e.Key)
				if len(m) == 0 {
					delete(v.byKey, k)
				}
			}
			continue
		}
		v.marks[e.Key] = e.Record
		if v.byKey[k] == nil {
			v.byKey[k] = map[string]Mark{}
		}
		v.byKey[k][e.Key] = e.Record
	}
	first := !v.synced
	if first {
		v.synced = true
		close(v.syncedCh)
		for k := range v.byKey {
			touched[k] = true
		}
	}
	subs := slices.Clone(v.subs)
	v.mu.Unlock()
	if first {
		v.log.Info("mcs: export view synced", "marks", len(b.Events), "revision", b.Revision)
	}
	keys := make([]model.ServiceKey, 0, len(touched))
	for k := range touched {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, model.ServiceKey.Compare)
	for _, fn := range subs {
		fn(keys)
	}
}

func serviceKey(m Mark) model.ServiceKey {
	return model.ServiceKey{Namespace: m.Value.GetService().GetNamespace(), Name: m.Value.GetService().GetName()}
}

// Synced reports whether the view holds the registry's first snapshot.
func (v *ExportView) Synced() bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.synced
}

// WaitSynced blocks until the view holds the registry's first snapshot; it returns ctx's error
// when ctx ends first.
func (v *ExportView) WaitSynced(ctx context.Context) error {
	select {
	case <-v.syncedCh:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Marks returns the export marks of one service from every cluster, sorted by registry key.
// The records are shared: callers must not change them.
func (v *ExportView) Marks(k model.ServiceKey) []Mark {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return registry.Snapshot(v.byKey[k])
}

// Services returns every service some cluster exports, sorted; with namespace set, only that
// namespace's.
func (v *ExportView) Services(namespace string) []model.ServiceKey {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make([]model.ServiceKey, 0, len(v.byKey))
	for k := range v.byKey {
		if namespace == "" || k.Namespace == namespace {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, model.ServiceKey.Compare)
	return out
}

// Own returns this cluster's mark of one service (origin o), if the view holds one.
func (v *ExportView) Own(o registry.Origin, k model.ServiceKey) (Mark, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	m, ok := v.byKey[k][o.ExportKey(k.Namespace, k.Name)]
	return m, ok
}
