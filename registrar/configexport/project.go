package configexport

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar/routestatus"
	"github.com/aethermesh/aether/registry"
)

// Condition types and reasons of the config projections (docs/projections.md).
const (
	// ConditionConfigExported is the ServiceExport's condition: True (ReasonExported) while this
	// cluster's projection of the Service is in the registry; False with ReasonTooLarge,
	// ReasonInvalid, ReasonWriteFailed, ReasonNotExportable or ReasonNotControlCluster.
	ConditionConfigExported = "aether.io/ConfigExported"
	ReasonExported          = "Exported"
	// ReasonTooLarge: the projection is over registry.MaxConfigBytes or MaxConfigRoutes; it is
	// not written and the last one written stays in the registry.
	ReasonTooLarge = "TooLarge"
	// ReasonInvalid: the registry refused the projection for another field.
	ReasonInvalid = "Invalid"
	// ReasonWriteFailed: the registry write failed; it is retried.
	ReasonWriteFailed = "WriteFailed"
	// ReasonNotExportable: the Service is missing or cannot be exported (the MCS Valid condition
	// says why); there is no projection.
	ReasonNotExportable = "NotExportable"
	// ReasonNotControlCluster: a control cluster is set and it is not this one (ServiceExport:
	// nothing is exported; ServiceImport: only other origins project the service).
	ReasonNotControlCluster = "NotControlCluster"

	// ConditionBackendsExported is the condition of aether's status entry of a projected route's
	// Service parentRef: False (ReasonBackendNotExported) when a Service backend of the route is
	// not exported from this cluster, so the importing clusters cannot reach it; True
	// (ReasonExported) when every one is.
	ConditionBackendsExported = "aether.io/BackendsExported"
	ReasonBackendNotExported  = "BackendNotExported"

	// ConditionConfigImported is the ServiceImport's condition: True (ReasonApplied, or
	// ReasonPartiallyInvalid when some imported routes cannot be served here) when a projection
	// of the service applies here; False with ReasonOverridden, ReasonNotControlCluster or
	// ReasonNoProjection.
	ConditionConfigImported = "aether.io/ConfigImported"
	ReasonApplied           = "Applied"
	ReasonPartiallyInvalid  = "PartiallyInvalid"
	// ReasonOverridden: local producer routes on the ServiceImport replace the projection.
	ReasonOverridden = "Overridden"
	// ReasonNoProjection: no cluster projects the service (or none the control cluster trusts).
	ReasonNoProjection = "NoProjection"

	// ConditionConfigDrift is the ServiceImport's condition: True (ReasonDrift) when the routes
	// this cluster applies to callers of the service differ from its home cluster's projection
	// (model.ConfigDrift), else False (ReasonNoDrift).
	ConditionConfigDrift = "aether.io/ConfigDrift"
	ReasonDrift          = "Drift"
	ReasonNoDrift        = "NoDrift"
)

// maxMessage bounds the condition messages written here, in bytes (the API allows 32768).
const maxMessage = 8192

// Project returns the ServiceConfigProjection of svc that origin writes: the producer routes of
// svc among routes (model.ProjectService, the projector the agents' routing binds with, each
// converted with model.RouteToProto) and created, the ServiceExport's creationTimestamp, as
// export_create_time (RFC 3339, UTC). Version and export_time are left for the writer.
func Project(origin registry.Origin, svc model.ServiceKey, routes []model.Route, created time.Time) *registryv1.ServiceConfigProjection {
	p := &registryv1.ServiceConfigProjection{
		Service:       &registryv1.ServiceRef{Namespace: svc.Namespace, Name: svc.Name},
		OriginCluster: origin.Cluster, OriginRegion: origin.Region,
		ExportCreateTime: created.UTC().Format(time.RFC3339Nano),
	}
	for _, r := range model.ProjectService(svc, routes) {
		p.Routes = append(p.Routes, model.RouteToProto(r))
	}
	return p
}

// byParent indexes routes by the services their Service parentRefs in their own namespace name
// (the only routes model.ProjectService can keep for a service), each route once per service.
func byParent(routes []model.Route) map[model.ServiceKey][]model.Route {
	return index(routes, func(r model.Route, p model.ParentRef) bool {
		return p.Kind == model.ParentService && p.Service.Namespace == r.Namespace
	})
}

// byNamed indexes routes by every service a parentRef of theirs names (Service or
// ServiceImport), each route once per service: the routes model.ConfigDrift looks at.
func byNamed(routes []model.Route) map[model.ServiceKey][]model.Route {
	return index(routes, func(model.Route, model.ParentRef) bool { return true })
}

