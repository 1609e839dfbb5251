package registrar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/registrar/authzstatus"
	"github.com/aethermesh/aether/registrar/configexport"
	"github.com/aethermesh/aether/registrar/gateway"
	"github.com/aethermesh/aether/registrar/mcs"
	"github.com/aethermesh/aether/registrar/routestatus"
	"github.com/aethermesh/aether/registry"
)

// Config configures one registrar instance (one replica of aether-registrar).
type Config struct {
	// Kube is the API server connection of this cluster. Required.
	Kube *rest.Config
	// Exports is this cluster's registry (its origin is this cluster's partition). Required.
	Exports mcs.Exports
	// Endpoints is the registry's endpoint records (every cluster's), which the route status
	// controller reads for the protocols of ports without appProtocol; *registry.Registry (the
	// same as Exports) implements it. Required.
	Endpoints routestatus.EndpointSource
	// Configs is the registry's config projections (*registry.Registry, the same as Exports):
	// with it, the registrar exports this cluster's config projections and reports their import
	// (package configexport); nil turns both off.
	Configs configexport.Configs
	// ControlCluster is --control-cluster: the only cluster that exports config and whose
	// projections importers trust ("": each cluster exports its own services' config).
	ControlCluster string
	// ConfigExportRefresh is how often an unchanged projection is written again (default
	// configexport.DefaultRefresh).
	ConfigExportRefresh time.Duration
	// Probe checks that the registry answers (for example a linearizable read with a short
	// timeout, or registry.Registry.EnsureClaim); readiness check "registry" fails while it
	// returns an error. An error matching registry.ErrPartitionClaimed (this cluster's partition
	// belongs to another cluster) stops the registrar (Start returns it), or, with
	// KeepRunningOnClaimConflict, only its controllers. Required.
	Probe func(ctx context.Context) error
	// KeepRunningOnClaimConflict makes a partition claimed by another cluster pause the export
	// controller and import generator (they read and write nothing) and fail readiness check
	// "partition-claim" with the probe's error, instead of stopping the registrar; everything
	// else (the process, the registry it may host, the probe) goes on, and once a probe
	// succeeds again (the claim re-claimed for this cluster) the controllers resume with a full
	// resync, without a restart. For the single-machine shape, whose process hosts every
	// cluster's registry.
	KeepRunningOnClaimConflict bool
	// WaitForCaches makes the controllers wait as long as it takes for their caches (the MCS
	// CRDs installed, the API server answering) instead of failing the manager, and so Start,
	// after controller-runtime's CacheSyncTimeout (2 min; controller.Options.CacheSyncTimeout);
	// readiness check "caches" fails meanwhile, naming what is missing. For the single-machine
	// shape, whose process hosts every cluster's registry.
	WaitForCaches bool
	// ProbeInterval is how often Probe runs (default 2 s); ProbeTimeout bounds one run (default 2 s).
	ProbeInterval, ProbeTimeout time.Duration

	// LeaderElection turns leader election on (a Lease named LeaderElectionID in
	// LeaderElectionNamespace); only the leader runs the controllers.
	LeaderElection          bool
	LeaderElectionID        string
	LeaderElectionNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod tune leader election (client-go defaults 15 s,
	// 10 s, 2 s when zero).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// ReleaseOnCancel makes a stopping leader give up its lease at once, so a standby takes
	// over without waiting LeaseDuration.
	ReleaseOnCancel bool

	// MetricsAddr is the metrics listener ("0" or "" disables it), HealthAddr the /healthz and
	// /readyz listener ("0" or "" disables it).
	MetricsAddr, HealthAddr string
	// Metrics receives the registrar's collectors (nil: not registered).
	Metrics prometheus.Registerer
	// Workers bounds parallel reconciles per controller (default 4).
	Workers int
	// MaxRetryDelay caps the per-object retry back-off (default 30 s).
	MaxRetryDelay time.Duration
	// SkipNameValidation allows several registrars in one process (tests).
	SkipNameValidation bool
	// RouteCRDRecheck is how often the route status controller looks again for a Gateway API
	// CRD (the routes', and the Gateway controller's GatewayClass, Gateway and ReferenceGrant;
	// the AuthorizationPolicy status writer's AuthorizationPolicy CRD too)
	// that is not installed, and checks that a watched one still is (default 30 s).
	RouteCRDRecheck time.Duration
	// EdgeEnvoyImage is the Envoy image of the edge Gateways' Deployments (registrar/gateway:
	// the agent DaemonSet's Envoy image). Empty turns aether's Gateway controller off: no
	// GatewayClass is served, and routes get status entries for their mesh parents only.
	EdgeEnvoyImage string
	// Namespace is the registrar's own namespace, where the Gateway controller publishes the
	// copies of the edge Gateways' certificates. Required with EdgeEnvoyImage.
	Namespace string
	// GatewayAddressCIDRs are the ranges a Gateway's spec.addresses may ask for
	// (gateway.Controller.AddressCIDRs); none when empty.
	GatewayAddressCIDRs []netip.Prefix
	// EdgeCrossNamespaceCertificates is model.GatewayInputs.CrossNamespaceCertificates.
	EdgeCrossNamespaceCertificates bool
	// EdgeReplicas is gateway.Controller.Replicas.
	EdgeReplicas int32
	// GatewayInfrastructureKeys are the spec.infrastructure keys the edge objects get
	// (gateway.Controller.InfrastructureKeys, model.GatewayInputs.InfrastructureKeys).
	GatewayInfrastructureKeys []string
	// Logger receives the registrar's logs. Required.
	Logger *slog.Logger
}

// Registrar is a configured, not yet started registrar: a controller-runtime manager with the
// ExportView, the ExportController, the ImportGenerator, the route status controller and the
// registry probe.
type Registrar struct {
	mgr    manager.Manager
	cfg    Config
	log    *slog.Logger
	export *mcs.ExportController
	imp    *mcs.ImportGenerator
	routes *routestatus.Controller
	// gateways is aether's Gateway controller; nil without Config.EdgeEnvoyImage.
	gateways *gateway.Controller
	// configs is the config-export controller; nil without Config.Configs.
	configs *configexport.Exporter

	mu       sync.Mutex
	probeErr error
	// claimErr is nil once a probe succeeded (the partition's claim verified as this
	// cluster's, with registry.Registry.EnsureClaim as the probe) and until one finds the
	// partition claimed by another cluster; the controllers are paused while it is not nil.
	claimErr error
}

// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=aether-system,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=aether-system,resources=events,verbs=create;patch

// New validates cfg and builds the manager and controllers. It returns an error naming the
// missing or bad setting, or the manager's error.
func New(cfg Config) (*Registrar, error) {
	switch {
	case cfg.Kube == nil:
		return nil, errors.New("create registrar: Kube: required")
	case cfg.Exports == nil:
		return nil, errors.New("create registrar: Exports: required")
	case cfg.Endpoints == nil:
		return nil, errors.New("create registrar: Endpoints: required")
	case cfg.Probe == nil:
		return nil, errors.New("create registrar: Probe: required")
	case cfg.Logger == nil:
		return nil, errors.New("create registrar: Logger: required")
	case cfg.EdgeEnvoyImage != "" && cfg.Namespace == "":
		return nil, errors.New("create registrar: Namespace: required with EdgeEnvoyImage (the Gateway controller's certificate copies live there)")
	case cfg.LeaderElection && (cfg.LeaderElectionID == "" || cfg.LeaderElectionNamespace == ""):
		return nil, fmt.Errorf("create registrar: leader election needs LeaderElectionID (%q) and LeaderElectionNamespace (%q)", cfg.LeaderElectionID, cfg.LeaderElectionNamespace)
	}
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = 2 * time.Second
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = 2 * time.Second
	}
	if cfg.MaxRetryDelay <= 0 {
		cfg.MaxRetryDelay = 30 * time.Second
	}
	addr := func(a string) string {
		if a == "" {
			return "0"
		}
		return a
	}
	scheme := runtime.NewScheme()
	if err := errors.Join(clientgoscheme.AddToScheme(scheme), mcsv1beta1.Install(scheme)); err != nil {
		return nil, fmt.Errorf("create registrar: build scheme: %w", err)
	}
	opts := ctrl.Options{
		Scheme:                        scheme,
		Cache:                         cache.Options{ByObject: gateway.CacheByObject()},
		Logger:                        logr.FromSlogHandler(cfg.Logger.Handler()),
		Metrics:                       metricsserver.Options{BindAddress: addr(cfg.MetricsAddr)},
		HealthProbeBindAddress:        addr(cfg.HealthAddr),
		LeaderElection:                cfg.LeaderElection,
		LeaderElectionID:              cfg.LeaderElectionID,
		LeaderElectionNamespace:       cfg.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: cfg.ReleaseOnCancel,
	}
	if cfg.WaitForCaches {
		opts.Controller.CacheSyncTimeout = waitForever
	}
	if cfg.LeaseDuration > 0 {
		opts.LeaseDuration = &cfg.LeaseDuration
	}
	if cfg.RenewDeadline > 0 {
		opts.RenewDeadline = &cfg.RenewDeadline
	}
	if cfg.RetryPeriod > 0 {
		opts.RetryPeriod = &cfg.RetryPeriod
	}
	mgr, err := ctrl.NewManager(cfg.Kube, opts)
	if err != nil {
		return nil, fmt.Errorf("create registrar: manager: %w", err)
	}
	met, err := mcs.NewMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("create registrar: %w", err)
	}
	log := cfg.Logger
	view := mcs.NewExportView(cfg.Exports, log)
	r := &Registrar{mgr: mgr, cfg: cfg, log: log, probeErr: errNotProbed, claimErr: errClaimNotVerified}
	// Each controller gets its own rate limiter (it keeps per-item failure counts).
	tuning := func() mcs.ControllerTuning {
		return mcs.ControllerTuning{MaxConcurrentReconciles: cfg.Workers, SkipNameValidation: cfg.SkipNameValidation,
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](100*time.Millisecond, cfg.MaxRetryDelay),
			Paused:      r.paused}
	}
	r.export = &mcs.ExportController{
		Client: mgr.GetClient(), Exports: cfg.Exports, View: view, Log: log, Metrics: met,
		ControllerTuning: tuning(),
	}
	r.imp = &mcs.ImportGenerator{
		Client: mgr.GetClient(), View: view, Recorder: mgr.GetEventRecorder("aether-registrar"), Log: log, Metrics: met,
		ControllerTuning: tuning(),
	}
	// The route status controller is not paused with the MCS controllers: it writes only this
	// cluster's route status, from this cluster's objects and the registry's records (read only,
	// as the agents read them), and never the registry.
	gw, err := gwclient.NewForConfig(cfg.Kube)
	if err != nil {
		return nil, fmt.Errorf("create registrar: Gateway API client: %w", err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg.Kube)
	if err != nil {
		return nil, fmt.Errorf("create registrar: discovery client: %w", err)
	}
	rmet, err := routestatus.NewMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("create registrar: %w", err)
	}
	r.routes = &routestatus.Controller{
		Client: mgr.GetClient(), Gateway: gw, Discovery: disc, Log: log, Metrics: rmet, CRDRecheck: cfg.RouteCRDRecheck,
		Cluster: cfg.Exports.Origin().Cluster, Endpoints: cfg.Endpoints, Exports: view, RegistryErr: r.registryErr,
		RateLimiter:        workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](100*time.Millisecond, cfg.MaxRetryDelay),
		SkipNameValidation: cfg.SkipNameValidation, APIReader: mgr.GetAPIReader(),
		CrossNamespaceCertificates: cfg.EdgeCrossNamespaceCertificates, InfrastructureKeys: cfg.GatewayInfrastructureKeys,
	}
	// aether's Gateway controller applies what the route status controller resolves (package
	// gateway's doc says why one pass computes both); like it, it is not paused on a claim
	// conflict: it writes nothing into the registry.
	if cfg.EdgeEnvoyImage != "" {
		r.gateways = &gateway.Controller{
			Client: mgr.GetClient(), Gateway: gw, Namespace: cfg.Namespace, EnvoyImage: cfg.EdgeEnvoyImage, AddressCIDRs: cfg.GatewayAddressCIDRs,
			InfrastructureKeys: cfg.GatewayInfrastructureKeys, Replicas: cfg.EdgeReplicas, Log: log,
			RateLimiter:        workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](100*time.Millisecond, cfg.MaxRetryDelay),
			SkipNameValidation: cfg.SkipNameValidation,
		}
		r.routes.Gateways = r.gateways
		if err := r.gateways.SetupWithManager(mgr); err != nil {
			return nil, fmt.Errorf("create registrar: %w", err)
		}
	} else {
		log.Info("registrar: no edge Envoy image (--edge-envoy-image): aether's Gateway controller is off, no GatewayClass is served")
	}
	if cfg.Configs != nil {
		if err := r.setupConfigs(mgr); err != nil {
			return nil, fmt.Errorf("create registrar: %w", err)
		}
	} else {
		log.Info("registrar: no config projections (Config.Configs unset): config export and import status are off")
	}
	// The AuthorizationPolicy status writer: like the route status controller, not paused on a
	// claim conflict (it reads this cluster's policies and Services and writes only their status).
	dyn, err := dynamic.NewForConfig(cfg.Kube)
	if err != nil {
		return nil, fmt.Errorf("create registrar: dynamic client: %w", err)
	}
	authz := &authzstatus.Controller{
		Client: mgr.GetClient(), Dynamic: dyn, Discovery: disc, Log: log, CRDRecheck: cfg.RouteCRDRecheck,
		RateLimiter:        workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](100*time.Millisecond, cfg.MaxRetryDelay),
		SkipNameValidation: cfg.SkipNameValidation,
	}
	if err := errors.Join(
		authz.SetupWithManager(mgr),
		mgr.Add(view),
		r.export.SetupWithManager(mgr),
		r.imp.SetupWithManager(mgr),
		r.routes.SetupWithManager(mgr),
		mgr.Add(everyReplica(r.probeLoop)),
		mgr.AddHealthzCheck("ping", healthz.Ping),
		mgr.AddReadyzCheck("registry", r.readyCheck),
		mgr.AddReadyzCheck(PartitionClaimCheck, r.claimCheck),
	); err != nil {
		return nil, fmt.Errorf("create registrar: %w", err)
	}
	if !cfg.WaitForCaches {
		return r, nil
	}
	if err := mgr.AddReadyzCheck(CachesCheck, r.cachesCheck); err != nil {
		return nil, fmt.Errorf("create registrar: %w", err)
	}
	return r, nil
}

