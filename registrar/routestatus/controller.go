package routestatus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar/gateway"
	"github.com/aethermesh/aether/registry"
)

// DefaultCRDRecheck is how often a route CRD that is not installed is looked for again, and how
// often one that is watched is checked to be still installed.
const DefaultCRDRecheck = 30 * time.Second

// DefaultPassDelay is how long a pass waits after the change that asks for it.
const DefaultPassDelay = 200 * time.Millisecond

// syncAll is the one request of the controller's queue: every change asks for the same full
// pass, so a burst of changes is coalesced into one (the queue holds a key once).
var syncAll = reconcile.Request{}

// kind is one Gateway API kind the controller follows: its resource as discovery names it, its
// kind, and whether only the Gateway side (Controller.Gateways) reads it.
type kind struct {
	res, kind string
	gateway   bool
}

// kinds are the kinds the controller follows, each once its CRD is installed.
var kinds = []kind{
	{"httproutes", "HTTPRoute", false}, {"grpcroutes", "GRPCRoute", false},
	{"tcproutes", "TCPRoute", false}, {"tlsroutes", "TLSRoute", false}, {"udproutes", "UDPRoute", false},
	{"gateways", "Gateway", true}, {"gatewayclasses", "GatewayClass", true}, {"referencegrants", "ReferenceGrant", true},
}

// GatewayViews receives the gateway.View of each pass (gateway.Controller).
type GatewayViews interface {
	SetView(gateway.View)
}

// ConfigHook is the config projections' part of each pass (configexport.Hook): a pass assembles
// the model with the hook's projections (model.Sources.Projections and ControlCluster, as an agent
// with --import-config assembles it), hands the hook what it found (Pass), and sets the
// conditions the hook returns in aether's mesh entries of the HTTPRoutes and GRPCRoutes.
type ConfigHook interface {
	// Projections returns every origin's ServiceConfigProjections and the control cluster ("":
	// none). The pass only reads them.
	Projections() (ps []model.Projection, controlCluster string)
	// Subscribe registers fn, called whenever the projections change: it asks for a pass.
	Subscribe(fn func())
	// Pass hands the hook one pass's findings and returns the conditions to set in the routes'
	// mesh entries, by route (this cluster's routes: RouteRef.Origin empty); a condition type
	// the hook set before and does not return again is removed. It must not block for long.
	Pass(p Pass) map[model.RouteRef][]ParentCondition
}

// Pass is what one pass hands the ConfigHook. Its contents are shared: the hook must not change
// them.
type Pass struct {
	// Routes are this cluster's HTTPRoutes and GRPCRoutes (model.HTTPRouteModel,
	// model.GRPCRouteModel), sorted by kind, namespace and name.
	Routes []model.Route
	// Mesh is the pass's model, assembled with the hook's projections.
	Mesh *model.Mesh
	// Imports are every ServiceImport of this cluster (the cache's objects).
	Imports []*mcsv1beta1.ServiceImport
	// ExportedHere holds the services the routes and projections name that this cluster exports
	// (its export marks in the registry).
	ExportedHere map[model.ServiceKey]bool
}

