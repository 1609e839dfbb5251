package configexport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar/mcs"
	"github.com/aethermesh/aether/registrar/routestatus"
	"github.com/aethermesh/aether/registry"
)

// DefaultRefresh is how often an unchanged projection is written again (--config-export-refresh),
// MinRefresh the shortest period allowed.
const (
	DefaultRefresh = 5 * time.Minute
	MinRefresh     = 10 * time.Second
)

// DefaultPassDelay is how long an export pass waits after the change that asks for it, so a burst
// of changes is one pass.
const DefaultPassDelay = 200 * time.Millisecond

// exportTimeLayout is export_time's format: RFC 3339 with nanoseconds, always nine digits, so a
// projection's encoded size does not change with the time of its write (a refusal for size, and
// its condition, stay the same from one pass to the next).
const exportTimeLayout = "2006-01-02T15:04:05.000000000Z07:00"

// syncAll is the one request of the Exporter's queue: every change asks for the same full pass.
var syncAll = reconcile.Request{}

// Exporter is the leader-elected config-export controller (seed 000, EM1 and EM3). For every
// ServiceExport of this cluster whose Service can be exported (mcs.MarkFromService accepts it,
// as for its export mark), it keeps one ServiceConfigProjection in this cluster's registry
// partition: the producer HTTPRoutes and GRPCRoutes of the Service (Project, from the routes the
// route status controller's last pass read: SetRoutes), export_create_time the ServiceExport's
// creationTimestamp, export_time the time of the write, and a version one above the last (see
// nextVersion: a version is never reused). An exported Service with no routes gets a projection
// with no routes: it says that its home cluster routes it plainly.
//
// A projection is written when its routes or export_create_time change, and again unchanged
// every Refresh so that importers can bound its staleness (now minus export_time). It is deleted
// when the ServiceExport or the Service goes or the Service cannot be exported; at the start of
// each leadership, this cluster's projections are read (ListConfigs), and those of services that
// are no longer exported are deleted by the first pass. A projection over
// registry.MaxConfigBytes or MaxConfigRoutes is not written (TooLarge), nor refreshed: the last
// one written stays, and its export_time ages.
//
// With ControlCluster set to another cluster, it exports nothing and deletes this cluster's
// projections (logged once, saying why). Each ServiceExport gets condition
// ConditionConfigExported (server-side apply, field manager ExportFieldManager: nothing else of
// its status is touched). Passes are coalesced (PassDelay) and idempotent: a pass that finds the
// registry and the conditions as they should be writes nothing. While the registry does not
// answer, writes fail and are retried; nothing is deleted because of the outage.
type Exporter struct {
	// Client reads ServiceExports and Services (the manager's cache) and writes ServiceExport
	// status. Required.
	Client client.Client
	// Configs is this cluster's registry. Required.
	Configs Configs
	// View is every origin's projections (this cluster's own: a projection deleted or rewritten
	// by someone else is written again). Required.
	View *ConfigView
	// ControlCluster is --control-cluster: "" or this cluster's name to export, another cluster's
	// name to export nothing.
	ControlCluster string
	// Refresh is how often an unchanged projection is written again (default DefaultRefresh).
	Refresh time.Duration
	// Log receives the controller's logs. Required.
	Log *slog.Logger
	// Metrics (nil: not recorded).
	Metrics *Metrics
	// WriteTimeout bounds one registry call (default 5 s).
	WriteTimeout time.Duration
	// PassDelay is how long a pass waits after the change that asks for it (default
	// DefaultPassDelay).
	PassDelay time.Duration
	// RateLimiter, when set, replaces the default back-off of a pass that failed.
	RateLimiter workqueue.TypedRateLimiter[reconcile.Request]
	// SkipNameValidation allows several controllers of this name in one process (tests).
	SkipNameValidation bool
	// Paused, when set and returning true, makes passes do nothing (the registrar pauses the
	// registry writers while its partition's claim is not this cluster's); Resync resumes.
	Paused func() bool

	queue queue

	// in holds what other goroutines hand a pass: the last routes handed over (routesSet: any
	// were), the view's events of this cluster's projections not applied yet, and whether the
	// projections must be read again.
	in struct {
		sync.Mutex
		routes    []model.Route
		routesSet bool
		events    ConfigEvents
		reload    bool
	}

	// The pass's own state (Reconcile runs one at a time): loaded is set once this cluster's
	// projections were read in this leadership; floor is the registry revision of that read,
	// held what the partition holds per service, deleted the last version of the projections
	// deleted since.
	loaded  bool
	floor   uint64
	held    map[model.ServiceKey]*held
	deleted map[model.ServiceKey]uint64
	// refused is the last refusal counted per service (its condition message).
	refused map[model.ServiceKey]string
	offLog  bool
}

