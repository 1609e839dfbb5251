package mcs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/model"
)

// ExportController turns this cluster's ServiceExports into export marks in this cluster's
// registry partition and keeps their MCS status conditions:
//   - Valid: True (reason Valid) when a backing Service of an exportable type exists, else False
//     (NoService, InvalidServiceType, or InvalidExportedMetadata for exported labels or
//     annotations aether refuses: MarkFromService);
//   - Ready: True (Exported) once the mark is in the registry, False (Pending) while the write
//     fails, False (Failed) for an invalid export;
//   - Conflict: True on every export of the service when the exports conflict (PortConflict,
//     SessionAffinityConflict, SessionAffinityConfigConflict, LabelsConflict,
//     AnnotationsConflict, joined by commas: see Resolve and ConflictCondition), else False
//     (NoConflicts); absent for an invalid export.
//
// A deleted (or invalid) ServiceExport's mark is removed; so is a mark of this cluster that no
// ServiceExport backs any more (found through the export view, so marks left behind while the
// registrar was down are cleaned up too). It runs on the elected leader only, so each cluster's
// partition has a single writer. While the registry is unreachable, writes fail and are retried;
// nothing in the registry or in Kubernetes is deleted because of the outage.
type ExportController struct {
	Client  client.Client
	Exports Exports
	View    *ExportView
	Log     *slog.Logger
	Metrics *Metrics
	// ControllerTuning sets parallelism, retry rate limiting and name validation.
	ControllerTuning
	// WriteTimeout bounds one registry write (default 5 s): without it a write to an unreachable
	// registry blocks until the registry returns, holding a worker.
	WriteTimeout time.Duration

	queue queueRef
}

// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceexports,verbs=get;list;watch
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceexports/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch

// Reconcile records or clears this cluster's export mark for the ServiceExport req names and
// updates its status. The ServiceExport's namespace and name are the exported Service's (MCS
// API). It returns an error (and is retried) when the registry or the API server refuses a write
// (a resourceVersion conflict is retried shortly without an error). It does nothing while
// Paused.
func (c *ExportController) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if c.paused() {
		return reconcile.Result{}, nil
	}
	return quietConflict(c.reconcile(ctx, req))
}

func (c *ExportController) reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	// Nothing is decided before the view holds the registry's first snapshot (a registry
	// unreachable at start must not look like "nothing is exported"): wait for it.
	if err := c.View.WaitSynced(ctx); err != nil {
		return reconcile.Result{}, nil
	}
	key := model.ServiceKey{Namespace: req.Namespace, Name: req.Name}
	origin := c.Exports.Origin()
	var se mcsv1beta1.ServiceExport
	if err := c.Client.Get(ctx, req.NamespacedName, &se); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("get ServiceExport %s: %w", req.NamespacedName, err)
		}
		return reconcile.Result{}, c.unexport(ctx, key)
	}
	if !se.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, c.unexport(ctx, key)
	}

	var svc corev1.Service
	var backing *corev1.Service
	if err := c.Client.Get(ctx, req.NamespacedName, &svc); err == nil {
		backing = &svc
	} else if !apierrors.IsNotFound(err) {
		return reconcile.Result{}, fmt.Errorf("get Service %s: %w", req.NamespacedName, err)
	}
	want, err := MarkFromService(backing, &se)
	var invalid *InvalidExportError
	if errors.As(err, &invalid) {
		uerr := c.unexport(ctx, key)
		st := se.Status.DeepCopy()
		setCond(st, metav1.ConditionFalse, mcsv1beta1.ServiceExportConditionValid, string(invalid.Reason), invalid.Message, se.Generation)
		setCond(st, metav1.ConditionFalse, mcsv1beta1.ServiceExportConditionReady, string(mcsv1beta1.ServiceExportReasonFailed), "not exported: "+invalid.Message, se.Generation)
		meta.RemoveStatusCondition(&st.Conditions, string(mcsv1beta1.ServiceExportConditionConflict))
		return reconcile.Result{}, errors.Join(uerr, c.updateStatus(ctx, &se, st))
	}
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("build export mark %s: %w", req.NamespacedName, err)
	}

	st := se.Status.DeepCopy()
	setCond(st, metav1.ConditionTrue, mcsv1beta1.ServiceExportConditionValid, string(mcsv1beta1.ServiceExportReasonValid), "the Service can be exported", se.Generation)
	if have, ok := c.View.Own(origin, key); !ok || !SameMark(have.Value, want) {
		wctx, cancel := c.writeCtx(ctx)
		err := c.Exports.Export(wctx, want)
		cancel()
		if err != nil {
			setCond(st, metav1.ConditionFalse, mcsv1beta1.ServiceExportConditionReady, string(mcsv1beta1.ServiceExportReasonPending), "writing the export mark to the registry failed; retrying: "+err.Error(), se.Generation)
			return reconcile.Result{}, errors.Join(fmt.Errorf("export %s: %w", key, err), c.updateStatus(ctx, &se, st))
		}
		c.Log.Debug("mcs: export mark written", "service", key.String())
	}
	setCond(st, metav1.ConditionTrue, mcsv1beta1.ServiceExportConditionReady, string(mcsv1beta1.ServiceExportReasonExported), "exported to the clusterset registry", se.Generation)

	// Conflicts are decided from every cluster's marks, with this cluster's as just written.
	marks := []Mark{{Key: origin.ExportKey(key.Namespace, key.Name), Origin: origin, Value: want}}
	for _, m := range c.View.Marks(key) {
		if m.Origin != origin {
			marks = append(marks, m)
		}
	}
	res, _ := Resolve(marks)
	cc := ConflictCondition(res, origin, se.Generation)
	setCond(st, cc.Status, mcsv1beta1.ServiceExportConditionConflict, cc.Reason, cc.Message, se.Generation)
	c.Metrics.setConflict(key, cc.Status == metav1.ConditionTrue)
	return reconcile.Result{}, c.updateStatus(ctx, &se, st)
}

