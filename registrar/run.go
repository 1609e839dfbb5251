package registrar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/aethermesh/aether/internal/clusterid"
	"github.com/aethermesh/aether/internal/kubeconfig"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/registry/embedded"
)

// clusterIDWaitLog is how often a registrar still waiting for its cluster ID says so.
const clusterIDWaitLog = 30 * time.Second

// Run connects to (or embeds) the registry and runs the registrar until ctx ends or it loses
// its leader lease. Its registry partition is claimed for this cluster (the UID of its
// kube-system Namespace): when another cluster holds the claim it writes nothing and returns an
// error that says how to fix it (claimError). In the single-machine shape (the registry
// embedded, so this process serves every cluster's registry) it does not return then: it keeps
// the registry serving, stops its export and import controllers, logs that error and fails
// readiness check partition-claim, and resumes once the claim is this cluster's again
// (Config.KeepRunningOnClaimConflict).
func Run(ctx context.Context, cfg RunConfig) error {
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel})).With("cluster", cfg.Cluster, "region", cfg.Region)
	rc, err := kubeconfig.RESTConfig(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = float32(cfg.KubeQPS), cfg.KubeBurst
	// With an external registry, a cluster ID not read within --cluster-id-timeout ends the
	// registrar (its Deployment restarts it). With the embedded one it waits as long as it
	// takes: exiting would take the registry of every cluster down with it.
	embedded := len(cfg.Registry.Endpoints()) == 0
	idTimeout := cfg.ClusterIDTimeout
	if embedded {
		idTimeout = 0
	}
	// Leader election is off with the embedded registry: that shape is one replica (each
	// replica would embed a registry of its own), and a leader that cannot renew its Lease while
	// this cluster's API server is down ends the manager, so the process, and every cluster's
	// registry with it.
	leaderElect := cfg.LeaderElect && !embedded
	if cfg.LeaderElect && embedded {
		log.Info("leader election off: this registrar hosts the registry (--registry-endpoints empty), a single replica whose process must outlive an API server outage")
	}
	reg, id, closeReg, err := openRegistry(ctx, cfg.target, rc, log, claimedBy("aether-registrar"), idTimeout)
	if err != nil {
		return err
	}
	defer closeReg()

	r, err := New(Config{
		Kube: rc, Exports: reg, Endpoints: reg, Configs: reg, ControlCluster: cfg.ControlCluster, ConfigExportRefresh: cfg.ConfigExportRefresh,
		// The claim check is a linearizable read (or the claiming transaction), so it probes the
		// registry's quorum too; a claim of another cluster stops the registrar, or, when it
		// hosts the registry, its controllers.
		Probe: func(ctx context.Context) error {
			_, err := reg.EnsureClaim(ctx)
			return claimError(err, cfg.target)
		},
		ProbeInterval: cfg.RegistryProbe, KeepRunningOnClaimConflict: embedded, WaitForCaches: embedded,
		LeaderElection: leaderElect, LeaderElectionID: cfg.LeaderElectID, LeaderElectionNamespace: cfg.LeaderElectNamespace,
		LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
		ReleaseOnCancel: cfg.ReleaseOnCancel,
		EdgeEnvoyImage:  cfg.EdgeEnvoyImage, Namespace: cfg.Namespace, GatewayAddressCIDRs: cfg.GatewayAddressCIDRs,
		EdgeCrossNamespaceCertificates: cfg.EdgeCrossNamespaceCertificates, GatewayInfrastructureKeys: cfg.GatewayInfrastructureKeys, EdgeReplicas: int32(cfg.EdgeReplicas),
		MetricsAddr: cfg.MetricsAddr, HealthAddr: cfg.HealthAddr, Metrics: ctrlmetrics.Registry,
		Workers: cfg.Workers, Logger: log,
	})
	if err != nil {
		return err
	}
	log.Info("registrar starting", "registry", reg.Client().Endpoints(), "leader_elect", leaderElect, "cluster_id", id,
		"control_cluster", cfg.ControlCluster, "config_export_refresh", cfg.ConfigExportRefresh)
	return r.Start(ctx)
}

