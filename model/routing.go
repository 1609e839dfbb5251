package model

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// ReasonConflicted is the Accepted=False reason of a route that lost to a route of a more
// specific type on the same Service port (GEP-1294, "Route types": GRPCRoute over HTTPRoute;
// Gateway API v1.6.3 names it in the GEP but defines no constant).
const ReasonConflicted = "Conflicted"

// Frontend is one service port as callers reach it: through the Service's cluster IPs (a Service
// parentRef) or, Import, through its clusterset IPs (a ServiceImport parentRef, GEP-1748).
type Frontend struct {
	Service ServiceKey
	Import  bool
	Port    uint32
}

// String returns "Service <ns>/<name>:<port>" or "ServiceImport <ns>/<name>:<port>".
func (f Frontend) String() string {
	k := "Service "
	if f.Import {
		k = "ServiceImport "
	}
	return k + f.Service.String() + ":" + strconv.FormatUint(uint64(f.Port), 10)
}

// Compare orders frontends by service, then Service before ServiceImport, then port.
func (f Frontend) Compare(o Frontend) int {
	if c := f.Service.Compare(o.Service); c != 0 {
		return c
	}
	if f.Import != o.Import {
		if !f.Import {
			return -1
		}
		return 1
	}
	return cmp.Compare(f.Port, o.Port)
}

// RouteEntry is one match of one rule bound to a frontend, in precedence order: the xDS builder
// makes one Envoy route of it.
type RouteEntry struct {
	Route      RouteRef
	RuleIndex  int
	MatchIndex int
	// Rule is the rule with its backends resolved (BackendRef.Invalid set); shared, read only.
	Rule  *RouteRule
	Match RouteMatch
}

// PortRoutes are the routes bound to one frontend: the producer routes (in the Service's own
// namespace, for every caller) and, per namespace, that namespace's consumer routes, which
// replace the producer routes for its callers (GEP-1294, "Namespace boundaries").
type PortRoutes struct {
	Producer  []RouteEntry
	Consumers map[string][]RouteEntry
}

// Routing is the GAMMA routes of one cluster bound to frontends (ResolveRoutes). The zero value
// has no routes.
type Routing struct {
	Ports map[Frontend]*PortRoutes
	// ConsumerNamespaces are the namespaces that have consumer routes, sorted.
	ConsumerNamespaces []string
}

// For returns the routes of fe for a caller in namespace ns: ns's consumer routes when it has any
// for fe, else the producer routes; nil means no route is bound (the default route applies).
func (r *Routing) For(fe Frontend, ns string) []RouteEntry {
	if r == nil {
		return nil
	}
	p := r.Ports[fe]
	if p == nil {
		return nil
	}
	if c, ok := p.Consumers[ns]; ok {
		return c
	}
	return p.Producer
}

// RouteStatus is what ResolveRoutes found for one route: an entry per mesh parentRef.
type RouteStatus struct {
	Route      RouteRef
	Generation int64
	Parents    []ParentStatus
}

// ParentStatus is the status of one mesh parentRef (spec.parentRefs[Index]): the Accepted and
// ResolvedRefs conditions, and PartiallyInvalid when some rules were dropped.
type ParentStatus struct {
	Index            int
	Accepted         Condition
	ResolvedRefs     Condition
	PartiallyInvalid *Condition
}

// candidate is one route bound to one frontend for one group ("" producer, else the consumer
// namespace).
type candidate struct {
	// ri is the route's index in ResolveRoutes' routes.
	ri    int
	route *Route
	fe    Frontend
	group string
	// parent is the index in statuses[route].Parents.
	parent int
}

