package model

import (
	"slices"
	"strings"
	"testing"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// TestGatewaySpecModel: the API's defaults are applied, hostnames are lower case, and what aether
// does not serve is listed with its field and value.
func TestGatewaySpecModel(t *testing.T) {
	g := GatewaySpecModel(decode[gwv1.Gateway](t, route("Gateway", "infra", "gw", 0, `  gatewayClassName: aether
  addresses:
  - {value: 192.0.2.10}
  - {type: IPAddress, value: "2001:db8::1"}
  - {type: IPAddress}
  - {type: IPAddress, value: lb.example.com}
  - {type: Hostname, value: lb.example.com}
  infrastructure:
    labels: {team: edge, aether.io/capture: "true"}
    annotations: {example.com/owner: edge, gateway.networking.k8s.io/gateway-name: other}
    parametersRef: {group: example.com, kind: Params, name: p}
  allowedListeners: {namespaces: {from: All}}
  listeners:
  - name: https
    port: 443
    protocol: HTTPS
    hostname: WWW.Example.com
    tls:
      certificateRefs: [{name: a}, {name: b, namespace: certs}, {group: example.com, kind: Cert, name: c}]
      options: {example.com/min-version: "1.3"}
  - name: pass
    port: 8443
    protocol: TLS
    tls: {mode: Passthrough}
    allowedRoutes:
      kinds: [{kind: TLSRoute}, {group: example.com, kind: Custom}]
      namespaces: {from: Selector, selector: {matchExpressions: [{key: team, operator: In, values: [a, b]}]}}
  - name: bad-selector
    port: 80
    protocol: HTTP
    allowedRoutes: {namespaces: {from: Selector, selector: {matchExpressions: [{key: team, operator: Near}]}}}
  - name: no-selector
    port: 81
    protocol: HTTP
    allowedRoutes: {namespaces: {from: Selector}}
`)))
	if g.Key != (GatewayKey{"infra", "gw"}) || g.Class != "aether" || g.Generation != 3 || !g.Created.Equal(t0) {
		t.Errorf("identity: %+v", g)
	}
	if !slices.Equal(g.Addresses, []string{"192.0.2.10", "2001:db8::1"}) {
		t.Errorf("addresses %v, want the two IPs (no value: assigned)", g.Addresses)
	}
	wantUnsupported := []string{
		`spec.addresses[3].value: value "lb.example.com": not an IP address`,
		`spec.addresses[4].type: value "Hostname": aether takes IPAddress addresses only`,
		`spec.infrastructure.parametersRef: Params "p" (group "example.com"): aether's Gateways take no parameters`,
		`spec.infrastructure.labels: key "aether.io/capture": reserved for aether's own labels`,
		`spec.infrastructure.annotations: key "gateway.networking.k8s.io/gateway-name": reserved for aether's own annotations`,
		`spec.allowedListeners.namespaces.from: value "All": aether attaches no ListenerSets (want None)`,
	}
	if !slices.Equal(g.Unsupported, wantUnsupported) {
		t.Errorf("Unsupported:\n%s\nwant\n%s", strings.Join(g.Unsupported, "\n"), strings.Join(wantUnsupported, "\n"))
	}
	https := g.Listeners[0]
	if https.Hostname != "www.example.com" || https.Port != 443 || https.TLS.Mode != TLSTerminate || https.AllowedRoutes.From != "Same" {
		t.Errorf("https listener: %+v", https)
	}
	wantRefs := []CertificateRef{
		{Group: "", Kind: "Secret", Ref: SecretKey{"infra", "a"}},
		{Group: "", Kind: "Secret", Ref: SecretKey{"certs", "b"}},
		{Group: "example.com", Kind: "Cert", Ref: SecretKey{"infra", "c"}},
	}
	if !slices.Equal(https.TLS.CertificateRefs, wantRefs) {
		t.Errorf("certificateRefs %+v\nwant %+v", https.TLS.CertificateRefs, wantRefs)
	}
	if want := []string{"spec.listeners[0].tls.options: example.com/min-version: aether knows no TLS options"}; !slices.Equal(https.Unsupported, want) {
		t.Errorf("https Unsupported %q, want %q", https.Unsupported, want)
	}
	pass := g.Listeners[1]
	wantKinds := []RouteGroupKind{{gwv1.GroupName, "TLSRoute"}, {"example.com", "Custom"}}
	if pass.TLS.Mode != TLSPassthrough || pass.AllowedRoutes.From != "Selector" || pass.AllowedRoutes.Selector != "team in (a,b)" || !slices.Equal(pass.AllowedRoutes.Kinds, wantKinds) {
		t.Errorf("pass listener: %+v", pass)
	}
	if u := g.Listeners[2].Unsupported; len(u) != 1 || !strings.HasPrefix(u[0], `spec.listeners[2].allowedRoutes.namespaces.selector: "Near" is not a valid label selector operator`) {
		t.Errorf("bad selector: %q", u)
	}
	if u := g.Listeners[3].Unsupported; len(u) != 1 || u[0] != "spec.listeners[3].allowedRoutes.namespaces.selector: not set: from Selector needs one" {
		t.Errorf("missing selector: %q", u)
	}

	// What GatewaySpecModel lists decides the Gateway's status.
	in := gatewayInputs(t)
	in.Gateways = []GatewaySpec{g}
	r := resolve(in)
	st := r.gateways["gw"]
	if got := cond(st.Accepted) + " " + cond(st.Programmed); got != "!UnsupportedAddress !Invalid" {
		t.Errorf("Gateway: %s, want !UnsupportedAddress !Invalid", got)
	}
	if _, ok := r.edges["gw"]; ok {
		t.Error("a Gateway not accepted is served")
	}
	want := "https: !UnsupportedValue !Invalid !InvalidCertificateRef !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0\n" +
		"pass: Accepted !Invalid !InvalidRouteKinds !NoConflicts kinds=TLSRoute attached=0\n" +
		"bad-selector: !UnsupportedValue !Invalid ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0\n" +
		"no-selector: !UnsupportedValue !Invalid ResolvedRefs !NoConflicts kinds=HTTPRoute,GRPCRoute attached=0"
	if got := r.listeners("gw"); got != want {
		t.Errorf("listeners:\n%s\nwant\n%s", got, want)
	}
	for _, tc := range []struct {
		unsupported []string
		want        string
	}{
		{[]string{wantUnsupported[2]}, "InvalidParameters"},
		{[]string{wantUnsupported[3]}, "Invalid"},
		{[]string{wantUnsupported[5]}, "Invalid"},
		{[]string{wantUnsupported[2], wantUnsupported[1]}, "UnsupportedAddress"},
	} {
		if got := gatewayRefusal(tc.unsupported); got != tc.want {
			t.Errorf("refusal of %q: %s, want %s", tc.unsupported, got, tc.want)
		}
	}
}

// TestReferenceGrantRefs: one reference per (from, to) pair, into the grant's namespace.
func TestReferenceGrantRefs(t *testing.T) {
	got := ReferenceGrantRefs(decode[gwv1.ReferenceGrant](t, route("ReferenceGrant", "shop", "g", 0, `  from:
  - {group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: infra}
  - {group: gateway.networking.k8s.io, kind: Gateway, namespace: edge}
  to:
  - {group: "", kind: Service}
  - {group: "", kind: Secret, name: tls}
`)))
	want := []NamespaceRef{
		{FromGroup: gwv1.GroupName, FromKind: "HTTPRoute", FromNamespace: "infra", ToKind: "Service", ToNamespace: "shop"},
		{FromGroup: gwv1.GroupName, FromKind: "HTTPRoute", FromNamespace: "infra", ToKind: "Secret", ToNamespace: "shop", ToName: "tls"},
		{FromGroup: gwv1.GroupName, FromKind: "Gateway", FromNamespace: "edge", ToKind: "Service", ToNamespace: "shop"},
		{FromGroup: gwv1.GroupName, FromKind: "Gateway", FromNamespace: "edge", ToKind: "Secret", ToNamespace: "shop", ToName: "tls"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("refs:\n%+v\nwant\n%+v", got, want)
	}
	secret := NamespaceRef{FromGroup: gwv1.GroupName, FromKind: "Gateway", FromNamespace: "edge", ToKind: "Secret", ToNamespace: "shop", ToName: "tls"}
	if !granted(got, secret) {
		t.Error("the named Secret is not granted")
	}
	secret.ToName = "other"
	if granted(got, secret) {
		t.Error("another Secret is granted")
	}
}

// TestInfrastructureKeys: the operator's allowlist (a key, or a prefix ending in "/") decides
// which spec.infrastructure keys the edge objects get; an accepted Gateway's Accepted message
// names the others; aether's own keys are never allowed.
func TestInfrastructureKeys(t *testing.T) {
	allowed := []string{"team", "example.com/", "aether.io/", "gateway.networking.k8s.io/gateway-name"}
	for k, want := range map[string]bool{
		"team": true, "teams": false, "example.com/lb": true, "example.com": false, "sub.example.com/lb": false,
		"aether.io/capture": false, "gateway.networking.k8s.io/gateway-name": false, "metallb.universe.tf/loadBalancerIPs": false,
	} {
		if got := InfrastructureKeyAllowed(allowed, k); got != want {
			t.Errorf("InfrastructureKeyAllowed(%q) = %v, want %v", k, got, want)
		}
	}
	if InfrastructureKeyAllowed(nil, "team") {
		t.Error("a key allowed with no allowlist")
	}

	in := gatewayInputs(t, route("Gateway", "infra", "web", 0, `  gatewayClassName: aether
  infrastructure:
    labels: {team: edge, pool: public}
    annotations: {example.com/lb: internal, metallb.universe.tf/loadBalancerIPs: 203.0.113.9}
  listeners:
  - {name: http, port: 80, protocol: HTTP}
`))
	in.InfrastructureKeys = []string{"team", "example.com/"}
	st := resolve(in).gateways["web"]
	want := `not put on the edge objects (not in the registrar's --gateway-infrastructure-keys): spec.infrastructure.labels "pool"; spec.infrastructure.annotations "metallb.universe.tf/loadBalancerIPs"`
	if cond(st.Accepted) != "Accepted" || st.Accepted.Message != want {
		t.Errorf("Accepted %s %q, want Accepted %q", cond(st.Accepted), st.Accepted.Message, want)
	}
	in.InfrastructureKeys = []string{"team", "pool", "example.com/", "metallb.universe.tf/"}
	if st := resolve(in).gateways["web"]; st.Accepted.Message != "" {
		t.Errorf("every key allowed: Accepted message %q, want none", st.Accepted.Message)
	}
}
