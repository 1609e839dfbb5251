package model

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Field paths of GatewaySpec.Unsupported entries that decide the Gateway's Accepted=False reason
// (gatewayRefusal).
const (
	fieldAddresses                 = "spec.addresses"
	fieldParametersRef             = "spec.infrastructure.parametersRef"
	fieldInfrastructureLabels      = "spec.infrastructure.labels"
	fieldInfrastructureAnnotations = "spec.infrastructure.annotations"
)

// GatewaySpecModel turns a Gateway into the GatewaySpec ResolveGateways reads, applying the
// API's defaults (allowedRoutes.namespaces.from Same, TLS mode Terminate, certificateRef group
// "" and kind Secret, namespaces the Gateway's). Listener hostnames are lower case. What aether
// does not serve is listed, "<field>: <reason>" with the value, in the Unsupported of the
// Gateway (an address that is not an IP, infrastructure.parametersRef, allowedListeners other
// than None, spec.tls, defaultScope) or of the listener (a namespace selector that does not
// convert, tls.options). infrastructure.labels and annotations are for the provisioner
// (GEP-1867); only a key ReservedInfrastructureKey refuses is listed.
func GatewaySpecModel(g *gwv1.Gateway) GatewaySpec {
	out := GatewaySpec{
		Key: GatewayKey{Namespace: g.Namespace, Name: g.Name}, UID: string(g.UID),
		Generation: g.Generation, Created: g.CreationTimestamp.Time, Class: string(g.Spec.GatewayClassName),
	}
	for i, l := range g.Spec.Listeners {
		out.Listeners = append(out.Listeners, listenerSpec(g.Namespace, fmt.Sprintf("spec.listeners[%d]", i), l))
	}
	for i, a := range g.Spec.Addresses {
		f := fmt.Sprintf("%s[%d]", fieldAddresses, i)
		t := gwv1.IPAddressType
		if a.Type != nil {
			t = *a.Type
		}
		switch {
		case t != gwv1.IPAddressType:
			out.Unsupported = append(out.Unsupported, fmt.Sprintf("%s.type: value %q: aether takes IPAddress addresses only", f, t))
		case a.Value == "":
			// No value asks the implementation to assign one (GatewaySpecAddress.value): the edge
			// Service gets whatever address its load balancer assigns.
		default:
			ip, err := netip.ParseAddr(a.Value)
			if err != nil {
				out.Unsupported = append(out.Unsupported, fmt.Sprintf("%s.value: value %q: not an IP address", f, a.Value))
				continue
			}
			out.Addresses = append(out.Addresses, ip.String())
		}
	}
	if inf := g.Spec.Infrastructure; inf != nil && inf.ParametersRef != nil {
		p := inf.ParametersRef
		out.Unsupported = append(out.Unsupported, fmt.Sprintf("%s: %s %q (group %q): aether's Gateways take no parameters", fieldParametersRef, p.Kind, p.Name, p.Group))
	}
	if inf := g.Spec.Infrastructure; inf != nil {
		for _, k := range slices.Sorted(maps.Keys(inf.Labels)) {
			out.InfrastructureLabels = append(out.InfrastructureLabels, string(k))
		}
		for _, k := range slices.Sorted(maps.Keys(inf.Annotations)) {
			out.InfrastructureAnnotations = append(out.InfrastructureAnnotations, string(k))
		}
		for _, k := range slices.Sorted(maps.Keys(inf.Labels)) {
			if ReservedInfrastructureKey(string(k)) {
				out.Unsupported = append(out.Unsupported, fmt.Sprintf("%s: key %q: reserved for aether's own labels", fieldInfrastructureLabels, k))
			}
		}
		for _, k := range slices.Sorted(maps.Keys(inf.Annotations)) {
			if ReservedInfrastructureKey(string(k)) {
				out.Unsupported = append(out.Unsupported, fmt.Sprintf("%s: key %q: reserved for aether's own annotations", fieldInfrastructureAnnotations, k))
			}
		}
	}
	if al := g.Spec.AllowedListeners; al != nil && al.Namespaces != nil && al.Namespaces.From != nil && *al.Namespaces.From != gwv1.NamespacesFromNone {
		out.Unsupported = append(out.Unsupported, fmt.Sprintf("spec.allowedListeners.namespaces.from: value %q: aether attaches no ListenerSets (want None)", *al.Namespaces.From))
	}
	if t := g.Spec.TLS; t != nil {
		if t.Frontend != nil {
			out.Unsupported = append(out.Unsupported, "spec.tls.frontend: client certificate validation is not supported")
		}
		if t.Backend != nil && t.Backend.ClientCertificateRef != nil {
			out.Unsupported = append(out.Unsupported, "spec.tls.backend.clientCertificateRef: not supported (the edge presents its mesh identity to backends)")
		}
	}
	if s := g.Spec.DefaultScope; s != "" && s != gwv1.GatewayDefaultScopeNone {
		out.Unsupported = append(out.Unsupported, fmt.Sprintf("spec.defaultScope: value %q: aether's Gateways are not default Gateways (want None)", s))
	}
	return out
}