// index indexes routes by the services of their parentRefs that keep accepts, each route once
// per service, in the order of routes.
func index(routes []model.Route, keep func(model.Route, model.ParentRef) bool) map[model.ServiceKey][]model.Route {
	out := map[model.ServiceKey][]model.Route{}
	for _, r := range routes {
		var seen []model.ServiceKey
		for _, p := range r.Parents {
			if keep(r, p) && !slices.Contains(seen, p.Service) {
				seen = append(seen, p.Service)
				out[p.Service] = append(out[p.Service], r)
			}
		}
	}
	return out
}

// held is what this cluster's registry partition holds for one service: the projection last
// written (or read at start).
type held struct {
	version    uint64
	routes     []*registryv1.Route
	created    string
	exportTime time.Time
}

func heldOf(p *registryv1.ServiceConfigProjection) *held {
	t, _ := time.Parse(time.RFC3339Nano, p.GetExportTime()) // validated by the registry
	return &held{version: p.GetVersion(), routes: p.GetRoutes(), created: p.GetExportCreateTime(), exportTime: t}
}

// sameContent reports whether want carries what h holds: the same routes and export_create_time.
func (h *held) sameContent(want *registryv1.ServiceConfigProjection) bool {
	return h.created == want.GetExportCreateTime() && slices.EqualFunc(h.routes, want.GetRoutes(), func(a, b *registryv1.Route) bool { return proto.Equal(a, b) })
}

// due returns when the projection h holds must be written again, unchanged, so that importers
// can bound its staleness (export_time at most every old).
func (h *held) due(every time.Duration) time.Time { return h.exportTime.Add(every) }

// nextVersion returns the version of the next write of a service's projection: one above what
// the registry holds (have), else one above the version of the projection deleted during this
// leadership (deleted) or the registry revision read when the leadership started (floor),
// whichever is higher. Every version an origin writes is at most the registry revision of its
// write (a first version is floor+1 and each write raises both by at least one), so a
// projection deleted and created again, even after a leader change, never reuses a version.
func nextVersion(have *held, deleted, floor uint64) uint64 {
	if have != nil {
		return have.version + 1
	}
	return max(deleted, floor) + 1
}

// TooLargeError is a projection over registry.MaxConfigRoutes or MaxConfigBytes.
type TooLargeError struct {
	Routes, Bytes int
}

// Error names the limit the projection is over and its value: its route count against
// registry.MaxConfigRoutes, else its encoded size in bytes against registry.MaxConfigBytes.
func (e *TooLargeError) Error() string {
	if e.Routes > registry.MaxConfigRoutes {
		return fmt.Sprintf("the projection has %d routes, over the limit of %d (registry.MaxConfigRoutes)", e.Routes, registry.MaxConfigRoutes)
	}
	return fmt.Sprintf("the projection is %d bytes encoded, over the limit of %d (registry.MaxConfigBytes)", e.Bytes, registry.MaxConfigBytes)
}

// check returns a *TooLargeError for a projection the registry would refuse for its size or
// route count, else registry.ValidateConfig's error (nil when the registry takes it).
func check(p *registryv1.ServiceConfigProjection) error {
	if n := len(p.GetRoutes()); n > registry.MaxConfigRoutes {
		return &TooLargeError{Routes: n, Bytes: proto.Size(p)}
	}
	if n := proto.Size(p); n > registry.MaxConfigBytes {
		return &TooLargeError{Routes: len(p.GetRoutes()), Bytes: n}
	}
	return registry.ValidateConfig(p)
}

// refusedCondition is the ServiceExport condition of a projection check refused; have is what the
// registry keeps (nil: nothing).
func refusedCondition(err error, have *held) (reason, msg string) {
	kept := "nothing of this service is in the registry"
	if have != nil {
		kept = fmt.Sprintf("the registry keeps version %d, written %s", have.version, have.exportTime.UTC().Format(time.RFC3339))
	}
	var tl *TooLargeError
	if errors.As(err, &tl) {
		return ReasonTooLarge, tl.Error() + ": not written; " + kept
	}
	return ReasonInvalid, "the registry refuses the projection: " + err.Error() + "; not written; " + kept
}

// exportedMessage is the True ConfigExported message of what h holds.
func exportedMessage(h *held) string {
	return fmt.Sprintf("projection version %d with %d routes in the registry, written %s", h.version, len(h.routes), h.exportTime.UTC().Format(time.RFC3339))
}

