package model

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// gatewayState is one of aether's Gateways while ResolveGateways works on it.
type gatewayState struct {
	spec      *GatewaySpec
	listeners []*listenerState
	status    GatewayStatus
	accepted  bool
}

// listenerState is one listener of a gatewayState.
type listenerState struct {
	spec  *ListenerSpec
	field string // "spec.listeners[i]"
	// proto is the protocol when aether serves it, "" otherwise.
	proto ListenerProtocol
	// mode is the TLS mode of an HTTPS or TLS listener whose tls block is valid, "" otherwise.
	mode TLSMode
	// hostname is the listener's hostname where the protocol has one (HTTP, HTTPS, TLS), else "".
	hostname string
	// kinds are the route kinds it takes (status.supportedKinds).
	kinds []RouteGroupKind
	// selector is the namespace selector of allowedRoutes From Selector (nil when invalid).
	selector labels.Selector
	// refusal is the Accepted=False condition, nil when the listener is accepted.
	refusal *Condition
	// conflict is the Conflicted=True condition, nil when the listener is distinct.
	conflict *Condition
	// servable is true when the listener is accepted and, for Terminate, has a certificate.
	servable bool
	certs    []Certificate
	status   ListenerStatus
	// bound are the routes bound to the listener (Accepted), in precedence order once
	// bindRoutes is done.
	bound []*binding
}

