package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AuthorizationPolicy says who may call the workloads it targets, in its own namespace
// (GEP-3779, "API Design"). Semantics, for every pod a policy selects:
//   - a policy matches a connection or request when any of its rules matches (no rules: it
//     matches nothing); a rule matches when each of its fields that is set matches;
//   - the DENY policies are checked first: a match is refused;
//   - then, once at least one ALLOW policy selects the pod, only what an ALLOW rule matches may
//     call it; with none, everything meshed may call it (the mesh default, GEP-3779 "Policy
//     Actions");
//   - a policy with dryRun true refuses nothing: what it would refuse is counted and logged.
//
// Callers are judged by the SPIFFE ID in their client certificate (the inbound mTLS at :15008),
// from this cluster or any other, never by a header.
//
// An invalid policy (status Accepted False, reason Invalid) applies nothing, except that an
// invalid DENY policy whose targets are valid refuses every caller of them (it fails closed,
// never open); see docs/authorization.md.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=aether
// +kubebuilder:printcolumn:name="Action",type=string,JSONPath=`.spec.action`
// +kubebuilder:printcolumn:name="Dry Run",type=boolean,JSONPath=`.spec.dryRun`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AuthorizationPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what the policy asks for.
	// +required
	Spec AuthorizationPolicySpec `json:"spec"`

	// Status is what aether's registrar found (the only writer of it in its cluster).
	// +optional
	Status AuthorizationPolicyStatus `json:"status,omitempty"`
}

// AuthorizationPolicyList is a list of AuthorizationPolicies.
//
// +kubebuilder:object:root=true
type AuthorizationPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AuthorizationPolicy `json:"items"`
}

// AuthorizationPolicyAction is what a matching rule does: ALLOW (GEP-3779) or DENY (aether's
// extension, GEP-3779 "Future Enhancements: DENY Policies"; DENY wins over ALLOW).
//
// +kubebuilder:validation:Enum=ALLOW;DENY
type AuthorizationPolicyAction string

const (
	ActionAllow AuthorizationPolicyAction = "ALLOW"
	ActionDeny  AuthorizationPolicyAction = "DENY"
)

// Limits of the API (maxItems in the CRD; the conversion checks them again).
const (
	MaxTargetRefs = 16
	MaxRules      = 64
	MaxSources    = 64
	MaxPorts      = 32
	MaxPaths      = 32
	// MaxSPIFFEID is the longest SPIFFE ID in bytes (SPIFFE-ID spec section 2.3: 2048 bytes).
	MaxSPIFFEID = 2048
	// MaxPath is the longest HTTP path value in bytes (Gateway API HTTPPathMatch's maxLength).
	MaxPath = 1024
)

// AuthorizationPolicySpec is the policy's target, action and rules (GEP-3779
// AuthorizationPolicySpec, without enforcementLevel; with dryRun).
type AuthorizationPolicySpec struct {
	// TargetRefs are the workloads of the policy's namespace the policy applies to: a Service by
	// name (the pods it selects) or Pods by label selector (an empty selector: every pod of the
	// namespace). A policy never applies to another namespace's pods.
	//
	// +required
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	TargetRefs []PolicyTargetReferenceWithLabelSelectors `json:"targetRefs"`

	// Action is ALLOW or DENY.
	//
	// +required
	Action AuthorizationPolicyAction `json:"action"`

	// DryRun (aether's extension) makes the policy refuse nothing: the node Envoy counts and logs
	// each connection or request it would have refused (Envoy RBAC shadow rules). Default false.
	//
	// +optional
	DryRun bool `json:"dryRun,omitempty"`

	// Rules: the action applies when a connection or request matches any of them. None: the
	// policy matches nothing (an ALLOW policy without rules lets no caller in).
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Rules []AuthorizationRule `json:"rules,omitempty"`
}