// Controller writes aether's status.parents entries of every route (gateway.networking.k8s.io/v1,
// every namespace). Those of HTTPRoutes' and GRPCRoutes' mesh parentRefs are what model.Assemble
// resolves from the cluster's routes, Services, ServiceImports and mesh namespaces (labelled
// aether.io/mesh: enabled) and the registry's endpoint records and export marks of the services
// the routes name; ParentStatuses says what an entry holds. The endpoint records give a Service or
// ServiceImport port without appProtocol its protocol (the one most of its endpoints declare, from
// their pods' endpoint.aether.io/protocol annotation; this cluster's endpoints for a Service, the
// exporting clusters' for a ServiceImport), as the agents take it from the same records, so the
// status says what the agents serve.
//
// With Gateways set, each pass also resolves the Gateways (model.ResolveGateways) from the
// GatewayClasses, Gateways, ReferenceGrants, every route, the namespaces' labels, the mesh
// services of the same pass and the certificateRefs' Secrets (model.CheckCertificate), writes
// every route kind's entries for its parentRefs to aether's Gateways, and hands the Gateways'
// side to Gateways (a gateway.View); with no Gateway of a class aether accepts, nothing is
// resolved. An entry of aether's for a parentRef that is neither a mesh parent nor one of aether's
// Gateways is removed.
//
// A route is written (UpdateStatus) only when its merged status differs from the stored one; a
// write refused for a stale resourceVersion is retried on the route read again. A write the API
// server refuses as invalid or too large is not retried (the same pass would be refused again):
// it is logged and counted once per route generation, and the route is written again when it or
// what it refers to changes.
//
// Each Gateway API kind (the five route kinds; with Gateways set, GatewayClass, Gateway and
// ReferenceGrant too) is watched once its CRD is installed: at start the controller looks for it
// in discovery, and, when it is missing, logs so once and looks again every CRDRecheck. A watched
// kind whose CRD is deleted (its list answers 404, or discovery no longer lists it at a
// CRDRecheck) is no longer watched nor listed, and is looked for again as at start. No pass
// runs until each kind is either watched with its cache synced or known not to be installed: a
// pass that saw HTTPRoutes without the GRPCRoutes that win over them would write a status it
// would take back. Nor does one run before the registry's endpoint records and export marks were
// first read (a pass without them would count every port without appProtocol as HTTP and write
// a status it would take back a moment later): a registry unreachable at start delays every
// route's status until it answers, and what was written before stays meanwhile. Once read, they
// are kept current by a registry watch (re-listed after a compaction); while the registry does
// not answer, passes use the records last read, and say so in one log line per outage
// (RegistryErr). A change of the endpoint records asks for a pass only when it may change a
// port's protocol (the set of protocols declared for a port name, the clusters declaring them,
// or, when several are declared, their counts) of a service some route names. It runs on the
// elected leader only (a controller-runtime controller), the single writer of route status in
// its cluster.
//
// It does not pause while this cluster's registry partition is claimed by another cluster
// (registrar.Config.KeepRunningOnClaimConflict), unlike the MCS controllers: it reads this
// cluster's Kubernetes objects (the ServiceImports it reads are whatever this cluster holds,
// whether or not the import generator runs) and the registry's records, as the agents read them,
// and writes only route status (and hands on Gateway views), never the registry, so a claim conflict changes nothing it
// writes, and the agents go on serving the routes it reports on.
type Controller struct {
	// Client reads Services, ServiceImports and Namespaces (the manager's cache, whose informers
	// registrar/mcs shares). Required.
	Client client.Reader
	// CrossNamespaceCertificates is model.GatewayInputs.CrossNamespaceCertificates.
	CrossNamespaceCertificates bool
	// InfrastructureKeys is model.GatewayInputs.InfrastructureKeys.
	InfrastructureKeys []string
	// Gateway watches the routes and writes their status. Required.
	Gateway gwclient.Interface
	// Discovery tells whether the route CRDs are installed. Required.
	Discovery discovery.DiscoveryInterface
	// Cluster is this cluster's name in the registry (its partition's): its endpoints count for
	// its own Services, other clusters' only for the services it imports and they export
	// (model.Assemble). Required.
	Cluster string
	// Endpoints is the registry's endpoint records, watched from the start of the controller on
	// the leader until it stops. Required.
	Endpoints EndpointSource
	// Exports is the clusterset's export marks (which clusters' endpoints count for an imported
	// service). Required.
	Exports ExportSource
	// RegistryErr, when set, reports why the registry did not answer its last probe (nil: it
	// answered). A pass that runs while it is not nil logs once per outage that it uses the
	// records last read.
	RegistryErr func() error
	// Log receives the controller's logs. Required.
	Log *slog.Logger
	// Metrics counts passes and writes (nil: not counted).
	Metrics *Metrics
	// CRDRecheck is how often a missing route CRD is looked for again, and a watched one checked
	// (default DefaultCRDRecheck).
	CRDRecheck time.Duration
	// PassDelay is how long a pass waits after the first change that asks for it, so a burst of
	// changes (a rollout touching many Services) is one pass, and a cluster whose Services never
	// stop changing gets a pass at most every PassDelay plus the pass's own time (default
	// DefaultPassDelay).
	PassDelay time.Duration
	// RateLimiter, when set, replaces the default back-off of a pass that failed.
	RateLimiter workqueue.TypedRateLimiter[reconcile.Request]
	// SkipNameValidation allows several controllers of this name in one process (tests).
	SkipNameValidation bool

	// Gateways, when set, makes the controller aether's Gateway API reader too: it follows the
	// GatewayClass, Gateway and ReferenceGrant CRDs beside the routes', resolves the Gateways
	// (model.ResolveGateways) in every pass, writes the routes' entries for their Gateway
	// parentRefs and hands each pass's gateway.View to Gateways. Nil: no Gateway is aether's, and
	// the routes get entries for their mesh parentRefs only.
	Gateways GatewayViews
	// Config, when set, adds config projections to each pass (ConfigHook); nil: passes assemble
	// without projections, and need a watched route kind or Gateways to run.
	Config ConfigHook
	// APIReader reads a certificateRef's Secret that the manager's cache (which holds only
	// Secrets of type kubernetes.io/tls, gateway.CacheByObject) does not: one of another type is
	// reported as such rather than as missing. Nil: such a Secret counts as missing.
	APIReader client.Reader

	mu sync.Mutex
	// http ... grants list the watched objects of each kind (nil: not watched); pending holds
	// the kinds whose state is not known yet (no discovery answer, or a cache not synced).
	http     gwlisters.HTTPRouteLister
	grpc     gwlisters.GRPCRouteLister
	tcp      gwlisters.TCPRouteLister
	tls      gwlisters.TLSRouteLister
	udp      gwlisters.UDPRouteLister
	gateways gwlisters.GatewayLister
	classes  gwlisters.GatewayClassLister
	grants   gwlisters.ReferenceGrantLister
	pending  map[string]bool
	// secrets are the certificateRefs of the last pass's Gateways (under mu): their Secrets'
	// changes ask for a pass.
	secrets map[model.SecretKey]bool

	// notes is what was last logged about each route whose status did not fit or was refused,
	// refusals the last refused write of each route (Reconcile only, which runs one at a time).
	notes    map[model.RouteRef]string
	refusals map[model.RouteRef]*refusal

	// eps is the registry's endpoint records; refs the services the last pass's routes name
	// (under mu), whose endpoint and export changes ask for a pass. stale is true while passes
	// run on records last read from a registry that does not answer (Reconcile only).
	eps   *endpointView
	refs  map[model.ServiceKey]bool
	stale bool
}

var _ reconcile.Reconciler = &Controller{}

// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes;grpcroutes;tcproutes;tlsroutes;udproutes,verbs=get;list;watch
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes/status;grpcroutes/status;tcproutes/status;tlsroutes/status;udproutes/status,verbs=update;patch
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=gatewayclasses;gateways;referencegrants,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=services;namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=serviceimports,verbs=get;list;watch