// ResolveGateways binds the routes of in to the listeners of the Gateways whose class is
// aether's (in.Classes[g.Class] == GatewayControllerName) as Gateway API v1.6.3 specifies, and
// returns the edge Gateways to serve (those Accepted, with their programmed listeners), each
// Gateway's status and each route's Gateway parent statuses (routes without a Gateway parentRef
// to one of aether's Gateways are not listed), all in the order of in. It is pure and does not
// change in.
//
// Gateways: a Gateway with Unsupported fields is Accepted=False (UnsupportedAddress for
// spec.addresses, InvalidParameters for infrastructure.parametersRef, else Invalid), as is one
// none of whose listeners is accepted (ListenersNotValid); with some listeners not programmed it
// is Accepted=True, ListenersNotValid. Programmed is True when it is accepted and a listener is
// programmed (the edge Deployment's readiness is the caller's to add).
//
// Listeners (GatewaySpec.listeners, ListenerConditionType):
//   - Accepted=False: a protocol other than HTTP, HTTPS, TLS, TCP and UDP (UnsupportedProtocol);
//     a TCP-based listener on one of EdgeReservedPorts (PortUnavailable);
//     a tls block where the protocol forbids it, none where it needs one, HTTPS with mode
//     Passthrough, or listener Unsupported (UnsupportedValue); a conflict (its reason);
//   - Conflicted ("Compatible Listeners"): on one port, TCP-based listeners of more than one family
//     (HTTP; HTTPS and TLS, told apart by SNI; TCP, which takes a port alone), or more than one UDP
//     listener, conflict with ProtocolConflict; HTTP listeners, or HTTPS and TLS listeners, with
//     the same hostname conflict with HostnameConflict. Every listener of a conflict is refused
//     (none wins). A UDP listener may share a port number with TCP-based ones;
//   - ResolvedRefs=False: a certificateRef that is not a Secret (InvalidCertificateRef), in another
//     namespace without a ReferenceGrant from the Gateway, or at all without
//     GatewayInputs.CrossNamespaceCertificates (RefNotPermitted), missing or with a
//     CertificateState.Problem (InvalidCertificateRef); an allowedRoutes kind the protocol does
//     not take (InvalidRouteKinds; supportedKinds lists the others). Usable certificates are
//     served;
//   - Programmed: accepted, of an accepted Gateway, and, for Terminate, with a usable certificate;
//   - OverlappingTLSConfig (OverlappingHostnames): Terminate listeners of one port whose hostnames
//     overlap;
//   - AttachedRoutes: the routes Accepted on the listener, whatever the listener's own conditions
//     (and a route's Accepted does not depend on them, nor on the Gateway's: its message names
//     the listeners that are not programmed).
//
// Kinds by protocol: HTTP and HTTPS take HTTPRoute and GRPCRoute; TLS Passthrough takes TLSRoute;
// TLS Terminate takes TLSRoute and TCPRoute (its decrypted stream); TCP takes TCPRoute; UDP takes
// UDPRoute.
//
// Routes, per Gateway parentRef (its sectionName and port select listeners; none selected:
// NoMatchingParent): a selected listener takes the route when its kinds include the route's and
// allowedRoutes.namespaces admits the route's namespace (Same, All, or Selector against
// in.NamespaceLabels), else NotAllowedByListeners; and when a route hostname intersects the
// listener's (precise names, "*." wildcards of one or more labels, none for any host), else
// NoMatchingListenerHostname. Rules are dropped as ResolveRoutes drops them (PartiallyInvalid;
// Accepted=False UnsupportedValue or IncompatibleFilters when none is left). Of an HTTPRoute and a
// GRPCRoute on one listener whose intersected hostnames overlap, the oldest (then by
// "<namespace>/<name>") is bound and the other not (GRPCRouteSpec.hostnames, GEP-1016): a parent
// that lost every listener so is Accepted=False, Conflicted. Backends are checked as
// ResolveRoutes checks them (a mesh Service port of the route's protocol: BackendNotFound,
// InvalidKind, UnsupportedProtocol; an L4 route takes any TCP port, a UDPRoute UDP ports), and a
// backendRef or mirror into another namespace needs a ReferenceGrant from the route
// (RefNotPermitted); an invalid backend keeps its weight, answered with an error.
//
// EdgeGateway: the programmed listeners per port, most specific hostname first. An HTTP(S)
// listener has an EdgeHost per intersected hostname of its routes, most specific first, whose
// entries are the routes with that hostname in HTTPRouteRule.matches precedence (ties to the
// oldest route, then "<namespace>/<name>"), followed by the routes whose hostname is a wildcard
// covering it, least specific last (HTTPRouteSpec.hostnames: precedence goes to the route with
// the most specific matching hostname, then to match precedence). Listener isolation: a hostname
// that a more specific programmed listener of the port covers is left out of a listener's Hosts
// (and of its TLS routes' Hostnames), since such requests belong to that listener. An L4 listener
// lists its routes oldest first; on a TLS listener each intersected SNI name goes to the first
// TLSRoute having it and a TLSRoute left with none is not listed, while a TCPRoute (TLS
// Terminate) has no Hostnames: it takes what no TLSRoute names; a TCP or UDP listener serves its
// first route only (as Gateway API conformance asks: every route Accepted, the oldest served).
func ResolveGateways(in GatewayInputs) ([]*EdgeGateway, []GatewayStatus, []GatewayRouteStatus) {
	var gws []*gatewayState
	byKey := map[GatewayKey]*gatewayState{}
	for i := range in.Gateways {
		g := &in.Gateways[i]
		if ctrl, ok := in.Classes[g.Class]; !ok || ctrl != GatewayControllerName || byKey[g.Key] != nil {
			continue
		}
		gs := resolveGateway(in, g)
		gws = append(gws, gs)
		byKey[g.Key] = gs
	}
	routeStatuses := bindRoutes(in, byKey)
	var edges []*EdgeGateway
	var statuses []GatewayStatus
	for _, gs := range gws {
		for _, l := range gs.listeners {
			l.status.AttachedRoutes = int32(len(l.bound))
			gs.status.Listeners = append(gs.status.Listeners, l.status)
		}
		statuses = append(statuses, gs.status)
		if gs.accepted {
			edges = append(edges, edgeGateway(gs))
		}
	}
	return edges, statuses, routeStatuses
}