// ResolveRoutes binds routes to the services of a cluster's model (by key) as GEP-1294 and
// GEP-1748 say, and returns the routing and each route's status, in the order of routes:
//   - a Service parentRef binds to the Service's cluster IPs, a ServiceImport parentRef to its
//     clusterset IPs; parentRef.port (and sectionName, a port name) pick one port, else every HTTP
//     port of the service; a headless Service, a service not in a mesh namespace or a port that is
//     not HTTP does not bind (Accepted=False, NoMatchingParent);
//   - a route in the parent's namespace is a producer route; in another namespace a consumer
//     route, for that namespace's callers only, replacing the producer routes;
//   - on one frontend and group, GRPCRoutes win over HTTPRoutes (the losers Accepted=False,
//     Conflicted);
//   - rules with unsupported fields are dropped (PartiallyInvalid, or Accepted=False with
//     UnsupportedValue or IncompatibleFilters when none is left);
//   - a backend that is not a mesh Service port of an HTTP protocol (HTTP/2 or gRPC for a
//     GRPCRoute) is Invalid (ResolvedRefs=False with BackendNotFound, InvalidKind or
//     UnsupportedProtocol, as is a Service of type ExternalName) and its share of requests gets
//     500; a Service backend means the
//     Service's endpoints in this cluster, a ServiceImport backend its clusterset endpoints;
//     backends in other namespaces need no ReferenceGrant (GEP-1294);
//   - entries are ordered by the match precedence of HTTPRouteRule.matches (Exact path, longest
//     PathPrefix, RegularExpression last as Istio orders it; then method, header count, query
//     count) or GRPCRouteRule.matches (service length, method length, header count), ties to the
//     oldest route, then by "<namespace>/<name>", then rule and match order.
//
// hostnames are not interpreted (GEP-1294). ResolveRoutes is pure and does not change routes.
func ResolveRoutes(services map[ServiceKey]*Service, routes []Route) (*Routing, []RouteStatus) {
	statuses := make([]RouteStatus, len(routes))
	resolved := make([]Route, len(routes))
	var cands []candidate
	for i := range routes {
		r := &routes[i]
		rr := resolveBackends(services, r)
		resolved[i] = rr
		refs := resolvedRefs(&rr)
		st := RouteStatus{Route: r.RouteRef, Generation: r.Generation}
		served, dropped, incompatible := servedRules(&rr)
		for _, p := range r.Parents {
			ps, fes := parentBinding(services, r, p, refs)
			switch {
			case len(fes) == 0:
			case len(r.Rules) == 0:
				// GRPCRoute rules have no minimum (an HTTPRoute's default to one rule): a route
				// without rules would route nothing, so that every request to the frontend fails.
				ps.Accepted = Condition{Reason: string(gwv1.RouteReasonUnsupportedValue),
					Message: fmt.Sprintf("the %s has no rules: nothing to route; give it a rule (a rule without matches matches every request)", r.Kind)}
			case served == 0:
				reason := gwv1.RouteReasonUnsupportedValue
				if incompatible {
					reason = gwv1.RouteReasonIncompatibleFilters
				}
				ps.Accepted = Condition{Reason: string(reason), Message: "no rule can be served: " + strings.Join(dropped, "; ")}
			default:
				ps.accept(fes, dropped)
				group := ""
				if r.Namespace != p.Service.Namespace {
					group = r.Namespace
				}
				for _, fe := range fes {
					cands = append(cands, candidate{ri: i, route: &resolved[i], fe: fe, group: group, parent: len(st.Parents)})
				}
			}
			st.Parents = append(st.Parents, ps)
		}
		statuses[i] = st
	}
	return bindCandidates(cands, statuses), statuses
}

// parentBinding starts the status of parentRef p of route r, whose backends resolved to refs:
// the frontends p binds to (bindParent), or none and Accepted=False, NoMatchingParent.
func parentBinding(services map[ServiceKey]*Service, r *Route, p ParentRef, refs Condition) (ParentStatus, []Frontend) {
	ps := ParentStatus{Index: p.Index, ResolvedRefs: refs}
	fes, why := bindParent(services, r, p)
	if why != "" {
		ps.Accepted = Condition{Reason: string(gwv1.RouteReasonNoMatchingParent), Message: why}
	}
	return ps, fes
}

// accept makes ps Accepted, bound to fes, and PartiallyInvalid when rules were dropped.
func (ps *ParentStatus) accept(fes []Frontend, dropped []string) {
	ps.Accepted = Condition{Status: true, Reason: string(gwv1.RouteReasonAccepted), Message: "bound to " + joinFrontends(fes)}
	if len(dropped) > 0 {
		ps.PartiallyInvalid = &Condition{Status: true, Reason: string(gwv1.RouteReasonUnsupportedValue), Message: "Dropped Rule(s): " + strings.Join(dropped, "; ")}
	}
}

