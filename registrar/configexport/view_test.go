package configexport

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

// origin is the part of Configs a ConfigView reads before it starts: this cluster's origin.
type origin struct {
	Configs
	o registry.Origin
}

func (o origin) Origin() registry.Origin { return o.o }

var _ Configs = origin{}

// TestConfigViewIgnored: with a control cluster, projections of other origins (this cluster's
// own excepted: the exporter deletes those) are counted once per origin, service and version;
// an unreadable one is counted as invalid and left out; every readable one is in Projections,
// with its origin and service from the key.
func TestConfigViewIgnored(t *testing.T) {
	reg := prometheus.NewRegistry()
	met, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	v := NewConfigView(origin{o: east}, "hub", slog.New(slog.NewTextHandler(io.Discard, nil)), met)
	var seen int
	v.Subscribe(func(evs ConfigEvents) { seen += len(evs) })
	ev := func(typ registry.EventType, o registry.Origin, k model.ServiceKey, version uint64, exportTime string) registry.Event[*registryv1.ServiceConfigProjection] {
		return registry.Event[*registryv1.ServiceConfigProjection]{Type: typ, Record: registry.Record[*registryv1.ServiceConfigProjection]{
			Key: o.ConfigKey(k.Namespace, k.Name), Origin: o,
			Value: &registryv1.ServiceConfigProjection{Service: &registryv1.ServiceRef{Namespace: k.Namespace, Name: k.Name}, Version: version,
				ExportTime: exportTime, ExportCreateTime: "2026-07-01T10:00:00Z"}}}
	}
	const ts = "2026-07-01T10:00:01Z"
	hub := registry.Origin{Region: "r1", Cluster: "hub"}
	rogue := registry.Origin{Region: "r2", Cluster: "rogue"}
	ignored := func(reason string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if mf.GetName() == "aether_config_ignored_projections_total" && m.GetLabel()[0].GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
		return -1
	}

	v.apply(registry.Batch[*registryv1.ServiceConfigProjection]{Snapshot: true, Events: ConfigEvents{
		ev(registry.Added, hub, cart, 3, ts),
		ev(registry.Added, east, cart, 9, ts),
		ev(registry.Added, rogue, cart, 1, ts),
		ev(registry.Added, rogue, db, 1, "yesterday"),
	}})
	if !v.Synced() || v.WaitSynced(context.Background()) != nil {
		t.Fatal("not synced after the snapshot")
	}
	if got := ignored(ignoredNotControl); got != 1 {
		t.Errorf("not_control_cluster %v, want 1 (rogue only)", got)
	}
	if got := ignored(ignoredInvalid); got != 1 {
		t.Errorf("invalid %v, want 1", got)
	}
	ps := v.Projections()
	if len(ps) != 3 {
		t.Fatalf("projections %v, want hub's, east's and rogue's of cart", ps)
	}
	for _, p := range ps {
		if p.Service != cart || p.Origin == "" || p.Region == "" {
			t.Errorf("projection %v", p.String())
		}
	}
	v.apply(registry.Batch[*registryv1.ServiceConfigProjection]{Events: ConfigEvents{
		ev(registry.Updated, rogue, cart, 1, ts), // the same version again: not counted
		ev(registry.Updated, rogue, cart, 2, ts),
	}})
	if got := ignored(ignoredNotControl); got != 2 {
		t.Errorf("not_control_cluster %v after a new version, want 2", got)
	}
	v.apply(registry.Batch[*registryv1.ServiceConfigProjection]{Events: ConfigEvents{ev(registry.Deleted, rogue, cart, 2, ts)}})
	if len(v.Projections()) != 2 || seen != 7 {
		t.Errorf("after the deletion: %d projections, %d events seen", len(v.Projections()), seen)
	}
}
