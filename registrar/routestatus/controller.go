package routestatus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/model"
)

// DefaultCRDRecheck is how often a route CRD that is not installed is looked for again.
const DefaultCRDRecheck = 30 * time.Second

// syncAll is the one request of the controller's queue: every change asks for the same full
// pass, so a burst of changes is coalesced into one (the queue holds a key once).
var syncAll = reconcile.Request{}

// Controller writes aether's status.parents entries of every HTTPRoute and GRPCRoute
// (gateway.networking.k8s.io/v1, every namespace), as model.Assemble resolves them from the
// cluster's routes, Services, ServiceImports and mesh namespaces (labelled aether.io/mesh:
// enabled); ParentStatuses says what an entry holds. A route is written (UpdateStatus) only when
// its merged status differs from the stored one; a write refused for a stale resourceVersion is
// retried on the route read again.
//
// Each route kind is watched once its CRD is installed: at start the controller looks for it in
// discovery, and, when it is missing, logs so once and looks again every CRDRecheck. It runs on
// the elected leader only (a controller-runtime controller), the single writer of route status
// in its cluster.
type Controller struct {
	// Client reads Services, ServiceImports and Namespaces (the manager's cache, whose informers
	// registrar/mcs shares). Required.
	Client client.Client
	// Gateway watches the routes and writes their status. Required.
	Gateway gwclient.Interface
	// Discovery tells whether the route CRDs are installed. Required.
	Discovery discovery.DiscoveryInterface
	// Log receives the controller's logs. Required.
	Log *slog.Logger
	// Metrics counts passes and writes (nil: not counted).
	Metrics *Metrics
	// CRDRecheck is how often a missing route CRD is looked for again (default 30 s).
	CRDRecheck time.Duration
	// RateLimiter, when set, replaces the default back-off of a pass that failed.
	RateLimiter workqueue.TypedRateLimiter[reconcile.Request]
	// SkipNameValidation allows several controllers of this name in one process (tests).
	SkipNameValidation bool

	mu   sync.Mutex
	http gwlisters.HTTPRouteLister
	grpc gwlisters.GRPCRouteLister
}

var _ reconcile.Reconciler = &Controller{}

// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes;grpcroutes,verbs=get;list;watch
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes/status;grpcroutes/status,verbs=update;patch
// +kubebuilder:rbac:groups="",resources=services;namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceimports,verbs=get;list;watch

// Reconcile makes one pass over every watched route (the request is ignored: there is one) and
// writes the status of those whose status differs. It returns the errors of the routes it could
// not write, joined (the pass is retried with back-off), or the cache's error.
func (c *Controller) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	c.mu.Lock()
	hl, gl := c.http, c.grpc
	c.mu.Unlock()
	if hl == nil && gl == nil {
		return reconcile.Result{}, nil // no route kind watched yet
	}
	src, err := c.sources(ctx, hl, gl)
	if err != nil {
		return reconcile.Result{}, err
	}
	httpRoutes := map[model.RouteRef]*gwv1.HTTPRoute{}
	for _, r := range src.HTTPRoutes {
		httpRoutes[model.RouteRef{Kind: model.KindHTTPRoute, Namespace: r.Namespace, Name: r.Name}] = r
	}
	grpcRoutes := map[model.RouteRef]*gwv1.GRPCRoute{}
	for _, r := range src.GRPCRoutes {
		grpcRoutes[model.RouteRef{Kind: model.KindGRPCRoute, Namespace: r.Namespace, Name: r.Name}] = r
	}
	now := metav1.Now()
	var errs []error
	for _, st := range model.Assemble(0, src).RouteStatuses() {
		switch st.Route.Kind {
		case model.KindHTTPRoute:
			if r := httpRoutes[st.Route]; r != nil {
				errs = append(errs, write(ctx, c.Log, c.Metrics, httpKind(c.Gateway), r, st, now))
			}
		case model.KindGRPCRoute:
			if r := grpcRoutes[st.Route]; r != nil {
				errs = append(errs, write(ctx, c.Log, c.Metrics, grpcKind(c.Gateway), r, st, now))
			}
		}
	}
	c.Metrics.pass()
	return reconcile.Result{}, errors.Join(errs...)
}