// resolveGateway checks Gateway g and its listeners and sets their conditions.
func resolveGateway(in GatewayInputs, g *GatewaySpec) *gatewayState {
	gs := &gatewayState{spec: g, status: GatewayStatus{Key: g.Key, Generation: g.Generation}}
	for i := range g.Listeners {
		gs.listeners = append(gs.listeners, checkListener(&g.Listeners[i], fmt.Sprintf("spec.listeners[%d]", i)))
	}
	markConflicts(gs.listeners)
	var accepted, unservable []string
	for _, l := range gs.listeners {
		refs := listenerRefs(in, g, l)
		l.servable = l.refusal == nil && (l.mode != TLSTerminate || len(l.certs) > 0)
		l.status.SupportedKinds = l.kinds
		l.status.ResolvedRefs = refs
		l.status.Conflicted = Condition{Reason: string(gwv1.ListenerReasonNoConflicts)}
		if l.conflict != nil {
			l.status.Conflicted = *l.conflict
		}
		l.status.Accepted = Condition{Status: true, Reason: string(gwv1.ListenerReasonAccepted)}
		if l.refusal != nil {
			l.status.Accepted = *l.refusal
		} else {
			accepted = append(accepted, l.spec.Name)
		}
		if !l.servable {
			unservable = append(unservable, l.spec.Name)
		}
	}
	markOverlappingTLS(gs.listeners)
	switch {
	case len(g.Unsupported) > 0:
		gs.status.Accepted = Condition{Reason: gatewayRefusal(g.Unsupported), Message: "not supported: " + strings.Join(g.Unsupported, "; ")}
	case len(accepted) == 0:
		gs.status.Accepted = Condition{Reason: string(gwv1.GatewayReasonListenersNotValid), Message: "no listener is accepted (see the listeners' conditions)"}
	case len(unservable) > 0:
		gs.accepted = true
		gs.status.Accepted = Condition{Status: true, Reason: string(gwv1.GatewayReasonListenersNotValid),
			Message: listenerNames(unservable) + " cannot be served (see the listeners' conditions); the others are"}
	default:
		gs.accepted = true
		gs.status.Accepted = Condition{Status: true, Reason: string(gwv1.GatewayReasonAccepted)}
	}
	if held := infrastructureHeldBack(g, in.InfrastructureKeys); gs.accepted && held != "" {
		gs.status.Accepted.Message = strings.TrimPrefix(gs.status.Accepted.Message+"; "+held, "; ")
	}
	var programmed []string
	for _, l := range gs.listeners {
		switch {
		case !gs.accepted:
			l.status.Programmed = Condition{Reason: string(gwv1.ListenerReasonInvalid), Message: "the Gateway is not accepted"}
		case l.refusal != nil:
			l.status.Programmed = Condition{Reason: string(gwv1.ListenerReasonInvalid), Message: "the listener is not accepted: " + l.refusal.Message}
		case !l.servable:
			l.status.Programmed = Condition{Reason: string(gwv1.ListenerReasonInvalid), Message: "no usable certificate: " + l.status.ResolvedRefs.Message}
		default:
			l.status.Programmed = Condition{Status: true, Reason: string(gwv1.ListenerReasonProgrammed)}
			programmed = append(programmed, l.spec.Name)
		}
	}
	gs.status.Programmed = Condition{Reason: string(gwv1.GatewayReasonInvalid), Message: "no listener is programmed"}
	if len(programmed) > 0 {
		gs.status.Programmed = Condition{Status: true, Reason: string(gwv1.GatewayReasonProgrammed), Message: "programmed: " + listenerNames(programmed)}
	}
	return gs
}

// gatewayRefusal is the Accepted=False reason of a Gateway with Unsupported entries: the first
// address entry's UnsupportedAddress, then InvalidParameters for parametersRef, else Invalid.
func gatewayRefusal(unsupported []string) string {
	reason := gwv1.GatewayReasonInvalid
	for _, u := range unsupported {
		switch {
		case strings.HasPrefix(u, fieldAddresses):
			return string(gwv1.GatewayReasonUnsupportedAddress)
		case strings.HasPrefix(u, fieldParametersRef):
			reason = gwv1.GatewayReasonInvalidParameters
		}
	}
	return string(reason)
}

