package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

// Reasons of aether_config_import_errors_total.
const (
	// importErrInvalid: a projection in the registry the agent cannot use (it does not decode,
	// validate or convert); the previous good one of its origin and service is kept.
	importErrInvalid = "invalid"
	// importErrStateWrite: the projections could not be persisted (configStateFile).
	importErrStateWrite = "state_write"
	// importErrStateRead: the persisted projections, or one of them, could not be used at start.
	importErrStateRead = "state_read"
)

// configImport keeps the ServiceConfigProjections of every origin in the registry for the model
// (--import-config; seed 000, EM2): model.Sources.Projections, from which model.Assemble selects
// one per service (SelectProjections: the control cluster's only, or the oldest export's) and
// routes the imported services by it (ImportRoutes: local config wins).
//
// It holds the last good projection per registry key (one per origin and service) and keeps it
// while the registry is cut off (the watch retries; a watch error or partition drops nothing):
//   - an added or updated record replaces it once it converts (model.ProjectionFromProto, the
//     origin from the key path); a record that does not (registry.Batch.Invalid, or a
//     conversion error) is logged once per origin, service and version, counted
//     (aether_config_import_errors_total{reason="invalid"}) and the previous one is kept;
//   - a deleted record is dropped (also one that held an invalid record);
//   - the first batch of the live watch (a snapshot of the store) replaces what it held (the
//     projections loaded from configStateFile at start), keeping the previous one only for a
//     key that holds an invalid record.
//
// Every change is persisted to its state file (only when the set changed), which load reads back
// at start.
type configImport struct {
	log      *slog.Logger
	onChange func()
	// file persists the projections; nil: not persisted.
	file *stateFile
	errs *prometheus.CounterVec
	// controlCluster is --control-cluster, handed to the model with the projections.
	controlCluster string

	mu   sync.Mutex
	held map[string]heldProjection // registry key -> last good projection
	out  []model.Projection        // held's projections ordered by key; replaced on change
	// rejected is the identity ("<origin>/<ns>/<svc> version <n>") of the last invalid record
	// logged and counted per key, so that a re-list does not log it again.
	rejected map[string]string
	// live is set once the live watch delivered its snapshot.
	live bool
}

// heldProjection is a projection with the record it came from (what configStateFile holds).
type heldProjection struct {
	proj model.Projection
	rec  *registryv1.ServiceConfigProjection
}

// newConfigImport returns an import with nothing held, calling onChange after every change of
// its projections and counting errors in errs (aether_config_import_errors_total).
func newConfigImport(log *slog.Logger, controlCluster string, file *stateFile, errs *prometheus.CounterVec, onChange func()) *configImport {
	return &configImport{log: log, onChange: onChange, file: file, errs: errs, controlCluster: controlCluster,
		held: map[string]heldProjection{}, rejected: map[string]string{}}
}

// Fill implements model.KubeFiller: it sets the projections held and the control cluster.
func (c *configImport) Fill(s *model.Sources) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s.Projections, s.ControlCluster = c.out, c.controlCluster
	return nil
}

// projections returns the projections held, ordered by registry key.
func (c *configImport) projections() []model.Projection {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out
}

