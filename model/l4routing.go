package model

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// L4Routing is the mesh's TCPRoutes, TLSRoutes and UDPRoutes bound to frontends
// (ResolveL4Routes): what the caller's node Envoy does, on the capture path, with a connection
// to a frontend's VIP and port instead of passing it to the Service's own floor chain, and with
// a datagram to a frontend's VIP and UDP port (a UDP listener per frontend, UDPFrontends). The
// zero value has no routes.
type L4Routing struct {
	// Ports holds the TCPRoutes and TLSRoutes, by the frontend (a TCP Service port) they bind.
	Ports map[Frontend]*L4Port
	// UDP holds the UDPRoutes, by the frontend (a UDP Service port) they bind: one route each
	// (the oldest). A Service's UDP port may share its number with a TCP port, hence a map of
	// its own.
	UDP map[Frontend]*L4Port
}

// L4Port is what one frontend's L4 routes do: a TCPRoute takes every connection (Routes holds
// it alone), or TLSRoutes share the frontend by SNI, each taking the names of its Hostnames. A
// connection whose SNI no route names, or that is not TLS, goes to the Service as without
// routes.
type L4Port struct {
	// Routes are the routes bound, in precedence order (the oldest first, then
	// "<namespace>/<name>").
	Routes []L4Route
}

// For returns the L4 routes bound to fe, nil when none is.
func (r *L4Routing) For(fe Frontend) []L4Route {
	if r == nil || r.Ports[fe] == nil {
		return nil
	}
	return r.Ports[fe].Routes
}

// L4Route is one TCPRoute or TLSRoute bound to a frontend.
type L4Route struct {
	Route RouteRef
	// Hostnames are the SNI names a TLSRoute serves on the frontend, lower case: its
	// spec.hostnames less those an older TLSRoute of the frontend names ("*.example.com" matches
	// one or more labels in front of example.com); "*" for a TLSRoute without hostnames, which
	// takes every TLS connection whose SNI no other route names. Empty for a TCPRoute.
	Hostnames []string
	// Backends are the route's first rule's backendRefs, resolved (BackendRef.Invalid set; the
	// share of an invalid backend's connections is closed). The same on every frontend the
	// route binds.
	Backends []BackendRef
}

// AnySNI is the L4Route.Hostnames entry of a TLSRoute without hostnames: every SNI name no
// other route of the frontend names.
const AnySNI = "*"

// l4Candidate is one L4 route bound to one frontend by one of its parentRefs.
type l4Candidate struct {
	ri     int
	route  *Route
	fe     Frontend
	parent int // index in the route's status Parents
}

