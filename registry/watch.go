package registry

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
)

// EventType says what happened to a record.
type EventType int

// The event types of a watch.
const (
	// Added: a record appeared (or became valid).
	Added EventType = iota + 1
	// Updated: an existing record changed.
	Updated
	// Deleted: a record was deleted, expired with its lease, or became invalid.
	Deleted
)

// String returns "added", "updated" or "deleted".
func (t EventType) String() string {
	switch t {
	case Added:
		return "added"
	case Updated:
		return "updated"
	case Deleted:
		return "deleted"
	}
	return "unknown"
}

// Event is one change of one record. For Deleted, Record holds the last value the watcher knew,
// with ModRevision set to the revision of the deletion (or of the re-list that found it gone).
type Event[T proto.Message] struct {
	Type EventType
	Record[T]
}

// Batch is what a watch delivers at once.
type Batch[T proto.Message] struct {
	// Snapshot is true for the first batch: every record in the store as Added events (possibly
	// none). Later batches hold changes only.
	Snapshot bool
	// Relisted is true for a batch computed by re-listing after the watch fell behind a
	// compaction: exactly the difference between what the watcher had delivered and the store.
	Relisted bool
	// Revision is the etcd revision the watcher's view is at after this batch.
	Revision int64
	Events   []Event[T]
	// Invalid are keys of this kind that hold a value readers skip (it does not decode or
	// validate): in a Snapshot or Relisted batch every such key in the store, else those
	// written in this batch; and, with Deleted set, keys that held one and were deleted. A
	// valid record that turns bad is also delivered as Deleted, so a consumer that ignores
	// Invalid drops it; one that keeps the last good value of a key (the agent's config import)
	// keeps it for these keys instead, until the key is deleted.
	Invalid []InvalidRecord[T]
}

// InvalidRecord is a stored record a reader skips because its value does not decode or validate
// (it has been logged and counted, aether_registry_bad_records_total). Origin, Namespace and
// Service come from its key.
type InvalidRecord[T proto.Message] struct {
	Key                string
	Origin             Origin
	Namespace, Service string
	ModRevision        int64
	// Value is the value as decoded when it unmarshalled (stamped with the key's origin and
	// service, failing validation), else the zero value.
	Value T
	Err   error
	// Deleted is set when the key, which held an invalid record, was deleted (Value and Err
	// are then those it had).
	Deleted bool
}

// Apply folds the batch into a view keyed by record key (Added and Updated set, Deleted
// removes), so that a consumer's view equals the store's valid records of this kind.
func (b Batch[T]) Apply(view map[string]Record[T]) {
	for _, e := range b.Events {
		if e.Type == Deleted {
			delete(view, e.Key)
		} else {
			view[e.Key] = e.Record
		}
	}
}

// watch lists every record of c's kind under Root, delivers them as one Snapshot batch, then
// watches Root from the next revision and delivers typed events. On a watch error (member lost,
// no leader) it resumes from the last revision it delivered; when that revision was compacted it
// re-lists and delivers exactly the difference, deletions included. Bad records are skipped,
// logged and counted; a record that turns bad is delivered as Deleted. The channel is closed when
// ctx ends or the Registry is closed.
func watch[T proto.Message](ctx context.Context, r *Registry, c codec[T]) <-chan Batch[T] {
	out := make(chan Batch[T])
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(r.ctx, cancel)
	go func() {
		defer close(out)
		defer cancel()
		defer stop()
		w := &watcher[T]{r: r, c: c, out: out, state: map[string]Record[T]{}, bad: map[string]InvalidRecord[T]{}}
		w.run(ctx)
	}()
	return out
}

type watcher[T proto.Message] struct {
	r     *Registry
	c     codec[T]
	out   chan<- Batch[T]
	state map[string]Record[T]
	// bad holds the keys of this kind whose value is invalid (Batch.Invalid).
	bad map[string]InvalidRecord[T]
	rev int64
}

func (w *watcher[T]) send(ctx context.Context, b Batch[T]) bool {
	select {
	case w.out <- b:
		return true
	case <-ctx.Done():
		return false
	}
}

