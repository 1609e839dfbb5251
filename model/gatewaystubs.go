package model

import (
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Stand-ins for what branch h-gwmodel implements (the registrar's gateway controller, branch
// h-gwctl, codes against them). When h-gwmodel is merged, delete this file: the compiler then
// names any signature that differs.

// CheckCertificate says whether a Secret of type secretType with data can serve as a listener's
// certificate (tls.crt and tls.key that parse and match), as a CertificateState.
func CheckCertificate(secretType string, data map[string][]byte) CertificateState {
	panic("not implemented yet")
}

// TCPRouteModel turns a TCPRoute into a Route (its Gateway parentRefs in GatewayParents, its
// rule's backendRefs in Rules[0].Backends).
func TCPRouteModel(r *gwv1.TCPRoute) Route { panic("not implemented yet") }

// TLSRouteModel turns a TLSRoute into a Route (hostnames in Hostnames).
func TLSRouteModel(r *gwv1.TLSRoute) Route { panic("not implemented yet") }

// UDPRouteModel turns a UDPRoute into a Route.
func UDPRouteModel(r *gwv1.UDPRoute) Route { panic("not implemented yet") }