// checkListener checks listener spec (field f) alone: its protocol, tls block, Unsupported
// fields, namespace selector and kinds.
func checkListener(spec *ListenerSpec, f string) *listenerState {
	l := &listenerState{spec: spec, field: f, status: ListenerStatus{Name: spec.Name}}
	refuse := func(reason gwv1.ListenerConditionReason, msg string) {
		if l.refusal == nil {
			l.refusal = &Condition{Reason: string(reason), Message: msg}
		}
	}
	switch p := ListenerProtocol(spec.Protocol); p {
	case ListenerHTTP, ListenerHTTPS, ListenerTLS:
		l.proto, l.hostname = p, spec.Hostname
	case ListenerTCP, ListenerUDP:
		l.proto = p // the hostname is ignored (Listener.hostname)
	default:
		refuse(gwv1.ListenerReasonUnsupportedProtocol, fmt.Sprintf("%s.protocol: value %q: aether serves HTTP, HTTPS, TLS, TCP and UDP listeners", f, spec.Protocol))
	}
	switch t := spec.TLS; {
	case l.proto == "":
	case l.proto != ListenerHTTPS && l.proto != ListenerTLS:
		if t != nil {
			refuse(gwv1.ListenerReasonUnsupportedValue, fmt.Sprintf("%s.tls: set: protocol %s takes no tls", f, l.proto))
		}
	case t == nil:
		refuse(gwv1.ListenerReasonUnsupportedValue, fmt.Sprintf("%s.tls: not set: protocol %s needs one", f, l.proto))
	case l.proto == ListenerHTTPS && t.Mode != TLSTerminate:
		refuse(gwv1.ListenerReasonUnsupportedValue, fmt.Sprintf("%s.tls.mode: value %q: protocol HTTPS takes Terminate only (TLS passthrough is protocol TLS)", f, t.Mode))
	case t.Mode != TLSTerminate && t.Mode != TLSPassthrough:
		refuse(gwv1.ListenerReasonUnsupportedValue, fmt.Sprintf("%s.tls.mode: value %q: want Terminate or Passthrough", f, t.Mode))
	default:
		l.mode = t.Mode
	}
	if len(spec.Unsupported) > 0 {
		refuse(gwv1.ListenerReasonUnsupportedValue, "not supported: "+strings.Join(spec.Unsupported, "; "))
	}
	if l.proto != ListenerUDP && slices.Contains(EdgeReservedPorts, spec.Port) {
		refuse(gwv1.ListenerReasonPortUnavailable, fmt.Sprintf("%s.port: value %d: the edge pod uses TCP ports %v itself (its xDS and metrics)", f, spec.Port, EdgeReservedPorts))
	}
	if ar := spec.AllowedRoutes; ar.From == string(gwv1.NamespacesFromSelector) {
		sel, err := labels.Parse(ar.Selector)
		if err != nil {
			refuse(gwv1.ListenerReasonUnsupportedValue, fmt.Sprintf("%s.allowedRoutes.namespaces.selector: value %q: %v", f, ar.Selector, err))
		} else {
			l.selector = sel
		}
	}
	l.kinds = supportedKinds(l.proto, l.mode, spec.AllowedRoutes.Kinds)
	return l
}

// listenerKinds are the route kinds a listener of protocol p (and TLS mode m) takes.
func listenerKinds(p ListenerProtocol, m TLSMode) []RouteKind {
	switch p {
	case ListenerHTTP, ListenerHTTPS:
		return []RouteKind{KindHTTPRoute, KindGRPCRoute}
	case ListenerTLS:
		if m == TLSTerminate {
			return []RouteKind{KindTLSRoute, KindTCPRoute}
		}
		return []RouteKind{KindTLSRoute}
	case ListenerTCP:
		return []RouteKind{KindTCPRoute}
	case ListenerUDP:
		return []RouteKind{KindUDPRoute}
	}
	return nil
}

