package model

import (
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// GatewaySpecModel turns a Gateway into the GatewaySpec ResolveGateways reads, applying the
// API's defaults (allowedRoutes.namespaces.from Same, TLS mode Terminate, certificateRef group
// "" and kind Secret, namespaces the Gateway's).
func GatewaySpecModel(g *gwv1.Gateway) GatewaySpec {
	panic("not implemented yet")
}

// ReferenceGrantRefs lists the references a ReferenceGrant allows: one per (from, to) pair, into
// the grant's namespace.
func ReferenceGrantRefs(g *gwv1.ReferenceGrant) []NamespaceRef {
	panic("not implemented yet")
}

// ResolveGateways binds the routes of in to the listeners of the Gateways whose class is
// aether's (in.Classes[g.Class] == GatewayControllerName) as Gateway API v1.6.3 specifies, and
// returns the edge Gateways to serve (those Accepted, with their programmed listeners), each
// Gateway's status and each route's Gateway parent statuses (routes without a Gateway parentRef
// to one of aether's Gateways are not listed). It is pure and does not change in.
func ResolveGateways(in GatewayInputs) ([]*EdgeGateway, []GatewayStatus, []GatewayRouteStatus) {
	panic("not implemented yet")
}

// TCPRouteModel, TLSRouteModel and UDPRouteModel turn the L4 routes into Routes.
func TCPRouteModel(r *gwv1.TCPRoute) Route { panic("not implemented yet") }
func TLSRouteModel(r *gwv1.TLSRoute) Route { panic("not implemented yet") }
func UDPRouteModel(r *gwv1.UDPRoute) Route { panic("not implemented yet") }

// CheckCertificate checks a certificate Secret's type and data.
func CheckCertificate(secretType string, data map[string][]byte) CertificateState {
	panic("not implemented yet")
}
