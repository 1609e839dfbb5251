package model

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// binding is one route bound to one listener.
type binding struct {
	// route is the route with its backends resolved for the edge; shared, read only.
	route *Route
	// hosts are the intersected hostnames, each once.
	hosts []string
	// parents are the parentRefs that bound the route to the listener.
	parents []*parentState
}

// parentState is one Gateway parentRef of a route while bindRoutes works on it.
type parentState struct {
	status *GatewayParentStatus
	gw     *gatewayState
	// listeners are the listeners the parentRef is bound to.
	listeners []*listenerState
	// lost says where a route of the other type won (GEP-1016).
	lost []string
}

// bindRoutes binds the routes of in to the listeners of gws and returns the routes' statuses
// (see ResolveGateways).
func bindRoutes(in GatewayInputs, gws map[GatewayKey]*gatewayState) []GatewayRouteStatus {
	var out []GatewayRouteStatus
	var bound []*parentState
	for i := range in.Routes {
		r := &in.Routes[i]
		var ours []GatewayParentRef
		for _, p := range r.GatewayParents {
			if gws[p.Gateway] != nil {
				ours = append(ours, p)
			}
		}
		if len(ours) == 0 {
			continue
		}
		rr := edgeRoute(in, r)
		refs := resolvedRefs(rr)
		served, dropped, incompatible := servedRules(rr)
		st := GatewayRouteStatus{Route: r.RouteRef, Generation: r.Generation, Parents: make([]GatewayParentStatus, len(ours))}
		for k, p := range ours {
			ps := &parentState{status: &st.Parents[k], gw: gws[p.Gateway]}
			*ps.status = GatewayParentStatus{Index: p.Index, ResolvedRefs: refs}
			hosted, refusal := selectListeners(in, ps.gw, rr, p)
			switch {
			case refusal != nil:
				ps.status.Accepted = *refusal
			case len(r.Rules) == 0:
				ps.status.Accepted = Condition{Reason: string(gwv1.RouteReasonUnsupportedValue), Message: fmt.Sprintf("the %s has no rules: nothing to route", r.Kind)}
			case served == 0:
				reason := gwv1.RouteReasonUnsupportedValue
				if incompatible {
					reason = gwv1.RouteReasonIncompatibleFilters
				}
				ps.status.Accepted = Condition{Reason: string(reason), Message: "no rule can be served: " + strings.Join(dropped, "; ")}
			default:
				if len(dropped) > 0 {
					ps.status.PartiallyInvalid = &Condition{Status: true, Reason: string(gwv1.RouteReasonUnsupportedValue), Message: "Dropped Rule(s): " + strings.Join(dropped, "; ")}
				}
				for _, h := range hosted {
					ps.listeners = append(ps.listeners, h.l)
					h.l.bind(rr, h.hosts, ps)
				}
				bound = append(bound, ps)
			}
		}
		out = append(out, st)
	}
	for _, gs := range gws {
		for _, l := range gs.listeners {
			slices.SortStableFunc(l.bound, func(a, b *binding) int { return comparePrecedence(a.route, b.route) })
			if l.proto == ListenerHTTP || l.proto == ListenerHTTPS {
				dropTypeConflicts(l)
			}
		}
	}
	for _, ps := range bound {
		acceptParent(ps)
	}
	return out
}

// hostedListener is a listener that takes a route, with the intersected hostnames.
type hostedListener struct {
	l     *listenerState
	hosts []string
}

