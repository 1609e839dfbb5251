package authzstatus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sec "github.com/aethermesh/aether/api/aether/security/v1alpha1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar/configexport"
	"github.com/aethermesh/aether/registrar/routestatus"
)

// peerAuthnPass resolves every PeerAuthentication (model.ResolvePeerAuthns) and writes each
// status that differs, by server-side apply of the Accepted condition (FieldManager). It returns
// the write errors, joined; nothing before the watch has synced (its sync brings a pass).
func (c *Controller) peerAuthnPass(ctx context.Context) error {
	if !c.peerAuthns.Known() {
		return nil
	}
	policies := c.peerAuthns.Policies()
	byKey := make(map[model.ServiceKey]*sec.PeerAuthentication, len(policies))
	for _, p := range policies {
		byKey[model.ServiceKey{Namespace: p.Namespace, Name: p.Name}] = p
	}
	now := metav1.Now()
	var errs []error
	for _, r := range model.ResolvePeerAuthns(policies) {
		p := byKey[model.ServiceKey{Namespace: r.Namespace, Name: r.Name}]
		if st, changed := PeerAuthnStatus(p, r, now); changed {
			errs = append(errs, c.apply(ctx, "PeerAuthentication", p, &st))
		}
	}
	return errors.Join(errs...)
}

// PeerAuthnStatus returns the status PeerAuthentication p should hold given what
// model.ResolvePeerAuthns found for it (r), and whether it differs from p.Status in the Accepted
// condition (what FieldManager owns):
//   - Accepted False, reason Invalid, when a field is refused: the message says what applies
//     instead (STRICT on every port of its pods, or no pod when the selector is refused), then
//     each refusal (field, value, reason);
//   - else Accepted False, reason Conflicted, when an older namespace-wide policy of the
//     namespace decides instead (r.OverriddenBy, named in the message);
//   - else Accepted True, reason Accepted.
//
// The condition's observedGeneration is r.Generation; its lastTransitionTime is kept while its
// status holds, now when it changes (configexport.MergeCondition). Messages are cut at
// routestatus.MaxMessage bytes.
func PeerAuthnStatus(p *sec.PeerAuthentication, r model.PeerAuthnResolved, now metav1.Time) (sec.PeerAuthenticationStatus, bool) {
	cond := metav1.Condition{Type: sec.ConditionAccepted}
	switch {
	case !r.Valid():
		msgs := make([]string, len(r.Errors))
		for i, e := range r.Errors {
			msgs[i] = e.Error()
		}
		head := "invalid: its pods are STRICT on every port until it is fixed: "
		if slices.ContainsFunc(r.Errors, func(e model.AuthzFieldError) bool { return e.Field == "spec.selector" }) {
			head = "invalid: it selects no pod until it is fixed (the pods keep their namespace's mode): "
		}
		if r.OverriddenBy != "" {
			head = "invalid, and overridden by the older namespace-wide policy " + r.OverriddenBy + ": "
		}
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, sec.ReasonInvalid, head+strings.Join(msgs, "; ")
	case r.OverriddenBy != "":
		cond.Status, cond.Reason = metav1.ConditionFalse, sec.ReasonConflicted
		cond.Message = fmt.Sprintf("the namespace-wide policy %s is older and decides for namespace %s: this one applies to no pod (one namespace-wide policy per namespace)",
			r.OverriddenBy, r.Namespace)
	default:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, sec.ReasonAccepted, "the policy applies"
	}
	cond.Message = routestatus.Cut(cond.Message, routestatus.MaxMessage)
	cond, changed := configexport.MergeCondition(p.Status.Conditions, cond, "", r.Generation, now)
	var st sec.PeerAuthenticationStatus
	meta.SetStatusCondition(&st.Conditions, cond)
	return st, changed
}
