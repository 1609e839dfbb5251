package gateway

import (
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/aethermesh/aether/model"
)

// TestStatus computes Gateway status from what model.ResolveGateways found, the edge
// Deployment and the edge Service: the addresses (load balancer ingress first, then externalIPs,
// then ClusterIPs), Programmed only with an available replica and an address (Pending,
// AddressNotAssigned, Invalid for a Gateway name aether cannot provision, AddressNotUsable with
// the refused addresses' reasons, and the listeners' Programmed following), the model's
// Programmed=False
// kept, observedGeneration, and, computed again later with nothing changed, the same status
// (lastTransitionTime kept, another controller's condition kept).
func TestStatus(t *testing.T) {
	t1 := metav1.NewTime(time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC))
	yes := model.Condition{Status: true, Reason: "Accepted", Message: "ok"}
	st := model.GatewayStatus{
		Key: model.GatewayKey{Namespace: "shop", Name: "web"}, Generation: 3,
		Accepted: yes, Programmed: model.Condition{Status: true, Reason: string(gwv1.GatewayReasonProgrammed)},
		Listeners: []model.ListenerStatus{{
			Name: "http", AttachedRoutes: 2, SupportedKinds: []model.RouteGroupKind{{Group: gwv1.GroupName, Kind: "HTTPRoute"}},
			Accepted: yes, Programmed: model.Condition{Status: true, Reason: "Programmed"},
			ResolvedRefs: model.Condition{Status: true, Reason: "ResolvedRefs"}, Conflicted: model.Condition{Reason: "NoConflicts"},
		}},
	}
	invalid := st
	invalid.Accepted = model.Condition{Reason: string(gwv1.GatewayReasonListenersNotValid), Message: "no valid listener"}
	invalid.Programmed = model.Condition{Reason: string(gwv1.GatewayReasonInvalid), Message: "no valid listener"}
	ready := &appsv1.Deployment{Status: appsv1.DeploymentStatus{AvailableReplicas: 1}}
	starting := &appsv1.Deployment{}
	svc := func(lb []corev1.LoadBalancerIngress, external, cluster []string) *corev1.Service {
		return &corev1.Service{Spec: corev1.ServiceSpec{ExternalIPs: external, ClusterIPs: cluster},
			Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: lb}}}
	}
	ip := func(v string) gwv1.GatewayStatusAddress {
		return gwv1.GatewayStatusAddress{Type: ptr(gwv1.IPAddressType), Value: v}
	}
	host := func(v string) gwv1.GatewayStatusAddress {
		return gwv1.GatewayStatusAddress{Type: ptr(gwv1.HostnameAddressType), Value: v}
	}
	for _, c := range []struct {
		name              string
		st                model.GatewayStatus
		dep               *appsv1.Deployment
		svc               *corev1.Service
		problem           string
		refused           []string
		addresses         []gwv1.GatewayStatusAddress
		programmed        string // "True" or the False reason
		listenerProgramed string
	}{
		{"load balancer", st, ready, svc([]corev1.LoadBalancerIngress{{IP: "203.0.113.7"}, {Hostname: "lb.example.com"}}, []string{"192.0.2.10"}, []string{"10.96.0.10"}), "", nil,
			[]gwv1.GatewayStatusAddress{ip("203.0.113.7"), host("lb.example.com")}, "True", "True"},
		{"external IPs", st, ready, svc(nil, []string{"192.0.2.10", "192.0.2.11"}, []string{"10.96.0.10"}), "", nil,
			[]gwv1.GatewayStatusAddress{ip("192.0.2.10"), ip("192.0.2.11")}, "True", "True"},
		{"cluster IPs", st, ready, svc(nil, nil, []string{"10.96.0.10", "fd00::10"}), "", nil, []gwv1.GatewayStatusAddress{ip("10.96.0.10"), ip("fd00::10")}, "True", "True"},
		{"no replica available", st, starting, svc(nil, nil, []string{"10.96.0.10"}), "", nil, []gwv1.GatewayStatusAddress{ip("10.96.0.10")}, "Pending", "Pending"},
		{"no Deployment", st, nil, svc(nil, nil, []string{"10.96.0.10"}), "", nil, []gwv1.GatewayStatusAddress{ip("10.96.0.10")}, "Pending", "Pending"},
		{"no Service", st, ready, nil, "", nil, nil, "AddressNotAssigned", "Pending"},
		{"refused addresses", st, ready, svc(nil, nil, []string{"10.96.0.10"}), "", []string{"spec.addresses[0]: value 192.0.2.99: not in the ranges", "spec.addresses[1]: value 192.0.2.11: the InternalIP of Node a"},
			[]gwv1.GatewayStatusAddress{ip("10.96.0.10")}, "AddressNotUsable", "Pending"},
		{"a name aether cannot provision", st, nil, nil, "metadata.name: too long", nil, nil, "Invalid", "Invalid"},
		{"not accepted", invalid, ready, svc(nil, nil, []string{"10.96.0.10"}), "", nil, []gwv1.GatewayStatusAddress{ip("10.96.0.10")}, "Invalid", "True"},
	} {
		t.Run(c.name, func(t *testing.T) {
			foreign := metav1.Condition{Type: "example.com/Audited", Status: metav1.ConditionTrue, Reason: "Audited", LastTransitionTime: t1}
			have := gwv1.GatewayStatus{Conditions: []metav1.Condition{foreign}}
			got := Status(have, c.st, c.dep, c.svc, c.problem, c.refused, t1)
			if !equality.Semantic.DeepEqual(got.Addresses, c.addresses) {
				t.Errorf("addresses %v, want %v", got.Addresses, c.addresses)
			}
			p := meta.FindStatusCondition(got.Conditions, "Programmed")
			if p == nil || (c.programmed == "True") != (p.Status == metav1.ConditionTrue) || (c.programmed != "True" && p.Reason != c.programmed) {
				t.Errorf("Programmed %+v, want %s", p, c.programmed)
			}
			if len(c.refused) > 0 && p.Message != strings.Join(c.refused, "; ") {
				t.Errorf("Programmed message %q, want the refusals joined", p.Message)
			}
			a := meta.FindStatusCondition(got.Conditions, "Accepted")
			if a == nil || a.Reason != c.st.Accepted.Reason || a.ObservedGeneration != 3 || p.ObservedGeneration != 3 {
				t.Errorf("Accepted %+v, Programmed %+v: want the model's Accepted, observedGeneration 3", a, p)
			}
			if f := meta.FindStatusCondition(got.Conditions, foreign.Type); f == nil || *f != foreign {
				t.Errorf("another controller's condition %+v, want it kept", f)
			}
			if len(got.Listeners) != 1 {
				t.Fatalf("listeners %+v", got.Listeners)
			}
			l := got.Listeners[0]
			lp := meta.FindStatusCondition(l.Conditions, "Programmed")
			if l.Name != "http" || l.AttachedRoutes != 2 || len(l.SupportedKinds) != 1 || l.SupportedKinds[0].Kind != "HTTPRoute" ||
				*l.SupportedKinds[0].Group != gwv1.GroupName || len(l.Conditions) != 4 || lp == nil ||
				(c.listenerProgramed == "True") != (lp.Status == metav1.ConditionTrue) || (c.listenerProgramed != "True" && lp.Reason != c.listenerProgramed) {
				t.Errorf("listener %+v, want http, 2 routes, HTTPRoute, 4 conditions, Programmed %s", l, c.listenerProgramed)
			}
			// Again an hour later with nothing changed: the same status.
			if again := Status(got, c.st, c.dep, c.svc, c.problem, c.refused, metav1.NewTime(t1.Add(time.Hour))); !equality.Semantic.DeepEqual(again, got) {
				t.Errorf("computed again with nothing changed:\n%+v\nwant\n%+v", again, got)
			}
		})
	}
	// Programmed becoming True later gets the new transition time; Accepted keeps its own.
	first := Status(gwv1.GatewayStatus{}, st, starting, svc(nil, nil, []string{"10.96.0.10"}), "", nil, t1)
	t2 := metav1.NewTime(t1.Add(time.Minute))
	second := Status(first, st, ready, svc(nil, nil, []string{"10.96.0.10"}), "", nil, t2)
	if p := meta.FindStatusCondition(second.Conditions, "Programmed"); p.Status != metav1.ConditionTrue || !p.LastTransitionTime.Equal(&t2) {
		t.Errorf("Programmed %+v, want True since %v", p, t2)
	}
	if a := meta.FindStatusCondition(second.Conditions, "Accepted"); !a.LastTransitionTime.Equal(&t1) {
		t.Errorf("Accepted %+v, want its transition at %v kept", a, t1)
	}
}