// ResolveL4Routes binds the mesh parentRefs (Service, ServiceImport) of TCPRoutes, TLSRoutes
// and UDPRoutes to the services of a cluster's model (by key), and returns the L4 routing and
// each L4 route's status, in the order of routes (routes of other kinds are skipped). The
// binding is ResolveRoutes' (a Service parentRef binds to the cluster IPs, a ServiceImport
// parentRef to the clusterset IPs; parentRef.port and sectionName pick a port, else every port
// the route's kind binds to), with these differences:
//   - TCPRoutes and TLSRoutes bind to TCP ports only (the floor chains): a port of another
//     protocol does not bind (Accepted=False, NoMatchingParent, the message naming the port's
//     protocol);
//   - only producer routes (in the Service's namespace) are served; a consumer route (in
//     another namespace) gets Accepted=False, UnsupportedValue;
//   - UDPRoutes bind to UDP ports only, into L4Routing.UDP (the pods' UDP capture serves them,
//     docs/capture.md);
//   - on one frontend the oldest route wins (then "<namespace>/<name>"), the others get
//     Accepted=False, Conflicted (UDPRoutes among themselves on a UDP port), except TLSRoutes,
//     which share a frontend by SNI: each hostname
//     goes to the oldest TLSRoute naming it, and a TLSRoute without hostnames takes every name
//     no other one names (AnySNI). A TLSRoute left with no name there, and every TCPRoute beside
//     an older TLSRoute (or TLSRoute beside an older TCPRoute), is Conflicted on it; a parent
//     still bound elsewhere stays Accepted and its message says where it is not;
//   - the first served rule is served (an L4 route has one rule, Gateway API v1.6.3); backends
//     resolve as for ResolveRoutes (a port of any protocol but UDP for a TCPRoute, a TCP port
//     for a TLSRoute, whose client's TLS the mesh passes through, a UDP port for a UDPRoute;
//     no ReferenceGrant needed in the mesh, GEP-1294), an invalid one gets ResolvedRefs=False
//     and its share of connections is closed.
//
// ResolveL4Routes is pure and does not change routes.
func ResolveL4Routes(services map[ServiceKey]*Service, routes []Route) (*L4Routing, []RouteStatus) {
	var statuses []RouteStatus
	var resolved []Route
	var cands []l4Candidate
	for i := range routes {
		if !isL4(routes[i].Kind) {
			continue
		}
		resolved = append(resolved, resolveBackends(services, &routes[i]))
	}
	for i := range resolved {
		r := &resolved[i]
		refs := resolvedRefs(r)
		st := RouteStatus{Route: r.RouteRef, Generation: r.Generation}
		served, dropped, _ := servedRules(r)
		for _, p := range r.Parents {
			ps, fes := parentBinding(services, r, p, refs)
			switch {
			case len(fes) == 0:
			case r.Namespace != p.Service.Namespace:
				ps.Accepted = Condition{Reason: string(gwv1.RouteReasonUnsupportedValue), Message: fmt.Sprintf(
					"consumer L4 routes are not supported: a %s in namespace %s on %s %s in another namespace is not served (only routes in the Service's namespace are)",
					r.Kind, r.Namespace, p.Kind, p.Service)}
			case len(r.Rules) == 0:
				ps.Accepted = Condition{Reason: string(gwv1.RouteReasonUnsupportedValue), Message: fmt.Sprintf("the %s has no rules: nothing to route", r.Kind)}
			case served == 0:
				ps.Accepted = Condition{Reason: string(gwv1.RouteReasonUnsupportedValue), Message: "no rule can be served: " + strings.Join(dropped, "; ")}
			default:
				ps.accept(fes, dropped)
				for _, fe := range fes {
					cands = append(cands, l4Candidate{ri: i, route: r, fe: fe, parent: len(st.Parents)})
				}
			}
			st.Parents = append(st.Parents, ps)
		}
		statuses = append(statuses, st)
	}
	return bindL4(cands, statuses), statuses
}