func (w *watcher[T]) run(ctx context.Context) {
	backoff := 100 * time.Millisecond
	relist, first := true, true
	for ctx.Err() == nil {
		if relist {
			b, err := w.relist(ctx)
			if err != nil {
				w.r.log.Warn("registry: watch list failed; retrying", "kind", string(w.c.kind), "err", err, "retry_in", backoff)
				if !sleep(ctx, backoff) {
					return
				}
				backoff = min(backoff*2, 5*time.Second)
				continue
			}
			b.Snapshot, b.Relisted = first, !first
			if (first || len(b.Events) > 0 || len(b.Invalid) > 0) && !w.send(ctx, b) {
				return
			}
			relist, first = false, false
		}
		compacted, healthy := w.follow(ctx)
		if compacted {
			w.r.m.relists.Inc()
			w.r.log.Info("registry: watch fell behind a compaction; re-listing", "kind", string(w.c.kind), "revision", w.rev)
			relist = true
			continue
		}
		if healthy {
			backoff = 100 * time.Millisecond
		}
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// relist reads the whole store and returns the difference from the delivered state as a batch,
// updating the state and revision.
func (w *watcher[T]) relist(ctx context.Context) (Batch[T], error) {
	now := map[string]Record[T]{}
	var invalid []InvalidRecord[T]
	rev, err := w.r.scan(ctx, func(key string, value []byte, modRev int64) {
		rec, ok, bad := decodeOrSkip(w.r, w.c, key, value, modRev)
		if ok {
			now[key] = rec
		} else if bad != nil {
			invalid = append(invalid, *bad)
		}
	})
	if err != nil {
		return Batch[T]{}, err
	}
	var evs []Event[T]
	for k, rec := range now {
		old, ok := w.state[k]
		switch {
		case !ok:
			evs = append(evs, Event[T]{Type: Added, Record: rec})
		case old.ModRevision != rec.ModRevision:
			evs = append(evs, Event[T]{Type: Updated, Record: rec})
		}
	}
	for k, old := range w.state {
		if _, ok := now[k]; !ok {
			old.ModRevision = rev
			evs = append(evs, Event[T]{Type: Deleted, Record: old})
		}
	}
	slices.SortFunc(evs, func(a, b Event[T]) int { return cmp.Compare(a.Key, b.Key) })
	bad := make(map[string]InvalidRecord[T], len(invalid))
	for _, iv := range invalid {
		bad[iv.Key] = iv
	}
	for k, iv := range w.bad {
		if _, ok := bad[k]; !ok {
			if _, ok := now[k]; !ok {
				iv.Deleted, iv.ModRevision = true, rev
				invalid = append(invalid, iv)
			}
		}
	}
	slices.SortFunc(invalid, func(a, b InvalidRecord[T]) int { return cmp.Compare(a.Key, b.Key) })
	w.state, w.bad, w.rev = now, bad, rev
	return Batch[T]{Revision: rev, Events: evs, Invalid: invalid}, nil
}

// follow watches from w.rev+1 until the watch ends. compacted reports that w.rev+1 was
// compacted; healthy that at least one response arrived (so the retry backoff resets).
func (w *watcher[T]) follow(ctx context.Context) (compacted, healthy bool) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := w.r.cli.Watch(wctx, Root, clientv3.WithPrefix(), clientv3.WithRev(w.rev+1), clientv3.WithProgressNotify())
	for resp := range wch {
		if resp.CompactRevision != 0 {
			return true, healthy
		}
		if err := resp.Err(); err != nil {
			if ctx.Err() == nil {
				w.r.log.Warn("registry: watch interrupted; resuming", "kind", string(w.c.kind), "revision", w.rev, "err", err)
			}
			return false, healthy
		}
		healthy = true
		var evs []Event[T]
		var invalid []InvalidRecord[T]
		for _, ev := range resp.Events {
			key := string(ev.Kv.Key)
			old, known := w.state[key]
			if iv, wasBad := w.bad[key]; wasBad {
				delete(w.bad, key)
				if ev.Type == clientv3.EventTypeDelete {
					iv.Deleted, iv.ModRevision = true, ev.Kv.ModRevision
					invalid = append(invalid, iv)
				}
			}
			if ev.Type == clientv3.EventTypeDelete {
				if known {
					delete(w.state, key)
					old.ModRevision = ev.Kv.ModRevision
					evs = append(evs, Event[T]{Type: Deleted, Record: old})
				}
			} else if rec, ok, bad := decodeOrSkip(w.r, w.c, key, ev.Kv.Value, ev.Kv.ModRevision); ok {
				w.state[key] = rec
				t := Added
				if known {
					t = Updated
				}
				evs = append(evs, Event[T]{Type: t, Record: rec})
			} else {
				if bad != nil {
					invalid = append(invalid, *bad)
					w.bad[key] = *bad
				}
				if known {
					// Turned bad (or into another kind): consumers must drop it.
					delete(w.state, key)
					old.ModRevision = ev.Kv.ModRevision
					evs = append(evs, Event[T]{Type: Deleted, Record: old})
				}
			}
			w.rev = max(w.rev, ev.Kv.ModRevision)
		}
		if len(resp.Events) == 0 && resp.IsProgressNotify() {
			// Progress notifications come only from a synced watcher: everything up to the
			// header revision has been delivered.
			w.rev = max(w.rev, resp.Header.Revision)
		}
		if (len(evs) > 0 || len(invalid) > 0) && !w.send(ctx, Batch[T]{Revision: w.rev, Events: evs, Invalid: invalid}) {
			return false, healthy
		}
	}
	return false, healthy
}

// Snapshot returns a copy of the records a view holds, sorted by key.
func Snapshot[T proto.Message](view map[string]Record[T]) []Record[T] {
	keys := slices.Sorted(maps.Keys(view))
	out := make([]Record[T], 0, len(keys))
	for _, k := range keys {
		out = append(out, view[k])
	}
	return out
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
