// Package authzstatus is the registrar's status writer of aether's security policies
// (security.aether.io/v1alpha1, issue #32): for each AuthorizationPolicy of its cluster it writes
// the Accepted condition and the targets the policy applies to, from what model.ResolveAuthz
// finds, and for each PeerAuthentication the Accepted condition (Invalid, Conflicted), from what
// model.ResolvePeerAuthns finds, so that the status says what every agent of the cluster
// enforces. It is the only writer of that status in its cluster (the elected registrar) and
// writes nothing else: no policy spec, no Envoy config (package xds), no capture rule, no
// registry record.
package authzstatus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	sec "github.com/aethermesh/aether/api/aether/security/v1alpha1"
	"github.com/aethermesh/aether/internal/policysource"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar/configexport"
	"github.com/aethermesh/aether/registrar/routestatus"
)

// FieldManager is the server-side apply field manager of the status written here: it owns the
// Accepted condition and status.targets, nothing else.
const FieldManager = "aether-authz-status"

// DefaultPassDelay is how long a pass waits after the change that asks for it.
const DefaultPassDelay = 200 * time.Millisecond

// syncAll is the one request of the controller's queue: every change asks for the same pass over
// every policy, so a burst of changes is one pass.
var syncAll = reconcile.Request{}

// Controller writes every AuthorizationPolicy's status (Status) from the cluster's policies and
// Services, and every PeerAuthentication's (PeerAuthnStatus) from the cluster's
// PeerAuthentications. Each kind is watched once its CRD is installed (policysource.Source:
// looked up in discovery at start and every CRDRecheck until it is there; until then there is
// nothing of it to write); Services come from the manager's cache. A policy is written, by server-side apply of
// the fields FieldManager owns, only when what it holds differs from what the pass found; a write
// that fails is retried with the pass (back-off). It runs on the elected leader only (a
// controller-runtime controller).
type Controller struct {
	// Client reads Services (the manager's cache) and writes the policies' status. Required.
	Client client.Client
	// Dynamic watches the policies; Discovery tells whether their CRD is installed. Required.
	Dynamic   dynamic.Interface
	Discovery discovery.DiscoveryInterface
	// Log receives the controller's logs. Required.
	Log *slog.Logger
	// CRDRecheck is how often a missing CRD is looked for again (default
	// policysource.DefaultRecheck).
	CRDRecheck time.Duration
	// PassDelay is how long a pass waits after the first change that asks for it (default
	// DefaultPassDelay).
	PassDelay time.Duration
	// RateLimiter, when set, replaces the default back-off of a pass that failed.
	RateLimiter workqueue.TypedRateLimiter[reconcile.Request]
	// SkipNameValidation allows several controllers of this name in one process (tests).
	SkipNameValidation bool

	policies   *policysource.AuthorizationPolicies
	peerAuthns *policysource.PeerAuthentications
	writes     atomic.Int64 // status applies sent, for tests
}

var _ reconcile.Reconciler = &Controller{}

// +kubebuilder:rbac:groups=security.aether.io,resources=authorizationpolicies;peerauthentications,verbs=get;list;watch
// +kubebuilder:rbac:groups=security.aether.io,resources=authorizationpolicies/status;peerauthentications/status,verbs=update;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch

// Reconcile is one pass over both kinds (authzPass, peerAuthnPass); it returns their errors,
// joined (the pass is retried).
func (c *Controller) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	return reconcile.Result{}, errors.Join(c.authzPass(ctx), c.peerAuthnPass(ctx))
}

// authzPass resolves every AuthorizationPolicy (model.ResolveAuthz, a Service target found when
// the Service exists in the policy's namespace) and writes each status that differs. It returns
// the write errors, joined, or the cache's error; nothing before the watch has synced (its sync
// brings a pass).
func (c *Controller) authzPass(ctx context.Context) error {
	if !c.policies.Known() {
		return nil
	}
	policies := c.policies.Policies()
	if len(policies) == 0 {
		return nil
	}
	var svcs corev1.ServiceList
	if err := c.Client.List(ctx, &svcs, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("authorization policy status: list Services: %w", err)
	}
	exists := make(map[model.ServiceKey]bool, len(svcs.Items))
	for i := range svcs.Items {
		exists[model.ServiceKey{Namespace: svcs.Items[i].Namespace, Name: svcs.Items[i].Name}] = true
	}
	resolved := model.ResolveAuthz(policies, func(k model.ServiceKey) bool { return exists[k] })
	now := metav1.Now()
	var errs []error
	byKey := make(map[model.ServiceKey]*sec.AuthorizationPolicy, len(policies))
	for _, p := range policies {
		byKey[model.ServiceKey{Namespace: p.Namespace, Name: p.Name}] = p
	}
	for _, r := range resolved {
		p := byKey[model.ServiceKey{Namespace: r.Namespace, Name: r.Name}]
		if st, changed := Status(p, r, now); changed {
			errs = append(errs, c.apply(ctx, "AuthorizationPolicy", p, &st))
		}
	}
	return errors.Join(errs...)
}

// apply writes status st of object p, of kind (of security.aether.io/v1alpha1), by server-side
// apply of the fields FieldManager owns, and counts the write. It returns the error, naming the
// kind and the object.
func (c *Controller) apply(ctx context.Context, kind string, p metav1.Object, st any) error {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(st)
	if err != nil {
		return fmt.Errorf("%s status %s/%s: %w", kind, p.GetNamespace(), p.GetName(), err)
	}
	if err := configexport.ApplyStatus(ctx, c.Client, sec.GroupVersion.WithKind(kind), p.GetNamespace(), p.GetName(), FieldManager, m); err != nil {
		return fmt.Errorf("%s status: %w", kind, err)
	}
	c.writes.Add(1)
	c.Log.Debug("status written", "kind", kind, "policy", p.GetNamespace()+"/"+p.GetName(), "generation", p.GetGeneration())
	return nil
}