// supportedKinds are the kinds of allowed (allowedRoutes.kinds, every kind the protocol takes
// when empty) that a listener of protocol p and TLS mode m takes, each once.
func supportedKinds(p ListenerProtocol, m TLSMode, allowed []RouteGroupKind) []RouteGroupKind {
	takes := listenerKinds(p, m)
	out := []RouteGroupKind{}
	if len(allowed) == 0 {
		for _, k := range takes {
			out = append(out, RouteGroupKind{Group: gwv1.GroupName, Kind: string(k)})
		}
		return out
	}
	for _, k := range allowed {
		if k.Group == gwv1.GroupName && slices.Contains(takes, RouteKind(k.Kind)) && !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// listenerRefs resolves the certificateRefs of a Terminate listener into l.certs and returns
// the ResolvedRefs condition, which also reports allowedRoutes kinds the listener does not take.
func listenerRefs(in GatewayInputs, g *GatewaySpec, l *listenerState) Condition {
	var reason string
	var msgs []string
	bad := func(r gwv1.ListenerConditionReason, msg string) {
		if reason == "" {
			reason = string(r)
		}
		msgs = append(msgs, msg)
	}
	if l.mode == TLSTerminate {
		refs := l.spec.TLS.CertificateRefs
		if len(refs) == 0 {
			bad(gwv1.ListenerReasonInvalidCertificateRef, l.field+".tls.certificateRefs: none: mode Terminate needs a certificate")
		}
		for j, c := range refs {
			f := fmt.Sprintf("%s.tls.certificateRefs[%d]", l.field, j)
			want := NamespaceRef{FromGroup: gwv1.GroupName, FromKind: "Gateway", FromNamespace: g.Key.Namespace,
				ToGroup: groupCore, ToKind: "Secret", ToNamespace: c.Ref.Namespace, ToName: c.Ref.Name}
			st, found := in.Certificates[c.Ref]
			switch {
			case c.Group != groupCore || c.Kind != "Secret":
				bad(gwv1.ListenerReasonInvalidCertificateRef, fmt.Sprintf("%s: %s %q (group %q): want a Secret (group \"\")", f, c.Kind, c.Ref.Name, c.Group))
			case c.Ref.Namespace != g.Key.Namespace && !in.CrossNamespaceCertificates:
				bad(gwv1.ListenerReasonRefNotPermitted, fmt.Sprintf("%s: Secret %s: another namespace: cross-namespace certificates are off in this mesh (the edge runs in the Gateway's namespace, whose pods could read the key; --edge-cross-namespace-certificates)", f, c.Ref))
			case c.Ref.Namespace != g.Key.Namespace && !granted(in.Grants, want):
				bad(gwv1.ListenerReasonRefNotPermitted, fmt.Sprintf("%s: Secret %s: another namespace: a ReferenceGrant in %s must allow Gateways of %s", f, c.Ref, c.Ref.Namespace, g.Key.Namespace))
			case !found:
				bad(gwv1.ListenerReasonInvalidCertificateRef, fmt.Sprintf("%s: Secret %s not found", f, c.Ref))
			case st.Problem != "":
				bad(gwv1.ListenerReasonInvalidCertificateRef, fmt.Sprintf("%s: Secret %s: %s", f, c.Ref, st.Problem))
			default:
				cert := st.Certificate
				cert.Ref = c.Ref
				l.certs = append(l.certs, cert)
			}
		}
	}
	for _, k := range l.spec.AllowedRoutes.Kinds {
		if !slices.Contains(l.kinds, k) {
			bad(gwv1.ListenerReasonInvalidRouteKinds, fmt.Sprintf("%s.allowedRoutes.kinds: %s (group %q): not a kind a %s listener takes (%s)",
				l.field, k.Kind, k.Group, cmp.Or(string(l.proto), l.spec.Protocol), joinKinds(listenerKinds(l.proto, l.mode))))
		}
	}
	if reason == "" {
		return Condition{Status: true, Reason: string(gwv1.ListenerReasonResolvedRefs)}
	}
	return Condition{Reason: reason, Message: strings.Join(msgs, "; ")}
}

// listenerNames is "listener a" or "listeners a, b".
func listenerNames(names []string) string {
	if len(names) == 1 {
		return "listener " + names[0]
	}
	return "listeners " + strings.Join(names, ", ")
}

func joinKinds(ks []RouteKind) string {
	if len(ks) == 0 {
		return "none"
	}
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// family is the port-sharing family of a TCP-based protocol: HTTP; HTTPS and TLS (SNI); TCP.
func family(p ListenerProtocol) ListenerProtocol {
	if p == ListenerHTTPS {
		return ListenerTLS
	}
	return p
}

// markConflicts refuses the listeners that are not distinct from another on their port
// (GatewaySpec.listeners, "Distinct Listeners" and "Compatible Listeners"); listeners already
// refused for themselves take no part.
func markConflicts(ls []*listenerState) {
	byPort := map[uint32][]*listenerState{}
	var ports []uint32
	for _, l := range ls {
		if l.refusal != nil {
			continue
		}
		if byPort[l.spec.Port] == nil {
			ports = append(ports, l.spec.Port)
		}
		byPort[l.spec.Port] = append(byPort[l.spec.Port], l)
	}
	for _, port := range ports {
		var stream, udp []*listenerState
		families := map[ListenerProtocol]bool{}
		for _, l := range byPort[port] {
			if l.proto == ListenerUDP {
				udp = append(udp, l)
				continue
			}
			stream = append(stream, l)
			families[family(l.proto)] = true
		}
		switch {
		case len(families) > 1:
			conflict(stream, gwv1.ListenerReasonProtocolConflict, fmt.Sprintf(
				"port %d is shared by %s: one port serves HTTP, or HTTPS and TLS (told apart by SNI), or one TCP listener", port, describe(stream)))
		case families[ListenerTCP] && len(stream) > 1:
			conflict(stream, gwv1.ListenerReasonProtocolConflict, fmt.Sprintf("port %d is shared by %s: a TCP listener takes its port alone", port, describe(stream)))
		default:
			byHost := map[string][]*listenerState{}
			for _, l := range stream {
				byHost[l.hostname] = append(byHost[l.hostname], l)
			}
			for _, l := range stream {
				if same := byHost[l.hostname]; len(same) > 1 {
					conflict([]*listenerState{l}, gwv1.ListenerReasonHostnameConflict, fmt.Sprintf(
						"port %d is shared by %s with the same hostname %q: a request cannot tell them apart", port, describe(same), l.hostname))
				}
			}
		}
		if len(udp) > 1 {
			conflict(udp, gwv1.ListenerReasonProtocolConflict, fmt.Sprintf("port %d is shared by %s: a UDP listener takes its port alone", port, describe(udp)))
		}
	}
}

// conflict marks ls Conflicted and not Accepted, with reason and msg.
func conflict(ls []*listenerState, reason gwv1.ListenerConditionReason, msg string) {
	for _, l := range ls {
		l.conflict = &Condition{Status: true, Reason: string(reason), Message: msg}
		l.refusal = &Condition{Reason: string(reason), Message: msg}
	}
}

// describe lists listeners as "listeners a (HTTP), b (TCP)".
func describe(ls []*listenerState) string {
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = fmt.Sprintf("%s (%s)", l.spec.Name, l.proto)
	}
	return "listeners " + strings.Join(s, ", ")
}

// markOverlappingTLS sets OverlappingTLSConfig on accepted Terminate listeners whose hostname
// overlaps another's on the same port (ListenerConditionOverlappingTLSConfig: overlapping
// hostnames MUST be detected).
func markOverlappingTLS(ls []*listenerState) {
	for _, l := range ls {
		if l.refusal != nil || l.mode != TLSTerminate {
			continue
		}
		var with []string
		for _, o := range ls {
			if o != l && o.refusal == nil && o.mode == TLSTerminate && o.spec.Port == l.spec.Port && overlapHostnames(l.hostname, o.hostname) {
				with = append(with, fmt.Sprintf("%s (%q)", o.spec.Name, o.hostname))
			}
		}
		if len(with) > 0 {
			l.status.OverlappingTLSConfig = &Condition{Status: true, Reason: string(gwv1.ListenerReasonOverlappingHostnames),
				Message: fmt.Sprintf("hostname %q overlaps the hostnames of listeners %s on port %d: a client may reuse one's connection for the other's hosts", l.hostname, strings.Join(with, ", "), l.spec.Port)}
		}
	}
}

// infrastructureHeldBack says which of g's spec.infrastructure labels and annotations its edge
// objects do not get, not being in allowed (InfrastructureKeyAllowed; reserved keys are
// Unsupported instead): "" when none.
func infrastructureHeldBack(g *GatewaySpec, allowed []string) string {
	var parts []string
	for _, kind := range []struct {
		field string
		keys  []string
	}{{fieldInfrastructureLabels, g.InfrastructureLabels}, {fieldInfrastructureAnnotations, g.InfrastructureAnnotations}} {
		var held []string
		for _, k := range kind.keys {
			if !ReservedInfrastructureKey(k) && !InfrastructureKeyAllowed(allowed, k) {
				held = append(held, fmt.Sprintf("%q", k))
			}
		}
		if len(held) > 0 {
			parts = append(parts, kind.field+" "+strings.Join(held, ", "))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "not put on the edge objects (not in the registrar's --gateway-infrastructure-keys): " + strings.Join(parts, "; ")
}
