// Package v1alpha1 is aether's security API, security.aether.io/v1alpha1: the namespaced
// AuthorizationPolicy and PeerAuthentication (issue #32). PeerAuthentication has the shape of
// Istio's security.istio.io PeerAuthentication (its deviations are on the type). AuthorizationPolicy
// is modelled on GEP-3779 ("Identity Based Authz for east-west
// traffic", Gateway API v1.6.3 geps/gep-3779, status Implementable) so that a move to the
// standard API later is a rename. Its deviations from GEP-3779 are aether's extensions and are
// marked where they are declared: the DENY action, spec.dryRun, Namespace sources and the L7
// rule attributes (rules[].http); GEP-3779's enforcementLevel is left out (the node Envoy
// enforces both levels at one point, the inbound chains at :15008). docs/authorization.md is the
// operator's description.
//
// The package owns the Go types, their OpenAPI validation (kubebuilder markers) and their
// generated deepcopy (zz_generated.deepcopy.go, hack/update-codegen.sh); the CRD is generated
// from them into deploy/chart/aether/crds. It imports only k8s.io/apimachinery: the conversion to
// the mesh model and the selection of pods are package model's (model/authzresolve.go,
// model/peerauthn.go), the status is the registrar's (registrar/authzstatus).
//
// +kubebuilder:object:generate=true
// +groupName=security.aether.io
package v1alpha1