// Reconcile makes one pass over every watched route (the request is ignored: there is one) and
// writes the status of those whose status differs; with Gateways set, it resolves the Gateways
// first and hands their View on. It returns the errors of the routes it could not write and may
// write later, joined (the pass is retried with back-off), or the cache's error.
func (c *Controller) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	ls, pending := c.listed()
	if pending || (ls == listers{} && c.Gateways == nil && c.Config == nil) {
		return reconcile.Result{}, nil // a kind's state is not known yet, or no kind is watched
	}
	if synced, _, _ := c.eps.state(); !synced || !c.Exports.Synced() {
		return reconcile.Result{}, nil // the registry's records not read yet: their first read brings a pass
	}
	src, err := c.sources(ctx, ls)
	if err != nil {
		return reconcile.Result{}, err
	}
	c.noteRegistry()
	mesh := model.Assemble(0, src.Sources)
	meshStatus := map[model.RouteRef]model.RouteStatus{}
	for _, st := range mesh.RouteStatuses() {
		meshStatus[st.Route] = st
	}
	var extra map[model.RouteRef][]ParentCondition
	if c.Config != nil {
		extra = c.Config.Pass(Pass{Routes: src.meshRoutes, Mesh: mesh, Imports: src.allImports, ExportedHere: src.exportedHere})
	}
	gwStatus := map[model.RouteRef]model.GatewayRouteStatus{}
	if c.Gateways != nil {
		view, routes, err := c.resolveGateways(ctx, &src, mesh)
		if err != nil {
			return reconcile.Result{}, err
		}
		c.Gateways.SetView(view)
		for _, st := range routes {
			gwStatus[st.Route] = st
		}
	}
	p := &passWrites{c: c, now: metav1.Now(), seen: map[model.RouteRef]bool{}, mesh: meshStatus, gw: gwStatus, extra: extra}
	writeAll(ctx, p, httpKind(c.Gateway), src.HTTPRoutes)
	writeAll(ctx, p, grpcKind(c.Gateway), src.GRPCRoutes)
	writeAll(ctx, p, tcpKind(c.Gateway), src.tcp)
	writeAll(ctx, p, tlsKind(c.Gateway), src.tls)
	writeAll(ctx, p, udpKind(c.Gateway), src.udp)
	for ref := range c.notes {
		if !p.seen[ref] {
			delete(c.notes, ref)
		}
	}
	for ref := range c.refusals {
		if !p.seen[ref] {
			delete(c.refusals, ref)
		}
	}
	c.Metrics.pass(p.truncated)
	return reconcile.Result{}, errors.Join(p.errs...)
}

// passWrites is what one pass writes from, and what its writes found.
type passWrites struct {
	c    *Controller
	now  metav1.Time
	mesh map[model.RouteRef]model.RouteStatus
	gw   map[model.RouteRef]model.GatewayRouteStatus
	// extra are the ConfigHook's conditions of the routes' mesh entries.
	extra map[model.RouteRef][]ParentCondition

	seen      map[model.RouteRef]bool
	errs      []error
	truncated int
}

// writeAll writes the status of each of routes, of kind k, that differs from what the pass
// found for it: its mesh parents' entries and its Gateway parents' (none when the pass found
// none, which removes aether's entries it holds).
func writeAll[T client.Object](ctx context.Context, p *passWrites, k routeKind[T], routes []T) {
	c := p.c
	for _, r := range routes {
		ref := model.RouteRef{Kind: k.kind, Namespace: r.GetNamespace(), Name: r.GetName()}
		w := routeWant{mesh: model.RouteStatus{Route: ref, Generation: r.GetGeneration()}, gw: p.gw[ref], extra: p.extra[ref]}
		if st, ok := p.mesh[ref]; ok {
			w.mesh = st
		}
		w.gw.Route, w.gw.Generation = ref, r.GetGeneration()
		res := write(ctx, c.Log, c.Metrics, k, r, w, p.now, c.refusals[ref])
		p.seen[ref] = true
		if res.refused != nil {
			if c.refusals == nil {
				c.refusals = map[model.RouteRef]*refusal{}
			}
			c.refusals[ref] = res.refused
		} else {
			delete(c.refusals, ref)
		}
		p.errs = append(p.errs, res.err)
		if res.omitted > 0 {
			p.truncated++
		}
		c.note(w.mesh, res)
	}
}

// noteRegistry logs, once per registry outage in which a pass runs, that the pass uses the
// registry's records last read, and once that the registry answers again.
func (c *Controller) noteRegistry() {
	if c.RegistryErr == nil {
		return
	}
	err := c.RegistryErr()
	switch {
	case err != nil && !c.stale:
		c.stale = true
		_, rev, n := c.eps.state()
		c.Log.Warn("route status: the registry does not answer; passes use the endpoint records and export marks last read until it does",
			"revision", rev, "endpoints", n, "err", err)
	case err == nil && c.stale:
		c.stale = false
		c.Log.Info("route status: the registry answers again; passes use its current records")
	}
}

// note logs, once per route generation and change, that route st's entries did not all fit in
// status.parents or that its write was refused, and counts a refusal.
func (c *Controller) note(st model.RouteStatus, res outcome) {
	var what string
	switch {
	case res.refused != nil:
		what = fmt.Sprintf("refused at generation %d", st.Generation)
	case res.omitted > 0:
		what = fmt.Sprintf("%d omitted at generation %d", res.omitted, st.Generation)
	}
	if what == c.notes[st.Route] {
		return
	}
	if what == "" {
		delete(c.notes, st.Route)
		return
	}
	if c.notes == nil {
		c.notes = map[model.RouteRef]string{}
	}
	c.notes[st.Route] = what
	if res.refused != nil {
		c.Metrics.refusedWrite(st.Route.Kind)
		c.Log.Warn("route status: the API server refused the status write; not retried until the route or what it refers to changes",
			"route", st.Route.String(), "generation", st.Generation, "err", res.refused.err)
		return
	}
	c.Log.Warn(fmt.Sprintf("route status: status.parents holds at most %d entries: other controllers' entries are kept, %d of aether's are left out (the last parentRefs)", MaxParents, res.omitted),
		"route", st.Route.String(), "generation", st.Generation)
}

// listers are the listers of the watched kinds (nil: not watched).
type listers struct {
	http     gwlisters.HTTPRouteLister
	grpc     gwlisters.GRPCRouteLister
	tcp      gwlisters.TCPRouteLister
	tls      gwlisters.TLSRouteLister
	udp      gwlisters.UDPRouteLister
	gateways gwlisters.GatewayLister
	classes  gwlisters.GatewayClassLister
	grants   gwlisters.ReferenceGrantLister
}