// bindL4 settles each frontend's candidates (ResolveL4Routes) into the routing and marks the
// parents that lost a frontend.
func bindL4(cands []l4Candidate, statuses []RouteStatus) *L4Routing {
	// A UDP port and a TCP port may have one number: their routes never meet.
	type slot struct {
		fe  Frontend
		udp bool
	}
	byFE := map[slot][]l4Candidate{}
	for _, c := range cands {
		k := slot{c.fe, c.route.Kind == KindUDPRoute}
		byFE[k] = append(byFE[k], c)
	}
	type parentKey struct{ route, parent int }
	won := map[parentKey][]Frontend{}
	lost := map[parentKey][]string{} // why, per frontend lost
	partly := map[parentKey][]string{}
	rt := &L4Routing{Ports: map[Frontend]*L4Port{}, UDP: map[Frontend]*L4Port{}}
	for sl, cs := range byFE {
		fe := sl.fe
		slices.SortStableFunc(cs, func(a, b l4Candidate) int {
			return cmp.Or(a.route.Created.Compare(b.route.Created),
				cmp.Compare(a.route.Namespace+"/"+a.route.Name, b.route.Namespace+"/"+b.route.Name),
				cmp.Compare(a.route.Kind, b.route.Kind))
		})
		first := cs[0].route
		port := &L4Port{}
		bound := map[int]int{}      // route index -> index in port.Routes
		claimed := map[string]int{} // TLS hostname -> route index that has it
		for _, c := range cs {
			pk := parentKey{c.ri, c.parent}
			if j, ok := bound[c.ri]; ok { // the same route by another parentRef
				won[pk] = append(won[pk], fe)
				if h := port.Routes[j].Hostnames; c.route.Kind == KindTLSRoute && len(h) < len(hostsOrAny(c.route)) {
					partly[pk] = append(partly[pk], fmt.Sprintf("%s: %s", fe, takenBy(c.route, claimed, cs)))
				}
				continue
			}
			switch {
			case c.route.Kind != first.Kind || (first.Kind != KindTLSRoute && c.route != first):
				lost[pk] = append(lost[pk], fmt.Sprintf("%s: %s is bound there and is older", fe, first.RouteRef))
				continue
			case c.route.Kind != KindTLSRoute:
				port.Routes = append(port.Routes, L4Route{Route: c.route.RouteRef, Backends: servedBackends(c.route)})
			default:
				var mine []string
				for _, h := range hostsOrAny(c.route) {
					if _, ok := claimed[h]; !ok {
						claimed[h] = c.ri
						mine = append(mine, h)
					}
				}
				if len(mine) == 0 {
					lost[pk] = append(lost[pk], fmt.Sprintf("%s: each of its hostnames is an older TLSRoute's: %s", fe, takenBy(c.route, claimed, cs)))
					continue
				}
				if len(mine) < len(hostsOrAny(c.route)) {
					partly[pk] = append(partly[pk], fmt.Sprintf("%s: %s", fe, takenBy(c.route, claimed, cs)))
				}
				port.Routes = append(port.Routes, L4Route{Route: c.route.RouteRef, Hostnames: mine, Backends: servedBackends(c.route)})
			}
			bound[c.ri] = len(port.Routes) - 1
			won[pk] = append(won[pk], fe)
		}
		if sl.udp {
			rt.UDP[fe] = port
		} else {
			rt.Ports[fe] = port
		}
	}
	for pk, whys := range lost {
		ps := &statuses[pk.route].Parents[pk.parent]
		slices.Sort(whys)
		if w := won[pk]; len(w) > 0 {
			slices.SortFunc(w, Frontend.Compare)
			ps.Accepted.Message = "bound to " + joinFrontends(w) + "; not to " + strings.Join(whys, "; ")
			continue
		}
		ps.Accepted = Condition{Reason: ReasonConflicted, Message: "not bound: " + strings.Join(whys, "; ") +
			" (the oldest route takes a frontend; TLSRoutes share one by hostname)"}
		ps.PartiallyInvalid = nil
	}
	for pk, notes := range partly {
		ps := &statuses[pk.route].Parents[pk.parent]
		if ps.Accepted.Status {
			slices.Sort(notes)
			ps.Accepted.Message += "; on " + strings.Join(notes, "; on ")
		}
	}
	return rt
}

// hostsOrAny are the SNI names TLSRoute r asks for: its hostnames (each once, in order), or
// AnySNI.
func hostsOrAny(r *Route) []string {
	if len(r.Hostnames) == 0 {
		return []string{AnySNI}
	}
	out := make([]string, 0, len(r.Hostnames))
	for _, h := range r.Hostnames {
		if !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

// takenBy says which of route r's hostnames older TLSRoutes among cs have:
// "hostname <h> is <route>'s".
func takenBy(r *Route, claimed map[string]int, cs []l4Candidate) string {
	var parts []string
	for _, h := range hostsOrAny(r) {
		ri, ok := claimed[h]
		if !ok {
			continue
		}
		i := slices.IndexFunc(cs, func(c l4Candidate) bool { return c.ri == ri })
		if cs[i].route == r {
			continue
		}
		what := "hostname " + h
		if h == AnySNI {
			what = "every hostname (it names none)"
		}
		parts = append(parts, fmt.Sprintf("%s is %s's", what, cs[i].route.RouteRef))
	}
	return strings.Join(parts, ", ")
}

// servedBackends are the backends of r's first served rule.
func servedBackends(r *Route) []BackendRef {
	for i := range r.Rules {
		if ok, _ := r.Rules[i].Served(); ok {
			return r.Rules[i].Backends
		}
	}
	return nil
}