// bindCandidates resolves type conflicts per frontend and group, marks parents that lost every
// frontend Conflicted, and orders each group's entries.
func bindCandidates(cands []candidate, statuses []RouteStatus) *Routing {
	type key struct {
		fe    Frontend
		group string
	}
	hasGRPC := map[key]bool{}
	for _, c := range cands {
		if c.route.Kind == KindGRPCRoute {
			hasGRPC[key{c.fe, c.group}] = true
		}
	}
	type parentKey struct{ route, parent int }
	won := map[parentKey][]Frontend{}
	lost := map[parentKey][]Frontend{}
	groups := map[key][]candidate{}
	for _, c := range cands {
		k, pk := key{c.fe, c.group}, parentKey{c.ri, c.parent}
		if c.route.Kind == KindHTTPRoute && hasGRPC[k] {
			lost[pk] = append(lost[pk], c.fe)
			continue
		}
		won[pk] = append(won[pk], c.fe)
		if !slices.ContainsFunc(groups[k], func(o candidate) bool { return o.route == c.route }) {
			groups[k] = append(groups[k], c)
		}
	}
	for pk, fes := range lost {
		ps := &statuses[pk.route].Parents[pk.parent]
		if w := won[pk]; len(w) > 0 {
			// Still bound where no GRPCRoute is: say where, and where not.
			ps.Accepted.Message = "bound to " + joinFrontends(w) + "; not to " + joinFrontends(fes) + ", where a GRPCRoute is bound and wins over an HTTPRoute (GEP-1294, Route types)"
			continue
		}
		ps.Accepted = Condition{Reason: ReasonConflicted, Message: "a GRPCRoute is bound to " + joinFrontends(fes) + " and wins over an HTTPRoute (GEP-1294, Route types)"}
		ps.PartiallyInvalid = nil
	}
	rt := &Routing{Ports: map[Frontend]*PortRoutes{}}
	consumers := map[string]bool{}
	for k, cs := range groups {
		entries := routeEntries(cs)
		p := rt.Ports[k.fe]
		if p == nil {
			p = &PortRoutes{}
			rt.Ports[k.fe] = p
		}
		if k.group == "" {
			p.Producer = entries
			continue
		}
		if p.Consumers == nil {
			p.Consumers = map[string][]RouteEntry{}
		}
		p.Consumers[k.group] = entries
		consumers[k.group] = true
	}
	for ns := range consumers {
		rt.ConsumerNamespaces = append(rt.ConsumerNamespaces, ns)
	}
	slices.Sort(rt.ConsumerNamespaces)
	return rt
}

// routeEntries lists the served matches of the routes cs (all of one kind) in precedence order.
func routeEntries(cs []candidate) []RouteEntry {
	var out []RouteEntry
	created := map[RouteRef]*Route{}
	for _, c := range cs {
		created[c.route.RouteRef] = c.route
		for ri := range c.route.Rules {
			rule := &c.route.Rules[ri]
			if served, _ := rule.Served(); !served {
				continue
			}
			for mi, m := range rule.Matches {
				out = append(out, RouteEntry{Route: c.route.RouteRef, RuleIndex: ri, MatchIndex: mi, Rule: rule, Match: m})
			}
		}
	}
	slices.SortStableFunc(out, func(a, b RouteEntry) int {
		if c := compareMatch(a.Match, b.Match); c != 0 {
			return c
		}
		ra, rb := created[a.Route], created[b.Route]
		if c := ra.Created.Compare(rb.Created); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Route.Namespace+"/"+a.Route.Name, b.Route.Namespace+"/"+b.Route.Name); c != 0 {
			return c
		}
		if c := cmp.Compare(a.RuleIndex, b.RuleIndex); c != 0 {
			return c
		}
		return cmp.Compare(a.MatchIndex, b.MatchIndex)
	})
	return out
}

// compareMatch orders a before b (negative) when a takes precedence: HTTPRouteRule.matches for
// HTTP matches, GRPCRouteRule.matches for gRPC ones (GRPC set or no Path type).
func compareMatch(a, b RouteMatch) int {
	if a.Path.Type == "" && b.Path.Type == "" { // GRPCRoute
		var sa, sb, ma, mb int
		if a.GRPC != nil {
			sa, ma = len(a.GRPC.Service), len(a.GRPC.Method)
		}
		if b.GRPC != nil {
			sb, mb = len(b.GRPC.Service), len(b.GRPC.Method)
		}
		return cmp.Or(cmp.Compare(sb, sa), cmp.Compare(mb, ma), cmp.Compare(len(b.Headers), len(a.Headers)))
	}
	rank := func(t MatchType) int {
		switch t {
		case MatchExact:
			return 3
		case MatchPathPrefix:
			return 2
		}
		return 1
	}
	hasMethod := func(m RouteMatch) int {
		if m.Method != "" {
			return 1
		}
		return 0
	}
	return cmp.Or(
		cmp.Compare(rank(b.Path.Type), rank(a.Path.Type)),
		cmp.Compare(len(prefixValue(b.Path)), len(prefixValue(a.Path))),
		cmp.Compare(hasMethod(b), hasMethod(a)),
		cmp.Compare(len(b.Headers), len(a.Headers)),
		cmp.Compare(len(b.Query), len(a.Query)),
	)
}