// listed returns the listers of the watched kinds and whether a kind's state is not known yet.
func (c *Controller) listed() (listers, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return listers{http: c.http, grpc: c.grpc, tcp: c.tcp, tls: c.tls, udp: c.udp, gateways: c.gateways, classes: c.classes, grants: c.grants},
		len(c.pending) > 0
}

// passSources is what one pass reads: the model's Sources (the HTTPRoutes and GRPCRoutes among
// them), the L4 routes, and the GatewayClasses, Gateways and ReferenceGrants; when some Gateway
// is of a class aether accepts (aether), every route as a model.Route (routes) and every
// namespace's labels (namespaceLabels) too, which model.ResolveGateways reads.
type passSources struct {
	model.Sources
	tcp      []*gwv1.TCPRoute
	tls      []*gwv1.TLSRoute
	udp      []*gwv1.UDPRoute
	classes  []*gwv1.GatewayClass
	gateways []*gwv1.Gateway
	grants   []*gwv1.ReferenceGrant

	aether          bool
	routes          []model.Route
	namespaceLabels map[string]map[string]string

	// With a ConfigHook: the HTTPRoutes and GRPCRoutes as model.Routes, every ServiceImport, and
	// the services named that this cluster exports (Pass).
	meshRoutes   []model.Route
	allImports   []*mcsv1beta1.ServiceImport
	exportedHere map[model.ServiceKey]bool
}

// listAll lists every object of lister l (none when l is nil, a kind not watched), sorted by
// namespace and name.
func listAll[T metav1.Object](l interface {
	List(labels.Selector) ([]T, error)
}, kind string) ([]T, error) {
	if l == nil {
		return nil, nil
	}
	out, err := l.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("route status: list %ss: %w", kind, err)
	}
	slices.SortFunc(out, func(a, b T) int { return byName(a, b) })
	return out, nil
}

// sources fills the pass's sources from the caches: the mesh namespaces, the watched objects
// (sorted), and the Services, ServiceImports, registry endpoints and export marks of the services
// the routes name (as parents, backends or mirror backends; with aether's <svc>-clusterset Service
// of a named service). A route's status depends on those only (model.ResolveRoutes and
// model.ResolveGateways look services up by the keys the routes name, and model.Assemble gives a
// service's ports their protocol from that service's endpoints only), so leaving the others out
// gives the same statuses for less work: a pass costs in proportion to the routes and their
// services' endpoints, not to every Service and endpoint of the clusterset. Services and
// ServiceImports are read from the cache without a copy (client.UnsafeDisableDeepCopy):
// model.Assemble only reads them. The L4 routes' backends count only when some Gateway is
// aether's (no mesh parent of theirs is served yet).
//
// The services named are recorded (refs) before the registry's records are read, so an endpoint
// or export change of a newly named service is either read by this pass or asks for another.
func (c *Controller) sources(ctx context.Context, ls listers) (passSources, error) {
	src := passSources{Sources: model.Sources{MeshNamespaces: map[string]bool{}}}
	keys := map[model.ServiceKey]bool{}
	var err error
	if src.HTTPRoutes, err = listAll(ls.http, "HTTPRoute"); err != nil {
		return passSources{}, err
	}
	if src.GRPCRoutes, err = listAll(ls.grpc, "GRPCRoute"); err != nil {
		return passSources{}, err
	}
	if src.tcp, err = listAll(ls.tcp, "TCPRoute"); err != nil {
		return passSources{}, err
	}
	if src.tls, err = listAll(ls.tls, "TLSRoute"); err != nil {
		return passSources{}, err
	}
	if src.udp, err = listAll(ls.udp, "UDPRoute"); err != nil {
		return passSources{}, err
	}
	if src.gateways, err = listAll(ls.gateways, "Gateway"); err != nil {
		return passSources{}, err
	}
	if src.classes, err = listAll(ls.classes, "GatewayClass"); err != nil {
		return passSources{}, err
	}
	if src.grants, err = listAll(ls.grants, "ReferenceGrant"); err != nil {
		return passSources{}, err
	}
	accepted := gateway.ClassNames(src.classes)
	src.aether = slices.ContainsFunc(src.gateways, func(g *gwv1.Gateway) bool {
		return accepted[string(g.Spec.GatewayClassName)] == model.GatewayControllerName
	})
	add := func(m model.Route) {
		referenced(keys, m)
		if src.aether {
			src.routes = append(src.routes, m)
		}
	}
	for _, r := range src.HTTPRoutes {
		m := model.HTTPRouteModel(r)
		add(m)
		if c.Config != nil {
			src.meshRoutes = append(src.meshRoutes, m)
		}
	}
	for _, r := range src.GRPCRoutes {
		m := model.GRPCRouteModel(r)
		add(m)
		if c.Config != nil {
			src.meshRoutes = append(src.meshRoutes, m)
		}
	}
	// The projections' routes bind to their services and name backends as local routes do
	// (model.ImportRoutes): their services are read too.
	if c.Config != nil {
		slices.SortFunc(src.meshRoutes, func(a, b model.Route) int { return a.RouteRef.Compare(b.RouteRef) })
		src.Projections, src.ControlCluster = c.Config.Projections()
		for _, p := range src.Projections {
			keys[p.Service] = true
			for _, r := range p.Routes {
				referenced(keys, r)
			}
		}
	}
	// The L4 routes bind to Services in the mesh too (model.ResolveL4Routes, through Assemble):
	// their services are always read.
	for _, r := range src.tcp {
		add(model.TCPRouteModel(r))
	}
	for _, r := range src.tls {
		add(model.TLSRouteModel(r))
	}
	for _, r := range src.udp {
		add(model.UDPRouteModel(r))
	}
	src.Edge.TCPRoutes, src.Edge.TLSRoutes, src.Edge.UDPRoutes = src.tcp, src.tls, src.udp
	if src.aether {
		src.namespaceLabels = map[string]map[string]string{}
	}
	c.mu.Lock()
	c.refs = keys
	c.mu.Unlock()
	src.Cluster = c.Cluster
	src.Endpoints = c.eps.endpoints(keys)
	if c.Config != nil {
		src.exportedHere = map[model.ServiceKey]bool{}
	}
	for k := range keys {
		for _, m := range c.Exports.Marks(k) {
			// With their ports: the model gives another cluster's endpoints only the ports its
			// export defines the winning way, as the agents' does.
			x := registry.ToModelExport(m)
			x.Service = k
			src.Exports = append(src.Exports, x)
			if src.exportedHere != nil && m.Origin.Cluster == c.Cluster {
				src.exportedHere[k] = true
			}
		}
	}
	var nss corev1.NamespaceList
	var svcs corev1.ServiceList
	var imps mcsv1beta1.ServiceImportList
	for _, l := range []client.ObjectList{&nss, &svcs, &imps} {
		if err := c.Client.List(ctx, l, client.UnsafeDisableDeepCopy); err != nil {
			return passSources{}, fmt.Errorf("route status: list %T: %w", l, err)
		}
	}
	for _, ns := range nss.Items {
		if model.NamespaceMeshed(ns.Labels) {
			src.MeshNamespaces[ns.Name] = true
		}
		if src.namespaceLabels != nil {
			src.namespaceLabels[ns.Name] = ns.Labels
		}
	}
	for i := range svcs.Items {
		if s := &svcs.Items[i]; keys[model.ServiceKey{Namespace: s.Namespace, Name: s.Name}] || keys[clustersetOf(s)] {
			src.Services = append(src.Services, s)
		}
	}
	for i := range imps.Items {
		imp := &imps.Items[i]
		if keys[model.ServiceKey{Namespace: imp.Namespace, Name: imp.Name}] {
			src.Imports = append(src.Imports, imp)
		}
		if c.Config != nil {
			src.allImports = append(src.allImports, imp)
		}
	}
	return src, nil
}