// listenerSpec converts listener l (field f) of a Gateway in namespace ns.
func listenerSpec(ns, f string, l gwv1.Listener) ListenerSpec {
	out := ListenerSpec{Name: string(l.Name), Port: uint32(max(l.Port, 0)), Protocol: string(l.Protocol),
		AllowedRoutes: AllowedRoutes{From: string(gwv1.NamespacesFromSame)}}
	if l.Hostname != nil {
		out.Hostname = strings.ToLower(string(*l.Hostname))
	}
	if t := l.TLS; t != nil {
		out.TLS = &ListenerTLSSpec{Mode: TLSTerminate}
		if t.Mode != nil {
			out.TLS.Mode = TLSMode(*t.Mode)
		}
		for _, c := range t.CertificateRefs {
			ref := CertificateRef{Group: groupCore, Kind: "Secret", Ref: SecretKey{Namespace: ns, Name: string(c.Name)}}
			if c.Group != nil {
				ref.Group = string(*c.Group)
			}
			if c.Kind != nil {
				ref.Kind = string(*c.Kind)
			}
			if c.Namespace != nil && *c.Namespace != "" {
				ref.Ref.Namespace = string(*c.Namespace)
			}
			out.TLS.CertificateRefs = append(out.TLS.CertificateRefs, ref)
		}
		if len(t.Options) > 0 {
			keys := make([]string, 0, len(t.Options))
			for k := range t.Options {
				keys = append(keys, string(k))
			}
			slices.Sort(keys)
			out.Unsupported = append(out.Unsupported, fmt.Sprintf("%s.tls.options: %s: aether knows no TLS options", f, strings.Join(keys, ", ")))
		}
	}
	ar := l.AllowedRoutes
	if ar == nil {
		return out
	}
	for _, k := range ar.Kinds {
		g := gwv1.GroupName
		if k.Group != nil {
			g = string(*k.Group)
		}
		out.AllowedRoutes.Kinds = append(out.AllowedRoutes.Kinds, RouteGroupKind{Group: g, Kind: string(k.Kind)})
	}
	if ar.Namespaces == nil || ar.Namespaces.From == nil {
		return out
	}
	out.AllowedRoutes.From = string(*ar.Namespaces.From)
	switch from := *ar.Namespaces.From; from {
	case gwv1.NamespacesFromAll, gwv1.NamespacesFromSame:
	case gwv1.NamespacesFromSelector:
		if ar.Namespaces.Selector == nil {
			out.Unsupported = append(out.Unsupported, f+".allowedRoutes.namespaces.selector: not set: from Selector needs one")
			break
		}
		sel, err := metav1.LabelSelectorAsSelector(ar.Namespaces.Selector)
		if err != nil {
			out.Unsupported = append(out.Unsupported, fmt.Sprintf("%s.allowedRoutes.namespaces.selector: %v", f, err))
			break
		}
		out.AllowedRoutes.Selector = sel.String()
	default:
		out.Unsupported = append(out.Unsupported, fmt.Sprintf("%s.allowedRoutes.namespaces.from: value %q: want All, Same or Selector", f, from))
	}
	return out
}

// ReferenceGrantRefs lists the references a ReferenceGrant allows: one per (from, to) pair, into
// the grant's namespace (ToName "" when the to entry names no object: any of its kind).
func ReferenceGrantRefs(g *gwv1.ReferenceGrant) []NamespaceRef {
	var out []NamespaceRef
	for _, from := range g.Spec.From {
		for _, to := range g.Spec.To {
			r := NamespaceRef{
				FromGroup: string(from.Group), FromKind: string(from.Kind), FromNamespace: string(from.Namespace),
				ToGroup: string(to.Group), ToKind: string(to.Kind), ToNamespace: g.Namespace,
			}
			if to.Name != nil {
				r.ToName = string(*to.Name)
			}
			out = append(out, r)
		}
	}
	return out
}

// allows reports whether grant g allows reference want (a grant's ToName "" allows any name).
func (g NamespaceRef) allows(want NamespaceRef) bool {
	if g.ToName == "" {
		g.ToName = want.ToName
	}
	return g == want
}

// granted reports whether one of grants allows reference want.
func granted(grants []NamespaceRef, want NamespaceRef) bool {
	return slices.ContainsFunc(grants, func(g NamespaceRef) bool { return g.allows(want) })
}

// InfrastructureKeyAllowed reports whether label or annotation key k of a Gateway's
// spec.infrastructure goes onto its edge objects under the operator's allowlist allowed
// (--gateway-infrastructure-keys): an entry is a key, or a prefix ending in "/" ("example.com/"
// for every key of that prefix); a ReservedInfrastructureKey never does. Nothing is allowed by
// default: a Service annotation or label can steer a load balancer (an address outside
// --gateway-address-cidrs, an internet-facing scheme, an IP pool chosen by label) and a pod one
// the edge pod's networks or confinement, which a tenant who may create Gateways, but not
// LoadBalancer Services or pods, must not reach.
func InfrastructureKeyAllowed(allowed []string, k string) bool {
	if ReservedInfrastructureKey(k) {
		return false
	}
	return slices.ContainsFunc(allowed, func(a string) bool {
		return a == k || (strings.HasSuffix(a, "/") && strings.HasPrefix(k, a))
	})
}

// ReservedInfrastructureKey reports whether a Gateway's spec.infrastructure may not carry label
// or annotation key k onto its edge objects: a key of aether's (prefix "aether.io/", such as
// aether.io/capture on the edge pods) or the gateway-name label the edge Deployment selects its
// pods by. A Gateway asking for one is not accepted.
func ReservedInfrastructureKey(k string) bool {
	return strings.HasPrefix(k, "aether.io/") || k == gwv1.GatewayNameLabelKey
}