// PolicyTargetReferenceWithLabelSelectors names the workloads a policy applies to, in the
// policy's namespace: kind Service (group "") with a name, or kind Pod (group "") with a label
// selector. It is GEP-3779's PolicyTargetReferenceWithLabelSelectors ("Label Selectors:
// Experimental Pattern", not in Gateway API v1.6.3's Go API) plus a name for Service targets.
//
// +kubebuilder:validation:XValidation:rule="self.kind != 'Pod' || (has(self.selector) && !has(self.name))",message="a Pod target takes a selector and no name"
// +kubebuilder:validation:XValidation:rule="self.kind != 'Service' || (has(self.name) && !has(self.selector))",message="a Service target takes a name and no selector"
type PolicyTargetReferenceWithLabelSelectors struct {
	// Group is the target's API group: "" (or "core"), the core group. Default "".
	//
	// +optional
	// +kubebuilder:default=""
	// +kubebuilder:validation:Enum="";core
	Group string `json:"group"`

	// Kind is Service or Pod.
	//
	// +required
	// +kubebuilder:validation:Enum=Service;Pod
	Kind string `json:"kind"`

	// Name is the Service's name (kind Service only).
	//
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name,omitempty"`

	// Selector selects the namespace's pods by label (kind Pod only); {} selects every pod of the
	// namespace (GEP-3779 "Targeting All Pods in a Namespace", option 3).
	//
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
}

// AuthorizationRule matches a connection or request when each of its fields that is set
// matches (GEP-3779 AuthorizationRule).
type AuthorizationRule struct {
	// Sources are the callers the rule matches: any one of them. Omitted: every authenticated
	// mesh caller. An empty list: no caller (GEP-3779: "If specified as an empty list, matches no
	// sources"). The field has no omitempty, so a Go client keeps the two apart.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Sources []AuthorizationSource `json:"sources"`

	// NetworkAttributes narrows the rule to destination ports (GEP-3779).
	//
	// +optional
	NetworkAttributes *AuthorizationNetworkAttributes `json:"networkAttributes,omitempty"`

	// HTTP (aether's extension, GEP-3779 "Future L7 Support") narrows the rule to HTTP requests
	// by method and path. On a TCP port such a rule cannot be checked: an ALLOW rule then matches
	// nothing there, a DENY rule matches without it (both fail closed).
	//
	// +optional
	HTTP *AuthorizationHTTPAttributes `json:"http,omitempty"`
}

// AuthorizationSourceType says which field of an AuthorizationSource is set.
//
// +kubebuilder:validation:Enum=ServiceAccount;SPIFFE;Namespace
type AuthorizationSourceType string

const (
	SourceServiceAccount AuthorizationSourceType = "ServiceAccount"
	SourceSPIFFE         AuthorizationSourceType = "SPIFFE"
	// SourceNamespace is aether's extension: every workload of a namespace.
	SourceNamespace AuthorizationSourceType = "Namespace"
)

// AuthorizationSource is one kind of caller (GEP-3779 Source): exactly the field Type names is
// set.
//
// +kubebuilder:validation:XValidation:rule="(self.type == 'ServiceAccount') == has(self.serviceAccount) && (self.type == 'SPIFFE') == has(self.spiffe) && (self.type == 'Namespace') == has(self.__namespace__)",message="exactly the field that type names must be set"
type AuthorizationSource struct {
	// Type is ServiceAccount, SPIFFE or Namespace.
	//
	// +required
	// +unionDiscriminator
	Type AuthorizationSourceType `json:"type"`

	// ServiceAccount is a service account in the mesh's trust domain; with namespace sameness it
	// matches that service account's workloads in every cluster of the clusterset.
	//
	// +optional
	ServiceAccount *AuthorizationSourceServiceAccount `json:"serviceAccount,omitempty"`

	// SPIFFE is a SPIFFE ID, "spiffe://<trust domain>/<path>", matched exactly, or
	// "spiffe://<trust domain>/*" for every workload of a trust domain (another mesh's too).
	//
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.startsWith('spiffe://')",message="a SPIFFE ID starts with spiffe://"
	SPIFFE string `json:"spiffe,omitempty"`

	// Namespace (aether's extension) is every workload of this namespace, in the mesh's trust
	// domain, in every cluster.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`
}