// prefixValue is a path match's value as compared: a PathPrefix without its trailing "/" ("/"
// stays), since "/abc/" and "/abc" match the same paths.
func prefixValue(p PathMatch) string {
	if p.Type == MatchPathPrefix && len(p.Value) > 1 {
		return strings.TrimRight(p.Value, "/")
	}
	return p.Value
}

// bindParent returns the frontends parentRef p of route r binds to, or why it binds to none.
func bindParent(services map[ServiceKey]*Service, r *Route, p ParentRef) ([]Frontend, string) {
	s := services[p.Service]
	imp := p.Kind == ParentServiceImport
	switch {
	case s == nil || (!imp && !s.Local) || (imp && !s.Imported):
		return nil, fmt.Sprintf("%s %s: not found in a mesh namespace (labelled %s=%s)", p.Kind, p.Service, LabelMeshNamespace, MeshNamespaceEnabled)
	case !imp && s.Headless:
		return nil, fmt.Sprintf("Service %s is headless: it has no frontend to route (GEP-1294, Allowed service types)", p.Service)
	case !imp && len(s.VIPs) == 0:
		return nil, fmt.Sprintf("Service %s has no cluster IP (GEP-1294: ClusterIP Services only)", p.Service)
	case imp && len(s.ClustersetVIPs) == 0:
		return nil, fmt.Sprintf("ServiceImport %s has no clusterset IP yet", p.Service)
	}
	var fes []Frontend
	var mismatch []string
	fits, want := portFits(r.Kind)
	for _, sp := range s.Ports {
		if (p.Port != 0 && sp.Port != p.Port) || (p.SectionName != "" && sp.Name != p.SectionName) {
			continue
		}
		if !fits(sp.Protocol) {
			mismatch = append(mismatch, fmt.Sprintf("port %d is %s", sp.Port, sp.Protocol))
			continue
		}
		fes = append(fes, Frontend{Service: p.Service, Import: imp, Port: sp.Port})
	}
	if len(fes) > 0 {
		return fes, ""
	}
	what := "a port"
	switch {
	case p.Port != 0 && p.SectionName != "":
		what = fmt.Sprintf("port %d named %q", p.Port, p.SectionName)
	case p.Port != 0:
		what = fmt.Sprintf("port %d", p.Port)
	case p.SectionName != "":
		what = fmt.Sprintf("a port named %q", p.SectionName)
	}
	if len(mismatch) > 0 {
		return nil, fmt.Sprintf("%s %s: %s: %s", p.Kind, p.Service, strings.Join(mismatch, ", "), fmt.Sprintf(want, r.Kind))
	}
	return nil, fmt.Sprintf("%s %s has no %s", p.Kind, p.Service, what)
}

// portFits returns which Service ports a route of kind binds to, and a format for a status
// message that says so (its verb takes the kind): HTTPRoutes and GRPCRoutes to HTTP ports (the
// capture HTTP chain), TCPRoutes and TLSRoutes to TCP ports (their floor chains), UDPRoutes to
// UDP ports.
func portFits(kind RouteKind) (fits func(Protocol) bool, want string) {
	switch kind {
	case KindTCPRoute, KindTLSRoute:
		return func(p Protocol) bool { return p == ProtocolTCP },
			"a %s binds to TCP ports only (appProtocol tcp, tls, mysql, ...; not HTTP, h2c, gRPC or UDP)"
	case KindUDPRoute:
		return func(p Protocol) bool { return p == ProtocolUDP }, "a %s binds to UDP ports only"
	}
	return Protocol.IsHTTP, "an %s binds to HTTP ports only (appProtocol http, h2c or grpc)"
}

// resolveBackends returns a copy of r whose backends (and mirror backends) have Invalid set when
// they cannot be used.
func resolveBackends(services map[ServiceKey]*Service, r *Route) Route {
	out := *r
	out.Rules = make([]RouteRule, len(r.Rules))
	for i, rule := range r.Rules {
		rule.Backends = slices.Clone(rule.Backends)
		for j := range rule.Backends {
			resolveBackend(services, r.Kind, &rule.Backends[j])
		}
		rule.Filters = slices.Clone(rule.Filters)
		for j, f := range rule.Filters {
			if f.Mirror != nil {
				m := *f.Mirror
				resolveBackend(services, r.Kind, &m.Backend)
				rule.Filters[j].Mirror = &m
			}
		}
		out.Rules[i] = rule
	}
	return out
}