// BackendConditions returns the aether.io/BackendsExported condition of every projected route's
// projected parentRefs: the parentRefs of kind Service, in the route's namespace, naming a
// Service this cluster exports (exportedHere), exactly those model.ProjectService keeps. The
// condition is False (ReasonBackendNotExported, naming them) when a Service backendRef of the
// route, or a mirror filter's backend, is not exported from this cluster: the importing clusters
// resolve it to its clusterset endpoints (model.ImportRoutes), which do not exist, so their
// callers get 500 for its share of requests; else True (ReasonExported). ServiceImport backends
// are clusterset backends already and count as reachable. Routes with another origin are not
// this cluster's and get nothing. cluster names this cluster in the messages.
func BackendConditions(routes []model.Route, exportedHere map[model.ServiceKey]bool, cluster string) map[model.RouteRef][]routestatus.ParentCondition {
	out := map[model.RouteRef][]routestatus.ParentCondition{}
	for _, r := range routes {
		if r.Origin != "" {
			continue
		}
		var idx []int
		for _, p := range r.Parents {
			if p.Kind == model.ParentService && p.Service.Namespace == r.Namespace && exportedHere[p.Service] {
				idx = append(idx, p.Index)
			}
		}
		if len(idx) == 0 {
			continue
		}
		missing := map[model.ServiceKey]bool{}
		check := func(b model.BackendRef) {
			if b.Kind == model.BackendService && !exportedHere[b.Service] {
				missing[b.Service] = true
			}
		}
		mirrors := func(fs []model.RouteFilter) {
			for _, f := range fs {
				if f.Mirror != nil {
					check(f.Mirror.Backend)
				}
			}
		}
		for _, rule := range r.Rules {
			mirrors(rule.Filters)
			for _, b := range rule.Backends {
				check(b)
				mirrors(b.Filters)
			}
		}
		c := model.Condition{Status: true, Reason: ReasonExported, Message: "every Service backend of the route is exported from cluster " + cluster}
		if len(missing) > 0 {
			names := make([]string, 0, len(missing))
			for _, k := range slices.SortedFunc(maps.Keys(missing), model.ServiceKey.Compare) {
				names = append(names, k.String())
			}
			what := "backend " + names[0] + " is"
			if len(names) > 1 {
				what = "backends " + strings.Join(names, ", ") + " are"
			}
			c = model.Condition{Reason: ReasonBackendNotExported, Message: fmt.Sprintf(
				"%s not exported from cluster %s (no ServiceExport, or the Service cannot be exported): callers in other clusters that import this route get 500 for their share of its requests",
				what, cluster)}
		}
		for _, i := range idx {
			out[r.RouteRef] = append(out[r.RouteRef], routestatus.ParentCondition{Index: i, Type: ConditionBackendsExported, Condition: c})
		}
	}
	return out
}

// importWant is the import status of one ServiceImport: its ConfigImported and ConfigDrift
// conditions (without lastTransitionTime and observedGeneration), and the part of ConfigImported's
// message that must match for a written message to stand (importedBase: the rest says how old
// the projection was when the condition was written, which alone is no reason to write).
type importWant struct {
	imported, drift metav1.Condition
	importedBase    string
}