var _ reconcile.Reconciler = &Exporter{}

// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceexports,verbs=get;list;watch
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceexports/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch

// Enabled reports whether this cluster exports config: no control cluster, or this one.
func (e *Exporter) Enabled() bool {
	return e.ControlCluster == "" || e.ControlCluster == e.Configs.Origin().Cluster
}

// SetRoutes hands the exporter this cluster's HTTPRoutes and GRPCRoutes (model.HTTPRouteModel,
// model.GRPCRouteModel: the route status pass's); a pass follows. routes are not changed.
func (e *Exporter) SetRoutes(routes []model.Route) {
	e.in.Lock()
	e.in.routes, e.in.routesSet = routes, true
	e.in.Unlock()
	e.queue.later(e.passDelay())
}

// Resync reads this cluster's projections again at the next pass and runs it; the registrar
// calls it when its partition's claim is this cluster's again (another cluster may have written
// into it meanwhile).
func (e *Exporter) Resync() {
	e.in.Lock()
	e.in.reload = true
	e.in.Unlock()
	e.queue.later(0)
}

func (e *Exporter) passDelay() time.Duration {
	if e.PassDelay <= 0 {
		return DefaultPassDelay
	}
	return e.PassDelay
}

func (e *Exporter) refresh() time.Duration {
	if e.Refresh <= 0 {
		return DefaultRefresh
	}
	return e.Refresh
}

func (e *Exporter) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	d := e.WriteTimeout
	if d <= 0 {
		d = 5 * time.Second
	}
	return context.WithTimeout(ctx, d)
}

// observe queues the view's events of this cluster's projections for the next pass (applyEvents).
func (e *Exporter) observe(evs ConfigEvents) {
	own := e.Configs.Origin()
	n := 0
	e.in.Lock()
	for _, ev := range evs {
		if ev.Origin == own {
			e.in.events = append(e.in.events, ev)
			n++
		}
	}
	e.in.Unlock()
	if n > 0 {
		e.queue.later(e.passDelay())
	}
}

// applyEvents follows this cluster's projections in the registry: one deleted by someone else
// is forgotten, so the pass writes it again, and a version above the one held (written by an
// earlier leader after this one read the partition) is taken over, so versions keep
// increasing. Since no version is reused, an event is never mistaken for another write's,
// whether it is older than the pass's read of the partition or not.
func (e *Exporter) applyEvents(evs ConfigEvents) {
	for _, ev := range evs {
		svc := model.ServiceKey{Namespace: ev.Value.GetService().GetNamespace(), Name: ev.Value.GetService().GetName()}
		h := e.held[svc]
		switch {
		case ev.Type == registry.Deleted && h != nil && h.version == ev.Value.GetVersion():
			delete(e.held, svc)
			e.deleted[svc] = max(e.deleted[svc], h.version)
			e.Metrics.setVersion(svc, 0)
		case ev.Type != registry.Deleted && (h == nil || ev.Value.GetVersion() > h.version):
			e.held[svc] = heldOf(ev.Value)
			e.Metrics.setVersion(svc, ev.Value.GetVersion())
		}
	}
}

