package model

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
)

// Projection is one ServiceConfigProjection (api/aether/registry/v1) as an importer holds it: the
// producer routes the origin cluster projected for one of its exported Services
// (docs/projections.md). Origin and Region come from the record's key path, never from its body.
type Projection struct {
	Service ServiceKey
	// Origin and Region are the cluster that wrote it and its region.
	Origin string
	Region string
	// Version increases with every write by the origin.
	Version uint64
	// ExportTime is when the origin last wrote it; ExportCreated the creationTimestamp of the
	// origin's ServiceExport (the oldest export's projection is applied).
	ExportTime    time.Time
	ExportCreated time.Time
	// Routes are the origin's producer routes of Service, as ProjectService returns them.
	Routes []Route
}

// String returns "<ns>/<name> from cluster <origin> (version <n>)".
func (p *Projection) String() string {
	return fmt.Sprintf("%s from cluster %s (version %d)", p.Service, p.Origin, p.Version)
}

// ProjectService returns the producer routes of svc among routes, as a ServiceConfigProjection
// carries them: the HTTPRoutes and GRPCRoutes in svc's namespace (GEP-1294: a route in the
// Service's namespace is a producer route) with a parentRef of kind Service naming svc, each with
// only those parentRefs (Gateway parentRefs, hostnames and parentRefs naming other services are
// dropped), sorted by kind, namespace and name. Routes are the converted ones (HTTPRouteModel,
// GRPCRouteModel), not ResolveRoutes' resolved copies; imported routes (Origin set) are never
// projected again. The result is what the origin's own ResolveRoutes binds to svc's Service
// frontends, so exported config and local routing come from one list. It returns nil when none.
func ProjectService(svc ServiceKey, routes []Route) []Route {
	var out []Route
	for _, r := range routes {
		if r.Origin != "" || r.Namespace != svc.Namespace {
			continue
		}
		var ps []ParentRef
		for _, p := range r.Parents {
			if p.Kind == ParentService && p.Service == svc {
				ps = append(ps, p)
			}
		}
		if len(ps) == 0 {
			continue
		}
		r.Parents, r.GatewayParents, r.Hostnames = ps, nil, nil
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Route) int { return a.RouteRef.Compare(b.RouteRef) })
	return out
}

// ProjectionFromProto turns a registry record read under origin/region's prefix into a
// Projection: the key path's origin, region and service win over the body's; every route is
// checked as RouteFromProto checks it (the registry validated the record already: an error
// here names the route and field). Routes are kept in the record's order.
func ProjectionFromProto(origin, region string, svc ServiceKey, c *registryv1.ServiceConfigProjection) (Projection, error) {
	p := Projection{Service: svc, Origin: origin, Region: region, Version: c.GetVersion()}
	var err error
	if p.ExportTime, err = time.Parse(time.RFC3339Nano, c.GetExportTime()); err != nil {
		return Projection{}, fmt.Errorf("config projection %s from %s: export_time: %w", svc, origin, err)
	}
	if p.ExportCreated, err = time.Parse(time.RFC3339Nano, c.GetExportCreateTime()); err != nil {
		return Projection{}, fmt.Errorf("config projection %s from %s: export_create_time: %w", svc, origin, err)
	}
	for i, rp := range c.GetRoutes() {
		r, err := RouteFromProto(rp)
		if err != nil {
			return Projection{}, fmt.Errorf("config projection %s from %s: routes[%d]: %w", svc, origin, i, err)
		}
		p.Routes = append(p.Routes, r)
	}
	return p, nil
}

// IgnoredProjection is a projection SelectProjections did not apply, and why.
type IgnoredProjection struct {
	Projection *Projection
	// NotControl is set when its origin is not the control cluster, NotExported when its origin
	// does not export the service (projections nobody should have written: counted and logged as
	// such).
	NotControl  bool
	NotExported bool
	Reason      string
}

// ProjectionSelection is what SelectProjections applies per service and what it ignores.
type ProjectionSelection struct {
	Applied map[ServiceKey]*Projection
	Ignored []IgnoredProjection
}