// selectListeners returns the listeners of gs parentRef p selects that take route r, or the
// Accepted=False condition saying why none does.
func selectListeners(in GatewayInputs, gs *gatewayState, r *Route, p GatewayParentRef) ([]hostedListener, *Condition) {
	var selected []*listenerState
	for _, l := range gs.listeners {
		if (p.SectionName == "" || l.spec.Name == p.SectionName) && (p.Port == 0 || l.spec.Port == p.Port) {
			selected = append(selected, l)
		}
	}
	if len(selected) == 0 {
		what := "listeners"
		switch {
		case p.SectionName != "" && p.Port != 0:
			what = fmt.Sprintf("listener named %q on port %d", p.SectionName, p.Port)
		case p.SectionName != "":
			what = fmt.Sprintf("listener named %q", p.SectionName)
		case p.Port != 0:
			what = fmt.Sprintf("listener on port %d", p.Port)
		}
		return nil, &Condition{Reason: string(gwv1.RouteReasonNoMatchingParent), Message: fmt.Sprintf("Gateway %s has no %s", p.Gateway, what)}
	}
	var allowed []*listenerState
	var why []string
	for _, l := range selected {
		if w := l.admits(in, gs.spec.Key.Namespace, r); w != "" {
			why = append(why, fmt.Sprintf("listener %s: %s", l.spec.Name, w))
			continue
		}
		allowed = append(allowed, l)
	}
	if len(allowed) == 0 {
		return nil, &Condition{Reason: string(gwv1.RouteReasonNotAllowedByListeners), Message: strings.Join(why, "; ")}
	}
	var out []hostedListener
	var theirs []string
	for _, l := range allowed {
		if hs := routeHosts(l.hostname, r.Hostnames); len(hs) > 0 {
			out = append(out, hostedListener{l, hs})
			continue
		}
		theirs = append(theirs, fmt.Sprintf("%s %q", l.spec.Name, l.hostname))
	}
	if len(out) == 0 {
		return nil, &Condition{Reason: string(gwv1.RouteReasonNoMatchingListenerHostname),
			Message: fmt.Sprintf("hostnames %s intersect none of the listeners' hostnames (%s)", strings.Join(r.Hostnames, ", "), strings.Join(theirs, ", "))}
	}
	return out, nil
}

// admits says why listener l of a Gateway in namespace gwNS does not take route r ("" when it
// does): its kinds, then allowedRoutes.namespaces.
func (l *listenerState) admits(in GatewayInputs, gwNS string, r *Route) string {
	if !slices.Contains(l.kinds, RouteGroupKind{Group: gwv1.GroupName, Kind: string(r.Kind)}) {
		var ks []string
		for _, k := range l.kinds {
			ks = append(ks, k.Kind)
		}
		return fmt.Sprintf("takes %s, not %s", cmp.Or(strings.Join(ks, ", "), "no route kind"), r.Kind)
	}
	ar := l.spec.AllowedRoutes
	switch gwv1.FromNamespaces(ar.From) {
	case gwv1.NamespacesFromAll:
		return ""
	case gwv1.NamespacesFromSame:
		if r.Namespace == gwNS {
			return ""
		}
		return fmt.Sprintf("takes routes of namespace %s only (allowedRoutes.namespaces.from Same), not of %s", gwNS, r.Namespace)
	case gwv1.NamespacesFromSelector:
		if l.selector == nil {
			return "its namespace selector is not valid"
		}
		if l.selector.Matches(labels.Set(in.NamespaceLabels[r.Namespace])) {
			return ""
		}
		return fmt.Sprintf("namespace %s does not match its selector %q", r.Namespace, ar.Selector)
	}
	return fmt.Sprintf("allowedRoutes.namespaces.from %q takes no namespace", ar.From)
}

// routeHosts are the intersections of a listener's hostname with a route's hostnames (with any
// host when the route has none), each once.
func routeHosts(listener string, route []string) []string {
	if len(route) == 0 {
		route = []string{""}
	}
	var out []string
	for _, h := range route {
		if i, ok := intersectHostnames(listener, h); ok && !slices.Contains(out, i) {
			out = append(out, i)
		}
	}
	return out
}

// bind binds route r with hostnames hosts to l for parentRef ps (once per route).
func (l *listenerState) bind(r *Route, hosts []string, ps *parentState) {
	for _, b := range l.bound {
		if b.route == r {
			b.parents = append(b.parents, ps)
			return
		}
	}
	l.bound = append(l.bound, &binding{route: r, hosts: hosts, parents: []*parentState{ps}})
}

// comparePrecedence orders routes oldest first, then by "<namespace>/<name>".
func comparePrecedence(a, b *Route) int {
	return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name))
}