// Reconcile makes one export pass (the request is ignored: there is one). It returns the joined
// errors of the writes that failed (the pass is retried with back-off), else a requeue at the
// next refresh.
func (e *Exporter) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	if e.Paused != nil && e.Paused() {
		return reconcile.Result{}, nil
	}
	e.in.Lock()
	routesSet, allRoutes, evs, reload := e.in.routesSet, e.in.routes, e.in.events, e.in.reload
	e.in.events, e.in.reload = nil, false
	e.in.Unlock()
	if reload {
		e.loaded = false
	}
	if !e.loaded {
		if err := e.load(ctx); err != nil {
			e.Metrics.exportErr(errList)
			e.in.Lock()
			e.in.events, e.in.reload = append(evs, e.in.events...), e.in.reload || reload
			e.in.Unlock()
			return reconcile.Result{}, err
		}
	}
	e.applyEvents(evs)
	var list mcsv1beta1.ServiceExportList
	if err := e.Client.List(ctx, &list); err != nil {
		return reconcile.Result{}, fmt.Errorf("config export: list ServiceExports: %w", err)
	}
	if !e.Enabled() {
		return reconcile.Result{}, e.off(ctx, list.Items)
	}
	if !routesSet {
		return reconcile.Result{}, nil // the route status pass hands the routes over, and a pass follows
	}
	var svcs corev1.ServiceList
	if err := e.Client.List(ctx, &svcs); err != nil {
		return reconcile.Result{}, fmt.Errorf("config export: list Services: %w", err)
	}
	services := make(map[model.ServiceKey]*corev1.Service, len(svcs.Items))
	for i := range svcs.Items {
		s := &svcs.Items[i]
		services[model.ServiceKey{Namespace: s.Namespace, Name: s.Name}] = s
	}
	routes := byParent(allRoutes)
	now := time.Now()
	var next time.Time
	var errs []error
	wanted := map[model.ServiceKey]bool{}
	// The conditions are written after the registry is as they say (a projection deleted first).
	type exportCond struct {
		se   *mcsv1beta1.ServiceExport
		cond metav1.Condition
	}
	var conds []exportCond
	for i := range list.Items {
		se := &list.Items[i]
		if !se.DeletionTimestamp.IsZero() {
			continue
		}
		key := model.ServiceKey{Namespace: se.Namespace, Name: se.Name}
		var cond metav1.Condition
		if _, err := mcs.MarkFromService(services[key], se); err != nil {
			cond = metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonNotExportable,
				Message: "no config projection: the Service cannot be exported (" + err.Error() + ")"}
		} else {
			wanted[key] = true
			var due time.Time
			var err error
			cond, due, err = e.export(ctx, key, Project(e.Configs.Origin(), key, routes[key], se.CreationTimestamp.Time), now)
			errs = append(errs, err)
			if !due.IsZero() && (next.IsZero() || due.Before(next)) {
				next = due
			}
		}
		conds = append(conds, exportCond{se, cond})
	}
	for key := range e.held {
		if !wanted[key] {
			errs = append(errs, e.remove(ctx, key))
		}
	}
	for _, c := range conds {
		errs = append(errs, e.setCondition(ctx, c.se, c.cond))
	}
	for key := range e.refused {
		if !wanted[key] {
			delete(e.refused, key)
		}
	}
	e.Metrics.setServices(len(e.held))
	if err := errors.Join(errs...); err != nil {
		return reconcile.Result{}, err
	}
	if next.IsZero() {
		return reconcile.Result{}, nil
	}
	return reconcile.Result{RequeueAfter: max(time.Until(next), time.Second)}, nil
}

// load reads this cluster's projections (at the start of a leadership, or after a claim
// conflict): what the partition holds per service, and the revision of the read as the version
// floor.
func (e *Exporter) load(ctx context.Context) error {
	lctx, cancel := e.callCtx(ctx)
	defer cancel()
	recs, rev, err := e.Configs.ListConfigs(lctx)
	if err != nil {
		return fmt.Errorf("config export: read this cluster's projections: %w", err)
	}
	own := e.Configs.Origin()
	for svc := range e.held {
		e.Metrics.setVersion(svc, 0)
	}
	e.held, e.deleted, e.refused = map[model.ServiceKey]*held{}, map[model.ServiceKey]uint64{}, map[model.ServiceKey]string{}
	for _, r := range recs {
		if r.Origin != own {
			continue
		}
		svc := model.ServiceKey{Namespace: r.Value.GetService().GetNamespace(), Name: r.Value.GetService().GetName()}
		e.held[svc] = heldOf(r.Value)
		e.Metrics.setVersion(svc, r.Value.GetVersion())
	}
	e.floor, e.loaded = uint64(max(rev, 0)), true
	e.Log.Info("config export: read this cluster's projections", "projections", len(e.held), "revision", rev)
	return nil
}

