package gateway

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/aethermesh/aether/model"
)

// maxMessage is the longest condition message written, in bytes (metav1.Condition allows 32768).
const maxMessage = 2048

// maxAddresses is the most entries GatewayStatus.addresses holds (maxItems in the CRD).
const maxAddresses = 16

// Accepts reports whether aether accepts GatewayClass gc: its spec.controllerName is
// model.GatewayControllerName and it has no parametersRef (aether takes no parameters). Only the
// Gateways of a class it accepts are aether's.
func Accepts(gc *gwv1.GatewayClass) bool {
	return gc.Spec.ControllerName == model.GatewayControllerName && gc.Spec.ParametersRef == nil
}

// ClassNames is model.GatewayInputs.Classes for classes: every class's controllerName by name,
// but for the classes of model.GatewayControllerName that aether does not accept (Accepts), which
// are left out, so their Gateways are no one's.
func ClassNames(classes []*gwv1.GatewayClass) map[string]string {
	out := make(map[string]string, len(classes))
	for _, gc := range classes {
		if gc.Spec.ControllerName == model.GatewayControllerName && !Accepts(gc) {
			continue
		}
		out[gc.Name] = string(gc.Spec.ControllerName)
	}
	return out
}

// ClassConditions returns the conditions GatewayClass gc (one of aether's controllerName) should
// hold: have with Accepted set to True (reason Accepted), or False with reason InvalidParameters
// when gc has a parametersRef; observedGeneration gc's generation, lastTransitionTime now when the
// status changed (meta.SetStatusCondition). Conditions of other types are kept.
func ClassConditions(gc *gwv1.GatewayClass, now metav1.Time) []metav1.Condition {
	out := slices.Clone(gc.Status.Conditions)
	c := metav1.Condition{Type: string(gwv1.GatewayClassConditionStatusAccepted), Status: metav1.ConditionTrue,
		Reason: string(gwv1.GatewayClassReasonAccepted), Message: "aether serves the Gateways of this class",
		ObservedGeneration: gc.Generation, LastTransitionTime: now}
	if p := gc.Spec.ParametersRef; p != nil {
		c.Status, c.Reason = metav1.ConditionFalse, string(gwv1.GatewayClassReasonInvalidParameters)
		c.Message = fmt.Sprintf("spec.parametersRef %s %q (group %q): aether takes no parameters; remove parametersRef", p.Kind, p.Name, p.Group)
	}
	meta.SetStatusCondition(&out, c)
	return out
}

// Addresses are the addresses clients reach the edge Service svc at, as GatewayStatus.addresses:
// its load balancer's status.loadBalancer.ingress (IP, or Hostname), else its spec.externalIPs
// (the Gateway's IPAddress addresses, on a node), else its ClusterIPs (in-cluster clients reach
// the Gateway there). None for a nil svc, or a Service with none of them yet.
func Addresses(svc *corev1.Service) []gwv1.GatewayStatusAddress {
	if svc == nil {
		return nil
	}
	ip, host := gwv1.IPAddressType, gwv1.HostnameAddressType
	var out []gwv1.GatewayStatusAddress
	add := func(t *gwv1.AddressType, v string) {
		a := gwv1.GatewayStatusAddress{Type: t, Value: v}
		if v != "" && v != corev1.ClusterIPNone && len(out) < maxAddresses && !slices.ContainsFunc(out, func(o gwv1.GatewayStatusAddress) bool { return o.Value == v }) {
			out = append(out, a)
		}
	}
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if in.IP != "" {
			add(&ip, in.IP)
		} else {
			add(&host, in.Hostname)
		}
	}
	if len(out) == 0 {
		for _, e := range svc.Spec.ExternalIPs {
			add(&ip, e)
		}
	}
	if len(out) == 0 {
		for _, c := range svc.Spec.ClusterIPs {
			add(&ip, c)
		}
		if len(svc.Spec.ClusterIPs) == 0 {
			add(&ip, svc.Spec.ClusterIP)
		}
	}
	return out
}

// available reports whether Deployment d has at least one available replica.
func available(d *appsv1.Deployment) bool { return d != nil && d.Status.AvailableReplicas > 0 }

