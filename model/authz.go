package model

import (
	"fmt"
	"slices"
	"strings"
)

// This file is the authorization model (issue #32): aether's AuthorizationPolicy
// (security.aether.io/v1alpha1, modelled on GEP-3779, "Identity Based Authz for East-West
// Traffic"), normalized for the node Envoy, which enforces it on the inbound mTLS filter chains at
// :15008 of the pods it selects. The conversion from the Kubernetes object and the selection of
// pods live beside it (authzresolve.go); the Envoy RBAC translation lives in package xds.

// AuthzAction is what a matching rule of a policy does: ALLOW or DENY (DENY is aether's
// extension of GEP-3779, which starts with ALLOW only; DENY wins over ALLOW, as in Istio).
type AuthzAction string

const (
	AuthzAllow AuthzAction = "ALLOW"
	AuthzDeny  AuthzAction = "DENY"
)

// AuthzPolicy is one AuthorizationPolicy as the data plane applies it.
//
// Semantics (the same in every translation):
//   - a policy matches a connection or request when any of its Rules matches (no Rules: it
//     matches nothing);
//   - on a pod, the enforced DENY policies are checked first: a match is refused;
//   - then, when at least one enforced ALLOW policy selects the pod (on any of its ports), only
//     what one of the ALLOW policies' rules matches is let through; with none, everything meshed
//     may call (the mesh default);
//   - a DryRun policy never refuses: what it would have refused is counted and logged
//     (Envoy RBAC shadow_rules), computed as if the dry-run policies were enforced beside the
//     enforced ones;
//   - FailClosed marks a DENY policy that could not be converted (Invalid set): it refuses every
//     caller of its targets, so a broken DENY never opens them.
type AuthzPolicy struct {
	Namespace, Name string
	Action          AuthzAction
	DryRun          bool
	Rules           []AuthzRule
	// FailClosed: the policy is invalid and DENY: it matches every connection.
	FailClosed bool
}

// String is "AuthorizationPolicy <ns>/<name>".
func (p *AuthzPolicy) String() string { return "AuthorizationPolicy " + p.Namespace + "/" + p.Name }

// AuthzRule is one rule: it matches when every field that is set matches (logical AND).
type AuthzRule struct {
	// Sources: a caller matches when it matches any of them. AnySource (Sources omitted in the
	// object) matches every authenticated mesh caller; an empty Sources with AnySource false
	// matches no caller (GEP-3779: "If specified as an empty list, matches no sources").
	Sources   []AuthzSource
	AnySource bool
	// Ports are destination ports as the pod serves them (target, container ports: the SNI
	// "<port>" of the inbound chain), empty for every port.
	Ports []uint32
	// Methods (HTTP methods, exact, e.g. "GET") and Paths (Exact or PathPrefix PathMatch, the
	// Gateway API's path semantics) are L7 attributes, empty for any. They apply to HTTP ports;
	// on a TCP port a rule with L7 attributes cannot be checked: an ALLOW rule then matches
	// nothing there, a DENY rule matches without them (both fail closed, as Istio does).
	Methods []string
	Paths   []PathMatch
}

// HasL7 reports whether r has HTTP attributes (Methods or Paths).
func (r *AuthzRule) HasL7() bool { return len(r.Methods) > 0 || len(r.Paths) > 0 }

// AppliesToPort reports whether r covers destination port port (no Ports: every port).
func (r *AuthzRule) AppliesToPort(port uint32) bool {
	return len(r.Ports) == 0 || slices.Contains(r.Ports, port)
}

// AuthzSource is one kind of caller, exactly one field set. Callers are judged by the URI SAN of
// their client certificate only (the SPIFFE ID spiffe://<trustDomain>/ns/<ns>/sa/<sa> of
// DESIGN.md); no header is ever trusted.
type AuthzSource struct {
	// SPIFFE is an exact SPIFFE ID ("spiffe://td/ns/n/sa/s"), or a trust domain's every workload
	// written "spiffe://td/*".
	SPIFFE string
	// ServiceAccount is a service account of Namespace ("*" for every one of that namespace), in
	// the mesh's trust domain; with namespace sameness (KEP-1645) it matches that service
	// account's workloads in every cluster of the clusterset.
	ServiceAccount *AuthzServiceAccount
	// Namespace is every workload of a namespace (aether's extension of GEP-3779), in the mesh's
	// trust domain, in every cluster.
	Namespace string
}

// AuthzServiceAccount names a service account: Name "*" is every one of Namespace.
type AuthzServiceAccount struct {
	Namespace, Name string
}

// SPIFFEPattern returns what the caller's URI SAN must be for s to match, in trust domain td:
// exact is the whole ID, else prefix is a prefix it must start with.
func (s AuthzSource) SPIFFEPattern(td string) (exact, prefix string) {
	switch {
	case s.SPIFFE != "":
		if p, ok := strings.CutSuffix(s.SPIFFE, "/*"); ok {
			return "", p + "/"
		}
		return s.SPIFFE, ""
	case s.ServiceAccount != nil:
		if s.ServiceAccount.Name == "*" {
			return "", fmt.Sprintf("spiffe://%s/ns/%s/sa/", td, s.ServiceAccount.Namespace)
		}
		return SPIFFEID(td, s.ServiceAccount.Namespace, s.ServiceAccount.Name), ""
	default:
		return "", fmt.Sprintf("spiffe://%s/ns/%s/sa/", td, s.Namespace)
	}
}