// SelectProjections picks, per service, the one projection an importer applies (seed 000,
// EM3). With controlCluster set, only that cluster's projections count (every other origin's is
// ignored, NotControl). A projection counts only when its origin (cluster and region) exports the
// service: an export mark of that origin for it is among exports, so no cluster can attach routes
// to a service it does not export (NotExported). Of the rest, the projection of the oldest export
// applies, by the create time of the origin's export mark (the projection's own
// export_create_time is not trusted), equal times going to the lexically smaller origin cluster,
// then region: the rule MCS uses for conflicts (KEP-1645, CompareExportAge), so editing a route
// (a new Version) never moves authority to another cluster. It is pure and does not depend on the
// order of ps or exports; Ignored is sorted by service, then origin.
func SelectProjections(ps []Projection, exports []ExportMark, controlCluster string) ProjectionSelection {
	sel := ProjectionSelection{Applied: map[ServiceKey]*Projection{}}
	type originKey struct {
		svc             ServiceKey
		cluster, region string
	}
	marks := make(map[originKey]ExportMark, len(exports))
	for _, x := range exports {
		marks[originKey{x.Service, x.Cluster, x.Region}] = x
	}
	type cand struct {
		p    *Projection
		mark ExportMark
	}
	byService := map[ServiceKey][]cand{}
	for i := range ps {
		p := &ps[i]
		mark, ok := marks[originKey{p.Service, p.Origin, p.Region}]
		switch {
		case controlCluster != "" && p.Origin != controlCluster:
			sel.Ignored = append(sel.Ignored, IgnoredProjection{Projection: p, NotControl: true,
				Reason: fmt.Sprintf("origin cluster %s is not the control cluster %s", p.Origin, controlCluster)})
		case !ok:
			sel.Ignored = append(sel.Ignored, IgnoredProjection{Projection: p, NotExported: true,
				Reason: fmt.Sprintf("cluster %s (region %s) does not export %s", p.Origin, p.Region, p.Service)})
		default:
			byService[p.Service] = append(byService[p.Service], cand{p, mark})
		}
	}
	for svc, cands := range byService {
		slices.SortFunc(cands, func(a, b cand) int { return CompareExportAge(a.mark, b.mark) })
		w := cands[0]
		sel.Applied[svc] = w.p
		for _, l := range cands[1:] {
			sel.Ignored = append(sel.Ignored, IgnoredProjection{Projection: l.p, Reason: fmt.Sprintf(
				"the export of cluster %s is older (created %s) and its projection is applied", w.p.Origin, w.mark.Created.UTC().Format(time.RFC3339))})
		}
	}
	slices.SortFunc(sel.Ignored, func(a, b IgnoredProjection) int {
		return cmp.Or(a.Projection.Service.Compare(b.Projection.Service), cmp.Compare(a.Projection.Origin, b.Projection.Origin), cmp.Compare(a.Projection.Region, b.Projection.Region))
	})
	return sel
}

// ImportRoutes turns the applied projections into routes of this cluster's routing (seed 000,
// EM2), as if they were local producer routes attached to each service's ServiceImport (GEP-1748):
//   - a route is kept only when it is in the service's namespace, and only its parentRefs of kind
//     Service naming the projection's service, each made a ServiceImport parentRef (so a
//     projection cannot attach routes to any other service: authority stays with the service);
//   - a backendRef (and a RequestMirror's backend) of kind Service becomes kind ServiceImport:
//     the Service of another cluster has no meaning here, so it resolves to the backend's
//     clusterset endpoints (aether's rule, a deviation from GEP-1748's "Service means local",
//     docs/projections.md); a Service backend the origin does not export (no export mark of the
//     origin for it in exports) cannot be reached from another cluster, and one that is not
//     imported into this cluster is not found: either is an invalid backendRef whose share of
//     requests gets 500;
//   - every route gets Origin, so it never collides with a local route of the same name;
//   - local config wins: a service with a local producer route on its ServiceImport (a route in
//     its namespace with a ServiceImport parentRef naming it) imports nothing, and is returned in
//     overridden (sorted). Consumer routes need no rule: ResolveRoutes already prefers them for
//     their namespace's callers.
//
// local are this cluster's routes (HTTPRouteModel, GRPCRouteModel), exports every cluster's
// export marks. ImportRoutes is pure.
func ImportRoutes(applied map[ServiceKey]*Projection, local []Route, exports []ExportMark) (imported []Route, overridden []ServiceKey) {
	type originKey struct {
		svc             ServiceKey
		cluster, region string
	}
	exported := make(map[originKey]bool, len(exports))
	for _, x := range exports {
		exported[originKey{x.Service, x.Cluster, x.Region}] = true
	}
	localProducer := map[ServiceKey]bool{}
	for _, r := range local {
		for _, p := range r.Parents {
			if p.Kind == ParentServiceImport && p.Service.Namespace == r.Namespace {
				localProducer[p.Service] = true
			}
		}
	}
	for _, svc := range slices.SortedFunc(maps.Keys(applied), ServiceKey.Compare) {
		if localProducer[svc] {
			overridden = append(overridden, svc)
			continue
		}
		p := applied[svc]
		for _, r := range p.Routes {
			if r.Namespace != svc.Namespace {
				continue
			}
			var parents []ParentRef
			for _, pr := range r.Parents {
				if pr.Kind == ParentService && pr.Service == svc {
					pr.Kind = ParentServiceImport
					parents = append(parents, pr)
				}
			}
			if len(parents) == 0 {
				continue
			}
			r.Origin, r.Parents, r.GatewayParents, r.Hostnames = p.Origin, parents, nil, nil
			r.Rules = importRules(r.Rules, func(b *BackendRef) {
				if !exported[originKey{b.Service, p.Origin, p.Region}] && b.Invalid == nil {
					b.Invalid = &Condition{Reason: string(gwv1.RouteReasonBackendNotFound), Message: fmt.Sprintf(
						"backendRef Service %s: not exported from cluster %s, so not reachable from other clusters", b.Service, p.Origin)}
				}
			})
			imported = append(imported, r)
		}
	}
	return imported, overridden
}