// dropTypeConflicts unbinds, from HTTP listener l (bound in precedence order), each route whose
// hostnames overlap those of an older bound route of the other type (HTTPRoute, GRPCRoute):
// GRPCRouteSpec.hostnames, "the implementation MUST accept exactly one of these two routes" (the
// oldest, then by "<namespace>/<name>").
func dropTypeConflicts(l *listenerState) {
	var kept []*binding
	for _, b := range l.bound {
		i := slices.IndexFunc(kept, func(k *binding) bool {
			return k.route.Kind != b.route.Kind && slices.ContainsFunc(k.hosts, func(h string) bool {
				return slices.ContainsFunc(b.hosts, func(o string) bool { return overlapHostnames(h, o) })
			})
		})
		if i < 0 {
			kept = append(kept, b)
			continue
		}
		for _, ps := range b.parents {
			ps.listeners = slices.DeleteFunc(ps.listeners, func(o *listenerState) bool { return o == l })
			ps.lost = append(ps.lost, fmt.Sprintf("listener %s, where the older %s has overlapping hostnames (of an HTTPRoute and a GRPCRoute whose hostnames intersect, only the older is accepted: GEP-1016)", l.spec.Name, kept[i].route.RouteRef))
		}
	}
	l.bound = kept
}

// acceptParent sets the Accepted condition of a parentRef whose route was bound.
func acceptParent(ps *parentState) {
	if len(ps.listeners) == 0 {
		ps.status.Accepted = Condition{Reason: ReasonConflicted, Message: "not bound to " + strings.Join(ps.lost, "; ")}
		ps.status.PartiallyInvalid = nil
		return
	}
	var names, idle []string
	for _, l := range ps.listeners {
		names = append(names, l.spec.Name)
		if l.status.Programmed.Status {
			continue
		}
		idle = append(idle, l.spec.Name)
	}
	msg := fmt.Sprintf("bound to %s of Gateway %s", listenerNames(names), ps.gw.spec.Key)
	if len(ps.lost) > 0 {
		msg += "; not to " + strings.Join(ps.lost, "; ")
	}
	if len(idle) > 0 {
		msg += "; not programmed (see the Gateway's status): " + listenerNames(idle)
	}
	ps.status.Accepted = Condition{Status: true, Reason: string(gwv1.RouteReasonAccepted), Message: msg}
}

// edgeRoute is route r with its backends resolved for an edge Gateway: as ResolveRoutes resolves
// them, and a backendRef or mirror in another namespace not allowed by a ReferenceGrant from the
// route is Invalid, RefNotPermitted (BackendRef: "a ReferenceGrant object is required in the
// referent namespace"; GEP-1294 waives it for the mesh only).
func edgeRoute(in GatewayInputs, r *Route) *Route {
	out := resolveBackends(in.Services, r)
	permit := func(b *BackendRef) {
		if b.Service.Namespace == r.Namespace || (b.Invalid != nil && b.Invalid.Reason == string(gwv1.RouteReasonInvalidKind)) {
			return
		}
		want := NamespaceRef{FromGroup: gwv1.GroupName, FromKind: string(r.Kind), FromNamespace: r.Namespace,
			ToGroup: groupCore, ToKind: "Service", ToNamespace: b.Service.Namespace, ToName: b.Service.Name}
		if b.Kind == BackendServiceImport {
			want.ToGroup, want.ToKind = groupMCS, "ServiceImport"
		}
		if !granted(in.Grants, want) {
			b.Invalid = &Condition{Reason: string(gwv1.RouteReasonRefNotPermitted),
				Message: fmt.Sprintf("backendRef %s %s: another namespace: a ReferenceGrant in %s must allow %ss of %s", b.Kind, b.Service, b.Service.Namespace, r.Kind, r.Namespace)}
		}
	}
	for i := range out.Rules {
		rule := &out.Rules[i]
		for j := range rule.Backends {
			permit(&rule.Backends[j])
		}
		for _, f := range rule.Filters {
			if f.Mirror != nil {
				permit(&f.Mirror.Backend) // resolveBackends copied the mirror
			}
		}
	}
	return &out
}