// referenced adds to keys every service route rt names: its parents, its backends and the
// backends of its mirror filters (a rule's or a backend's).
func referenced(keys map[model.ServiceKey]bool, rt model.Route) {
	mirrors := func(fs []model.RouteFilter) {
		for _, f := range fs {
			if f.Mirror != nil {
				keys[f.Mirror.Backend.Service] = true
			}
		}
	}
	for _, p := range rt.Parents {
		keys[p.Service] = true
	}
	for _, r := range rt.Rules {
		mirrors(r.Filters)
		for _, b := range r.Backends {
			keys[b.Service] = true
			mirrors(b.Filters)
		}
	}
}

// clustersetOf returns the service that Service s stands for when s is one of aether's
// <svc>-clusterset Services (label aether.io/managed-by: aether, annotation aether.io/mesh-service
// "<ns>/<svc>", as model.Assemble reads it), else the zero key.
func clustersetOf(s *corev1.Service) model.ServiceKey {
	v, ok := s.Annotations[model.AnnotationMeshService]
	if !ok || s.Labels[model.LabelManagedBy] != model.ManagedByAether {
		return model.ServiceKey{}
	}
	ns, name, _ := strings.Cut(v, "/")
	return model.ServiceKey{Namespace: ns, Name: name}
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

// statusClient is the part of a typed route client that write uses.
type statusClient[T any] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	UpdateStatus(ctx context.Context, r T, opts metav1.UpdateOptions) (T, error)
}

// newKind is the routeKind of kind, whose objects' spec.parentRefs and status.parents refs and
// status give, read and written through the typed client of a namespace.
func newKind[T client.Object](kind model.RouteKind, deepCopy func(T) T, refs func(T) []gwv1.ParentReference,
	status func(T) *gwv1.RouteStatus, typed func(ns string) statusClient[T]) routeKind[T] {
	return routeKind[T]{
		kind: kind, parentRefs: refs, status: status, deepCopy: deepCopy,
		get: func(ctx context.Context, ns, name string) (T, error) {
			return typed(ns).Get(ctx, name, metav1.GetOptions{})
		},
		update: func(ctx context.Context, r T) error {
			_, err := typed(r.GetNamespace()).UpdateStatus(ctx, r, metav1.UpdateOptions{})
			return err
		},
	}
}

func httpKind(gw gwclient.Interface) routeKind[*gwv1.HTTPRoute] {
	return newKind(model.KindHTTPRoute, (*gwv1.HTTPRoute).DeepCopy,
		func(r *gwv1.HTTPRoute) []gwv1.ParentReference { return r.Spec.ParentRefs },
		func(r *gwv1.HTTPRoute) *gwv1.RouteStatus { return &r.Status.RouteStatus },
		func(ns string) statusClient[*gwv1.HTTPRoute] { return gw.GatewayV1().HTTPRoutes(ns) })
}

func grpcKind(gw gwclient.Interface) routeKind[*gwv1.GRPCRoute] {
	return newKind(model.KindGRPCRoute, (*gwv1.GRPCRoute).DeepCopy,
		func(r *gwv1.GRPCRoute) []gwv1.ParentReference { return r.Spec.ParentRefs },
		func(r *gwv1.GRPCRoute) *gwv1.RouteStatus { return &r.Status.RouteStatus },
		func(ns string) statusClient[*gwv1.GRPCRoute] { return gw.GatewayV1().GRPCRoutes(ns) })
}

func tcpKind(gw gwclient.Interface) routeKind[*gwv1.TCPRoute] {
	return newKind(model.KindTCPRoute, (*gwv1.TCPRoute).DeepCopy,
		func(r *gwv1.TCPRoute) []gwv1.ParentReference { return r.Spec.ParentRefs },
		func(r *gwv1.TCPRoute) *gwv1.RouteStatus { return &r.Status.RouteStatus },
		func(ns string) statusClient[*gwv1.TCPRoute] { return gw.GatewayV1().TCPRoutes(ns) })
}

func tlsKind(gw gwclient.Interface) routeKind[*gwv1.TLSRoute] {
	return newKind(model.KindTLSRoute, (*gwv1.TLSRoute).DeepCopy,
		func(r *gwv1.TLSRoute) []gwv1.ParentReference { return r.Spec.ParentRefs },
		func(r *gwv1.TLSRoute) *gwv1.RouteStatus { return &r.Status.RouteStatus },
		func(ns string) statusClient[*gwv1.TLSRoute] { return gw.GatewayV1().TLSRoutes(ns) })
}

