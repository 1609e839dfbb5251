package routestatus

import (
	"slices"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/aethermesh/aether/model"
)

// maxMessage is the longest condition message the API accepts (metav1.Condition.Message,
// maxLength 32768 bytes).
const maxMessage = 32768

// ownTypes are the condition types of aether's status.parents entries.
var ownTypes = []string{
	string(gwv1.RouteConditionAccepted),
	string(gwv1.RouteConditionResolvedRefs),
	string(gwv1.RouteConditionPartiallyInvalid),
}

// ParentStatuses returns the status.parents a route should hold: have (its current
// status.parents) with aether's entries (controllerName model.GatewayControllerName) replaced by
// one entry per parent of st, whose parentRef is refs[Index] (the route's spec.parentRefs)
// copied as it is.
//
// Each entry has the Accepted and ResolvedRefs conditions, and PartiallyInvalid when st sets it,
// with observedGeneration st.Generation; a condition whose status did not change keeps its
// lastTransitionTime (meta.SetStatusCondition), one that is new or changed gets now. Entries of
// other controllers stay as and where they are; aether's entry for a parentRef that is no longer
// in st is removed; an entry for a parentRef aether had none for is appended. When nothing
// changed, the result is equal (equality.Semantic) to have, so a caller writes only on a
// difference. Messages over 32768 bytes are cut. ParentStatuses does not change its arguments.
func ParentStatuses(have []gwv1.RouteParentStatus, refs []gwv1.ParentReference, st model.RouteStatus, now metav1.Time) []gwv1.RouteParentStatus {
	ours := func(p gwv1.RouteParentStatus) bool { return p.ControllerName == model.GatewayControllerName }
	var want []gwv1.RouteParentStatus
	for _, p := range st.Parents {
		if p.Index < 0 || p.Index >= len(refs) {
			continue
		}
		ref := refs[p.Index]
		if slices.ContainsFunc(want, func(w gwv1.RouteParentStatus) bool { return sameRef(w.ParentRef, ref) }) {
			continue // the same parentRef twice (the CRD refuses it): one entry
		}
		var conds []metav1.Condition
		if i := slices.IndexFunc(have, func(h gwv1.RouteParentStatus) bool { return ours(h) && sameRef(h.ParentRef, ref) }); i >= 0 {
			for _, c := range have[i].Conditions {
				if slices.Contains(ownTypes, c.Type) && meta.FindStatusCondition(conds, c.Type) == nil {
					conds = append(conds, c)
				}
			}
		}
		meta.SetStatusCondition(&conds, condition(gwv1.RouteConditionAccepted, p.Accepted, st.Generation, now))
		meta.SetStatusCondition(&conds, condition(gwv1.RouteConditionResolvedRefs, p.ResolvedRefs, st.Generation, now))
		if p.PartiallyInvalid != nil {
			meta.SetStatusCondition(&conds, condition(gwv1.RouteConditionPartiallyInvalid, *p.PartiallyInvalid, st.Generation, now))
		} else {
			meta.RemoveStatusCondition(&conds, string(gwv1.RouteConditionPartiallyInvalid))
		}
		want = append(want, gwv1.RouteParentStatus{
			ParentRef: *ref.DeepCopy(), ControllerName: model.GatewayControllerName, Conditions: conds,
		})
	}

	out := make([]gwv1.RouteParentStatus, 0, len(have)+len(want))
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
	return out
}

// sameRef reports whether two parentRefs are the same one (every field equal, as the status
// entry echoes the spec's).
func sameRef(a, b gwv1.ParentReference) bool { return equality.Semantic.DeepEqual(a, b) }

// condition is c as a route condition of type typ.
func condition(typ gwv1.RouteConditionType, c model.Condition, generation int64, now metav1.Time) metav1.Condition {
	status := metav1.ConditionFalse
	if c.Status {
		status = metav1.ConditionTrue
	}
	reason := c.Reason
	if reason == "" { // the API requires one; the model always gives one
		reason = string(typ)
	}
	return metav1.Condition{
		Type: string(typ), Status: status, Reason: reason, Message: cut(c.Message, maxMessage),
		ObservedGeneration: generation, LastTransitionTime: now,
	}
}

// cut shortens s to at most n bytes, on a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