// edgeGateway is the EdgeGateway of accepted Gateway gs: its programmed listeners by port.
func edgeGateway(gs *gatewayState) *EdgeGateway {
	eg := &EdgeGateway{Key: gs.spec.Key, UID: gs.spec.UID, ServiceAccount: EdgeServiceAccountName(gs.spec.Key.Name)}
	byPort := map[uint32][]*listenerState{}
	for _, l := range gs.listeners {
		if l.status.Programmed.Status {
			byPort[l.spec.Port] = append(byPort[l.spec.Port], l)
		}
	}
	for port, ls := range byPort {
		slices.SortFunc(ls, func(a, b *listenerState) int {
			return cmp.Or(compareHostnames(a.hostname, b.hostname), cmp.Compare(a.spec.Name, b.spec.Name))
		})
		ep := EdgePort{Port: port}
		for _, l := range ls {
			var narrower []string // hostnames of the port's more specific listeners
			for _, o := range ls {
				if o.proto != ListenerUDP && l.proto != ListenerUDP && compareHostnames(o.hostname, l.hostname) < 0 {
					narrower = append(narrower, o.hostname)
				}
			}
			el := EdgeListener{Name: l.spec.Name, Protocol: l.proto, Hostname: l.hostname, TLSMode: l.mode, Certificates: l.certs}
			if l.proto == ListenerHTTP || l.proto == ListenerHTTPS {
				el.Hosts = edgeHosts(l, narrower)
			} else {
				el.L4 = edgeL4(l, narrower)
			}
			ep.Listeners = append(ep.Listeners, el)
		}
		eg.Ports = append(eg.Ports, ep)
	}
	slices.SortFunc(eg.Ports, func(a, b EdgePort) int { return cmp.Compare(a.Port, b.Port) })
	return eg
}

// isolated reports whether host h belongs to one of the narrower listeners (listener isolation).
func isolated(h string, narrower []string) bool {
	return slices.ContainsFunc(narrower, func(n string) bool { return coversHostname(n, h) })
}

// edgeHosts are the virtual hosts of HTTP(S) listener l (see ResolveGateways).
func edgeHosts(l *listenerState, narrower []string) []EdgeHost {
	var all []string
	for _, b := range l.bound {
		for _, h := range b.hosts {
			if !slices.Contains(all, h) {
				all = append(all, h)
			}
		}
	}
	slices.SortFunc(all, compareHostnames)
	var out []EdgeHost
	for _, h := range all {
		if isolated(h, narrower) {
			continue
		}
		seen := map[*Route]bool{}
		var entries []RouteEntry
		for _, tier := range all { // most specific first: h itself, then the wildcards covering it
			if !coversHostname(tier, h) {
				continue
			}
			var cs []candidate
			for _, b := range l.bound {
				if !seen[b.route] && slices.Contains(b.hosts, tier) {
					seen[b.route] = true
					cs = append(cs, candidate{route: b.route})
				}
			}
			entries = append(entries, routeEntries(cs)...)
		}
		out = append(out, EdgeHost{Hostname: h, Entries: entries})
	}
	return out
}

// edgeL4 are the routes of L4 listener l (see ResolveGateways).
func edgeL4(l *listenerState, narrower []string) []EdgeL4Route {
	var out []EdgeL4Route
	claimed := map[string]bool{}
	for _, b := range l.bound {
		i := slices.IndexFunc(b.route.Rules, func(r RouteRule) bool { ok, _ := r.Served(); return ok })
		if i < 0 {
			continue
		}
		er := EdgeL4Route{Route: b.route.RouteRef, Backends: b.route.Rules[i].Backends}
		if b.route.Kind == KindTLSRoute {
			for _, h := range b.hosts {
				if !claimed[h] && !isolated(h, narrower) {
					claimed[h] = true
					er.Hostnames = append(er.Hostnames, h)
				}
			}
			if len(er.Hostnames) == 0 {
				continue
			}
		}
		out = append(out, er)
	}
	return out
}