// export writes want (this pass's projection of key) when it differs from what the partition
// holds or is due for a refresh. It returns the ServiceExport's condition, when the projection
// is due next (zero: not held), and the write's error.
func (e *Exporter) export(ctx context.Context, key model.ServiceKey, want *registryv1.ServiceConfigProjection, now time.Time) (metav1.Condition, time.Time, error) {
	have := e.held[key]
	if have != nil && have.sameContent(want) && now.Before(have.due(e.refresh())) {
		delete(e.refused, key)
		return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonExported, Message: exportedMessage(have)}, have.due(e.refresh()), nil
	}
	want.Version = nextVersion(have, e.deleted[key], e.floor)
	want.ExportTime = now.UTC().Format(exportTimeLayout)
	if err := check(want); err != nil {
		reason, msg := refusedCondition(err, have)
		if e.refused[key] != msg {
			e.refused[key] = msg
			if reason == ReasonTooLarge {
				e.Metrics.exportErr(errTooLarge)
			} else {
				e.Metrics.exportErr(errInvalid)
			}
			e.Log.Warn("config export: projection not written", "service", key.String(), "reason", reason, "err", err)
		}
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: reason, Message: msg}, time.Time{}, nil
	}
	delete(e.refused, key)
	wctx, cancel := e.callCtx(ctx)
	err := e.Configs.PutConfig(wctx, want)
	cancel()
	if err != nil {
		e.Metrics.exportErr(errWrite)
		msg := "writing the projection to the registry failed; retrying: " + err.Error()
		var ve *registry.ValidationError
		if errors.As(err, &ve) {
			return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonInvalid, Message: msg}, time.Time{}, nil
		}
		return metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonWriteFailed, Message: msg}, time.Time{}, fmt.Errorf("config export: write projection of %s: %w", key, err)
	}
	h := heldOf(want)
	e.held[key] = h
	delete(e.deleted, key)
	e.Metrics.setVersion(key, h.version)
	e.Log.Debug("config export: projection written", "service", key.String(), "version", h.version, "routes", len(h.routes))
	return metav1.Condition{Status: metav1.ConditionTrue, Reason: ReasonExported, Message: exportedMessage(h)}, h.due(e.refresh()), nil
}

// remove deletes this cluster's projection of key.
func (e *Exporter) remove(ctx context.Context, key model.ServiceKey) error {
	wctx, cancel := e.callCtx(ctx)
	defer cancel()
	if err := e.Configs.DeleteConfig(wctx, key.Namespace, key.Name); err != nil {
		e.Metrics.exportErr(errDelete)
		return fmt.Errorf("config export: delete projection of %s: %w", key, err)
	}
	e.deleted[key] = max(e.deleted[key], e.held[key].version)
	delete(e.held, key)
	e.Metrics.setVersion(key, 0)
	e.Log.Debug("config export: projection deleted", "service", key.String())
	return nil
}

// off is a pass with another cluster as the control cluster: this cluster's projections are
// deleted and every ServiceExport says why there is none.
func (e *Exporter) off(ctx context.Context, exports []mcsv1beta1.ServiceExport) error {
	own := e.Configs.Origin().Cluster
	if !e.offLog {
		e.offLog = true
		e.Log.Info("config export off: the control cluster (--control-cluster) is another cluster, which alone exports config; this cluster's projections are deleted",
			"control_cluster", e.ControlCluster, "cluster", own, "projections", len(e.held))
	}
	var errs []error
	for key := range e.held {
		errs = append(errs, e.remove(ctx, key))
	}
	e.Metrics.setServices(len(e.held))
	cond := metav1.Condition{Status: metav1.ConditionFalse, Reason: ReasonNotControlCluster,
		Message: fmt.Sprintf("no config projection: only the control cluster %s exports config (--control-cluster), and this is cluster %s", e.ControlCluster, own)}
	for i := range exports {
		if se := &exports[i]; se.DeletionTimestamp.IsZero() {
			errs = append(errs, e.setCondition(ctx, se, cond))
		}
	}
	return errors.Join(errs...)
}

