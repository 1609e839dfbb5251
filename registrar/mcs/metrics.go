package mcs

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/aethermesh/aether/model"
)

// Metrics are the MCS controllers' Prometheus collectors:
//
//	aether_registrar_export_conflicts                 gauge: this cluster's exports in Conflict
//	aether_registrar_imports                          gauge: services imported here (ServiceImport kept)
//	aether_registrar_imports_missing_namespace        gauge: exported services not imported here because their namespace does not exist
//	aether_registrar_imports_blocked                  gauge: exported services not imported here because an object aether did not create holds the name, or the clusterset Service name is too long
//
// A nil *Metrics records nothing.
type Metrics struct {
	conflicts, imports, missingNS, blocked prometheus.Gauge

	mu        sync.Mutex
	conflictS map[model.ServiceKey]bool
	importS   map[model.ServiceKey]bool
	missingS  map[model.ServiceKey]bool
	blockedS  map[model.ServiceKey]bool
}

// NewMetrics creates the collectors and registers them with reg (nil: not registered). It returns
// the registration error.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	m := &Metrics{
		conflicts: g("aether_registrar_export_conflicts", "ServiceExports of this cluster whose Conflict condition is True."),
		imports:   g("aether_registrar_imports", "Exported services this cluster imports (ServiceImport and clusterset VIP Service kept)."),
		missingNS: g("aether_registrar_imports_missing_namespace", "Exported services not imported in this cluster because their namespace does not exist here (MCS namespace sameness)."),
		blocked:   g("aether_registrar_imports_blocked", "Exported services not imported in this cluster because an object aether did not create holds the ServiceImport or clusterset Service name, or that name is invalid."),
		conflictS: map[model.ServiceKey]bool{}, importS: map[model.ServiceKey]bool{},
		missingS: map[model.ServiceKey]bool{}, blockedS: map[model.ServiceKey]bool{},
	}
	if reg != nil {
		var errs []error
		for _, c := range []prometheus.Collector{m.conflicts, m.imports, m.missingNS, m.blocked} {
			errs = append(errs, reg.Register(c))
		}
		if err := errors.Join(errs...); err != nil {
			return nil, fmt.Errorf("register registrar metrics: %w", err)
		}
	}
	return m, nil
}

// setIn puts or removes k in set and updates g; it returns whether k was newly added.
func (m *Metrics) setIn(set map[model.ServiceKey]bool, g prometheus.Gauge, k model.ServiceKey, on bool) bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	added := on && !set[k]
	if on {
		set[k] = true
	} else {
		delete(set, k)
	}
	g.Set(float64(len(set)))
	return added
}

func (m *Metrics) setConflict(k model.ServiceKey, on bool) {
	if m != nil {
		m.setIn(m.conflictS, m.conflicts, k, on)
	}
}

func (m *Metrics) setImported(k model.ServiceKey, on bool) {
	if m != nil {
		m.setIn(m.importS, m.imports, k, on)
	}
}

// setMissingNS reports whether k newly entered the missing-namespace set (so one event is
// emitted per gap, not per reconcile).
func (m *Metrics) setMissingNS(k model.ServiceKey, on bool) bool {
	if m == nil {
		return on
	}
	return m.setIn(m.missingS, m.missingNS, k, on)
}

func (m *Metrics) setBlocked(k model.ServiceKey, on bool) bool {
	if m == nil {
		return on
	}
	return m.setIn(m.blockedS, m.blocked, k, on)
}

// queueRef holds a controller's work queue once its source started (safe for concurrent use).
type queueRef struct {
	mu sync.Mutex
	q  workqueue.TypedRateLimitingInterface[reconcile.Request]
}

func (r *queueRef) set(q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	r.mu.Lock()
	r.q = q
	r.mu.Unlock()
}

func (r *queueRef) get() workqueue.TypedRateLimitingInterface[reconcile.Request] {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.q
}
