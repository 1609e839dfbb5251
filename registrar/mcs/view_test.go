package mcs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

// feed is the registry watch at the unit-test boundary: batches a test sends.
type feed struct {
	origin registry.Origin
	ch     chan registry.Batch[*registryv1.ExportMark]
}

func (f *feed) Origin() registry.Origin                              { return f.origin }
func (f *feed) Export(context.Context, *registryv1.ExportMark) error { return nil }
func (f *feed) Unexport(context.Context, string, string) error       { return nil }
func (f *feed) WatchExports(context.Context) <-chan registry.Batch[*registryv1.ExportMark] {
	return f.ch
}

func markOf(cluster, ns, svc string) Mark {
	m := mark(cluster, "2026-01-01T00:00:00Z", "pi:80")
	m.Key = m.Origin.ExportKey(ns, svc)
	m.Value.Service = &registryv1.ServiceRef{Namespace: ns, Name: svc}
	return m
}

func TestExportView(t *testing.T) {
	f := &feed{origin: registry.Origin{Region: "r1", Cluster: "a"}, ch: make(chan registry.Batch[*registryv1.ExportMark])}
	v := NewExportView(f, slog.New(slog.NewTextHandler(io.Discard, nil)))
	touched := make(chan string, 10)
	v.Subscribe(func(keys []model.ServiceKey) { touched <- fmt.Sprint(keys) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error)
	go func() { done <- v.Start(ctx) }()

	wctx, wcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if err := v.WaitSynced(wctx); err == nil {
		t.Fatal("synced before the first batch")
	}
	wcancel()

	ev := func(typ registry.EventType, m Mark) registry.Event[*registryv1.ExportMark] {
		return registry.Event[*registryv1.ExportMark]{Type: typ, Record: m}
	}
	steps := []struct {
		name    string
		batch   registry.Batch[*registryv1.ExportMark]
		touched string
		check   func() error
	}{
		{"snapshot touches every service", registry.Batch[*registryv1.ExportMark]{Snapshot: true, Events: []registry.Event[*registryv1.ExportMark]{
			ev(registry.Added, markOf("a", "ns", "x")), ev(registry.Added, markOf("b", "ns", "x")), ev(registry.Added, markOf("b", "other", "y")),
		}}, "[ns/x other/y]", func() error {
			if len(v.Marks(model.ServiceKey{Namespace: "ns", Name: "x"})) != 2 {
				return fmt.Errorf("marks of ns/x: %v", v.Marks(model.ServiceKey{Namespace: "ns", Name: "x"}))
			}
			if _, ok := v.Own(f.origin, model.ServiceKey{Namespace: "ns", Name: "x"}); !ok {
				return fmt.Errorf("own mark of ns/x missing")
			}
			if got := fmt.Sprint(v.Services("other")); got != "[other/y]" {
				return fmt.Errorf("services of other: %s", got)
			}
			return nil
		}},
		{"deleting the last mark removes the service", registry.Batch[*registryv1.ExportMark]{Events: []registry.Event[*registryv1.ExportMark]{
			ev(registry.Deleted, markOf("b", "other", "y")),
		}}, "[other/y]", func() error {
			if got := fmt.Sprint(v.Services("")); got != "[ns/x]" {
				return fmt.Errorf("services: %s", got)
			}
			return nil
		}},
		{"deleting the own mark keeps the other cluster's", registry.Batch[*registryv1.ExportMark]{Events: []registry.Event[*registryv1.ExportMark]{
			ev(registry.Deleted, markOf("a", "ns", "x")),
		}}, "[ns/x]", func() error {
			if _, ok := v.Own(f.origin, model.ServiceKey{Namespace: "ns", Name: "x"}); ok {
				return fmt.Errorf("own mark still there")
			}
			if ms := v.Marks(model.ServiceKey{Namespace: "ns", Name: "x"}); len(ms) != 1 || ms[0].Origin.Cluster != "b" {
				return fmt.Errorf("marks of ns/x: %v", ms)
			}
			return nil
		}},
	}
	for _, s := range steps {
		f.ch <- s.batch
		select {
		case got := <-touched:
			if got != s.touched {
				t.Errorf("%s: touched %s, want %s", s.name, got, s.touched)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no notification", s.name)
		}
		if err := s.check(); err != nil {
			t.Errorf("%s: %v", s.name, err)
		}
	}
	if err := v.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	close(f.ch)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestExportViewLateSubscriber: a subscriber that comes after the view's first snapshot (the view
// and the controllers start side by side once elected) is given every service the view holds, so
// a stale mark of this cluster is still reconciled; before, it heard only of later batches.
func TestExportViewLateSubscriber(t *testing.T) {
	f := &feed{origin: registry.Origin{Region: "r1", Cluster: "a"}, ch: make(chan registry.Batch[*registryv1.ExportMark], 1)}
	v := NewExportView(f, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = v.Start(ctx) }()
	f.ch <- registry.Batch[*registryv1.ExportMark]{Snapshot: true, Events: []registry.Event[*registryv1.ExportMark]{
		{Type: registry.Added, Record: markOf("a", "ns", "stale")}, {Type: registry.Added, Record: markOf("b", "other", "y")},
	}}
	if err := v.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	var got []string
	v.Subscribe(func(keys []model.ServiceKey) { got = append(got, fmt.Sprint(keys)) })
	if fmt.Sprint(got) != "[[ns/stale other/y]]" {
		t.Errorf("late subscriber was given %v, want [[ns/stale other/y]]", got)
	}
}