// setCondition writes cond as se's ConditionConfigExported when it differs from what se holds.
func (e *Exporter) setCondition(ctx context.Context, se *mcsv1beta1.ServiceExport, cond metav1.Condition) error {
	cond.Type = ConditionConfigExported
	cond.Message = routestatus.Cut(cond.Message, maxMessage)
	c, changed := MergeCondition(se.Status.Conditions, cond, "", se.Generation, metav1.Now())
	if !changed {
		return nil
	}
	if err := applyConditions(ctx, e.Client, "ServiceExport", se.Namespace, se.Name, ExportFieldManager, c); err != nil {
		e.Metrics.exportErr(errStatus)
		return fmt.Errorf("config export: %w", err)
	}
	return nil
}

// SetupWithManager registers the exporter (leader only): ServiceExports and Services from the
// manager's cache and this cluster's projections (View) ask for a pass, PassDelay later.
func (e *Exporter) SetupWithManager(mgr ctrl.Manager) error {
	if e.Client == nil || e.Configs == nil || e.View == nil || e.Log == nil {
		return errors.New("set up config export controller: Client, Configs, View and Log are required")
	}
	all := e.queue.handler(e.passDelay())
	err := ctrl.NewControllerManagedBy(mgr).
		Named("configexport").
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			e.queue.set(q)
			e.View.Subscribe(e.observe)
			q.Add(syncAll)
			return nil
		})).
		Watches(&mcsv1beta1.ServiceExport{}, all).
		Watches(&corev1.Service{}, all).
		WithOptions(options(1, e.RateLimiter, e.SkipNameValidation)).
		Complete(e)
	if err != nil {
		return fmt.Errorf("set up config export controller: %w", err)
	}
	return nil
}

// options are the controller options of the package's controllers: workers parallel reconciles
// (at least 1), the retry rate limiter rl (nil: controller-runtime's), and name validation.
func options(workers int, rl workqueue.TypedRateLimiter[reconcile.Request], skipNameValidation bool) controller.Options {
	opts := controller.Options{MaxConcurrentReconciles: max(workers, 1), RateLimiter: rl}
	if skipNameValidation {
		opts.SkipNameValidation = &skipNameValidation
	}
	return opts
}

// queue holds a controller's work queue once its source started (safe for concurrent use).
type queue struct {
	mu sync.Mutex
	q  workqueue.TypedRateLimitingInterface[reconcile.Request]
}

func (r *queue) set(q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	r.mu.Lock()
	r.q = q
	r.mu.Unlock()
}

// later asks for a pass d from now (nothing before the queue is set: its start asks for one).
func (r *queue) later(d time.Duration) {
	r.mu.Lock()
	q := r.q
	r.mu.Unlock()
	if q != nil {
		q.AddAfter(syncAll, d)
	}
}

// handler is an event handler that asks for a pass d after any event.
func (r *queue) handler(d time.Duration) handler.TypedEventHandler[client.Object, reconcile.Request] {
	type wq = workqueue.TypedRateLimitingInterface[reconcile.Request]
	return handler.Funcs{
		CreateFunc:  func(_ context.Context, _ event.CreateEvent, q wq) { q.AddAfter(syncAll, d) },
		UpdateFunc:  func(_ context.Context, _ event.UpdateEvent, q wq) { q.AddAfter(syncAll, d) },
		DeleteFunc:  func(_ context.Context, _ event.DeleteEvent, q wq) { q.AddAfter(syncAll, d) },
		GenericFunc: func(_ context.Context, _ event.GenericEvent, q wq) { q.AddAfter(syncAll, d) },
	}
}