// sources fills the model's Sources from the caches: the mesh namespaces, every Service and
// ServiceImport (Assemble keeps those of mesh namespaces) and the watched routes, sorted.
func (c *Controller) sources(ctx context.Context, hl gwlisters.HTTPRouteLister, gl gwlisters.GRPCRouteLister) (model.Sources, error) {
	var nss corev1.NamespaceList
	var svcs corev1.ServiceList
	var imps mcsv1beta1.ServiceImportList
	for _, l := range []client.ObjectList{&nss, &svcs, &imps} {
		if err := c.Client.List(ctx, l); err != nil {
			return model.Sources{}, fmt.Errorf("route status: list %T: %w", l, err)
		}
	}
	src := model.Sources{MeshNamespaces: map[string]bool{}}
	for _, ns := range nss.Items {
		if model.NamespaceMeshed(ns.Labels) {
			src.MeshNamespaces[ns.Name] = true
		}
	}
	for i := range svcs.Items {
		src.Services = append(src.Services, &svcs.Items[i])
	}
	for i := range imps.Items {
		src.Imports = append(src.Imports, &imps.Items[i])
	}
	var err error
	if hl != nil {
		if src.HTTPRoutes, err = hl.List(labels.Everything()); err != nil {
			return model.Sources{}, fmt.Errorf("route status: list HTTPRoutes: %w", err)
		}
		slices.SortFunc(src.HTTPRoutes, func(a, b *gwv1.HTTPRoute) int { return byName(a, b) })
	}
	if gl != nil {
		if src.GRPCRoutes, err = gl.List(labels.Everything()); err != nil {
			return model.Sources{}, fmt.Errorf("route status: list GRPCRoutes: %w", err)
		}
		slices.SortFunc(src.GRPCRoutes, func(a, b *gwv1.GRPCRoute) int { return byName(a, b) })
	}
	return src, nil
}

func byName(a, b metav1.Object) int {
	return model.ServiceKey{Namespace: a.GetNamespace(), Name: a.GetName()}.Compare(model.ServiceKey{Namespace: b.GetNamespace(), Name: b.GetName()})
}

// routeKind is how the controller reads and writes one route kind.
type routeKind[T client.Object] struct {
	kind       model.RouteKind
	parentRefs func(T) []gwv1.ParentReference
	status     func(T) *gwv1.RouteStatus
	deepCopy   func(T) T
	get        func(ctx context.Context, ns, name string) (T, error)
	update     func(ctx context.Context, r T) error
}

func httpKind(gw gwclient.Interface) routeKind[*gwv1.HTTPRoute] {
	return routeKind[*gwv1.HTTPRoute]{
		kind:       model.KindHTTPRoute,
		parentRefs: func(r *gwv1.HTTPRoute) []gwv1.ParentReference { return r.Spec.ParentRefs },
		status:     func(r *gwv1.HTTPRoute) *gwv1.RouteStatus { return &r.Status.RouteStatus },
		deepCopy:   (*gwv1.HTTPRoute).DeepCopy,
		get: func(ctx context.Context, ns, name string) (*gwv1.HTTPRoute, error) {
			return gw.GatewayV1().HTTPRoutes(ns).Get(ctx, name, metav1.GetOptions{})
		},
		update: func(ctx context.Context, r *gwv1.HTTPRoute) error {
			_, err := gw.GatewayV1().HTTPRoutes(r.Namespace).UpdateStatus(ctx, r, metav1.UpdateOptions{})
			return err
		},
	}
}