// Status returns the status policy p should hold given what model.ResolveAuthz found for it (r),
// and whether it differs from p.Status in what FieldManager owns (the Accepted condition and
// targets):
//   - Accepted False, reason Invalid, when a field is refused: the message says whether nothing of
//     the policy applies or, for a DENY policy with valid targets, that it fails closed, then
//     each refusal (field, value, reason);
//   - else Accepted False, reason TargetNotFound, when no target was found: the message names the
//     missing Services;
//   - else Accepted True, reason Accepted; the message names any missing Service.
//
// Targets are the targetRefs the policy applies to (those found, in spec order; none when nothing
// of it applies). The condition's observedGeneration is r.Generation; its lastTransitionTime is
// kept while its status holds, now when it changes (configexport.MergeCondition). Messages are cut
// at routestatus.MaxMessage bytes.
func Status(p *sec.AuthorizationPolicy, r model.AuthzResolved, now metav1.Time) (sec.AuthorizationPolicyStatus, bool) {
	cond := metav1.Condition{Type: sec.ConditionAccepted}
	var missing string
	if m := r.Missing(); len(m) > 0 {
		missing = fmt.Sprintf("Service %s not found in namespace %s", strings.Join(quoted(m), ", "), r.Namespace)
	}
	switch {
	case !r.Valid():
		msgs := make([]string, len(r.Errors))
		for i, e := range r.Errors {
			msgs[i] = e.Error()
		}
		head := "invalid: nothing of the policy applies: "
		switch {
		case r.Policy != nil && r.Policy.FailClosed:
			head = "invalid: as a DENY policy it fails closed: every caller of its targets is refused until it is fixed: "
		case r.Policy != nil:
			head = "invalid: it fails closed as an ALLOW policy that allows nothing: its targets accept only what their other ALLOW policies allow until it is fixed: "
		}
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, sec.ReasonInvalid, head+strings.Join(msgs, "; ")
	case r.Policy == nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, sec.ReasonTargetNotFound, "no target found: "+missing
	default:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, sec.ReasonAccepted, "the policy applies to its targets"
		if missing != "" {
			cond.Message = "the policy applies to the targets found; " + missing
		}
	}
	cond.Message = routestatus.Cut(cond.Message, routestatus.MaxMessage)
	cond, condChanged := configexport.MergeCondition(p.Status.Conditions, cond, "", r.Generation, now)
	var targets []sec.PolicyTargetReferenceWithLabelSelectors
	if r.Policy != nil {
		for _, t := range r.Targets {
			if t.Found && t.Index < len(p.Spec.TargetRefs) {
				targets = append(targets, *p.Spec.TargetRefs[t.Index].DeepCopy())
			}
		}
	}
	st := sec.AuthorizationPolicyStatus{Targets: targets}
	meta.SetStatusCondition(&st.Conditions, cond)
	return st, condChanged || !equality.Semantic.DeepEqual(targets, p.Status.Targets)
}

func quoted(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

// SetupWithManager registers the controller (leader only): its policy watches (one per kind)
// start with it and, like every Service event of the manager's cache, ask for a pass PassDelay
// later.
func (c *Controller) SetupWithManager(mgr ctrl.Manager) error {
	if c.Client == nil || c.Dynamic == nil || c.Discovery == nil || c.Log == nil {
		return errors.New("set up authorization policy status controller: Client, Dynamic, Discovery and Log are required")
	}
	if c.PassDelay <= 0 {
		c.PassDelay = DefaultPassDelay
	}
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	later := func(q queue) { q.AddAfter(syncAll, c.PassDelay) }
	all := handler.Funcs{
		CreateFunc:  func(_ context.Context, _ event.CreateEvent, q queue) { later(q) },
		UpdateFunc:  func(_ context.Context, _ event.UpdateEvent, q queue) { later(q) },
		DeleteFunc:  func(_ context.Context, _ event.DeleteEvent, q queue) { later(q) },
		GenericFunc: func(_ context.Context, _ event.GenericEvent, q queue) { later(q) },
	}
	c.policies = &policysource.AuthorizationPolicies{Resource: sec.Resource, Dynamic: c.Dynamic, Discovery: c.Discovery, Log: c.Log, Recheck: c.CRDRecheck}
	c.peerAuthns = &policysource.PeerAuthentications{Resource: sec.PeerAuthenticationResource, Dynamic: c.Dynamic, Discovery: c.Discovery, Log: c.Log, Recheck: c.CRDRecheck}
	opts := controller.Options{MaxConcurrentReconciles: 1, RateLimiter: c.RateLimiter}
	if c.SkipNameValidation {
		opts.SkipNameValidation = &c.SkipNameValidation
	}
	err := ctrl.NewControllerManagedBy(mgr).
		Named("authzstatus").
		WatchesRawSource(source.Func(func(ctx context.Context, q queue) error {
			c.policies.OnChange = func() { later(q) }
			c.peerAuthns.OnChange = func() { later(q) }
			// A watch that does not sync within the minute is retried by the informer; the
			// error only says so.
			go func() {
				if err := c.policies.Start(ctx, time.Minute); err != nil {
					c.Log.Error("authorization policy status: watch policies", "err", err)
				}
			}()
			go func() {
				if err := c.peerAuthns.Start(ctx, time.Minute); err != nil {
					c.Log.Error("peer authentication status: watch policies", "err", err)
				}
			}()
			return nil
		})).
		Watches(&corev1.Service{}, all).
		WithOptions(opts).
		Complete(c)
	if err != nil {
		return fmt.Errorf("set up authorization policy status controller: %w", err)
	}
	return nil
}