func udpKind(gw gwclient.Interface) routeKind[*gwv1.UDPRoute] {
	return newKind(model.KindUDPRoute, (*gwv1.UDPRoute).DeepCopy,
		func(r *gwv1.UDPRoute) []gwv1.ParentReference { return r.Spec.ParentRefs },
		func(r *gwv1.UDPRoute) *gwv1.RouteStatus { return &r.Status.RouteStatus },
		func(ns string) statusClient[*gwv1.UDPRoute] { return gw.GatewayV1().UDPRoutes(ns) })
}

// routeWant is what a pass found for one route: its mesh parents' statuses (model.Assemble), its
// Gateway parents' (model.ResolveGateways), both at the route's generation, and the ConfigHook's
// conditions of its mesh parents.
type routeWant struct {
	mesh  model.RouteStatus
	gw    model.GatewayRouteStatus
	extra []ParentCondition
}

// outcome is what write did with one route: err to retry with the pass (nil when written,
// when nothing needed writing, or when the route is gone or moved on), refused when the API
// server refused the status for good, omitted as ParentStatuses says.
type outcome struct {
	err     error
	refused *refusal
	omitted int
}

// refusal is a status write the API server refused for good: the route as it was
// (resourceVersion), what aether had to say about it (the pass's statuses) and the error.
type refusal struct {
	resourceVersion string
	status          routeWant
	err             error
}

// write merges st (its mesh and Gateway parents' statuses) into route r's status.parents
// (ParentStatuses) and writes it when it differs.
// On a resourceVersion conflict it reads the route again and retries (retry.DefaultBackoff); a
// route whose generation moved past st's is left to the pass its change brings, and a route
// deleted meanwhile is no error. A write refused as invalid (422), too large (413) or a bad
// request (400) is outcome.refused, not an error: the same status would be refused again, so
// while the route is as it was (its resourceVersion) and st is what was refused (prev), it is
// not sent again.
func write[T client.Object](ctx context.Context, log *slog.Logger, met *Metrics, k routeKind[T], r T, st routeWant, now metav1.Time, prev *refusal) outcome {
	var res outcome
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		res.omitted = 0
		if r.GetGeneration() != st.mesh.Generation {
			return nil
		}
		have := k.status(r).Parents
		want, omitted := ParentStatuses(have, k.parentRefs(r), st.mesh, st.gw, st.extra, now)
		res.omitted = omitted
		if equalParents(have, want) {
			return nil
		}
		if prev != nil && prev.resourceVersion == r.GetResourceVersion() && reflect.DeepEqual(prev.status, st) {
			res.refused = prev // refused as it is: not sent again
			return nil
		}
		upd := k.deepCopy(r)
		k.status(upd).Parents = want
		err := k.update(ctx, upd)
		if err == nil {
			met.wrote(k.kind)
			log.Debug("route status written", "route", st.mesh.Route.String(), "generation", st.mesh.Generation)
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
	switch {
	case err == nil || apierrors.IsNotFound(err):
	case apierrors.IsInvalid(err) || apierrors.IsRequestEntityTooLargeError(err) || apierrors.IsBadRequest(err):
		res.refused = &refusal{resourceVersion: r.GetResourceVersion(), status: st, err: fmt.Errorf("write status of %s: %w", st.mesh.Route, err)}
	default:
		res.err = fmt.Errorf("write status of %s: %w", st.mesh.Route, err)
	}
	return res
}

// followed are the kinds the controller follows: the route kinds, and the Gateway side's with
// Gateways set.
func (c *Controller) followed() []kind {
	var out []kind
	for _, k := range kinds {
		if !k.gateway || c.Gateways != nil {
			out = append(out, k)
		}
	}
	return out
}

// SetupWithManager registers the controller (leader only): Services, ServiceImports and
// Namespaces from the manager's cache (and, with Gateways set, the Secrets the Gateways'
// certificateRefs name), the Gateway API objects of each kind while its CRD is installed
// (watchKinds), and the registry's endpoint records and export marks (followRegistry); every
// event asks for one pass, PassDelay later.
func (c *Controller) SetupWithManager(mgr ctrl.Manager) error {
	if c.Client == nil || c.Gateway == nil || c.Discovery == nil || c.Log == nil || c.Endpoints == nil || c.Exports == nil || c.Cluster == "" {
		return errors.New("set up route status controller: Client, Gateway, Discovery, Log, Cluster, Endpoints and Exports are required")
	}
	if c.CRDRecheck <= 0 {
		c.CRDRecheck = DefaultCRDRecheck
	}
	if c.PassDelay <= 0 {
		c.PassDelay = DefaultPassDelay
	}
	c.mu.Lock()
	c.pending = map[string]bool{}
	for _, k := range c.followed() {
		c.pending[k.res] = true
	}
	c.mu.Unlock()
	c.eps = newEndpointView()
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	later := func(q queue) { q.AddAfter(syncAll, c.PassDelay) }
	all := handler.Funcs{
		CreateFunc:  func(_ context.Context, _ event.CreateEvent, q queue) { later(q) },
		UpdateFunc:  func(_ context.Context, _ event.UpdateEvent, q queue) { later(q) },
		DeleteFunc:  func(_ context.Context, _ event.DeleteEvent, q queue) { later(q) },
		GenericFunc: func(_ context.Context, _ event.GenericEvent, q queue) { later(q) },
	}
	opts := controller.Options{MaxConcurrentReconciles: 1, RateLimiter: c.RateLimiter}
	if c.SkipNameValidation {
		opts.SkipNameValidation = &c.SkipNameValidation
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("routestatus").
		WatchesRawSource(source.Func(func(ctx context.Context, q queue) error {
			go c.watchKinds(ctx, func() { later(q) })
			go c.followRegistry(ctx, func() { later(q) })
			return nil
		})).
		Watches(&corev1.Service{}, all).
		Watches(&mcsv1beta1.ServiceImport{}, all).
		Watches(&corev1.Namespace{}, all)
	if c.Gateways != nil {
		b = b.Watches(&corev1.Secret{}, all, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.secrets[model.SecretKey{Namespace: o.GetNamespace(), Name: o.GetName()}]
		})))
	}
	if err := b.WithOptions(opts).Complete(c); err != nil {
		return fmt.Errorf("set up route status controller: %w", err)
	}
	return nil
}

