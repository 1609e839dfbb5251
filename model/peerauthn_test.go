package model

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sec "github.com/aethermesh/aether/api/aether/security/v1alpha1"
)

func peerAuthnObj(ns, name string, age int, spec sec.PeerAuthenticationSpec) *sec.PeerAuthentication {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	return &sec.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Generation: 1,
		CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Second))}, Spec: spec}
}

// showPeerAuthn prints what a PeerAuthn applies: its scope, mode and port modes in port order.
func showPeerAuthn(p PeerAuthn) string {
	scope := "namespace"
	if p.Selector != nil {
		scope = "selector(" + p.Selector.String() + ")"
		if _, selectable := p.Selector.Requirements(); !selectable {
			scope = "nothing" // labels.Nothing()
		}
	}
	var ports []string
	for _, port := range slices.Sorted(maps.Keys(p.PortModes)) {
		ports = append(ports, fmt.Sprintf("%d=%s", port, p.PortModes[port]))
	}
	return fmt.Sprintf("%s mode=%q ports=[%s]", scope, p.Mode, strings.Join(ports, " "))
}

// TestConvertPeerAuthn: the valid shapes (namespace-wide by absence or {}, a selector, modes
// and per-port modes, UNSET left out) and every refusal, each naming the field path and value,
// with what applies instead: STRICT on every port for its pods, or no pod when the selector is
// refused.
func TestConvertPeerAuthn(t *testing.T) {
	mode := func(m sec.MTLSMode) *sec.PeerAuthenticationMTLS { return &sec.PeerAuthenticationMTLS{Mode: m} }
	ports := func(kv ...string) map[string]sec.PeerAuthenticationMTLS {
		out := map[string]sec.PeerAuthenticationMTLS{}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = sec.PeerAuthenticationMTLS{Mode: sec.MTLSMode(kv[i+1])}
		}
		return out
	}
	app := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	many := map[string]sec.PeerAuthenticationMTLS{}
	for i := range sec.MaxPortLevelMTLS + 1 {
		many[fmt.Sprint(1000+i)] = sec.PeerAuthenticationMTLS{Mode: sec.MTLSStrict}
	}
	for _, tc := range []struct {
		name string
		spec sec.PeerAuthenticationSpec
		want string
		errs []string
	}{
		{"empty spec", sec.PeerAuthenticationSpec{}, `namespace mode="" ports=[]`, nil},
		{"namespace-wide permissive", sec.PeerAuthenticationSpec{MTLS: mode(sec.MTLSPermissive)}, `namespace mode="PERMISSIVE" ports=[]`, nil},
		{"empty selector is namespace-wide", sec.PeerAuthenticationSpec{Selector: &metav1.LabelSelector{}, MTLS: mode(sec.MTLSStrict)}, `namespace mode="STRICT" ports=[]`, nil},
		{"UNSET", sec.PeerAuthenticationSpec{MTLS: mode(sec.MTLSUnset)}, `namespace mode="" ports=[]`, nil},
		{"selector with ports", sec.PeerAuthenticationSpec{Selector: app, MTLS: mode(sec.MTLSPermissive), PortLevelMTLS: ports("8080", "STRICT", "9090", "UNSET", "443", "PERMISSIVE")},
			`selector(app=web) mode="PERMISSIVE" ports=[443=PERMISSIVE 8080=STRICT]`, nil},
		{"namespace-wide ports", sec.PeerAuthenticationSpec{PortLevelMTLS: ports("65535", "STRICT", "1", "PERMISSIVE")}, `namespace mode="" ports=[1=PERMISSIVE 65535=STRICT]`, nil},
		{"match expressions", sec.PeerAuthenticationSpec{Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"db"}}}}},
			`selector(tier in (db)) mode="" ports=[]`, nil},

		{"DISABLE", sec.PeerAuthenticationSpec{MTLS: mode(sec.MTLSDisable)}, `namespace mode="STRICT" ports=[]`,
			[]string{`spec.mtls.mode "DISABLE": aether has no plaintext-only mode: use PERMISSIVE to accept plaintext`}},
		{"mode unknown", sec.PeerAuthenticationSpec{Selector: app, MTLS: mode("strict")}, `selector(app=web) mode="STRICT" ports=[]`,
			[]string{`spec.mtls.mode "strict": want UNSET, STRICT or PERMISSIVE`}},
		{"port DISABLE", sec.PeerAuthenticationSpec{MTLS: mode(sec.MTLSPermissive), PortLevelMTLS: ports("8080", "DISABLE")}, `namespace mode="STRICT" ports=[]`,
			[]string{`spec.portLevelMtls["8080"].mode "DISABLE": aether has no plaintext-only mode: use PERMISSIVE to accept plaintext`}},
		{"port mode unknown", sec.PeerAuthenticationSpec{PortLevelMTLS: ports("8080", "OPEN")}, `namespace mode="STRICT" ports=[]`,
			[]string{`spec.portLevelMtls["8080"].mode "OPEN": want UNSET, STRICT or PERMISSIVE`}},
		{"port 0", sec.PeerAuthenticationSpec{PortLevelMTLS: ports("0", "STRICT")}, `namespace mode="STRICT" ports=[]`,
			[]string{`spec.portLevelMtls["0"] "0": want a port number 1-65535 (the pod's container port)`}},
		{"port too big", sec.PeerAuthenticationSpec{PortLevelMTLS: ports("65536", "STRICT")}, `namespace mode="STRICT" ports=[]`,
			[]string{`spec.portLevelMtls["65536"] "65536": want a port number 1-65535 (the pod's container port)`}},
		{"port leading zero", sec.PeerAuthenticationSpec{PortLevelMTLS: ports("08080", "STRICT")}, `namespace mode="STRICT" ports=[]`,
			[]string{`spec.portLevelMtls["08080"] "08080": want a port number 1-65535 (the pod's container port)`}},
		{"port name", sec.PeerAuthenticationSpec{PortLevelMTLS: ports("http", "STRICT")}, `namespace mode="STRICT" ports=[]`,
			[]string{`spec.portLevelMtls["http"] "http": want a port number 1-65535 (the pod's container port)`}},
		{"inbound port", sec.PeerAuthenticationSpec{PortLevelMTLS: ports("15008", "PERMISSIVE")}, `namespace mode="STRICT" ports=[]`,
			[]string{`spec.portLevelMtls["15008"] "15008": the inbound mTLS port is aether's (always mTLS)`}},
		{"capture port", sec.PeerAuthenticationSpec{PortLevelMTLS: ports("15001", "STRICT")}, `namespace mode="STRICT" ports=[]`,
			[]string{`spec.portLevelMtls["15001"] "15001": the capture port is aether's`}},
		{"dns port", sec.PeerAuthenticationSpec{PortLevelMTLS: ports("18054", "STRICT")}, `namespace mode="STRICT" ports=[]`,
			[]string{`spec.portLevelMtls["18054"] "18054": the DNS port is aether's`}},
		{"too many ports", sec.PeerAuthenticationSpec{PortLevelMTLS: many}, `namespace mode="STRICT" ports=[]`,
			[]string{`spec.portLevelMtls "65": want at most 64 ports`}},
		{"bad selector selects nothing", sec.PeerAuthenticationSpec{MTLS: mode(sec.MTLSPermissive),
			Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Near", Values: []string{"x"}}}}},
			`nothing mode="STRICT" ports=[]`,
			[]string{`spec.selector "{\"matchExpressions\":[{\"key\":\"app\",\"operator\":\"Near\",\"values\":[\"x\"]}]}": "Near" is not a valid label selector operator`}},
		{"bad label value", sec.PeerAuthenticationSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a b"}}},
			`nothing mode="STRICT" ports=[]`, []string{`spec.selector "{\"matchLabels\":{\"app\":\"a b\"}}": values[0][app]: Invalid value: "a b"`}},
		{"every refusal, in field order", sec.PeerAuthenticationSpec{MTLS: mode(sec.MTLSDisable), PortLevelMTLS: ports("15008", "STRICT", "9090", "X", "80", "DISABLE")},
			`namespace mode="STRICT" ports=[]`, []string{`spec.mtls.mode "DISABLE"`, `spec.portLevelMtls["80"].mode "DISABLE"`,
				`spec.portLevelMtls["9090"].mode "X"`, `spec.portLevelMtls["15008"] "15008"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := peerAuthnObj("shop", "p", 3, tc.spec)
			got, errs := ConvertPeerAuthn(p)
			if s := showPeerAuthn(got); s != tc.want {
				t.Errorf("applied %s, want %s", s, tc.want)
			}
			if got.Namespace != "shop" || got.Name != "p" || !got.Created.Equal(p.CreationTimestamp.Time) {
				t.Errorf("identity = %s/%s created %v", got.Namespace, got.Name, got.Created)
			}
			if len(errs) != len(tc.errs) {
				t.Fatalf("errors = %v, want %d: %q", errs, len(tc.errs), tc.errs)
			}
			for i, e := range errs {
				if !strings.HasPrefix(e.Error(), tc.errs[i]) {
					t.Errorf("error %d = %q, want it to start with %q", i, e.Error(), tc.errs[i])
				}
			}
		})
	}
}

// TestResolvePeerAuthns: two namespace-wide policies of one namespace conflict and the oldest
// (then the smaller name) decides, an invalid older one included; selecting policies and other
// namespaces never conflict; the result is sorted; the converted policies decide pods as
// ResolveInbound says, a namespace made permissive beside a strict one.
func TestResolvePeerAuthns(t *testing.T) {
	perm := sec.PeerAuthenticationSpec{MTLS: &sec.PeerAuthenticationMTLS{Mode: sec.MTLSPermissive}}
	strict := sec.PeerAuthenticationSpec{MTLS: &sec.PeerAuthenticationMTLS{Mode: sec.MTLSStrict}}
	bad := sec.PeerAuthenticationSpec{MTLS: &sec.PeerAuthenticationMTLS{Mode: sec.MTLSDisable}}
	sel := sec.PeerAuthenticationSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}, MTLS: &sec.PeerAuthenticationMTLS{Mode: sec.MTLSStrict}}
	ps := []*sec.PeerAuthentication{
		peerAuthnObj("web", "z-migrate", 5, perm),
		peerAuthnObj("web", "a-newer", 9, strict),
		peerAuthnObj("web", "b-same-age", 5, strict), // same age as z-migrate: the smaller name wins
		peerAuthnObj("web", "db", 1, sel),
		peerAuthnObj("web", "db-too", 2, sel),
		peerAuthnObj("pay", "broken", 1, bad),
		peerAuthnObj("pay", "open", 2, perm),
		peerAuthnObj("shop", "only", 7, perm),
	}
	var got []string
	for _, r := range ResolvePeerAuthns(ps) {
		got = append(got, fmt.Sprintf("%s/%s valid=%v overridden=%q", r.Namespace, r.Name, r.Valid(), r.OverriddenBy))
	}
	want := []string{
		`pay/broken valid=false overridden=""`,
		`pay/open valid=true overridden="pay/broken"`,
		`shop/only valid=true overridden=""`,
		`web/a-newer valid=true overridden="web/b-same-age"`,
		`web/b-same-age valid=true overridden=""`,
		`web/db valid=true overridden=""`,
		`web/db-too valid=true overridden=""`,
		`web/z-migrate valid=true overridden="web/b-same-age"`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("resolved:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// What the pods get: shop is permissive beside strict neighbours; pay stays strict (its
	// older policy is invalid); web's winner is strict.
	pas := ConvertPeerAuthns(ps)
	for _, tc := range []struct{ ns, mode, policy string }{
		{"shop", "PERMISSIVE", "shop/only"}, {"pay", "STRICT", "pay/broken"}, {"web", "STRICT", "web/b-same-age"}, {"other", "STRICT", ""},
	} {
		if in := ResolveInbound(MTLSStrict, pas, tc.ns, map[string]string{"app": "web"}, nil); string(in.Mode) != tc.mode || in.Policy != tc.policy {
			t.Errorf("pod of %s: %+v, want %s by %q", tc.ns, in, tc.mode, tc.policy)
		}
	}
}