// load reads the persisted projections (c.file) into an import that holds none yet. A missing
// file is not an error; a file or record it cannot use is logged, counted (state_read) and left
// out. It returns the file's write time (zero when nothing was loaded) and how many it loaded.
func (c *configImport) load() (time.Time, int) {
	st, err := c.file.load()
	if errors.Is(err, errNoState) {
		return time.Time{}, 0
	}
	if err != nil {
		c.errs.WithLabelValues(importErrStateRead).Inc()
		c.log.Error("persisted config projections ignored", "err", err)
		return time.Time{}, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range st.Records {
		rec, err := registry.DecodeConfig(r.Key, r.Value)
		var p model.Projection
		if err == nil {
			p, err = projectionOf(rec)
		}
		if err != nil {
			c.errs.WithLabelValues(importErrStateRead).Inc()
			c.log.Error("persisted config projection ignored", "file", c.file.path, "key", r.Key, "err", err)
			continue
		}
		c.held[r.Key] = heldProjection{proj: p, rec: rec.Value}
	}
	c.rebuild()
	return st.Written, len(c.held)
}

// projectionOf converts a record; its origin and service come from the key path.
func projectionOf(rec registry.Record[*registryv1.ServiceConfigProjection]) (model.Projection, error) {
	svc := model.ServiceKey{Namespace: rec.Value.GetService().GetNamespace(), Name: rec.Value.GetService().GetName()}
	return model.ProjectionFromProto(rec.Origin.Cluster, rec.Origin.Region, svc, rec.Value)
}

// run applies the batches of a config watch (registry.WatchConfigs) until it closes.
func (c *configImport) run(ch <-chan registry.Batch[*registryv1.ServiceConfigProjection]) {
	for b := range ch {
		c.mu.Lock()
		changed := c.apply(b)
		first := b.Snapshot && !c.live
		c.live = c.live || b.Snapshot
		n := len(c.held)
		c.mu.Unlock()
		if first {
			c.log.Info("config projections: registry watch synced", "projections", n)
		}
		if changed {
			c.persist()
			c.onChange()
		}
	}
}

// apply folds a batch into held and reports whether held changed. Callers hold mu.
func (c *configImport) apply(b registry.Batch[*registryv1.ServiceConfigProjection]) bool {
	var next map[string]heldProjection
	if b.Snapshot {
		// The store's whole content replaces what was held, except where a key holds an
		// invalid record: its last good projection stays (below).
		next = map[string]heldProjection{}
	} else {
		next = maps.Clone(c.held)
	}
	invalid := map[string]bool{} // keys holding an invalid record after this batch
	for _, iv := range b.Invalid {
		if iv.Deleted {
			invalid[iv.Key] = false
			delete(next, iv.Key)
			delete(c.rejected, iv.Key)
			continue
		}
		invalid[iv.Key] = true
		if h, ok := c.held[iv.Key]; ok {
			next[iv.Key] = h
		}
		version := "unreadable"
		if iv.Value != nil {
			version = fmt.Sprint(iv.Value.GetVersion())
		}
		c.reject(iv.Key, iv.Origin.Cluster, model.ServiceKey{Namespace: iv.Namespace, Name: iv.Service}, version, iv.ModRevision, iv.Err)
	}
	for _, e := range b.Events {
		if e.Type == registry.Deleted {
			if !invalid[e.Key] { // a record turned bad is also Deleted: keep its last good one
				delete(next, e.Key)
				delete(c.rejected, e.Key)
			}
			continue
		}
		p, err := projectionOf(e.Record)
		if err != nil {
			svc := model.ServiceKey{Namespace: e.Value.GetService().GetNamespace(), Name: e.Value.GetService().GetName()}
			c.reject(e.Key, e.Origin.Cluster, svc, fmt.Sprint(e.Value.GetVersion()), e.ModRevision, err)
			if h, ok := c.held[e.Key]; ok {
				next[e.Key] = h
			}
			continue
		}
		delete(c.rejected, e.Key)
		next[e.Key] = heldProjection{proj: p, rec: e.Value}
	}
	changed := !maps.EqualFunc(c.held, next, func(a, b heldProjection) bool { return a.rec == b.rec || proto.Equal(a.rec, b.rec) })
	c.held = next
	if changed {
		c.rebuild()
	}
	return changed
}

// reject logs and counts an invalid record once per key and identity (origin, service,
// version; the modification revision when the version cannot be read). Callers hold mu.
func (c *configImport) reject(key, origin string, svc model.ServiceKey, version string, modRev int64, err error) {
	id := fmt.Sprintf("%s/%s version %s", origin, svc, version)
	if version == "unreadable" {
		id += fmt.Sprintf(" (revision %d)", modRev)
	}
	if c.rejected[key] == id {
		return
	}
	c.rejected[key] = id
	c.errs.WithLabelValues(importErrInvalid).Inc()
	msg := "config projection rejected: keeping the previous one of its origin and service"
	if _, ok := c.held[key]; !ok {
		msg = "config projection rejected: none of its origin and service applies"
	}
	c.log.Warn(msg, "origin", origin, "service", svc.String(), "version", version, "err", err)
}

// rebuild replaces out with held's projections ordered by key. Callers hold mu.
func (c *configImport) rebuild() {
	out := make([]model.Projection, 0, len(c.held))
	for _, k := range slices.Sorted(maps.Keys(c.held)) {
		out = append(out, c.held[k].proj)
	}
	c.out = out
}

// persist writes the held projections to c.file (when set and they changed).
func (c *configImport) persist() {
	if c.file == nil {
		return
	}
	c.mu.Lock()
	recs := make([]storedRecord, 0, len(c.held))
	var err error
	for k, h := range c.held {
		var r storedRecord
		if r, err = storeRecord(k, h.rec); err != nil {
			break
		}
		recs = append(recs, r)
	}
	c.mu.Unlock()
	if err == nil {
		_, err = c.file.save(recs, time.Now())
	}
	if err != nil {
		c.errs.WithLabelValues(importErrStateWrite).Inc()
		c.log.Error("config projections not persisted: an agent restart while the registry is cut off would start without them", "err", err)
	}
}

// followConfigs runs c on the registry's config watch until ctx ends. The watch is not part of
// the registry view's sync (registryView.synced): a slow or failing config watch never delays
// the agent's start.
func followConfigs(ctx context.Context, c *configImport, reg *registry.Registry) {
	go c.run(reg.WatchConfigs(ctx))
}

// importMetrics are the agent's config-import metrics (docs/projections.md), set from
// each model's ConfigImports.
type importMetrics struct {
	services prometheus.Gauge
	errs     *prometheus.CounterVec
	version  *prometheus.GaugeVec
	ignored  *prometheus.CounterVec
	log      *slog.Logger

	mu sync.Mutex
	// oldest is the export time of the oldest applied projection (zero: none applied).
	oldest time.Time
	// seen are the ignored projections already counted (and logged); problems and overridden
	// the import problems and overridden services already logged.
	seen, problems, overridden seenSet
}

// newImportMetrics registers the config-import metrics with reg.
func newImportMetrics(reg prometheus.Registerer, log *slog.Logger) *importMetrics {
	m := &importMetrics{log: log,
		services: prometheus.NewGauge(prometheus.GaugeOpts{Name: "aether_config_import_services",
			Help: "Services this cluster imports with an applied config projection (one per service: the control cluster's, or the oldest export's)."}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aether_config_import_errors_total",
			Help: "Config import errors, by reason: invalid (a projection in the registry that does not decode, validate or convert; the previous one is kept), state_write (the projections could not be persisted), state_read (the persisted projections, or one of them, were unusable at start)."}, []string{"reason"}),
		version: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "aether_config_import_version",
			Help: "Version of the applied config projection of each service, by origin cluster: compare it across clusters to see skew."}, []string{"namespace", "service", "origin"}),
		ignored: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aether_config_ignored_projections_total",
			Help: "Config projections not applied, each counted once per origin and service while it lasts, by reason: not_exported (its origin does not export the service), not_control (its origin is not --control-cluster), shadowed (another cluster's export of the service is older)."}, []string{"reason"}),
	}
	age := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "aether_config_import_age_max_seconds",
		Help: "Now minus the export time of the oldest applied config projection (an origin rewrites its projections periodically, so this bounds how stale the imported config is); 0 when none is applied."},
		func() float64 {
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.oldest.IsZero() {
				return 0
			}
			return max(time.Since(m.oldest).Seconds(), 0)
		})
	reg.MustRegister(m.services, m.errs, m.version, m.ignored, age)
	return m
}

