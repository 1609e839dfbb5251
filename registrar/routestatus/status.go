package routestatus

import (
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/aethermesh/aether/model"
)

// MaxParents is the most entries a route's status.parents holds (RouteStatus.Parents,
// maxItems 32 in the v1.6.3 CRDs); the API server refuses a status with more.
const MaxParents = 32

// MaxMessage is the longest condition message aether writes, in bytes (the API allows 32768,
// metav1.Condition.Message). It bounds what a route can make aether write: a route may name
// up to 32 parents, each with up to three conditions, and the whole object must stay under
// etcd's request limit (1.5 MiB by default) beside a spec that may be large itself.
const MaxMessage = 2048

// ownTypes are the condition types of aether's status.parents entries.
var ownTypes = []string{
	string(gwv1.RouteConditionAccepted),
	string(gwv1.RouteConditionResolvedRefs),
	string(gwv1.RouteConditionPartiallyInvalid),
}

// ParentCondition is a condition another part of the registrar sets in aether's status entry of one
// mesh parentRef of a route (ConfigHook: configexport's aether.io/BackendsExported). Type must
// not be one of the Gateway API's route condition types.
type ParentCondition struct {
	// Index is the parentRef's index in spec.parentRefs.
	Index int
	// Type is the condition type, a domain-prefixed name (aether.io/...).
	Type string
	model.Condition
}

// ParentStatuses returns the status.parents a route should hold: have (its current
// status.parents) with aether's entries (controllerName model.GatewayControllerName) replaced by
// one entry per parent of st whose parentRef, refs[Index] (the route's spec.parentRefs), is a
// mesh parent (kind Service in the core group, or ServiceImport in multicluster.x-k8s.io) and
// one per parent of gst (what model.ResolveGateways found for the route's parentRefs to aether's
// Gateways) whose parentRef is a Gateway (gateway.networking.k8s.io), with the API's defaults
// group gateway.networking.k8s.io and kind Gateway for unset fields, each parentRef copied as it
// is. A parent whose Index is outside refs or whose parentRef is not of its kind gets no entry;
// aether's entry for any other parentRef (another controller's Gateway, a kind nobody serves) is
// removed.
//
// A mesh entry has the Accepted and ResolvedRefs conditions, PartiallyInvalid when st sets it,
// and the conditions of extra with its parentRef's index (any other condition type it holds is
// removed), with observedGeneration st.Generation; a Gateway entry has Accepted and ResolvedRefs at
// gst.Generation. A condition whose status did not change keeps its lastTransitionTime
// (meta.SetStatusCondition), one that is new or changed gets now. Entries of other controllers
// stay as and where they are; aether's entry for a parentRef that is no longer in st or gst is
// removed; an entry for a parentRef aether had none for is appended, in the order of
// spec.parentRefs. When nothing changed, the result is equal to have (equalParents,
// equality.Semantic alike), so a caller writes only on a difference. Messages over MaxMessage
// bytes are cut.
//
// status.parents holds at most MaxParents entries: when other controllers' entries and aether's
// would exceed it, aether's are kept in the order of spec.parentRefs up to what fits and omitted
// is how many were left out (0 when all fit). ParentStatuses does not change its arguments.
func ParentStatuses(have []gwv1.RouteParentStatus, refs []gwv1.ParentReference, st model.RouteStatus, gst model.GatewayRouteStatus, extra []ParentCondition, now metav1.Time) (out []gwv1.RouteParentStatus, omitted int) {
	ours := func(p gwv1.RouteParentStatus) bool { return p.ControllerName == model.GatewayControllerName }
	type entry struct {
		index  int
		status gwv1.RouteParentStatus
	}
	var entries []entry
	add := func(index int, kindOK func(gwv1.ParentReference) bool, keep []string, set func(conds *[]metav1.Condition)) {
		if index < 0 || index >= len(refs) || !kindOK(refs[index]) {
			return
		}
		ref := refs[index]
		if slices.ContainsFunc(entries, func(e entry) bool { return sameRef(e.status.ParentRef, ref) }) {
			return // the same parentRef twice (the CRD refuses it): one entry
		}
		var conds []metav1.Condition
		if i := slices.IndexFunc(have, func(h gwv1.RouteParentStatus) bool { return ours(h) && sameRef(h.ParentRef, ref) }); i >= 0 {
			for _, c := range have[i].Conditions {
				if (slices.Contains(ownTypes, c.Type) || slices.Contains(keep, c.Type)) && meta.FindStatusCondition(conds, c.Type) == nil {
					conds = append(conds, c)
				}
			}
		}
		set(&conds)
		entries = append(entries, entry{index, gwv1.RouteParentStatus{
			ParentRef: *ref.DeepCopy(), ControllerName: model.GatewayControllerName, Conditions: conds,
		}})
	}
	for _, p := range st.Parents {
		var keep []string
		for _, x := range extra {
			if x.Index == p.Index && !slices.Contains(ownTypes, x.Type) {
				keep = append(keep, x.Type)
			}
		}
		add(p.Index, meshParent, keep, func(conds *[]metav1.Condition) {
			meta.SetStatusCondition(conds, condition(string(gwv1.RouteConditionAccepted), p.Accepted, st.Generation, now))
			meta.SetStatusCondition(conds, condition(string(gwv1.RouteConditionResolvedRefs), p.ResolvedRefs, st.Generation, now))
			if p.PartiallyInvalid != nil {
				meta.SetStatusCondition(conds, condition(string(gwv1.RouteConditionPartiallyInvalid), *p.PartiallyInvalid, st.Generation, now))
			} else {
				meta.RemoveStatusCondition(conds, string(gwv1.RouteConditionPartiallyInvalid))
			}
			for _, x := range extra {
				if x.Index == p.Index && slices.Contains(keep, x.Type) {
					meta.SetStatusCondition(conds, condition(x.Type, x.Condition, st.Generation, now))
				}
			}
		})
	}
	for _, p := range gst.Parents {
		add(p.Index, gatewayParent, nil, func(conds *[]metav1.Condition) {
			meta.SetStatusCondition(conds, condition(string(gwv1.RouteConditionAccepted), p.Accepted, gst.Generation, now))
			meta.SetStatusCondition(conds, condition(string(gwv1.RouteConditionResolvedRefs), p.ResolvedRefs, gst.Generation, now))
			meta.RemoveStatusCondition(conds, string(gwv1.RouteConditionPartiallyInvalid))
		})
	}
	slices.SortStableFunc(entries, func(a, b entry) int { return a.index - b.index })
	want := make([]gwv1.RouteParentStatus, len(entries))
	for i, e := range entries {
		want[i] = e.status
	}
	others := 0
	for _, h := range have {
		if !ours(h) {
			others++
		}
	}
	if room := max(MaxParents-others, 0); len(want) > room {
		omitted, want = len(want)-room, want[:room]
	}

	out = make([]gwv1.RouteParentStatus, 0, len(have)+len(want))
	placed := make([]bool, len(want))
	for _, h := range have {
		if !ours(h) {
			out = append(out, *h.DeepCopy())
			continue
		}
		i := slices.IndexFunc(want, func(w gwv1.RouteParentStatus) bool { return sameRef(w.ParentRef, h.ParentRef) })
		if i < 0 || placed[i] {
			continue // its parentRef is gone (or a second entry of ours for it)
		}
		placed[i] = true
		out = append(out, want[i])
	}
	for i, w := range want {
		if !placed[i] {
			out = append(out, w)
		}
	}
	return out, omitted
}