// TestClassConditions: a class of aether's controllerName is Accepted, one with a parametersRef
// refused with InvalidParameters naming it; an unchanged status keeps its transition time, and
// Accepts and ClassNames agree (a refused class's Gateways are no one's).
func TestClassConditions(t *testing.T) {
	t1 := metav1.NewTime(time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC))
	ok := &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "aether", Generation: 2}, Spec: gwv1.GatewayClassSpec{ControllerName: model.GatewayControllerName}}
	params := ok.DeepCopy()
	params.Name = "tuned"
	params.Spec.ParametersRef = &gwv1.ParametersReference{Group: "example.com", Kind: "Tuning", Name: "fast"}
	other := &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: gwv1.GatewayClassSpec{ControllerName: "example.com/gw"}}

	c := ClassConditions(ok, t1)
	if a := meta.FindStatusCondition(c, "Accepted"); a == nil || a.Status != metav1.ConditionTrue || a.Reason != "Accepted" || a.ObservedGeneration != 2 {
		t.Errorf("Accepted %+v, want True at generation 2", a)
	}
	ok.Status.Conditions = c
	if again := ClassConditions(ok, metav1.NewTime(t1.Add(time.Hour))); !equality.Semantic.DeepEqual(again, c) {
		t.Errorf("computed again: %+v, want %+v", again, c)
	}
	c = ClassConditions(params, t1)
	if a := meta.FindStatusCondition(c, "Accepted"); a == nil || a.Status != metav1.ConditionFalse || a.Reason != "InvalidParameters" ||
		!strings.Contains(a.Message, `Tuning "fast"`) {
		t.Errorf("Accepted %+v, want False InvalidParameters naming the parametersRef", a)
	}
	if !Accepts(ok) || Accepts(params) || Accepts(other) {
		t.Errorf("Accepts: aether %v, with parameters %v, other controller %v; want true, false, false", Accepts(ok), Accepts(params), Accepts(other))
	}
	names := ClassNames([]*gwv1.GatewayClass{ok, params, other})
	if want := map[string]string{"aether": model.GatewayControllerName, "other": "example.com/gw"}; !equality.Semantic.DeepEqual(names, want) {
		t.Errorf("ClassNames %v, want %v", names, want)
	}
}

// TestNameProblem: a Gateway name gives its edge objects a valid name (a DNS-1035 label) up to 51
// characters; one with a dot, an upper case letter or 52 characters is refused, naming the field,
// the value and the limit.
func TestNameProblem(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"web", true}, {strings.Repeat("a", 51), true}, {strings.Repeat("a", 52), false}, {"web.example", false}, {"9web", false},
	} {
		p := NameProblem(c.name)
		if (p == "") != c.ok {
			t.Errorf("NameProblem(%q) = %q, want ok %v", c.name, p, c.ok)
		}
		if !c.ok && (!strings.Contains(p, "metadata.name \""+c.name+"\"") || !strings.Contains(p, "at most 51 characters")) {
			t.Errorf("NameProblem(%q) = %q, want the field, the value and the limit named", c.name, p)
		}
	}
}