// importRules copies rules with every Service backendRef (and mirror backend) made a
// ServiceImport one, after check has seen it (as a Service backend).
func importRules(rules []RouteRule, check func(*BackendRef)) []RouteRule {
	out := make([]RouteRule, len(rules))
	for i, rule := range rules {
		rule.Backends = slices.Clone(rule.Backends)
		for j := range rule.Backends {
			if b := &rule.Backends[j]; b.Kind == BackendService {
				check(b)
				b.Kind = BackendServiceImport
			}
		}
		rule.Filters = slices.Clone(rule.Filters)
		for j, f := range rule.Filters {
			if f.Mirror != nil && f.Mirror.Backend.Kind == BackendService {
				m := *f.Mirror
				check(&m.Backend)
				m.Backend.Kind = BackendServiceImport
				rule.Filters[j].Mirror = &m
			}
		}
		out[i] = rule
	}
	return out
}

// ConfigDrift says how the routes this cluster applies to callers of clusterset service svc
// differ from applied, the projection of its home cluster (nil: the home cluster projects none),
// one sentence per difference, sorted (class-2 drift visibility, docs/projections.md); nil when
// they do not differ:
//   - local producer routes on svc's ServiceImport replace the projection for every caller;
//   - consumer routes on svc's ServiceImport (or on its Service, when svc is also local) replace
//     it for their namespace's callers;
//   - local producer routes on svc's Service, in a cluster that is not the projection's origin,
//     whose rules differ from the projection's.
//
// local are this cluster's routes. Only rules and parentRefs are compared: creation times and
// generations differ between clusters that hold the same config.
func ConfigDrift(svc ServiceKey, applied *Projection, local []Route) []string {
	var out []string
	consumers := map[string][]string{}
	var producers []string
	for _, r := range local {
		if r.Origin != "" {
			continue
		}
		onImport, onService := false, false
		for _, p := range r.Parents {
			if p.Service == svc {
				onImport = onImport || p.Kind == ParentServiceImport
				onService = onService || p.Kind == ParentService
			}
		}
		switch {
		case r.Namespace != svc.Namespace && (onImport || onService):
			consumers[r.Namespace] = append(consumers[r.Namespace], r.RouteRef.String())
		case r.Namespace == svc.Namespace && onImport:
			producers = append(producers, r.RouteRef.String())
		}
	}
	from := "the home cluster projects no routes"
	if applied != nil {
		from = "the config projected from " + applied.String()
	}
	if len(producers) > 0 {
		out = append(out, fmt.Sprintf("local producer routes %s on ServiceImport %s replace %s for every caller", strings.Join(producers, ", "), svc, from))
	}
	for ns, rs := range consumers {
		out = append(out, fmt.Sprintf("callers in namespace %s use consumer routes %s instead of %s", ns, strings.Join(rs, ", "), from))
	}
	if applied != nil {
		mine := ProjectService(svc, local)
		if len(mine) > 0 && !sameRoutes(mine, applied.Routes) {
			names := make([]string, len(mine))
			for i, r := range mine {
				names[i] = r.RouteRef.String()
			}
			out = append(out, fmt.Sprintf("callers of the local Service %s use producer routes %s, which differ from %s", svc, strings.Join(names, ", "), from))
		}
	}
	slices.Sort(out)
	return out
}

// sameRoutes reports whether two ProjectService lists hold the same routes: names, parentRefs
// and rules (the registry record's fields other than generation and creation time).
func sameRoutes(a, b []Route) bool {
	return slices.EqualFunc(a, b, func(x, y Route) bool {
		px, py := RouteToProto(x), RouteToProto(y)
		px.Generation, py.Generation, px.CreateTime, py.CreateTime = 0, 0, "", ""
		return proto.Equal(px, py)
	})
}

// ConfigImports is what Assemble did with its Sources' projections.
type ConfigImports struct {
	Selection ProjectionSelection
	// Overridden are the services whose applied projection local producer routes replace.
	Overridden []ServiceKey
	// Problems lists, per service, what of its applied projection cannot be served here: an
	// imported route's parentRef not accepted (the service is not imported into this cluster, or
	// the port is not HTTP) or a backend not found (a backend not exported from its cluster),
	// one "<route>: <message>" each.
	Problems map[ServiceKey][]string
}

// problems fills Problems from the imported routes (ImportRoutes: every parentRef names the
// route's service) and ResolveRoutes' statuses of them, in the same order.
func (ci *ConfigImports) problems(imported []Route, statuses []RouteStatus) {
	for i, st := range statuses {
		svc := imported[i].Parents[0].Service
		for _, ps := range st.Parents {
			var msg string
			switch {
			case !ps.Accepted.Status:
				msg = ps.Accepted.Reason + ": " + ps.Accepted.Message
			case !ps.ResolvedRefs.Status:
				msg = ps.ResolvedRefs.Reason + ": " + ps.ResolvedRefs.Message
			default:
				continue
			}
			if ci.Problems == nil {
				ci.Problems = map[ServiceKey][]string{}
			}
			if e := st.Route.String() + ": " + msg; !slices.Contains(ci.Problems[svc], e) {
				ci.Problems[svc] = append(ci.Problems[svc], e)
			}
		}
	}
}
