package authzstatus

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sec "github.com/aethermesh/aether/api/aether/security/v1alpha1"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// TestPeerAuthnStatus: Accepted, Invalid (what applies instead, then each field and value),
// Conflicted naming the older namespace-wide policy; a second pass with the status written
// changes nothing and keeps the transition time.
func TestPeerAuthnStatus(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Hour))
	pa := func(name string, age int, spec sec.PeerAuthenticationSpec) *sec.PeerAuthentication {
		return &sec.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Generation: 2,
			CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Second))}, Spec: spec}
	}
	mode := func(m sec.MTLSMode) *sec.PeerAuthenticationMTLS { return &sec.PeerAuthenticationMTLS{Mode: m} }
	app := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}
	older := pa("older", 1, sec.PeerAuthenticationSpec{MTLS: mode(sec.MTLSStrict)})
	for _, tc := range []struct {
		name           string
		p              *sec.PeerAuthentication
		others         []*sec.PeerAuthentication
		status, reason string
		message        string
	}{
		{"accepted", pa("p", 5, sec.PeerAuthenticationSpec{MTLS: mode(sec.MTLSPermissive)}), nil, "True", sec.ReasonAccepted, "the policy applies"},
		{"selecting beside a namespace-wide one", pa("p", 5, sec.PeerAuthenticationSpec{Selector: app}), []*sec.PeerAuthentication{older}, "True", sec.ReasonAccepted, "the policy applies"},
		{"conflicted", pa("p", 5, sec.PeerAuthenticationSpec{MTLS: mode(sec.MTLSPermissive)}), []*sec.PeerAuthentication{older}, "False", sec.ReasonConflicted,
			"the namespace-wide policy shop/older is older and decides for namespace shop: this one applies to no pod"},
		{"invalid", pa("p", 5, sec.PeerAuthenticationSpec{MTLS: mode(sec.MTLSDisable), PortLevelMTLS: map[string]sec.PeerAuthenticationMTLS{"15008": {Mode: sec.MTLSStrict}}}), nil,
			"False", sec.ReasonInvalid, `invalid: its pods are STRICT on every port until it is fixed: spec.mtls.mode "DISABLE": aether has no plaintext-only mode: use PERMISSIVE to accept plaintext; spec.portLevelMtls["15008"] "15008"`},
		{"invalid selector", pa("p", 5, sec.PeerAuthenticationSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a b"}}}), nil,
			"False", sec.ReasonInvalid, `invalid: it selects no pod until it is fixed (the pods keep their namespace's mode): spec.selector`},
		{"invalid and overridden", pa("p", 5, sec.PeerAuthenticationSpec{MTLS: mode("OPEN")}), []*sec.PeerAuthentication{older}, "False", sec.ReasonInvalid,
			`invalid, and overridden by the older namespace-wide policy shop/older: spec.mtls.mode "OPEN"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r model.PeerAuthnResolved
			for _, x := range model.ResolvePeerAuthns(append([]*sec.PeerAuthentication{tc.p}, tc.others...)) {
				if x.Name == tc.p.Name {
					r = x
				}
			}
			st, changed := PeerAuthnStatus(tc.p, r, t0)
			if !changed || len(st.Conditions) != 1 {
				t.Fatalf("changed %v, conditions %+v", changed, st.Conditions)
			}
			c := st.Conditions[0]
			if c.Type != "Accepted" || string(c.Status) != tc.status || c.Reason != tc.reason || !strings.Contains(c.Message, tc.message) || c.ObservedGeneration != 2 {
				t.Errorf("condition = %+v, want %s %s %q at generation 2", c, tc.status, tc.reason, tc.message)
			}
			tc.p.Status = st
			again, changed := PeerAuthnStatus(tc.p, r, t1)
			if changed || !again.Conditions[0].LastTransitionTime.Equal(&t0) {
				t.Errorf("second pass: changed %v, condition %+v", changed, again.Conditions[0])
			}
		})
	}
}

// TestPeerAuthnStatusRealAPIServer runs the controller against a real kube-apiserver whose
// PeerAuthentication CRD is installed after the start (and the AuthorizationPolicy CRD never):
// a second namespace-wide policy is Conflicted naming the first, a policy whose selector the CRD
// lets through but the conversion refuses is Invalid, a selecting one is Accepted; once the
// first is deleted the second is Accepted.
func TestPeerAuthnStatusRealAPIServer(t *testing.T) {
	ctx, cl, _ := startController(t, "security.aether.io_peerauthentications.yaml")
	pa := func(name string, spec sec.PeerAuthenticationSpec) *sec.PeerAuthentication {
		return &sec.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name}, Spec: spec}
	}
	testenv.Eventually(t, 30*time.Second, "the first policy created", func() error {
		return cl.Create(ctx, pa("first", sec.PeerAuthenticationSpec{MTLS: &sec.PeerAuthenticationMTLS{Mode: sec.MTLSPermissive}}))
	})
	for _, p := range []*sec.PeerAuthentication{
		// "second" > "first": it loses also when both are created within one second.
		pa("second", sec.PeerAuthenticationSpec{MTLS: &sec.PeerAuthenticationMTLS{Mode: sec.MTLSStrict}}),
		pa("bad-selector", sec.PeerAuthenticationSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a b"}}}),
		pa("db", sec.PeerAuthenticationSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			PortLevelMTLS: map[string]sec.PeerAuthenticationMTLS{"5432": {Mode: sec.MTLSStrict}}}),
	} {
		if err := cl.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	wait := func(name, status, reason, message string) {
		t.Helper()
		testenv.Eventually(t, 60*time.Second, "status of "+name, func() error {
			var p sec.PeerAuthentication
			if err := cl.Get(ctx, client.ObjectKey{Namespace: "shop", Name: name}, &p); err != nil {
				return err
			}
			c := findAccepted(p.Status.Conditions)
			if c == nil || string(c.Status) != status || c.Reason != reason || !strings.Contains(c.Message, message) || c.ObservedGeneration != p.Generation {
				return fmt.Errorf("status = %+v", p.Status)
			}
			return nil
		})
	}
	wait("first", "True", sec.ReasonAccepted, "the policy applies")
	wait("second", "False", sec.ReasonConflicted, "shop/first is older")
	wait("bad-selector", "False", sec.ReasonInvalid, `selects no pod until it is fixed (the pods keep their namespace's mode): spec.selector "{\"matchLabels\":{\"app\":\"a b\"}}"`)
	wait("db", "True", sec.ReasonAccepted, "the policy applies")
	if err := cl.Delete(ctx, pa("first", sec.PeerAuthenticationSpec{})); err != nil {
		t.Fatal(err)
	}
	wait("second", "True", sec.ReasonAccepted, "the policy applies")
}