func grpcKind(gw gwclient.Interface) routeKind[*gwv1.GRPCRoute] {
	return routeKind[*gwv1.GRPCRoute]{
		kind:       model.KindGRPCRoute,
		parentRefs: func(r *gwv1.GRPCRoute) []gwv1.ParentReference { return r.Spec.ParentRefs },
		status:     func(r *gwv1.GRPCRoute) *gwv1.RouteStatus { return &r.Status.RouteStatus },
		deepCopy:   (*gwv1.GRPCRoute).DeepCopy,
		get: func(ctx context.Context, ns, name string) (*gwv1.GRPCRoute, error) {
			return gw.GatewayV1().GRPCRoutes(ns).Get(ctx, name, metav1.GetOptions{})
		},
		update: func(ctx context.Context, r *gwv1.GRPCRoute) error {
			_, err := gw.GatewayV1().GRPCRoutes(r.Namespace).UpdateStatus(ctx, r, metav1.UpdateOptions{})
			return err
		},
	}
}

// write merges st into route r's status.parents (ParentStatuses) and writes it when it differs.
// On a resourceVersion conflict it reads the route again and retries (retry.DefaultBackoff); a
// route whose generation moved past st's is left to the pass its change brings, and a route
// deleted meanwhile is no error.
func write[T client.Object](ctx context.Context, log *slog.Logger, met *Metrics, k routeKind[T], r T, st model.RouteStatus, now metav1.Time) error {
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if r.GetGeneration() != st.Generation {
			return nil
		}
		have := k.status(r).Parents
		want := ParentStatuses(have, k.parentRefs(r), st, now)
		if equality.Semantic.DeepEqual(have, want) {
			return nil
		}
		upd := k.deepCopy(r)
		k.status(upd).Parents = want
		err := k.update(ctx, upd)
		if err == nil {
			met.wrote(k.kind)
			log.Debug("route status written", "route", st.Route.String(), "generation", st.Generation)
			return nil
		}
		if apierrors.IsConflict(err) {
			fresh, gerr := k.get(ctx, r.GetNamespace(), r.GetName())
			if gerr != nil {
				return gerr
			}
			r = fresh
		}
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("write status of %s: %w", st.Route, err)
	}
	return nil
}

// SetupWithManager registers the controller (leader only): Services, ServiceImports and
// Namespaces from the manager's cache, and the routes of each kind once its CRD is installed
// (watchRoutes); every event asks for one pass.
func (c *Controller) SetupWithManager(mgr ctrl.Manager) error {
	if c.Client == nil || c.Gateway == nil || c.Discovery == nil || c.Log == nil {
		return errors.New("set up route status controller: Client, Gateway, Discovery and Log are required")
	}
	if c.CRDRecheck <= 0 {
		c.CRDRecheck = DefaultCRDRecheck
	}
	all := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{syncAll}
	})
	opts := controller.Options{MaxConcurrentReconciles: 1, RateLimiter: c.RateLimiter}
	if c.SkipNameValidation {
		opts.SkipNameValidation = &c.SkipNameValidation
	}
	err := ctrl.NewControllerManagedBy(mgr).
		Named("routestatus").
		WatchesRawSource(source.Func(func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			go c.watchRoutes(ctx, func() { q.Add(syncAll) })
			return nil
		})).
		Watches(&corev1.Service{}, all).
		Watches(&mcsv1beta1.ServiceImport{}, all).
		Watches(&corev1.Namespace{}, all).
		WithOptions(opts).
		Complete(c)
	if err != nil {
		return fmt.Errorf("set up route status controller: %w", err)
	}
	return nil
}

// watchRoutes watches each route kind once discovery shows its CRD, looking again every
// CRDRecheck for a missing one, until ctx ends. A kind is listed for passes only once its
// informer has synced (a partial list would flip other routes' Conflicted). enqueue asks for a
// pass; it is called on every route event and when a kind starts being watched.
func (c *Controller) watchRoutes(ctx context.Context, enqueue func()) {
	var wg sync.WaitGroup
	for _, res := range []string{"httproutes", "grpcroutes"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !c.waitInstalled(ctx, res) {
				return
			}
			if c.startInformer(ctx, res, enqueue) {
				c.Log.Info("route status: watching "+res, "group_version", gwv1.GroupVersion.String())
				enqueue()
			}
		}()
	}
	wg.Wait()
}