// resolveBackend sets b.Invalid when b is not a usable mesh backend, and fills a ServiceImport's
// port when it has one port only.
func resolveBackend(services map[ServiceKey]*Service, kind RouteKind, b *BackendRef) {
	if b.Invalid != nil {
		return
	}
	s := services[b.Service]
	imp := b.Kind == BackendServiceImport
	if s == nil || (!imp && !s.Local) || (imp && !s.Imported) {
		b.Invalid = &Condition{Reason: string(gwv1.RouteReasonBackendNotFound),
			Message: fmt.Sprintf("backendRef %s %s: not found in a mesh namespace", b.Kind, b.Service)}
		return
	}
	if imp && len(s.ClustersetVIPs)+len(s.VIPs) == 0 && !s.Headless {
		b.Invalid = &Condition{Reason: string(gwv1.RouteReasonBackendNotFound),
			Message: fmt.Sprintf("backendRef ServiceImport %s has no clusterset IP yet", b.Service)}
		return
	}
	if !imp && s.ExternalName {
		b.Invalid = &Condition{Reason: string(gwv1.RouteReasonUnsupportedProtocol),
			Message: fmt.Sprintf("backendRef Service %s is of type ExternalName: aether routes to mesh Services with endpoints, not to a DNS alias (Gateway API: implementations SHOULD NOT support ExternalName Services)", b.Service)}
		return
	}
	if b.Port == 0 {
		if !imp || len(s.Ports) != 1 {
			b.Invalid = &Condition{Reason: string(gwv1.RouteReasonBackendNotFound),
				Message: fmt.Sprintf("backendRef %s %s: port is required", b.Kind, b.Service)}
			return
		}
		b.Port = s.Ports[0].Port
	}
	i := slices.IndexFunc(s.Ports, func(sp ServicePort) bool { return sp.Port == b.Port })
	if i < 0 {
		b.Invalid = &Condition{Reason: string(gwv1.RouteReasonBackendNotFound),
			Message: fmt.Sprintf("backendRef %s %s: no port %d", b.Kind, b.Service, b.Port)}
		return
	}
	switch p := s.Ports[i].Protocol; {
	case isL4(kind):
		b.Invalid = l4BackendProtocol(kind, b, p)
	case kind == KindGRPCRoute && p != ProtocolGRPC && p != ProtocolHTTP2:
		b.Invalid = &Condition{Reason: string(gwv1.RouteReasonUnsupportedProtocol),
			Message: fmt.Sprintf("backendRef %s %s port %d is %s: a GRPCRoute backend needs appProtocol grpc or kubernetes.io/h2c", b.Kind, b.Service, b.Port, p)}
	case !p.IsHTTP():
		b.Invalid = &Condition{Reason: string(gwv1.RouteReasonUnsupportedProtocol),
			Message: fmt.Sprintf("backendRef %s %s port %d is %s: an %s backend must be an HTTP port", b.Kind, b.Service, b.Port, p, kind)}
	}
}

// resolvedRefs is the ResolvedRefs condition of a route whose backends are resolved: the first
// invalid backend's reason, every invalid backend's message.
func resolvedRefs(r *Route) Condition {
	var reason string
	var msgs []string
	note := func(b *BackendRef) {
		if b.Invalid != nil {
			if reason == "" {
				reason = b.Invalid.Reason
			}
			msgs = append(msgs, b.Invalid.Message)
		}
	}
	for _, rule := range r.Rules {
		for j := range rule.Backends {
			note(&rule.Backends[j])
		}
		for _, f := range rule.Filters {
			if f.Mirror != nil {
				note(&f.Mirror.Backend)
			}
		}
	}
	if reason == "" {
		return Condition{Status: true, Reason: string(gwv1.RouteReasonResolvedRefs)}
	}
	return Condition{Reason: reason, Message: strings.Join(msgs, "; ")}
}

// servedRules counts the rules of r that can be served and lists the dropped ones; incompatible
// is true when every dropped rule was dropped for a filter combination only.
func servedRules(r *Route) (served int, dropped []string, incompatible bool) {
	incompatible = true
	for i, rule := range r.Rules {
		ok, asError := rule.Served()
		switch {
		case ok && !asError:
			served++
			continue
		case asError:
			served++
			dropped = append(dropped, fmt.Sprintf("rule %d (its requests are answered with an error, not passed to other rules): %s", i, strings.Join(rule.Unsupported, "; ")))
			continue
		}
		dropped = append(dropped, fmt.Sprintf("rule %d: %s", i, strings.Join(rule.Unsupported, "; ")))
		for _, u := range rule.Unsupported {
			if !strings.Contains(u, ".filters: ") {
				incompatible = false
			}
		}
	}
	return served, dropped, incompatible && len(dropped) > 0
}

func joinFrontends(fes []Frontend) string {
	s := make([]string, len(fes))
	for i, f := range fes {
		s[i] = f.String()
	}
	return strings.Join(s, ", ")
}
