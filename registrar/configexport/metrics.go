package configexport

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aethermesh/aether/model"
)

// Reasons of aether_config_export_errors_total.
const (
	errTooLarge = "too_large" // a projection over registry.MaxConfigBytes or MaxConfigRoutes
	errInvalid  = "invalid"   // a projection the registry refused for another field
	errWrite    = "write"     // a registry write failed
	errDelete   = "delete"    // a registry delete failed
	errList     = "list"      // reading this cluster's projections at start failed
	errStatus   = "status"    // a ServiceExport status write failed
)

// Reasons of aether_config_ignored_projections_total.
const (
	ignoredNotControl = "not_control_cluster" // its origin is not the control cluster
	ignoredInvalid    = "invalid"             // it cannot be read as a projection
)

// Metrics are the config projections' Prometheus collectors:
//
//	aether_config_export_services                      gauge: this cluster's projections in the registry
//	aether_config_export_errors_total{reason}          counter: projections not written (too_large, invalid),
//	                                                   failed registry writes, deletes and reads (write,
//	                                                   delete, list) and ServiceExport status writes (status)
//	aether_config_export_version{namespace,service}    gauge: version of this cluster's projection of the service
//	aether_config_drift_services                       gauge: ServiceImports whose aether.io/ConfigDrift is True
//	aether_config_ignored_projections_total{reason}    counter: projections importers here ignore
//	                                                   (not_control_cluster, invalid), once per origin,
//	                                                   service and version
//
// A nil *Metrics records nothing.
type Metrics struct {
	services prometheus.Gauge
	errors   *prometheus.CounterVec
	version  *prometheus.GaugeVec
	drift    prometheus.Gauge
	ignored  *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them with reg (nil: not registered). It
// returns the registration error.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		services: prometheus.NewGauge(prometheus.GaugeOpts{Name: "aether_config_export_services",
			Help: "Config projections this cluster's registrar holds in the registry (one per exported Service)."}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aether_config_export_errors_total",
			Help: "Config projections not written (too_large, invalid: once per content), failed registry writes, deletes and reads (write, delete, list) and ServiceExport status writes (status)."}, []string{"reason"}),
		version: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "aether_config_export_version",
			Help: "Version of this cluster's config projection of the service in the registry."}, []string{"namespace", "service"}),
		drift: prometheus.NewGauge(prometheus.GaugeOpts{Name: "aether_config_drift_services",
			Help: "ServiceImports of this cluster whose aether.io/ConfigDrift condition is True."}),
		ignored: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aether_config_ignored_projections_total",
			Help: "Config projections of other clusters that importers in this cluster ignore (not_control_cluster: the origin is not --control-cluster; invalid), once per origin, service and version."}, []string{"reason"}),
	}
	for _, r := range []string{errTooLarge, errInvalid, errWrite, errDelete, errList, errStatus} {
		m.errors.WithLabelValues(r)
	}
	for _, r := range []string{ignoredNotControl, ignoredInvalid} {
		m.ignored.WithLabelValues(r)
	}
	if reg != nil {
		if err := errors.Join(reg.Register(m.services), reg.Register(m.errors), reg.Register(m.version), reg.Register(m.drift), reg.Register(m.ignored)); err != nil {
			return nil, fmt.Errorf("register config projection metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) exportErr(reason string) {
	if m != nil {
		m.errors.WithLabelValues(reason).Inc()
	}
}

// setVersion records svc's projection version; 0 removes the series (no projection).
func (m *Metrics) setVersion(svc model.ServiceKey, v uint64) {
	if m == nil {
		return
	}
	if v == 0 {
		m.version.DeleteLabelValues(svc.Namespace, svc.Name)
		return
	}
	m.version.WithLabelValues(svc.Namespace, svc.Name).Set(float64(v))
}

func (m *Metrics) setServices(n int) {
	if m != nil {
		m.services.Set(float64(n))
	}
}

func (m *Metrics) setDrift(n int) {
	if m != nil {
		m.drift.Set(float64(n))
	}
}

func (m *Metrics) ignoredProjection(reason string) {
	if m != nil {
		m.ignored.WithLabelValues(reason).Inc()
	}
}