// waitInstalled returns true once discovery lists resource res in gateway.networking.k8s.io/v1,
// false when ctx ends first. It logs once that the CRD is missing, and a discovery error when it
// changes.
func (c *Controller) waitInstalled(ctx context.Context, res string) bool {
	t := time.NewTicker(c.CRDRecheck)
	defer t.Stop()
	logged, lastErr := false, ""
	for {
		ok, err := RouteCRDInstalled(c.Discovery, res)
		switch {
		case ok:
			return true
		case err != nil:
			if err.Error() != lastErr {
				lastErr = err.Error()
				c.Log.Warn("route status: discovery failed; retrying", "resource", res, "recheck", c.CRDRecheck, "err", err)
			}
		case !logged:
			logged = true
			c.Log.Info("route status: the Gateway API CRD for "+res+" ("+gwv1.GroupVersion.String()+") is not installed; no status is written for those routes until it is",
				"recheck", c.CRDRecheck)
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// startInformer starts the informer of route resource res, waits until it has synced (or ctx
// ends: false) and lists that kind in passes from then on.
func (c *Controller) startInformer(ctx context.Context, res string, enqueue func()) bool {
	f := gwinformers.NewSharedInformerFactory(c.Gateway, 0)
	var inf cache.SharedIndexInformer
	var set func()
	switch res {
	case "httproutes":
		i := f.Gateway().V1().HTTPRoutes()
		inf, set = i.Informer(), func() { c.http = i.Lister() }
	default:
		i := f.Gateway().V1().GRPCRoutes()
		inf, set = i.Informer(), func() { c.grpc = i.Lister() }
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { enqueue() },
		UpdateFunc: func(any, any) { enqueue() },
		DeleteFunc: func(any) { enqueue() },
	}); err != nil {
		c.Log.Error("route status: watch "+res, "err", err)
		return false
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return false
	}
	c.mu.Lock()
	set()
	c.mu.Unlock()
	return true
}

// RouteCRDInstalled reports whether discovery lists resource res (httproutes, grpcroutes) in
// gateway.networking.k8s.io/v1. A group version the API server does not serve is no error: the
// resource is not installed. Other discovery errors are returned.
func RouteCRDInstalled(disc discovery.DiscoveryInterface, res string) (bool, error) {
	rl, err := disc.ServerResourcesForGroupVersion(gwv1.GroupVersion.String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discover %s: %w", gwv1.GroupVersion, err)
	}
	return slices.ContainsFunc(rl.APIResources, func(r metav1.APIResource) bool { return r.Name == res }), nil
}

// Metrics are the route status controller's Prometheus collectors:
//
//	aether_registrar_route_status_passes_total   counter: passes over every route
//	aether_registrar_route_status_writes_total   counter: status writes, by kind (HTTPRoute, GRPCRoute)
//
// A nil *Metrics records nothing.
type Metrics struct {
	passes prometheus.Counter
	writes *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them with reg (nil: not registered). It
// returns the registration error.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		passes: prometheus.NewCounter(prometheus.CounterOpts{Name: "aether_registrar_route_status_passes_total",
			Help: "Passes of the route status controller over every HTTPRoute and GRPCRoute."}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aether_registrar_route_status_writes_total",
			Help: "Route status writes (UpdateStatus) of the route status controller, by route kind."}, []string{"kind"}),
	}
	if reg != nil {
		if err := errors.Join(reg.Register(m.passes), reg.Register(m.writes)); err != nil {
			return nil, fmt.Errorf("register route status metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) pass() {
	if m != nil {
		m.passes.Inc()
	}
}

func (m *Metrics) wrote(k model.RouteKind) {
	if m != nil {
		m.writes.WithLabelValues(string(k)).Inc()
	}
}
