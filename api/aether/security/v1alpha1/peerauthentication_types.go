package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PeerAuthentication says which inbound connections the pods of its namespace accept: mesh mTLS
// only (STRICT) or plaintext too (PERMISSIVE), for the whole pod or per port (issue #32 item 5).
// It has the shape of Istio's security.istio.io PeerAuthentication, so that an Istio user moves
// a policy over by changing its apiVersion, with these differences:
//   - mode DISABLE is refused (by the CRD and again by the conversion): aether has no
//     plaintext-only mode. An aether client always reaches a meshed pod over mTLS (:15008), so
//     DISABLE could only mean PERMISSIVE here; rather than run a pod in a mode other than the
//     one written, the object is refused with a message that says to write PERMISSIVE, a
//     one-word edit made once at migration;
//   - there is no mesh-wide policy in a root namespace: the mesh default is the agent's
//     --inbound-mode (the Helm value inboundMode), and a PeerAuthentication applies to its own
//     namespace only, wherever it is;
//   - portLevelMtls is allowed without a selector (Istio requires one): a namespace-wide policy
//     may set per-port modes for every pod of the namespace;
//   - selector is a metav1.LabelSelector (matchLabels as Istio's, matchExpressions too); an
//     empty selector ({}) is namespace-wide, as an absent one.
//
// Which policy decides for a pod (model.ResolveInbound): the oldest policy of its namespace whose
// selector matches it, else the oldest namespace-wide one, else the mesh default; a mode UNSET
// inherits the next level's. Ports an enforced AuthorizationPolicy covers are STRICT whatever
// the mode (authorization needs the caller's identity). Two namespace-wide policies of one
// namespace conflict: the older decides, the other reports Accepted False, reason Conflicted.
//
// An invalid policy never opens anything: its pods are STRICT on every port until it is fixed
// (when its selector is invalid, it selects no pod); see docs/authorization.md.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=aether,shortName=pa
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mtls.mode`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type PeerAuthentication struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what the policy asks for.
	// +optional
	Spec PeerAuthenticationSpec `json:"spec,omitempty"`

	// Status is what aether's registrar found (the only writer of it in its cluster).
	// +optional
	Status PeerAuthenticationStatus `json:"status,omitempty"`
}

// PeerAuthenticationList is a list of PeerAuthentications.
//
// +kubebuilder:object:root=true
type PeerAuthenticationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PeerAuthentication `json:"items"`
}

// MTLSMode is an inbound mTLS mode (Istio's PeerAuthentication.MutualTLS.Mode): UNSET inherits
// (a port: the policy's mode; a selecting policy: the namespace-wide policy's; a namespace-wide
// policy: the mesh default), STRICT accepts mesh mTLS only, PERMISSIVE plaintext too. DISABLE is
// listed so that the refusal says why (see PeerAuthentication).
//
// +kubebuilder:validation:Enum=UNSET;STRICT;PERMISSIVE;DISABLE
// +kubebuilder:validation:XValidation:rule="self != 'DISABLE'",message="mode DISABLE is not supported: aether has no plaintext-only mode; use PERMISSIVE to accept plaintext"
type MTLSMode string

const (
	MTLSUnset      MTLSMode = "UNSET"
	MTLSStrict     MTLSMode = "STRICT"
	MTLSPermissive MTLSMode = "PERMISSIVE"
	// MTLSDisable is Istio's plaintext-only mode; aether refuses it.
	MTLSDisable MTLSMode = "DISABLE"
)

// Ports of aether's own inside every pod's netns, which a policy may not name (capture's
// defaults: capture.DefaultInboundPort, DefaultCapturePort, DefaultDNSPort).
const (
	ReservedInboundPort = 15008
	ReservedCapturePort = 15001
	ReservedDNSPort     = 18054
)

// MaxPortLevelMTLS is the most entries portLevelMtls may hold (maxProperties in the CRD; the
// conversion checks it again).
const MaxPortLevelMTLS = 64

// PeerAuthenticationSpec is the policy's scope and modes (Istio's PeerAuthentication spec).
//
// +kubebuilder:validation:XValidation:rule="!has(self.portLevelMtls) || self.portLevelMtls.all(k, k.matches('^[1-9][0-9]{0,4}$') && int(k) <= 65535)",message="portLevelMtls keys are port numbers 1-65535 (the pod's container port, not a Service port)"
// +kubebuilder:validation:XValidation:rule="!has(self.portLevelMtls) || self.portLevelMtls.all(k, !(k in ['15001', '15008', '18054']))",message="portLevelMtls may not name 15001, 15008 or 18054: aether's capture, inbound mTLS and DNS ports"
type PeerAuthenticationSpec struct {
	// Selector selects the pods of the policy's namespace it applies to; absent or {}: every pod
	// of the namespace (a namespace-wide policy). A policy never applies to another namespace's
	// pods.
	//
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`

	// MTLS is the mode of the selected pods' ports; absent: UNSET.
	//
	// +optional
	MTLS *PeerAuthenticationMTLS `json:"mtls,omitempty"`

	// PortLevelMTLS sets the mode of single ports, keyed by port number written as a string
	// ("8080"; JSON object keys are strings, and Istio's YAML `8080:` arrives as one): the pod's
	// container port (a Service's targetPort, not its port). A port's UNSET is the policy's mode.
	//
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	PortLevelMTLS map[string]PeerAuthenticationMTLS `json:"portLevelMtls,omitempty"`
}

// PeerAuthenticationMTLS is a mode (Istio's PeerAuthentication.MutualTLS).
type PeerAuthenticationMTLS struct {
	// Mode is UNSET, STRICT or PERMISSIVE; default UNSET.
	//
	// +optional
	// +kubebuilder:default=UNSET
	Mode MTLSMode `json:"mode,omitempty"`
}

// ReasonConflicted is the Accepted False reason of a namespace-wide PeerAuthentication that an
// older namespace-wide one of the same namespace overrides (the message names it).
const ReasonConflicted = "Conflicted"

// PeerAuthenticationStatus is what the registrar found.
type PeerAuthenticationStatus struct {
	// Conditions: Accepted (True, reason Accepted; False, reason Invalid or Conflicted).
	//
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}