// meshParent reports whether parentRef p names a Service (core group) or a ServiceImport
// (multicluster.x-k8s.io), the parents of mesh routes (GEP-1294, GEP-1748).
func meshParent(p gwv1.ParentReference) bool {
	group, kind := parentKind(p)
	return (group == "" && kind == "Service") || (group == "multicluster.x-k8s.io" && kind == "ServiceImport")
}

// gatewayParent reports whether parentRef p names a Gateway (gateway.networking.k8s.io).
func gatewayParent(p gwv1.ParentReference) bool {
	group, kind := parentKind(p)
	return group == gwv1.GroupName && kind == "Gateway"
}

// parentKind returns the group and kind of parentRef p; unset, they are the API's defaults,
// gateway.networking.k8s.io and Gateway (model.HTTPRouteModel reads them the same way).
func parentKind(p gwv1.ParentReference) (group, kind string) {
	group, kind = gwv1.GroupName, "Gateway"
	if p.Group != nil {
		group = string(*p.Group)
	}
	if p.Kind != nil {
		kind = string(*p.Kind)
	}
	return group, kind
}

// sameRef reports whether two parentRefs are the same one (every field equal, as the status
// entry echoes the spec's). It compares the fields of gwv1.ParentReference one by one, without
// reflection (a pass compares every route's entries); TestComparedFields fails when the type
// gains a field.
func sameRef(a, b gwv1.ParentReference) bool {
	return a.Name == b.Name && same(a.Group, b.Group) && same(a.Kind, b.Kind) && same(a.Namespace, b.Namespace) &&
		same(a.SectionName, b.SectionName) && same(a.Port, b.Port)
}

// same reports whether two optional values are both unset or both set and equal.
func same[T comparable](a, b *T) bool { return a == b || (a != nil && b != nil && *a == *b) }

// equalParents reports whether two status.parents are equal as equality.Semantic.DeepEqual says
// (nil and empty lists are equal, times compare as instants), field by field without reflection.
// TestComparedFields fails when gwv1.RouteParentStatus or metav1.Condition gains a field.
func equalParents(a, b []gwv1.RouteParentStatus) bool {
	return slices.EqualFunc(a, b, func(x, y gwv1.RouteParentStatus) bool {
		return x.ControllerName == y.ControllerName && sameRef(x.ParentRef, y.ParentRef) &&
			slices.EqualFunc(x.Conditions, y.Conditions, func(c, d metav1.Condition) bool {
				return c.Type == d.Type && c.Status == d.Status && c.ObservedGeneration == d.ObservedGeneration &&
					c.LastTransitionTime.Equal(&d.LastTransitionTime) && c.Reason == d.Reason && c.Message == d.Message
			})
	})
}

// condition is c as a route condition of type typ.
func condition(typ string, c model.Condition, generation int64, now metav1.Time) metav1.Condition {
	status := metav1.ConditionFalse
	if c.Status {
		status = metav1.ConditionTrue
	}
	reason := c.Reason
	if reason == "" { // the API requires one; the model always gives one
		reason = typ[strings.LastIndex(typ, "/")+1:]
	}
	return metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: Cut(c.Message, MaxMessage),
		ObservedGeneration: generation, LastTransitionTime: now,
	}
}

// Cut shortens a condition message s to at most n bytes: a longer s is cut on a rune boundary
// and ends with " [... N bytes cut]".
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// The note's length depends on the count it prints; the count's digits are at most len(s)'s.
	keep := n - len(" [... ") - len(strconv.Itoa(len(s))) - len(" bytes cut]")
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + " [... " + strconv.Itoa(len(s)-keep) + " bytes cut]"
}