// ImportConditions returns the import status of each of the ServiceImports imports names (their
// keys): ci is what model.Assemble did with every origin's projections (Mesh.ConfigImports),
// routes this cluster's HTTPRoutes and GRPCRoutes, controlCluster the one origin importers trust
// ("" for none), now the time the projections' ages are measured at. It is pure.
//
// ConfigImported is True with ReasonApplied naming the applied projection's origin, version,
// export time and age, or ReasonPartiallyInvalid listing ci.Problems; False with
// ReasonOverridden naming the local producer routes on the ServiceImport that replace it,
// ReasonNotControlCluster when only other origins than the control cluster project the service,
// else ReasonNoProjection (naming the origins whose projections are ignored because they do not
// export the service). What it says is what agents running with --import-config apply;
// the registrar does not know whether they do. ConfigDrift carries model.ConfigDrift's sentences.
func ImportConditions(imports []model.ServiceKey, ci *model.ConfigImports, routes []model.Route, controlCluster string, now time.Time) map[model.ServiceKey]importWant {
	out := make(map[model.ServiceKey]importWant, len(imports))
	if ci == nil {
		ci = &model.ConfigImports{}
	}
	notControl, notExported := map[model.ServiceKey][]string{}, map[model.ServiceKey][]string{}
	for _, ig := range ci.Selection.Ignored {
		switch {
		case ig.NotControl:
			notControl[ig.Projection.Service] = append(notControl[ig.Projection.Service], ig.Projection.Origin)
		case ig.NotExported:
			notExported[ig.Projection.Service] = append(notExported[ig.Projection.Service], ig.Projection.Origin)
		}
	}
	named := byNamed(routes)
	for _, k := range imports {
		applied := ci.Selection.Applied[k]
		var w importWant
		w.imported.Type = ConditionConfigImported
		switch {
		case applied != nil && slices.Contains(ci.Overridden, k):
			var local []string
			for _, r := range named[k] {
				if r.Namespace == k.Namespace && slices.ContainsFunc(r.Parents, func(p model.ParentRef) bool {
					return p.Kind == model.ParentServiceImport && p.Service == k
				}) {
					local = append(local, r.RouteRef.String())
				}
			}
			w.imported.Status, w.imported.Reason = metav1.ConditionFalse, ReasonOverridden
			w.imported.Message = fmt.Sprintf("local producer routes %s on ServiceImport %s replace the routes projected from cluster %s (version %d) for every caller here",
				strings.Join(local, ", "), k, applied.Origin, applied.Version)
			w.importedBase = w.imported.Message
		case applied != nil:
			w.imported.Status, w.imported.Reason = metav1.ConditionTrue, ReasonApplied
			w.importedBase = fmt.Sprintf("agents with --import-config apply the %d route(s) projected from cluster %s: version %d, exported %s",
				len(applied.Routes), applied.Origin, applied.Version, applied.ExportTime.UTC().Format(time.RFC3339Nano))
			if ps := ci.Problems[k]; len(ps) > 0 {
				w.imported.Reason = ReasonPartiallyInvalid
				w.importedBase += "; not served here: " + strings.Join(ps, "; ")
			}
			age := max(now.Sub(applied.ExportTime), 0).Round(time.Millisecond)
			w.imported.Message = w.importedBase + " (" + age.String() + " old when this condition was written)"
		case len(notControl[k]) > 0:
			w.imported.Status, w.imported.Reason = metav1.ConditionFalse, ReasonNotControlCluster
			w.imported.Message = fmt.Sprintf("the projections from cluster(s) %s are ignored: only the control cluster %s's apply (--control-cluster), and it projects none for this service",
				strings.Join(notControl[k], ", "), controlCluster)
			w.importedBase = w.imported.Message
		default:
			w.imported.Status, w.imported.Reason = metav1.ConditionFalse, ReasonNoProjection
			w.imported.Message = "no cluster projects config for this service"
			if controlCluster != "" {
				w.imported.Message = "the control cluster " + controlCluster + " projects no config for this service"
			}
			if o := notExported[k]; len(o) > 0 {
				w.imported.Message += fmt.Sprintf("; the projections from cluster(s) %s are ignored: they do not export this service", strings.Join(o, ", "))
			}
			w.importedBase = w.imported.Message
		}
		w.drift.Type = ConditionConfigDrift
		if d := model.ConfigDrift(k, applied, named[k]); len(d) > 0 {
			w.drift.Status, w.drift.Reason, w.drift.Message = metav1.ConditionTrue, ReasonDrift, strings.Join(d, "; ")
		} else {
			w.drift.Status, w.drift.Reason, w.drift.Message = metav1.ConditionFalse, ReasonNoDrift, "the routes callers here get are the config of the service's home cluster"
		}
		w.imported.Message, w.importedBase = routestatus.Cut(w.imported.Message, maxMessage), routestatus.Cut(w.importedBase, maxMessage)
		w.drift.Message = routestatus.Cut(w.drift.Message, maxMessage)
		out[k] = w
	}
	return out
}

// MergeCondition returns want as the condition to write over have (the object's conditions) at
// generation gen: lastTransitionTime kept while the status holds, now when it changes; and
// whether it differs from what have holds. A message that starts with base stands (base ""
// compares the whole message).
func MergeCondition(have []metav1.Condition, want metav1.Condition, base string, gen int64, now metav1.Time) (metav1.Condition, bool) {
	want.ObservedGeneration, want.LastTransitionTime = gen, now
	var old *metav1.Condition
	for i := range have {
		if have[i].Type == want.Type {
			old = &have[i]
		}
	}
	if old == nil {
		return want, true
	}
	if old.Status == want.Status {
		want.LastTransitionTime = old.LastTransitionTime
	}
	if old.Status == want.Status && old.Reason == want.Reason && old.ObservedGeneration == gen &&
		(old.Message == want.Message || (base != "" && strings.HasPrefix(old.Message, base))) {
		return *old, false
	}
	return want, true
}
