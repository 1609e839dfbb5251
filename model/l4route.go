package model

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// TCPRouteModel turns a TCPRoute into a Route (Kind KindTCPRoute): its mesh parentRefs
// (Service, ServiceImport), its Gateway parentRefs and its rule's backendRefs, as HTTPRouteModel
// does. A rule has no matches (Matches stays empty). Gateway API v1.6.3 allows one rule
// (TCPRouteSpec.rules MaxItems=1) and says nothing of how several would combine, so a rule after
// the first is not served: it is listed in its Unsupported, as Envoy Gateway and Istio serve one
// rule per L4 route.
func TCPRouteModel(r *gwv1.TCPRoute) Route {
	return l4Route(KindTCPRoute, r.ObjectMeta, r.Spec.CommonRouteSpec, nil, len(r.Spec.Rules), func(i int) (*gwv1.SectionName, []gwv1.BackendRef) {
		return r.Spec.Rules[i].Name, r.Spec.Rules[i].BackendRefs
	})
}

// TLSRouteModel turns a TLSRoute into a Route (Kind KindTLSRoute) as TCPRouteModel does, with
// its hostnames (the SNI names, lower case).
func TLSRouteModel(r *gwv1.TLSRoute) Route {
	return l4Route(KindTLSRoute, r.ObjectMeta, r.Spec.CommonRouteSpec, r.Spec.Hostnames, len(r.Spec.Rules), func(i int) (*gwv1.SectionName, []gwv1.BackendRef) {
		return r.Spec.Rules[i].Name, r.Spec.Rules[i].BackendRefs
	})
}

// UDPRouteModel turns a UDPRoute into a Route (Kind KindUDPRoute) as TCPRouteModel does.
func UDPRouteModel(r *gwv1.UDPRoute) Route {
	return l4Route(KindUDPRoute, r.ObjectMeta, r.Spec.CommonRouteSpec, nil, len(r.Spec.Rules), func(i int) (*gwv1.SectionName, []gwv1.BackendRef) {
		return r.Spec.Rules[i].Name, r.Spec.Rules[i].BackendRefs
	})
}

// l4Route builds the Route of an L4 route object with n rules, rule(i) giving rule i's name and
// backendRefs.
func l4Route(kind RouteKind, meta metav1.ObjectMeta, spec gwv1.CommonRouteSpec, hs []gwv1.Hostname, n int,
	rule func(i int) (*gwv1.SectionName, []gwv1.BackendRef)) Route {
	ns := meta.Namespace
	out := Route{
		RouteRef:   RouteRef{Kind: kind, Namespace: ns, Name: meta.Name},
		Generation: meta.Generation, Created: meta.CreationTimestamp.Time,
		Parents:        meshParents(ns, spec.ParentRefs),
		GatewayParents: gatewayParents(ns, spec.ParentRefs),
		Hostnames:      hostnames(hs),
	}
	for i := range n {
		name, brs := rule(i)
		mr := RouteRule{Name: sectionName(name)}
		for _, b := range brs {
			mr.Backends = append(mr.Backends, backendRef(ns, b))
		}
		if i > 0 {
			mr.Unsupported = append(mr.Unsupported, fmt.Sprintf("spec.rules[%d]: a %s has one rule (Gateway API v1.6.3, rules MaxItems=1); rules after the first are not served", i, kind))
		}
		out.Rules = append(out.Rules, mr)
	}
	return out
}

// isL4 reports whether kind is a TCPRoute, TLSRoute or UDPRoute.
func isL4(kind RouteKind) bool {
	return kind == KindTCPRoute || kind == KindTLSRoute || kind == KindUDPRoute
}

// l4BackendProtocol is the Invalid condition of backend b of an L4 route of kind whose Service
// port has protocol p, nil when the port can carry it: a UDPRoute sends datagrams to UDP ports
// only, a TCPRoute a byte stream to any port that is not UDP (an HTTP port takes a stream too),
// a TLSRoute a TLS stream to a port that is neither UDP nor HTTP.
func l4BackendProtocol(kind RouteKind, b *BackendRef, p Protocol) *Condition {
	if kind == KindTLSRoute && p.IsHTTP() {
		// The client's TLS goes through (in the mesh, and at a Passthrough listener), and the
		// backend pods' inbound listener would read it as HTTP on such a port (its inbound chain
		// is an HTTP connection manager).
		return &Condition{Reason: string(gwv1.RouteReasonUnsupportedProtocol),
			Message: fmt.Sprintf("backendRef %s %s port %d is %s: a TLSRoute passes TLS on to its backend, which must be a TCP port (appProtocol tcp, tls, ...)", b.Kind, b.Service, b.Port, p)}
	}
	if (kind == KindUDPRoute) == (p == ProtocolUDP) {
		return nil
	}
	want := "a TCP port (any protocol but UDP)"
	if kind == KindUDPRoute {
		want = "a UDP port"
	}
	return &Condition{Reason: string(gwv1.RouteReasonUnsupportedProtocol),
		Message: fmt.Sprintf("backendRef %s %s port %d is %s: a %s backend must be %s", b.Kind, b.Service, b.Port, p, kind, want)}
}