// openRegistry opens the registry (embedding etcd when no endpoints are given, started first so
// that it serves the other clusters while this one's API server does not answer), reads this
// cluster's ID (the UID of its kube-system Namespace, waiting up to idTimeout, or until ctx ends
// when idTimeout is 0, and logging every clusterIDWaitLog that it still waits) and returns a
// writer of the target's partition that claims it under that ID. claimedBy names the process in
// a claim it writes. The returned func closes the registry and the embedded etcd.
func openRegistry(ctx context.Context, t target, rc *rest.Config, log *slog.Logger, claimedBy string, idTimeout time.Duration) (*registry.Registry, string, func(), error) {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, "", nil, fmt.Errorf("kubernetes client: %w", err)
	}
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	endpoints := t.Registry.Endpoints()
	if len(endpoints) == 0 {
		emb, err := embedded.Start(ctx, embedded.Config{
			DataDir: t.RegistryDataDir, ClientURL: t.RegistryListen, PeerURL: t.RegistryPeer,
			CertFile: t.RegistryServeCert, KeyFile: t.RegistryServeKey, ClientCAFile: t.RegistryServeClientCA,
			LogFile: filepath.Join(t.RegistryDataDir, "etcd.log"), Logger: log,
		})
		if err != nil {
			return nil, "", nil, err
		}
		closers = append(closers, func() { emb.Close() })
		endpoints = emb.Endpoints
	}
	// After the embedded etcd is up: it is every cluster's registry, served also while this
	// cluster's API server does not answer yet.
	id, err := waitClusterID(ctx, cs, idTimeout, log)
	if err != nil {
		closeAll()
		return nil, "", nil, err
	}
	rcfg := registry.Config{
		Endpoints: endpoints, Username: t.RegistryUser, Password: t.RegistryPassword,
		Region: t.Region, Cluster: t.Cluster, Logger: log, Metrics: ctrlmetrics.Registry,
		ClusterID: id, Claimer: true, ClaimedBy: claimedBy, AllowForeignUser: t.Registry.Insecure,
	}
	if rcfg.TLS, err = t.Registry.TLS(); err != nil {
		closeAll()
		return nil, "", nil, err
	}
	t.Registry.WarnInsecure(log)
	reg, err := registry.New(rcfg)
	if err != nil {
		closeAll()
		return nil, "", nil, err
	}
	closers = append(closers, func() { reg.Close() })
	return reg, id, closeAll, nil
}

// waitClusterID reads this cluster's ID (clusterid.Get), giving up after timeout, or with
// timeout 0 only when ctx ends (retrying also after the API server refused it: 401, 403), and
// logging every clusterIDWaitLog while the API server has not given it.
func waitClusterID(ctx context.Context, cs kubernetes.Interface, timeout time.Duration, log *slog.Logger) (string, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		start := time.Now()
		t := time.NewTicker(clusterIDWaitLog)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				log.Warn("still waiting for this cluster's ID (the UID of Namespace kube-system): the API server has not given it",
					"waited", time.Since(start).Round(time.Second), "timeout", timeout)
			}
		}
	}()
	if timeout > 0 {
		return clusterid.Get(ctx, cs)
	}
	// No timeout (the embedded registry): an API server that refuses (401, 403: credentials not
	// valid or not allowed yet) is retried too, as one that does not answer, since exiting
	// would take every cluster's registry down; the refusal is logged when it changes.
	var last string
	for {
		id, err := clusterid.Get(ctx, cs)
		if err == nil || ctx.Err() != nil {
			return id, err
		}
		if err.Error() != last {
			last = err.Error()
			log.Error("the API server refused this cluster's ID; retrying every "+clusterIDRetry.String()+", the embedded registry serving meanwhile", "err", err)
		}
		select {
		case <-ctx.Done():
			return "", err
		case <-time.After(clusterIDRetry):
		}
	}
}

// clusterIDRetry is how long a registrar with the embedded registry waits before asking again
// for its cluster ID after the API server refused it.
const clusterIDRetry = 5 * time.Second

// claimError adds to an error caused by a partition claimed by another cluster what the
// operator can do about it; other errors pass unchanged. In the single-machine shape the
// re-claim command it prints reaches the running registrar's embedded registry through
// --registry-endpoints (its --registry-listen URL).
func claimError(err error, t target) error {
	var ce *registry.ClaimConflictError
	if !errors.As(err, &ce) {
		return err
	}
	reach := ""
	if len(t.Registry.Endpoints()) == 0 {
		reach = " --registry-endpoints " + t.RegistryListen
	}
	return fmt.Errorf(`%w
Nothing was written into the registry partition of cluster name %q (region %q): it belongs to the cluster whose kube-system Namespace has UID %s, and this cluster's is %s.
- If this is another cluster (for example its configuration was copied from that one), give it a cluster name of its own: --cluster (AETHER_CLUSTER in the aether-config ConfigMap), the same for its registrar and agents.
- If the cluster that made the claim no longer exists and this one replaces it (rebuilt), re-claim the partition once, with this cluster's kubeconfig and the registrar's registry flags:
    aether-registrar %s --cluster %s --region %s%s --previous-cluster-id %s`,
		err, t.Cluster, t.Region, ce.Claim.GetClusterId(), ce.ClusterID, ReclaimCommand, t.Cluster, t.Region, reach, ce.Claim.GetClusterId())
}