// AuthorizationSourceServiceAccount names a service account (GEP-3779).
type AuthorizationSourceServiceAccount struct {
	// Namespace is the service account's namespace; default: the policy's.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`

	// Name is the service account's name, or "*" for every service account of Namespace.
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// AuthorizationNetworkAttributes are L4 attributes of the destination (GEP-3779).
type AuthorizationNetworkAttributes struct {
	// Ports are destination ports as the pod serves them (container ports, a Service's
	// targetPort, not its port); omitted or empty: every port.
	//
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:items:Maximum=65535
	Ports []int32 `json:"ports,omitempty"`
}

// AuthorizationHTTPAttributes are L7 attributes of an HTTP request (aether's extension); each
// list omitted or empty matches any.
type AuthorizationHTTPAttributes struct {
	// Methods are HTTP methods, matched exactly.
	//
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=9
	Methods []HTTPMethod `json:"methods,omitempty"`

	// Paths match the request path (Gateway API HTTPPathMatch semantics): any one of them.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Paths []HTTPPathMatch `json:"paths,omitempty"`
}

// HTTPMethod is an HTTP method (RFC 9110 section 9; Gateway API HTTPMethod).
//
// +kubebuilder:validation:Enum=GET;HEAD;POST;PUT;DELETE;CONNECT;OPTIONS;TRACE;PATCH
type HTTPMethod string

// PathMatchType is Exact or PathPrefix (Gateway API PathMatchType, without RegularExpression).
//
// +kubebuilder:validation:Enum=Exact;PathPrefix
type PathMatchType string

const (
	PathMatchExact      PathMatchType = "Exact"
	PathMatchPathPrefix PathMatchType = "PathPrefix"
)

// HTTPPathMatch matches the request path: Exact, or PathPrefix by path elements ("/api"
// matches "/api" and "/api/x", not "/apix"; a trailing "/" is ignored), as Gateway API's
// HTTPPathMatch.
type HTTPPathMatch struct {
	// Type is Exact or PathPrefix; default PathPrefix.
	//
	// +optional
	// +kubebuilder:default=PathPrefix
	Type PathMatchType `json:"type,omitempty"`

	// Value is an absolute path: it starts with "/" and holds no "?", "#", "//", "/./" or "/../".
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/')",message="a path starts with /"
	Value string `json:"value"`
}

// Condition type and reasons of AuthorizationPolicy status (the Gateway API's policy condition
// Accepted and its reasons Accepted, Invalid and TargetNotFound, GEP-713).
const (
	ConditionAccepted = "Accepted"
	// ReasonAccepted: the policy is valid and at least one target exists.
	ReasonAccepted = "Accepted"
	// ReasonInvalid: a field is invalid; the message names each field and value. Nothing of the
	// policy applies, except an invalid DENY policy, which refuses every caller of its targets.
	ReasonInvalid = "Invalid"
	// ReasonTargetNotFound: no Service a targetRef names exists in the policy's namespace.
	ReasonTargetNotFound = "TargetNotFound"
)

// AuthorizationPolicyStatus is what the registrar found.
//
// It is kept stable on purpose: it changes when the policy or the existence of a targeted
// Service changes, never with pod churn. Targets lists the targetRefs the policy applies to
// (those that exist, or, for Pod selectors, are valid), not the pods they select or how many:
// pod selection happens on every node for its own pods, and a count that moved with every scale
// event would make the registrar write status at the pace of rollouts.
type AuthorizationPolicyStatus struct {
	// Conditions: Accepted (True, reason Accepted; False, reason Invalid or TargetNotFound).
	//
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Targets are the targetRefs the policy applies to, in spec order: each Service that exists
	// in the namespace, and each Pod selector. Empty when nothing of the policy applies (an
	// invalid ALLOW policy); an invalid DENY policy lists the targets it refuses every caller of.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Targets []PolicyTargetReferenceWithLabelSelectors `json:"targets,omitempty"`
}
