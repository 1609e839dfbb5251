package model

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	secv1alpha1 "github.com/aethermesh/aether/api/aether/security/v1alpha1"
)

// This file turns PeerAuthentication objects (api/aether/security/v1alpha1) into the model's
// PeerAuthn (mtls.go): the conversion with its refusals, and the conflicts the registrar's
// status reports.

// portKey is a portLevelMtls key: a port number in decimal without leading zeros (the CRD's
// rule, checked again here).
var portKey = regexp.MustCompile(`^[1-9][0-9]{0,4}$`)

// ConvertPeerAuthn converts PeerAuthentication p into the PeerAuthn the model applies, checking
// every field again whatever the CRD's validation let through (an object stored before a CRD
// upgrade, or with validation off). A selector absent or empty ({}) is namespace-wide (Selector
// nil); a mode absent or UNSET is MTLSUnset; portLevelMtls keys become port numbers (a port's
// UNSET is left out: it is the policy's mode). Created is the object's creationTimestamp.
//
// It returns every refusal, sorted by field path (portLevelMtls keys in numeric order), each
// naming the field's path and value. With any refusal the PeerAuthn returned is what applies
// instead, and it never opens anything: Mode STRICT on every port (no port modes) for the pods
// its selector selects, or, when the selector itself is refused, a policy that selects no pod
// (labels.Nothing(): its pods keep the namespace's mode). A policy meant to make a namespace
// PERMISSIVE that fails thus leaves it STRICT, and one meant to make some pods STRICT in a
// permissive namespace that fails still makes them STRICT.
func ConvertPeerAuthn(p *secv1alpha1.PeerAuthentication) (PeerAuthn, []AuthzFieldError) {
	out := PeerAuthn{Namespace: p.Namespace, Name: p.Name, Created: p.CreationTimestamp.Time}
	var errs []AuthzFieldError
	fail := func(field, value, reason string) {
		errs = append(errs, AuthzFieldError{Field: field, Value: value, Reason: reason})
	}
	if s := p.Spec.Selector; s != nil && (len(s.MatchLabels) > 0 || len(s.MatchExpressions) > 0) {
		sel, err := metav1.LabelSelectorAsSelector(s)
		if err != nil {
			js, _ := json.Marshal(s) // FormatLabelSelector says only "<error>"
			fail("spec.selector", string(js), err.Error())
			sel = labels.Nothing()
		}
		out.Selector = sel
	}
	if p.Spec.MTLS != nil {
		m, reason := convertMTLSMode(p.Spec.MTLS.Mode)
		if reason != "" {
			fail("spec.mtls.mode", string(p.Spec.MTLS.Mode), reason)
		}
		out.Mode = m
	}
	if n := len(p.Spec.PortLevelMTLS); n > secv1alpha1.MaxPortLevelMTLS {
		fail("spec.portLevelMtls", strconv.Itoa(n), fmt.Sprintf("want at most %d ports", secv1alpha1.MaxPortLevelMTLS))
	}
	keys := slices.SortedFunc(maps.Keys(p.Spec.PortLevelMTLS), cmpPortKeys)
	for _, k := range keys {
		f := fmt.Sprintf("spec.portLevelMtls[%q]", k)
		port, reason := convertPortKey(k)
		if reason != "" {
			fail(f, k, reason)
			continue
		}
		mode := p.Spec.PortLevelMTLS[k].Mode
		m, reason := convertMTLSMode(mode)
		if reason != "" {
			fail(f+".mode", string(mode), reason)
			continue
		}
		if m == MTLSUnset {
			continue
		}
		if out.PortModes == nil {
			out.PortModes = map[uint32]MTLSMode{}
		}
		out.PortModes[port] = m
	}
	if len(errs) > 0 {
		out.Mode, out.PortModes = MTLSStrict, nil
	}
	return out, errs
}

// convertMTLSMode returns the model's mode of m, or why m is refused.
func convertMTLSMode(m secv1alpha1.MTLSMode) (MTLSMode, string) {
	switch m {
	case "", secv1alpha1.MTLSUnset:
		return MTLSUnset, ""
	case secv1alpha1.MTLSStrict:
		return MTLSStrict, ""
	case secv1alpha1.MTLSPermissive:
		return MTLSPermissive, ""
	case secv1alpha1.MTLSDisable:
		return MTLSUnset, "aether has no plaintext-only mode: use PERMISSIVE to accept plaintext"
	}
	return MTLSUnset, "want UNSET, STRICT or PERMISSIVE"
}