// Status returns the status Gateway gw should hold: have (gw.Status) with the Accepted and
// Programmed conditions and the listeners of st (what model.ResolveGateways found), addresses
// Addresses(svc), every condition at observedGeneration st.Generation. Programmed is st's when
// that is False; else False with reason Invalid when the Gateway cannot have an edge data plane
// (problem, NameProblem's), else False with reason AddressNotUsable when an address spec.addresses
// asks for was refused (refused, AddressAssignment.Refused: the message joins them), else True
// only when the edge Deployment dep has an available replica and an address is known, else False
// with reason AddressNotAssigned (no address) or Pending (no available replica). A listener's Programmed=True becomes False with the Gateway's (reason
// Invalid, or Pending). A condition whose status did not change keeps its lastTransitionTime;
// conditions of other types are kept.
func Status(have gwv1.GatewayStatus, st model.GatewayStatus, dep *appsv1.Deployment, svc *corev1.Service, problem string, refused []string, now metav1.Time) gwv1.GatewayStatus {
	out := gwv1.GatewayStatus{Addresses: Addresses(svc), Conditions: slices.Clone(have.Conditions), AttachedListenerSets: have.AttachedListenerSets}
	programmed, listenerReason := st.Programmed, ""
	if programmed.Status {
		edge := st.Key.Namespace + "/" + model.EdgeServiceAccountName(st.Key.Name)
		switch {
		case problem != "":
			programmed = model.Condition{Reason: string(gwv1.GatewayReasonInvalid), Message: problem}
			listenerReason = string(gwv1.ListenerReasonInvalid)
		case len(refused) > 0:
			programmed = model.Condition{Reason: string(gwv1.GatewayReasonAddressNotUsable), Message: strings.Join(refused, "; ")}
			listenerReason = string(gwv1.ListenerReasonPending)
		case len(out.Addresses) == 0:
			programmed = model.Condition{Reason: string(gwv1.GatewayReasonAddressNotAssigned), Message: "the edge Service " + edge + " has no address yet"}
			listenerReason = string(gwv1.ListenerReasonPending)
		case !available(dep):
			programmed = model.Condition{Reason: string(gwv1.GatewayReasonPending), Message: "waiting for the edge Deployment " + edge + " to have an available replica"}
			listenerReason = string(gwv1.ListenerReasonPending)
		}
	}
	meta.SetStatusCondition(&out.Conditions, condition(string(gwv1.GatewayConditionAccepted), st.Accepted, st.Generation, now))
	meta.SetStatusCondition(&out.Conditions, condition(string(gwv1.GatewayConditionProgrammed), programmed, st.Generation, now))
	for _, l := range st.Listeners {
		var conds []metav1.Condition
		if i := slices.IndexFunc(have.Listeners, func(h gwv1.ListenerStatus) bool { return string(h.Name) == l.Name }); i >= 0 {
			conds = slices.Clone(have.Listeners[i].Conditions)
		}
		lp := l.Programmed
		if lp.Status && listenerReason != "" {
			lp = model.Condition{Reason: listenerReason, Message: "the Gateway is not programmed: " + programmed.Message}
		}
		for _, c := range []struct {
			typ gwv1.ListenerConditionType
			c   model.Condition
		}{
			{gwv1.ListenerConditionAccepted, l.Accepted}, {gwv1.ListenerConditionProgrammed, lp},
			{gwv1.ListenerConditionResolvedRefs, l.ResolvedRefs}, {gwv1.ListenerConditionConflicted, l.Conflicted},
		} {
			meta.SetStatusCondition(&conds, condition(string(c.typ), c.c, st.Generation, now))
		}
		var kinds []gwv1.RouteGroupKind
		for _, k := range l.SupportedKinds {
			g := gwv1.Group(k.Group)
			kinds = append(kinds, gwv1.RouteGroupKind{Group: &g, Kind: gwv1.Kind(k.Kind)})
		}
		out.Listeners = append(out.Listeners, gwv1.ListenerStatus{Name: gwv1.SectionName(l.Name), SupportedKinds: kinds,
			AttachedRoutes: l.AttachedRoutes, Conditions: conds})
	}
	return out
}

// condition is c as a condition of type typ.
func condition(typ string, c model.Condition, generation int64, now metav1.Time) metav1.Condition {
	status := metav1.ConditionFalse
	if c.Status {
		status = metav1.ConditionTrue
	}
	reason := c.Reason
	if reason == "" { // the API requires one
		reason = typ
	}
	msg := c.Message
	if len(msg) > maxMessage {
		keep := maxMessage - len(" [...]")
		for keep > 0 && !utf8.RuneStart(msg[keep]) {
			keep--
		}
		msg = msg[:keep] + " [...]"
	}
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: generation, LastTransitionTime: now}
}