// followRegistry keeps the endpoint view current from the registry's endpoint watch until ctx
// ends, and asks for a pass (enqueue) once both the endpoint records and the export marks were
// first read, and then whenever the records or marks of a service the last pass's routes named
// changed in a way that may change its ports' protocols (endpointView.apply). The view keeps its
// records when the registry is unreachable: the watch resumes, or re-lists after a compaction,
// when it answers again.
func (c *Controller) followRegistry(ctx context.Context, enqueue func()) {
	if c.Config != nil {
		c.Config.Subscribe(enqueue)
	}
	c.Exports.Subscribe(func(keys []model.ServiceKey) {
		if c.named(keys) {
			enqueue()
		}
	})
	go func() {
		if c.Exports.WaitSynced(ctx) == nil {
			enqueue()
		}
	}()
	for b := range c.Endpoints.WatchEndpoints(ctx) {
		changed, first := c.eps.apply(b)
		switch {
		case first:
			_, rev, n := c.eps.state()
			c.Log.Info("route status: registry endpoint records read", "endpoints", n, "revision", rev)
			enqueue()
		case c.named(changed):
			enqueue()
		}
	}
}

// named reports whether a route of the last pass names one of keys.
func (c *Controller) named(keys []model.ServiceKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.ContainsFunc(keys, func(k model.ServiceKey) bool { return c.refs[k] })
}

// watchKinds follows each kind's CRD until ctx ends (followKind). enqueue asks for a pass; it is
// called on every event of a watched kind and whenever a kind's state changes.
func (c *Controller) watchKinds(ctx context.Context, enqueue func()) {
	var wg sync.WaitGroup
	for _, k := range c.followed() {
		wg.Go(func() { c.followKind(ctx, k, enqueue) })
	}
	wg.Wait()
}

// followKind watches kind k while its CRD is installed, until ctx ends: it waits until discovery
// lists it (waitInstalled), watches it (watchKind) until the CRD is gone, and starts over.
func (c *Controller) followKind(ctx context.Context, k kind, enqueue func()) {
	for c.waitInstalled(ctx, k, enqueue) {
		c.watchKind(ctx, k, enqueue)
	}
}

// setKind records the state of kind k: pending (not known yet) or not, with the lister of its
// objects (nil: not listed). It asks for a pass.
func (c *Controller) setKind(k kind, pending bool, lister any, enqueue func()) {
	c.mu.Lock()
	if pending {
		c.pending[k.res] = true
	} else {
		delete(c.pending, k.res)
	}
	on := false
	switch k.res {
	case "httproutes":
		c.http, _ = lister.(gwlisters.HTTPRouteLister)
		on = c.http != nil
	case "grpcroutes":
		c.grpc, _ = lister.(gwlisters.GRPCRouteLister)
		on = c.grpc != nil
	case "tcproutes":
		c.tcp, _ = lister.(gwlisters.TCPRouteLister)
		on = c.tcp != nil
	case "tlsroutes":
		c.tls, _ = lister.(gwlisters.TLSRouteLister)
		on = c.tls != nil
	case "udproutes":
		c.udp, _ = lister.(gwlisters.UDPRouteLister)
		on = c.udp != nil
	case "gateways":
		c.gateways, _ = lister.(gwlisters.GatewayLister)
		on = c.gateways != nil
	case "gatewayclasses":
		c.classes, _ = lister.(gwlisters.GatewayClassLister)
		on = c.classes != nil
	case "referencegrants":
		c.grants, _ = lister.(gwlisters.ReferenceGrantLister)
		on = c.grants != nil
	}
	c.Metrics.watching(k.kind, on)
	c.mu.Unlock()
	enqueue()
}