// convertPortKey returns the port a portLevelMtls key names, or why it is refused: not a port
// number 1-65535 written without leading zeros, or one of aether's own ports in the pod.
func convertPortKey(k string) (uint32, string) {
	if !portKey.MatchString(k) {
		return 0, "want a port number 1-65535 (the pod's container port)"
	}
	n, _ := strconv.Atoi(k) // at most 5 digits
	switch n {
	case secv1alpha1.ReservedInboundPort:
		return 0, "the inbound mTLS port is aether's (always mTLS)"
	case secv1alpha1.ReservedCapturePort:
		return 0, "the capture port is aether's"
	case secv1alpha1.ReservedDNSPort:
		return 0, "the DNS port is aether's"
	}
	if n > 65535 {
		return 0, "want a port number 1-65535 (the pod's container port)"
	}
	return uint32(n), ""
}

// cmpPortKeys orders portLevelMtls keys by length, then as strings: numeric order for port
// numbers without leading zeros.
func cmpPortKeys(a, b string) int {
	return cmp.Or(cmp.Compare(len(a), len(b)), cmp.Compare(a, b))
}

// ConvertPeerAuthns converts every policy (ConvertPeerAuthn), invalid ones included as what
// applies instead of them, in the order given: the model's Sources.PeerAuthns.
func ConvertPeerAuthns(ps []*secv1alpha1.PeerAuthentication) []PeerAuthn {
	if len(ps) == 0 {
		return nil
	}
	out := make([]PeerAuthn, len(ps))
	for i, p := range ps {
		out[i], _ = ConvertPeerAuthn(p)
	}
	return out
}

// PeerAuthnResolved is what ResolvePeerAuthns made of one PeerAuthentication: the inputs of its
// status.
type PeerAuthnResolved struct {
	Namespace, Name string
	// Generation is the object's metadata.generation the result is for.
	Generation int64
	// Applied is what the model applies (ConvertPeerAuthn).
	Applied PeerAuthn
	// Errors are the refused fields (ConvertPeerAuthn); none for a valid policy.
	Errors []AuthzFieldError
	// OverriddenBy names ("<namespace>/<name>") the older namespace-wide policy of the same
	// namespace that decides instead of this one, a namespace-wide policy too; "" when none.
	OverriddenBy string
}

// Valid reports whether the policy converted without a refusal.
func (r *PeerAuthnResolved) Valid() bool { return len(r.Errors) == 0 }

// ResolvePeerAuthns converts each policy and finds the conflicts of one scope: two
// namespace-wide policies (no selector, or {}) of one namespace conflict, and the oldest
// (creationTimestamp, then name: as ResolveInbound picks) decides; every other one is
// OverriddenBy it. An invalid policy takes part as what applies instead of it (STRICT), so an
// older invalid namespace-wide policy still overrides a newer valid one. Selecting policies never
// conflict here, even when their selectors overlap: ResolveInbound gives a pod several of them
// select the oldest's mode, and which pods overlap is each node's to see. The result has one
// entry per policy, sorted by namespace, then name. It is pure.
func ResolvePeerAuthns(ps []*secv1alpha1.PeerAuthentication) []PeerAuthnResolved {
	out := make([]PeerAuthnResolved, len(ps))
	oldest := map[string]*PeerAuthn{} // namespace-wide, by namespace
	for i, p := range ps {
		a, errs := ConvertPeerAuthn(p)
		out[i] = PeerAuthnResolved{Namespace: p.Namespace, Name: p.Name, Generation: p.Generation, Applied: a, Errors: errs}
	}
	for i := range out {
		a := &out[i].Applied
		if a.Selector != nil {
			continue
		}
		if o := oldest[a.Namespace]; o == nil || peerAuthnOlder(a, o) {
			oldest[a.Namespace] = a
		}
	}
	for i := range out {
		a := &out[i].Applied
		if o := oldest[a.Namespace]; a.Selector == nil && o != a {
			out[i].OverriddenBy = o.Namespace + "/" + o.Name
		}
	}
	slices.SortFunc(out, func(a, b PeerAuthnResolved) int {
		return ServiceKey{Namespace: a.Namespace, Name: a.Name}.Compare(ServiceKey{Namespace: b.Namespace, Name: b.Name})
	})
	return out
}