// setupConfigs adds the config projections' view, exporter and import status controller, hooked
// into the route status pass (package configexport).
func (r *Registrar) setupConfigs(mgr manager.Manager) error {
	cfg := r.cfg
	met, err := configexport.NewMetrics(cfg.Metrics)
	if err != nil {
		return err
	}
	view := configexport.NewConfigView(cfg.Configs, cfg.ControlCluster, r.log, met)
	r.configs = &configexport.Exporter{
		Client: mgr.GetClient(), Configs: cfg.Configs, View: view, ControlCluster: cfg.ControlCluster, Refresh: cfg.ConfigExportRefresh,
		Log: r.log, Metrics: met, Paused: r.paused, SkipNameValidation: cfg.SkipNameValidation,
		RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](100*time.Millisecond, cfg.MaxRetryDelay),
	}
	imports := &configexport.ImportStatus{
		Client: mgr.GetClient(), Log: r.log, Metrics: met, Workers: cfg.Workers, SkipNameValidation: cfg.SkipNameValidation,
		RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](100*time.Millisecond, cfg.MaxRetryDelay),
	}
	r.routes.Config = &configexport.Hook{Exporter: r.configs, View: view, Imports: imports, Cluster: cfg.Configs.Origin().Cluster}
	return errors.Join(mgr.Add(view), r.configs.SetupWithManager(mgr), imports.SetupWithManager(mgr))
}