// waitInstalled returns true once discovery lists k's resource in gateway.networking.k8s.io/v1,
// false when ctx ends first. The first time discovery answers that it is not installed, the kind
// stops being pending (passes run without it); it logs once that the CRD is missing, and a
// discovery error when it changes.
func (c *Controller) waitInstalled(ctx context.Context, k kind, enqueue func()) bool {
	t := time.NewTicker(c.CRDRecheck)
	defer t.Stop()
	logged, lastErr := false, ""
	for {
		ok, err := RouteCRDInstalled(c.Discovery, k.res)
		switch {
		case ok:
			return true
		case err != nil:
			if err.Error() != lastErr {
				lastErr = err.Error()
				c.Log.Warn("route status: discovery failed; retrying", "resource", k.res, "recheck", c.CRDRecheck, "err", err)
			}
		case !logged:
			logged = true
			c.setKind(k, false, nil, enqueue)
			c.Log.Info("route status: the Gateway API CRD for "+k.res+" ("+gwv1.GroupVersion.String()+") is not installed; "+k.kind+"s are ignored until it is",
				"recheck", c.CRDRecheck)
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// informer returns the informer and lister of kind k from f.
func informer(f gwinformers.SharedInformerFactory, k kind) (cache.SharedIndexInformer, any) {
	v1 := f.Gateway().V1()
	switch k.res {
	case "httproutes":
		return v1.HTTPRoutes().Informer(), v1.HTTPRoutes().Lister()
	case "grpcroutes":
		return v1.GRPCRoutes().Informer(), v1.GRPCRoutes().Lister()
	case "tcproutes":
		return v1.TCPRoutes().Informer(), v1.TCPRoutes().Lister()
	case "tlsroutes":
		return v1.TLSRoutes().Informer(), v1.TLSRoutes().Lister()
	case "udproutes":
		return v1.UDPRoutes().Informer(), v1.UDPRoutes().Lister()
	case "gateways":
		return v1.Gateways().Informer(), v1.Gateways().Lister()
	case "gatewayclasses":
		return v1.GatewayClasses().Informer(), v1.GatewayClasses().Lister()
	default:
		return v1.ReferenceGrants().Informer(), v1.ReferenceGrants().Lister()
	}
}

// watchKind watches kind k with an informer of its own until ctx ends or the CRD is gone: the
// kind is pending until the informer has synced, then listed in passes. The CRD is looked up in
// discovery when the informer's list or watch answers 404 and every CRDRecheck; once discovery no
// longer lists it, the informer is stopped and the kind is no longer listed.
func (c *Controller) watchKind(ctx context.Context, k kind, enqueue func()) {
	c.setKind(k, true, nil, enqueue)
	ictx, cancel := context.WithCancel(ctx)
	f := gwinformers.NewSharedInformerFactory(c.Gateway, 0)
	defer f.Shutdown()
	defer cancel()
	inf, lister := informer(f, k)
	lookup := make(chan struct{}, 1)
	err := errors.Join(
		inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			if apierrors.IsNotFound(err) { // the CRD is gone, or going: look now
				select {
				case lookup <- struct{}{}:
				default:
				}
				return
			}
			cache.DefaultWatchErrorHandler(ctx, r, err)
		}),
		func() error {
			_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
				AddFunc:    func(any) { enqueue() },
				UpdateFunc: func(any, any) { enqueue() },
				DeleteFunc: func(any) { enqueue() },
			})
			return err
		}(),
	)
	if err != nil { // only when the informer has started, which it has not
		c.Log.Error("route status: watch "+k.res, "err", err)
		<-ctx.Done()
		return
	}
	f.Start(ictx.Done())
	synced := make(chan bool, 1)
	go func() { synced <- cache.WaitForCacheSync(ictx.Done(), inf.HasSynced) }()
	t := time.NewTicker(c.CRDRecheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ok := <-synced:
			if ok {
				c.setKind(k, false, lister, enqueue)
				c.Log.Info("route status: watching "+k.res, "group_version", gwv1.GroupVersion.String())
			}
			continue
		case <-lookup:
		case <-t.C:
		}
		if installed, err := RouteCRDInstalled(c.Discovery, k.res); err == nil && !installed {
			cancel()
			c.setKind(k, false, nil, enqueue)
			c.Log.Warn("route status: the Gateway API CRD for "+k.res+" ("+gwv1.GroupVersion.String()+") was removed; "+k.kind+"s are no longer watched until it is installed again",
				"recheck", c.CRDRecheck)
			return
		}
	}
}

// RouteCRDInstalled reports whether discovery lists resource res (httproutes, gateways, ...) in
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
//	aether_registrar_route_status_passes_total           counter: passes over every route
//	aether_registrar_route_status_writes_total           counter: status writes, by route kind (HTTPRoute, ...)
//	aether_registrar_route_status_refused_total          counter: status writes the API server refused as
//	                                                     invalid or too large, by kind; once per route generation
//	aether_registrar_route_status_truncated_routes       gauge: routes whose status.parents could not hold all
//	                                                     of aether's entries (MaxParents) at the last pass
//	aether_registrar_route_status_watched                gauge: 1 while the kind's CRD is installed and its
//	                                                     objects are watched (cache synced), else 0; by kind
//	                                                     (the route kinds; Gateway, GatewayClass and
//	                                                     ReferenceGrant with the Gateway controller on)
//
// A nil *Metrics records nothing.
type Metrics struct {
	passes          prometheus.Counter
	writes, refused *prometheus.CounterVec
	truncated       prometheus.Gauge
	watched         *prometheus.GaugeVec
}

// NewMetrics creates the collectors and registers them with reg (nil: not registered). It
// returns the registration error.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		passes: prometheus.NewCounter(prometheus.CounterOpts{Name: "aether_registrar_route_status_passes_total",
			Help: "Passes of the route status controller over every route."}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aether_registrar_route_status_writes_total",
			Help: "Route status writes (UpdateStatus) of the route status controller, by route kind."}, []string{"kind"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aether_registrar_route_status_refused_total",
			Help: "Route status writes the API server refused as invalid or too large (not retried until the route or what it refers to changes), by route kind; counted once per route generation."}, []string{"kind"}),
		truncated: prometheus.NewGauge(prometheus.GaugeOpts{Name: "aether_registrar_route_status_truncated_routes",
			Help: "Routes whose status.parents (at most 32 entries) could not hold all of aether's entries beside other controllers' at the last pass."}),
		watched: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "aether_registrar_route_status_watched",
			Help: "1 while the Gateway API kind's CRD is installed and its objects are watched (cache synced), else 0."}, []string{"kind"}),
	}
	for _, k := range []model.RouteKind{model.KindHTTPRoute, model.KindGRPCRoute, model.KindTCPRoute, model.KindTLSRoute, model.KindUDPRoute} {
		m.watched.WithLabelValues(string(k)).Set(0)
	}
	if reg != nil {
		if err := errors.Join(reg.Register(m.passes), reg.Register(m.writes), reg.Register(m.refused), reg.Register(m.truncated), reg.Register(m.watched)); err != nil {
			return nil, fmt.Errorf("register route status metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) pass(truncated int) {
	if m != nil {
		m.passes.Inc()
		m.truncated.Set(float64(truncated))
	}
}

func (m *Metrics) watching(kind string, on bool) {
	if m != nil {
		v := 0.0
		if on {
			v = 1
		}
		m.watched.WithLabelValues(kind).Set(v)
	}
}

func (m *Metrics) refusedWrite(k model.RouteKind) {
	if m != nil {
		m.refused.WithLabelValues(string(k)).Inc()
	}
}

func (m *Metrics) wrote(k model.RouteKind) {
	if m != nil {
		m.writes.WithLabelValues(string(k)).Inc()
	}
}