// unexport removes this cluster's mark of key when the export view holds one; a missing mark
// costs no registry call. A mark written moments ago that the view has not seen yet is removed
// when the view delivers it (the view's notification reconciles the key again).
func (c *ExportController) unexport(ctx context.Context, key model.ServiceKey) error {
	c.Metrics.setConflict(key, false)
	if _, ok := c.View.Own(c.Exports.Origin(), key); !ok {
		return nil
	}
	wctx, cancel := c.writeCtx(ctx)
	defer cancel()
	if err := c.Exports.Unexport(wctx, key.Namespace, key.Name); err != nil {
		return fmt.Errorf("unexport %s: %w", key, err)
	}
	c.Log.Debug("mcs: export mark removed", "service", key.String())
	return nil
}

func (c *ExportController) writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	d := c.WriteTimeout
	if d <= 0 {
		d = 5 * time.Second
	}
	return context.WithTimeout(ctx, d)
}

func setCond(st *mcsv1beta1.ServiceExportStatus, status metav1.ConditionStatus, t mcsv1beta1.ServiceExportConditionType, reason, msg string, gen int64) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: string(t), Status: status, Reason: reason, Message: msg, ObservedGeneration: gen})
}

// updateStatus writes st when it differs from se's status (conditions keep their
// lastTransitionTime unless their status changes, so an unchanged outcome writes nothing).
func (c *ExportController) updateStatus(ctx context.Context, se *mcsv1beta1.ServiceExport, st *mcsv1beta1.ServiceExportStatus) error {
	if condsEqual(se.Status.Conditions, st.Conditions) {
		return nil
	}
	upd := se.DeepCopy()
	upd.Status = *st
	if err := c.Client.Status().Update(ctx, upd); err != nil {
		return fmt.Errorf("update ServiceExport %s/%s status: %w", se.Namespace, se.Name, err)
	}
	return nil
}

func condsEqual(a, b []metav1.Condition) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		y := meta.FindStatusCondition(b, x.Type)
		if y == nil || y.Status != x.Status || y.Reason != x.Reason || y.Message != x.Message || y.ObservedGeneration != x.ObservedGeneration {
			return false
		}
	}
	return true
}

// Resync re-enqueues every ServiceExport and every service of the export view; the registrar
// calls it when the registry becomes reachable again, so writes that failed during the outage
// are retried at once instead of after their back-off.
func (c *ExportController) Resync(ctx context.Context) {
	q := c.queue.get()
	if q == nil {
		return
	}
	var list mcsv1beta1.ServiceExportList
	if err := c.Client.List(ctx, &list); err == nil {
		for _, se := range list.Items {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: se.Namespace, Name: se.Name}})
		}
	}
	for _, k := range c.View.Services("") {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: k.Namespace, Name: k.Name}})
	}
}

// ControllerTuning is what the export controller and the import generator share of their
// controller-runtime options (controller.Options).
type ControllerTuning struct {
	// MaxConcurrentReconciles bounds parallel reconciles (default 4).
	MaxConcurrentReconciles int
	// SkipNameValidation allows several controllers of this name in one process (tests).
	SkipNameValidation bool
	// RateLimiter, when set, replaces the default retry rate limiter.
	RateLimiter workqueue.TypedRateLimiter[reconcile.Request]
	// Paused, when set and returning true, stops the controller's work: every Reconcile returns
	// at once, reading and writing nothing, and the request is dropped. The registrar pauses
	// both controllers while its registry partition's claim is not verified as this cluster's,
	// and calls Resync when it is.
	Paused func() bool
}

// paused reports whether Paused says so.
func (t ControllerTuning) paused() bool { return t.Paused != nil && t.Paused() }

// options returns the controller.Options the tuning gives, with MaxConcurrentReconciles 4 when
// unset.
func (t ControllerTuning) options() controller.Options {
	opts := controller.Options{MaxConcurrentReconciles: t.MaxConcurrentReconciles, RateLimiter: t.RateLimiter}
	if opts.MaxConcurrentReconciles == 0 {
		opts.MaxConcurrentReconciles = 4
	}
	if t.SkipNameValidation {
		opts.SkipNameValidation = &t.SkipNameValidation
	}
	return opts
}

// SetupWithManager registers the controller: ServiceExports, the Services of the same name, and
// the export view (a change of any cluster's mark of a service re-decides its conflicts, and this
// cluster's marks without a ServiceExport are removed).
func (c *ExportController) SetupWithManager(mgr ctrl.Manager) error {
	opts := c.options()
	err := ctrl.NewControllerManagedBy(mgr).
		Named("serviceexport").
		For(&mcsv1beta1.ServiceExport{}).
		Watches(&corev1.Service{}, &handler.EnqueueRequestForObject{}).
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			c.queue.set(q)
			c.View.Subscribe(func(keys []model.ServiceKey) {
				for _, k := range keys {
					q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: k.Namespace, Name: k.Name}})
				}
			})
			return nil
		})).
		WithOptions(opts).
		Complete(c)
	if err != nil {
		return fmt.Errorf("set up ServiceExport controller: %w", err)
	}
	return nil
}