// Start runs the registrar until ctx ends (nil) or the manager fails, for instance when it loses
// its leader lease (an error: the process should exit and be restarted).
func (r *Registrar) Start(ctx context.Context) error {
	if err := r.mgr.Start(ctx); err != nil {
		return fmt.Errorf("run registrar: %w", err)
	}
	return nil
}

// Elected is closed when this instance becomes the leader (at once without leader election).
func (r *Registrar) Elected() <-chan struct{} { return r.mgr.Elected() }

// Ready returns nil when the registry answered the last probe and the partition is not
// claimed by another cluster, else the probe's error.
func (r *Registrar) Ready() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.probeErr != nil {
		return r.probeErr
	}
	if r.claimErr != errClaimNotVerified {
		return r.claimErr
	}
	return nil
}

// PartitionClaimCheck names the readiness check (/readyz) that fails while this cluster's
// registry partition is claimed by another cluster (Config.KeepRunningOnClaimConflict).
const PartitionClaimCheck = "partition-claim"

// registryErr is the last probe's error, nil before the first probe (the route status controller
// reads the registry's records through watches of their own: until they are read it runs no pass).
func (r *Registrar) registryErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.probeErr == errNotProbed {
		return nil
	}
	return r.probeErr
}

func (r *Registrar) readyCheck(*http.Request) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.probeErr
}

