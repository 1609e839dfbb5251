package model

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/labels"
)

// MTLSMode is the inbound mTLS mode of a pod or port (issue #32 item 5, modelled on Istio's
// PeerAuthentication): STRICT accepts only mesh mTLS (the inbound port 15008), PERMISSIVE also
// plaintext, for migration. MTLSUnset inherits: from the namespace-wide policy, then the mesh
// default (the agent's --inbound-mode).
type MTLSMode string

const (
	MTLSUnset      MTLSMode = ""
	MTLSStrict     MTLSMode = "STRICT"
	MTLSPermissive MTLSMode = "PERMISSIVE"
)

// PeerAuthn is one PeerAuthentication as the model applies it: in Namespace, selecting the pods
// Selector matches (nil: every pod of the namespace, a namespace-wide policy), with Mode and
// per-port modes (PortModes, by the pod's target/container port). Created orders policies of one
// scope: the oldest wins, then the smaller name (as Istio resolves conflicts).
type PeerAuthn struct {
	Namespace, Name string
	Selector        labels.Selector
	Mode            MTLSMode
	PortModes       map[uint32]MTLSMode
	Created         time.Time
}

// peerAuthnOlder reports whether a wins over b in one scope: created earlier, then the smaller
// name.
func peerAuthnOlder(a, b *PeerAuthn) bool {
	return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.Name, b.Name)) < 0
}

// PodInbound is the inbound mTLS policy one pod gets: Mode (STRICT or PERMISSIVE, never unset)
// and the ports that differ from it: PermissivePorts in STRICT mode (plaintext accepted there),
// StrictPorts in PERMISSIVE mode (plaintext refused there), each sorted. Policy names the
// PeerAuthentication that decided the mode ("" for the mesh default). AuthzAll is set when
// authorization made the whole pod STRICT, AuthzStrict lists the ports it made strict otherwise
// (see ResolveInbound).
type PodInbound struct {
	Mode            MTLSMode
	StrictPorts     []uint32
	PermissivePorts []uint32
	Policy          string
	AuthzAll        bool
	AuthzStrict     []uint32
}

// ResolveInbound decides the inbound mTLS policy of a pod of namespace with podLabels:
//
//  1. the PeerAuthentication of the pod's namespace whose selector matches podLabels (the oldest
//     when several do) decides, then the namespace-wide one (no selector), then meshDefault
//     (MTLSUnset: STRICT); a mode left unset in the selecting policy inherits the
//     namespace-wide policy's, then meshDefault; port modes come from the deciding policy only;
//  2. authorization needs an identity, which plaintext does not have: with an enforced (not
//     dry-run) AuthorizationPolicy among authz that covers every port (an ALLOW policy, a
//     FailClosed one, a DENY rule that names no port), the whole pod is STRICT (AuthzAll); else
//     every port a DENY rule names is. Without this, a plaintext caller of a permissive pod would
//     pass around the policy.
//
// It is pure; pas may hold every namespace's policies.
func ResolveInbound(meshDefault MTLSMode, pas []PeerAuthn, namespace string, podLabels map[string]string, authz []*AuthzPolicy) PodInbound {
	if meshDefault == MTLSUnset {
		meshDefault = MTLSStrict
	}
	var selected, nsWide *PeerAuthn
	older := peerAuthnOlder
	for i := range pas {
		p := &pas[i]
		if p.Namespace != namespace {
			continue
		}
		switch {
		case p.Selector == nil:
			if nsWide == nil || older(p, nsWide) {
				nsWide = p
			}
		case p.Selector.Matches(labels.Set(podLabels)):
			if selected == nil || older(p, selected) {
				selected = p
			}
		}
	}
	out := PodInbound{Mode: meshDefault}
	var portModes map[uint32]MTLSMode
	if nsWide != nil {
		out.Policy, portModes = nsWide.Namespace+"/"+nsWide.Name, nsWide.PortModes
		if nsWide.Mode != MTLSUnset {
			out.Mode = nsWide.Mode
		}
	}
	if selected != nil {
		out.Policy, portModes = selected.Namespace+"/"+selected.Name, selected.PortModes
		if selected.Mode != MTLSUnset {
			out.Mode = selected.Mode
		}
	}
	strict := map[uint32]bool{}
	for _, port := range slices.Sorted(maps.Keys(portModes)) {
		switch m := portModes[port]; {
		case m == MTLSStrict && out.Mode == MTLSPermissive:
			strict[port] = true
		case m == MTLSPermissive && out.Mode == MTLSStrict:
			out.PermissivePorts = append(out.PermissivePorts, port)
		}
	}
	authzStrict, all := map[uint32]bool{}, false
	for _, p := range authz {
		if p.DryRun {
			continue
		}
		if p.FailClosed || p.Action == AuthzAllow {
			all = true
		}
		for _, r := range p.Rules {
			if len(r.Ports) == 0 {
				all = true
			}
			for _, port := range r.Ports {
				authzStrict[port] = true
			}
		}
	}
	if all {
		out.AuthzAll = out.Mode == MTLSPermissive || len(out.PermissivePorts) > 0
		out.Mode, out.PermissivePorts = MTLSStrict, nil
		return out
	}
	for _, port := range slices.Sorted(maps.Keys(authzStrict)) {
		if out.Mode == MTLSStrict {
			if i := slices.Index(out.PermissivePorts, port); i >= 0 {
				out.PermissivePorts = slices.Delete(out.PermissivePorts, i, i+1)
				out.AuthzStrict = append(out.AuthzStrict, port)
			}
			continue
		}
		if !strict[port] {
			out.AuthzStrict = append(out.AuthzStrict, port)
		}
		strict[port] = true
	}
	if out.Mode == MTLSPermissive {
		out.StrictPorts = slices.Sorted(maps.Keys(strict))
	}
	return out
}