// observe sets the metrics from a model: its applied projections of services this cluster
// imports and, once each, its ignored ones (a projection from a non-control origin or from an
// origin that does not export the service is logged then, once per origin and service). It also logs, once each while they last, what of an applied projection of a service
// this cluster imports cannot be served here (ConfigImports.Problems: a backend this cluster
// does not import gets 500) and the services whose local producer routes override their
// projection. Called from one assembler
// subscriber.
func (m *importMetrics) observe(mesh *model.Mesh) {
	ci := mesh.ConfigImports()
	if ci == nil {
		return
	}
	applied := ci.Selection.Applied
	m.version.Reset()
	var oldest time.Time
	n := 0
	for _, p := range applied {
		if s := mesh.Service(p.Service); s == nil || !s.Imported {
			continue // every cluster's projections reach every agent: only this cluster's imports count
		}
		n++
		m.version.WithLabelValues(p.Service.Namespace, p.Service.Name, p.Origin).Set(float64(p.Version))
		if oldest.IsZero() || p.ExportTime.Before(oldest) {
			oldest = p.ExportTime
		}
	}
	m.services.Set(float64(n))
	m.mu.Lock()
	m.oldest = oldest
	ign := ci.Selection.Ignored
	// Once per origin and service while it lasts (not per version: a periodic rewrite would log
	// and count it again).
	fresh := m.seen.update(len(ign), func(i int) string {
		p := ign[i].Projection
		return fmt.Sprintf("%v/%v/%s/%s/%s", ign[i].NotControl, ign[i].NotExported, p.Region, p.Origin, p.Service)
	})
	type problem struct {
		svc model.ServiceKey
		msg string
	}
	var probs []problem
	for _, svc := range slices.SortedFunc(maps.Keys(ci.Problems), model.ServiceKey.Compare) {
		if s := mesh.Service(svc); s == nil || !s.Imported {
			continue // every cluster's projections reach every agent: only this cluster's imports matter
		}
		for _, msg := range ci.Problems[svc] {
			probs = append(probs, problem{svc, msg})
		}
	}
	freshProbs := m.problems.update(len(probs), func(i int) string { return probs[i].svc.String() + ": " + probs[i].msg })
	freshOver := m.overridden.update(len(ci.Overridden), func(i int) string { return ci.Overridden[i].String() })
	m.mu.Unlock()
	for _, i := range freshProbs {
		p := applied[probs[i].svc]
		m.log.Warn("imported config not served in full", "service", probs[i].svc.String(), "origin", p.Origin, "version", p.Version, "problem", probs[i].msg)
	}
	for _, i := range freshOver {
		svc := ci.Overridden[i]
		m.log.Info("local producer routes override the imported config", "service", svc.String(), "origin", applied[svc].Origin)
	}
	for _, i := range fresh {
		g := ign[i]
		if g.NotControl {
			m.ignored.WithLabelValues("not_control").Inc()
			m.log.Warn("config projection ignored: its origin is not the control cluster", "origin", g.Projection.Origin,
				"service", g.Projection.Service.String(), "version", g.Projection.Version, "reason", g.Reason)
			continue
		}
		if g.NotExported {
			m.ignored.WithLabelValues("not_exported").Inc()
			m.log.Warn("config projection ignored: its origin does not export the service", "origin", g.Projection.Origin,
				"service", g.Projection.Service.String(), "version", g.Projection.Version, "reason", g.Reason)
			continue
		}
		m.ignored.WithLabelValues("shadowed").Inc()
		m.log.Info("config projection ignored: another cluster's export is older", "origin", g.Projection.Origin,
			"service", g.Projection.Service.String(), "version", g.Projection.Version, "reason", g.Reason)
	}
}