func (r *Registrar) claimCheck(*http.Request) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.claimErr == errClaimNotVerified {
		return nil // check "registry" fails until the first probe
	}
	return r.claimErr
}

// paused reports whether the controllers must do nothing: the partition's claim is not
// verified as this cluster's yet (no probe succeeded), or another cluster holds it.
func (r *Registrar) paused() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.claimErr != nil
}

// probeLoop probes the registry every ProbeInterval on every replica (readiness is per replica),
// the first time at start. When the registry answers again after failing, it re-enqueues
// everything, so writes that failed during the outage are retried at once. A partition claimed
// by another cluster (registry.ErrPartitionClaimed) ends it with that error, which stops the
// manager; with KeepRunningOnClaimConflict it pauses the controllers instead (logging the
// conflict when it starts and when the claim changes) and resumes them, with the same
// re-enqueueing, at the first probe that succeeds afterwards.
func (r *Registrar) probeLoop(ctx context.Context) error {
	t := time.NewTicker(r.cfg.ProbeInterval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, r.cfg.ProbeTimeout)
		err := r.cfg.Probe(pctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, registry.ErrPartitionClaimed) {
			r.mu.Lock()
			wasClaim := r.claimErr
			r.claimErr = err
			if r.cfg.KeepRunningOnClaimConflict {
				// The registry answered: check "registry" passes, "partition-claim" fails.
				r.probeErr = nil
			} else {
				r.probeErr = err
			}
			r.mu.Unlock()
			if !r.cfg.KeepRunningOnClaimConflict {
				r.log.Error("registrar: this cluster's registry partition is claimed by another cluster; stopping without writing into it", "err", err)
				return fmt.Errorf("check registry partition: %w", err)
			}
			if wasClaim == nil || wasClaim == errClaimNotVerified || wasClaim.Error() != err.Error() {
				r.log.Error("registrar: this cluster's registry partition is claimed by another cluster; export and import stopped, writing nothing, not ready (check "+PartitionClaimCheck+"); the registry this process serves keeps serving the other clusters", "err", err)
			}
		} else {
			r.probe(ctx, err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// probe records the outcome of a probe that found no claim conflict and acts on its change.
func (r *Registrar) probe(ctx context.Context, err error) {
	r.mu.Lock()
	was, wasClaim := r.probeErr, r.claimErr
	r.probeErr = err
	if err == nil {
		r.claimErr = nil
	}
	r.mu.Unlock()
	switch {
	case err != nil && (was == nil || was == errNotProbed || err.Error() != was.Error()):
		// Logged when the registry fails, and again when the reason changes: a first probe
		// that fails (etcd down, a permission the cluster's etcd user lacks) is logged too.
		r.log.Warn("registrar: registry probe failed; not ready (nothing is deleted while it is)", "err", err)
	case err == nil && (was != nil || wasClaim != nil):
		if wasClaim != nil && wasClaim != errClaimNotVerified {
			r.log.Info("registrar: this cluster's registry partition is claimed by this cluster again; export and import resumed")
		}
		r.log.Info("registrar: registry reachable; ready")
		r.export.Resync(ctx)
		r.imp.Resync(ctx)
		if r.configs != nil {
			r.configs.Resync()
		}
	}
}

// CachesCheck names the readiness check (/readyz) that fails, with Config.WaitForCaches, until
// the caches of the ServiceExports and ServiceImports the controllers watch have synced (their
// CRDs installed, the API server answering).
const CachesCheck = "caches"

// waitForever is the controllers' CacheSyncTimeout with Config.WaitForCaches: long enough never
// to end, short enough that now plus it is a valid time.
const waitForever = 100 * 365 * 24 * time.Hour

// cachesCheck fails until the informers of the MCS kinds have synced; it starts none that the
// controllers have not (the registrar runs them on its only replica).
func (r *Registrar) cachesCheck(req *http.Request) error {
	for _, o := range []client.Object{&mcsv1beta1.ServiceExport{}, &mcsv1beta1.ServiceImport{}} {
		inf, err := r.mgr.GetCache().GetInformer(req.Context(), o, cache.BlockUntilSynced(false))
		if err != nil {
			return fmt.Errorf("cache of %T: %w", o, err)
		}
		if !inf.HasSynced() {
			return fmt.Errorf("cache of %T not synced yet", o)
		}
	}
	return nil
}

// errNotProbed is the registry state before the first probe: not ready.
var errNotProbed = errors.New("registry not probed yet")

// errClaimNotVerified is the claim state before the first successful probe: the controllers
// wait (check "registry" reports it).
var errClaimNotVerified = errors.New("registry partition claim not verified yet")

// everyReplica is a Runnable that runs on every replica, leader or not.
type everyReplica func(ctx context.Context) error

func (f everyReplica) Start(ctx context.Context) error { return f(ctx) }
func (f everyReplica) NeedLeaderElection() bool        { return false }

// EtcdProbe returns a registry probe for Config.Probe: a linearizable read of at most one key
// under registry.Root, which succeeds only when a quorum of the registry's etcd answers.
func EtcdProbe(cli *clientv3.Client) func(context.Context) error {
	return func(ctx context.Context) error {
		if _, err := cli.Get(ctx, registry.Root, clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly()); err != nil {
			return fmt.Errorf("probe registry: %w", err)
		}
		return nil
	}
}
