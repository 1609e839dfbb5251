package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	mcsclient "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned"

	secv1alpha1 "github.com/aethermesh/aether/api/aether/security/v1alpha1"
	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/cni"
	"github.com/aethermesh/aether/dnsd"
	"github.com/aethermesh/aether/envoy"
	"github.com/aethermesh/aether/internal/clusterid"
	"github.com/aethermesh/aether/internal/kubeconfig"
	"github.com/aethermesh/aether/internal/policysource"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/tunnel"
	"github.com/aethermesh/aether/xds"
)

// Run starts the agent's parts in an order that never exposes a half-ready node and blocks until
// ctx ends; it returns nil then, or the error of the part that could not start or stopped.
// Envoy is its own process and keeps serving its last configuration after Run returns.
func Run(ctx context.Context, cfg Config) error {
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	log = log.With("node", cfg.NodeName, "cluster", cfg.Cluster)
	ready := newReadiness("kubernetes", "registry", partitionClaimPart, "model", "dns", "xds", "envoy", "cni")
	metrics := newAgentMetrics()
	haddr, err := serveHealth(ctx, cfg.HealthAddr, ready, metrics)
	if err != nil {
		return err
	}
	log.Info("health endpoints up", "addr", haddr.String())
	if cfg.MetricsAddr != "" {
		maddr, err := serveMetrics(ctx, cfg.MetricsAddr, metrics)
		if err != nil {
			return err
		}
		log.Info("metrics endpoint up", "addr", maddr.String())
	}
	if cfg.DebugSocket != "" {
		if _, err := serveDebug(ctx, cfg.DebugSocket); err != nil {
			return err
		}
	}

	rc, err := kubeconfig.RESTConfig(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	mcs, err := mcsclient.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("MCS client: %w", err)
	}
	gw, err := gwclient.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("gateway API client: %w", err)
	}

	// The sources report changes on one channel, created before the assembler that consumes it
	// (below, once the sources it reads exist); each change is counted by source.
	changed := make(chan struct{}, 1)
	notify := func(source string) func() {
		return func() {
			metrics.events.WithLabelValues(source).Inc()
			signal(changed)
		}
	}
	kube, err := NewKubeSource(cs, mcs, cfg.NodeName, 0, notify("kubernetes"))
	if err != nil {
		return err
	}
	routes := NewRouteSource(log, gw, cs.Discovery(), notify("routes"))
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	authz := &policysource.AuthorizationPolicies{Resource: secv1alpha1.Resource, Dynamic: dyn, Discovery: cs.Discovery(),
		Log: log.With("part", "authz"), OnChange: notify("authz")}
	peerAuthn := &policysource.PeerAuthentications{Resource: secv1alpha1.PeerAuthenticationResource, Dynamic: dyn, Discovery: cs.Discovery(),
		Log: log.With("part", "peerauthn"), OnChange: notify("peerauthn")}
	// Endpoint deletions wait two lease TTLs after the registry was last unreachable: long
	// enough for writers cut off with this node to reconnect and re-register (registryView).
	view := newRegistryView(log, 2*cfg.RegistryLeaseTTL, notify("registry"))
	view.trustDomains = append([]string{cfg.TrustDomain}, cfg.ClustersetTrustDomains...)
	// The last-known registry view, served when the registry does not answer within
	// --registry-sync-grace of the start (waitRegistry).
	viewFile := newStateFile(cfg.StateDir, viewStateFile, "registry-view", cfg.Cluster)
	savedView, err := viewFile.load()
	if err != nil {
		if !errors.Is(err, errNoState) {
			log.Error("persisted registry view ignored: a start while the registry is cut off waits for it", "err", err)
		}
		savedView = nil
	}
	// Imported route config (--import-config): the last-known projections are served from the
	// start, until the registry's config watch syncs.
	imports := newImportMetrics(metrics.reg, log.With("part", "config-import"))
	sources := fillers{kube, routes, authzPolicies{authz}, peerAuthns{peerAuthn}, inboundDefault(mtlsMode(cfg.InboundMode))}
	var cimp *configImport
	configFile := newStateFile(cfg.StateDir, configStateFile, "config-projections", cfg.Cluster)
	if cfg.ImportConfig {
		cimp = newConfigImport(log.With("part", "config-import"), cfg.ControlCluster, configFile, imports.errs, notify("config"))
		if written, n := cimp.load(); n > 0 {
			log.Info(fmt.Sprintf("serving %d last-known config projections from %s written at %s until the registry's config watch syncs",
				n, configFile.path, written.UTC().Format(time.RFC3339)))
		}
		sources = append(sources, cimp)
	} else {
		// Projections imported while --import-config was on are not served when it is turned on
		// again, however old they are.
		if err := os.Remove(configFile.path); err == nil {
			log.Info("--import-config is off: removed the persisted config projections", "file", configFile.path)
		}
		if cfg.ControlCluster != "" {
			log.Info("--control-cluster is set without --import-config: this agent imports no route config", "control_cluster", cfg.ControlCluster)
		}
	}
	// Pods captured before a restart are known from the persisted attachments before the first
	// model is built, so repair finds them already served.
	store := cni.Store{Dir: cfg.StateDir}
	recs, err := store.List()
	if err != nil {
		// One unreadable record must not stop the agent (and with it every ADD and the DNS of
		// the node): the others are served; the CNI server's repair reports it again.
		log.Error("read persisted attachments: serving the readable ones", "state_dir", cfg.StateDir, "readable", len(recs), "err", err)
	}
	// A pod whose sandbox was recreated may have a stale record beside the live one (its DEL
	// never arrived): serve the newest; repair releases the stale one without touching it.
	persisted, added := map[string]cniv1.PodAttachment{}, map[string]time.Time{}
	uncaptured, uadded := map[string]cniv1.PodAttachment{}, map[string]time.Time{}
	for _, r := range recs {
		if r.Captured && (added[r.Attachment.PodUID].IsZero() || r.Added.After(added[r.Attachment.PodUID])) {
			persisted[r.Attachment.PodUID], added[r.Attachment.PodUID] = r.Attachment, r.Added
		}
		if !r.Captured && (uadded[r.Attachment.PodUID].IsZero() || r.Added.After(uadded[r.Attachment.PodUID])) {
			uncaptured[r.Attachment.PodUID], uadded[r.Attachment.PodUID] = r.Attachment, r.Added
		}
	}
	att := newAttachments(persisted)
	att.uncaptured = uncaptured

	// DNS first, before anything that waits for the API server or the registry: every pod's
	// DNS on this node is DNAT'ed here, so an agent restarted while either is unreachable must
	// still answer. Before the first model the resolver forwards every name that cannot be a
	// mesh name and answers SERVFAIL for the rest; readiness waits for the first model.
	dnsAddr := netip.AddrPortFrom(cfg.HostIP, uint16(cfg.DNSPort)).String()
	upstreams, err := dnsd.ReadResolvConf(cfg.ResolvConf, log.With("part", "dns"), dnsAddr)
	if err != nil {
		return err
	}
	fwd, err := dnsd.NewForwarder(upstreams, dnsd.ForwarderOptions{Logger: log.With("part", "dns")})
	if err != nil {
		return fmt.Errorf("--resolv-conf %s: %w", cfg.ResolvConf, err)
	}
	// Deferred before the DNS servers' shutdown, so it runs after it: the idle upstream
	// connections are closed once no query can use them.
	defer fwd.Close()
	clusterDomain, from, err := clusterDomain(cfg)
	if err != nil {
		return err
	}
	log.Info("cluster domain for search-list expansions of mesh names", "domain", clusterDomain, "from", from)
	resolver, err := dnsd.NewResolver(fwd, dnsd.ResolverOptions{Registerer: metrics.reg, Logger: log.With("part", "dns"),
		MeshDomain: cfg.MeshDomain, Index: dnsd.IndexOptions{ClusterDomain: clusterDomain},
		Cache: dnsd.CacheOptions{Size: cfg.DNSCacheSize, MaxTTL: cfg.DNSCacheMaxTTL, MaxNegativeTTL: cfg.DNSCacheMaxNegativeTTL,
			ServeStale: cfg.DNSCacheServeStale, Prefetch: cfg.DNSCachePrefetch},
		Sources: dnsd.SourcePolicy{Restrict: true, Allow: dnsAllowed(cfg), RateLimit: cfg.DNSRateLimit}})
	if err != nil {
		return err
	}
	dnsAddrs := map[string]string{dnsAddr: "--host-ip/--dns-port"}
	if cfg.HostIPv6.IsValid() {
		dnsAddrs[netip.AddrPortFrom(cfg.HostIPv6, uint16(cfg.DNSPort)).String()] = "--host-ip-v6/--dns-port"
	}
	for addr, flags := range dnsAddrs {
		dnsSrv := dnsd.NewServer(resolver, dnsd.ServerConfig{Addr: addr, Logger: log.With("part", "dns")})
		if err := dnsSrv.Start(ctx); err != nil {
			return fmt.Errorf("DNS on %s %s: %w", flags, addr, err)
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = dnsSrv.Shutdown(sctx)
		}()
	}

	kube.CrossNamespaceCertificates = cfg.EdgeCrossNamespaceCertificates
	if cfg.EdgeCertificateNamespace != "" {
		if err := kube.WatchEdgeCertificates(cfg.EdgeCertificateNamespace); err != nil {
			return err
		}
	}
	if err := kube.Start(ctx, 2*time.Minute); err != nil {
		return err
	}
	if err := routes.Start(ctx, 2*time.Minute); err != nil {
		return err
	}
	if err := authz.Start(ctx, 2*time.Minute); err != nil {
		return err
	}
	if err := peerAuthn.Start(ctx, 2*time.Minute); err != nil {
		return err
	}
	go watchHealth(ctx, "kubernetes", ready, log, func(ctx context.Context) error { return kube.Healthy(ctx, 5*time.Second) })

	// This node's locality: the region is the cluster's, --region (AETHER_REGION), else
	// "default", exactly as the registrar derives it, so the agents write inside the partition
	// regions/<region>/clusters/<cluster> the registrar claimed, and this cluster's endpoints
	// and the node compare alike in the xDS priority tiers. The Node's region label is not used:
	// it would put a node's endpoints outside the claimed partition. The zone is the flag, else
	// the Node's label.
	region := firstNonEmpty(cfg.Region, registry.DefaultRegion)
	asm := model.NewAssembler(model.AssemblerConfig{
		Cluster: cfg.Cluster, MeshDomain: cfg.MeshDomain, TrustDomain: cfg.TrustDomain, Logger: log,
		Region: region, Zone: cfg.Zone,
		Observe: func(took time.Duration) { metrics.buildSeconds.Observe(took.Seconds()) },
	}, sources, view, att)
	go forward(ctx, changed, asm.Trigger)
	// Clashes and skipped fields are logged when they first appear, not on every rebuild (an
	// endpoint change rebuilds the model); the metric always has the current count.
	var clashSeen, skipSeen seenSet
	asm.Subscribe(func(m *model.Mesh) {
		metrics.rebuilds.Inc()
		metrics.modelVersion.Set(float64(m.Version))
		clashes := m.ShortNameClashes()
		for _, i := range clashSeen.update(len(clashes), func(i int) string { return fmt.Sprint(clashes[i]) }) {
			c := clashes[i]
			log.Warn("short mesh name clash: oldest service keeps the short name", "name", c.Name+"."+m.MeshDomain, "winner", c.Winner.String(), "losers", fmt.Sprint(c.Losers))
		}
		skipped := m.Skipped()
		metrics.skipped.Set(float64(len(skipped)))
		for _, i := range skipSeen.update(len(skipped), func(i int) string { return skipped[i].String() }) {
			s := skipped[i]
			log.Warn("left out of the mesh model; the rest is served", "object", s.Object, "field", s.Field, "value", s.Value, "reason", s.Reason)
		}
		imports.observe(m)
	})

	// This cluster's ID (the UID of its kube-system Namespace): the agent writes endpoints into
	// the registry partition of --cluster only while its claim names this cluster or nobody
	// (the registrar claims it; the agent only checks).
	idCtx, cancelID := context.WithTimeout(ctx, 2*time.Minute)
	clusterID, err := clusterid.Get(idCtx, cs)
	cancelID()
	if err != nil {
		return err
	}
	rcfg := registry.Config{
		Endpoints: cfg.Registry.Endpoints(), Region: region, Cluster: cfg.Cluster,
		LeaseTTL: cfg.RegistryLeaseTTL, Logger: log, Metrics: metrics.reg, ClusterID: clusterID,
		AllowForeignUser: cfg.Registry.Insecure,
	}
	if rcfg.TLS, err = cfg.Registry.TLS(); err != nil {
		return err
	}
	cfg.Registry.WarnInsecure(log)
	reg, err := registry.New(rcfg)
	if err != nil {
		return err
	}
	defer reg.Close()
	followRegistry(ctx, view, reg, cfg.RegistryLeaseTTL)
	if cimp != nil {
		followConfigs(ctx, cimp, reg)
	}
	go persistView(ctx, view, viewFile, viewPersistInterval, log)
	go watchHealth(ctx, "registry", ready, log, view.health)
	if !waitRegistry(ctx, view, savedView, viewFile.path, cfg.RegistrySyncGrace, log) {
		return nil
	}
	endpoints := newEndpointRegistrar(reg, log)
	go watchClaim(ctx, reg, endpoints, ready, claimSafetyInterval)
	latest := make(chan *model.Mesh, 1)
	asm.Subscribe(func(m *model.Mesh) { replaceLatest(latest, m) })
	go syncEndpointsLoop(ctx, endpoints, latest, log)

	// The node proxy: the xDS server (with the SVIDs of --identity-source) and its Envoy. Both
	// are up before the first model, so a CNI ADD can wait for Envoy's ACK of its pod.
	ids, err := startIdentity(ctx, cfg, log.With("part", "identity"))
	if err != nil {
		return err
	}
	go watchHealth(ctx, "identity", ready, log, ids.health)
	// A rejected configuration starts a CNI repair pass at once: after an Envoy restart, the
	// listeners of a pod whose netns is gone (its DEL never came) are rejected until repair
	// releases the pod, which would otherwise wait for --cni-repair-interval.
	// The CNI server, started last, takes the requests from nacked.
	nacked := make(chan struct{}, 1)
	// Routed UDP frontends: listeners first, then the pods' redirects (udpCapture).
	udp := &udpCapture{log: log.With("part", "udp"), rebuild: asm.Trigger, retry: 5 * time.Second, current: func() uint64 {
		if m := asm.Current(); m != nil {
			return m.Version
		}
		return 0
	}}
	// The redirects a previous agent left in the pods (the CNI server repairs them with the
	// persisted set) hold their local ports until the first pass replaces them.
	if rs, err := cni.LoadUDPRedirects(cfg.StateDir, cfg.HostIP, cfg.HostIPv6); err != nil {
		log.Error("persisted routed UDP frontends ignored", "err", err)
	} else {
		udp.hold(rs)
	}
	// --east-west-waypoint: remote endpoints through their nodes' waypoints, and this node's
	// tunnel listener on node_ip:15443 (xds.Build adds it once the node IP is known). Routed
	// UDP frontends listen on HOST_IP, where the pods' capture DNATs them.
	build := xds.Options{EastWestWaypoint: cfg.EastWestWaypoint, PodMaxConnections: cfg.PodMaxConnections, UDPHeld: udp.Held,
		HostIP: cfg.HostIP, HostIPv6: cfg.HostIPv6, PeerTrustDomains: cfg.ClustersetTrustDomains}
	udp.frontends = build.UDPFrontends
	xsrv, err := xds.NewServer(xds.ServerOptions{NodeID: cfg.NodeName, Identity: ids.node,
		Logger: log.With("part", "xds"), Registerer: metrics.reg,
		OnNACK: func(string, string) { signal(nacked) },
		Build:  build})
	if err != nil {
		return err
	}
	xl, err := listenUnix(cfg.XDSSocket)
	if err != nil {
		return fmt.Errorf("--xds-socket: %w", err)
	}
	go func() {
		if err := xsrv.Serve(ctx, xl); err != nil {
			log.Error("xDS server stopped", "err", err)
			ready.set("xds", err)
		}
	}()
	// The DNS index first: it admits a new pod's queries (dnsd.SourcePolicy), so it must hold
	// the pod before Envoy's ACK lets the pod's CNI ADD return.
	asm.Subscribe(func(m *model.Mesh) {
		if err := resolver.Update(m); err != nil {
			log.Error("DNS index not updated; answering from the previous one", "err", err)
		}
	})
	push := newPusher(xsrv, log.With("part", "xds"))
	push.served = metrics.lastPush.SetToCurrentTime
	go push.run(ctx)
	asm.Subscribe(push.offer)
	// Edge Gateways' pods on this node get their Gateway's configuration over ADS inside their
	// own netns (docs/gateway.md).
	edgeSrv := newEdges(log.With("part", "edge"), ids.edge, xds.Options{EastWestWaypoint: cfg.EastWestWaypoint, PeerTrustDomains: cfg.ClustersetTrustDomains})
	edgeLatest := make(chan *model.Mesh, 1)
	asm.Subscribe(func(m *model.Mesh) { replaceLatest(edgeLatest, m) })
	go func() {
		defer edgeSrv.stopAll()
		for {
			select {
			case <-ctx.Done():
				return
			case m := <-edgeLatest:
				edgeSrv.update(ctx, m)
			}
		}
	}()
	if err := startEnvoy(ctx, cfg, ready, log.With("part", "envoy")); err != nil {
		return err
	}

	if err := asm.Rebuild(); err != nil {
		return err
	}
	ready.set("dns", nil)
	ready.set("xds", nil)
	ready.set("model", nil)
	go asm.Run(ctx)

	clusterDNS := cfg.ClusterDNS
	if len(clusterDNS) == 0 {
		all, err := kubeDNSAddrs(ctx, cs)
		if err != nil {
			return err
		}
		var left []netip.Addr
		clusterDNS, left = dnsForFamilies(all, cfg.HostIPv6.IsValid())
		if len(left) > 0 {
			log.Warn("IPv6 cluster DNS left alone: no --host-ip-v6 for the resolver to listen on", "addresses", fmt.Sprint(left))
		}
		if len(clusterDNS) == 0 {
			return fmt.Errorf("kube-system/kube-dns has only IPv6 ClusterIPs %v: set --host-ip-v6", left)
		}
	}
	backend, closeBackend, err := captureBackend(cfg, ready, metrics.reg, log.With("part", "capture"))
	if err != nil {
		return err
	}
	defer closeBackend()
	// A CNI ADD returns once Envoy ACKed a model holding the pod and its listeners are warm.
	dp := &podDataplane{att: att, asm: asm, acked: push.waitAcked,
		served: func(ctx context.Context, uid string) error {
			v, err := xsrv.WaitPodServed(ctx, uid)
			if err != nil {
				return err
			}
			return xsrv.WaitForAck(ctx, v)
		},
		warm: func(ctx context.Context, names []string) error {
			return envoy.WaitListenersWarm(ctx, cfg.EnvoyAdmin, names)
		}}
	cniSrv := &cni.Server{
		Config: cni.ServerConfig{
			Socket: cfg.CNISocket, StateDir: cfg.StateDir, HostIP: cfg.HostIP, HostIPv6: cfg.HostIPv6, ClusterDNS: clusterDNS,
			DNSPort: uint16(cfg.DNSPort), Mode: capture.Mode(cfg.InboundMode), NodeName: cfg.NodeName,
			RepairInterval: cfg.CNIRepairInterval, AllowCloudMetadata: cfg.AllowCloudMetadata,
		},
		Lookup: &cni.KubePods{Client: cs}, NodePods: &cni.KubePods{Client: cs},
		Dataplane: dp, Backend: backend, Log: log.With("part", "cni"),
	}
	if cfg.NodeSourceGuard {
		cniSrv.Guard = flagGuard{capture.NFTGuard{NetnsPath: "/proc/self/ns/net"}}
	} else {
		log.Warn("--node-source-guard=false: pods on this node can send with the node's addresses across the pod bridge")
	}
	go forward(ctx, nacked, cniSrv.RequestRepair)
	udp.acked, udp.set = push.waitAcked, cniSrv.SetUDPRedirects
	udpLatest := make(chan *model.Mesh, 1)
	asm.Subscribe(func(m *model.Mesh) { replaceLatest(udpLatest, m) })
	replaceLatest(udpLatest, asm.Current())
	go udp.run(ctx, udpLatest)
	// Inbound mTLS modes per pod and port (PeerAuthentications, and strict wherever an
	// authorization policy is enforced): the pods' capture rules follow the model.
	inboundLatest := make(chan *model.Mesh, 1)
	asm.Subscribe(func(m *model.Mesh) { replaceLatest(inboundLatest, m) })
	replaceLatest(inboundLatest, asm.Current())
	go inboundSync(ctx, inboundLatest, cniSrv.SetInboundPolicies, []uint16{uint16(cfg.DNSPort)}, 5*time.Second, log.With("part", "inbound"))
	cniErr := make(chan error, 1)
	go func() { cniErr <- cniSrv.Serve(ctx) }()
	// aether-cni goes into the node's conflist only once the server answers: from then on a pod
	// that starts is captured (or fails closed), never left running uncaptured.
	if cfg.CNIPlugin != "" {
		inst := installer(cfg, log)
		inst.Changed = func(string) { sweepAfterChainChange(ctx, cniSrv.RequestRepair) }
		if err := inst.InstallBinary(); err != nil {
			return err
		}
		go func() {
			if err := inst.Watch(ctx); err != nil {
				log.Error("CNI conflist watch stopped", "err", err)
				ready.set("cni", err)
			}
		}()
	}
	go watchHealth(ctx, "cni", ready, log, func(context.Context) error {
		if !cniSrv.Ready() {
			return fmt.Errorf("repairing persisted attachments")
		}
		return nil
	})

	log.Info("agent running", "model_version", asm.Current().Version)
	select {
	case <-ctx.Done():
	case err := <-cniErr:
		if err != nil {
			return err
		}
	}
	log.Info("agent stopping; Envoy keeps serving its last configuration")
	return nil
}

// waitRegistry waits until view synced (both registry watches delivered their snapshot) and
// returns true, or false when ctx ends first. With a persisted view (saved, read from file) it
// waits at most grace (--registry-sync-grace), then makes the view serve saved until the
// watches sync (registryView.seedFrom; readiness "registry" says so) and returns true: an agent
// restarted while the registry is cut off serves what it served before. Without one it waits
// as long as the registry takes: there is nothing to serve.
func waitRegistry(ctx context.Context, view *registryView, saved *registryState, file string, grace time.Duration, log *slog.Logger) bool {
	var expired <-chan time.Time
	if saved != nil {
		t := time.NewTimer(grace)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-view.synced:
		return true
	case <-ctx.Done():
		return false
	case <-expired:
	}
	eps, exps := view.seedFrom(saved, file)
	log.Warn(fmt.Sprintf("registry not synced within --registry-sync-grace %s: serving the last-known registry state from %s written at %s",
		grace, file, saved.Written.UTC().Format(time.RFC3339)), "endpoints", eps, "exports", exps)
	return true
}

// chainSweeps are the delays after aether-cni entered the node's conflist at which the agent
// asks the CNI server for a repair pass. Sandboxes the runtime set up before that ran the
// primary CNI alone (the kubelet restarting a rebooted node's pods while the agent starts; a
// primary CNI that rewrote its conflist), some of them still in flight; the repair deletes every
// meshed pod on the node that has no attachment once the pod shows its IP in the API, and its
// controller recreates it through the chain. The periodic repair (--cni-repair-interval) stays
// the backstop.
var chainSweeps = []time.Duration{0, 2 * time.Second, 10 * time.Second, 30 * time.Second}

// sweepAfterChainChange calls repair at each of chainSweeps until ctx ends; it does not block.
func sweepAfterChainChange(ctx context.Context, repair func()) {
	go func() {
		var waited time.Duration
		for _, d := range chainSweeps {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d - waited):
			}
			waited = d
			repair()
		}
	}()
}

// watchHealth probes a source every 2 s and records its state in ready: the agent reports
// degraded readiness with the reason while the source is down and keeps serving the last model.
func watchHealth(ctx context.Context, part string, ready *readiness, log *slog.Logger, probe func(context.Context) error) {
	var last error
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		err := probe(ctx)
		ready.set(part, err)
		if (err == nil) != (last == nil) {
			if err != nil {
				log.Warn("source unavailable; serving the last model", "source", part, "err", err)
			} else {
				log.Info("source back", "source", part)
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// startEnvoy keeps the node's Envoy running from the bootstrap pointing at the agent's xDS
// socket. With --envoy-binary the agent supervises Envoy itself (adopting a running one, never
// starting a second); with an empty --envoy-binary Envoy runs in its own container from the
// bootstrap written here. Readiness "envoy" follows Envoy's admin API either way.
func startEnvoy(ctx context.Context, cfg Config, ready *readiness, log *slog.Logger) error {
	boot := envoy.BootstrapConfig{NodeID: cfg.NodeName, XDSAddress: "unix://" + cfg.XDSSocket, AdminAddress: cfg.EnvoyAdmin,
		StatsAddress: cfg.EnvoyStatsAddr, MaxConnections: cfg.EnvoyMaxConnections, MaxHeapBytes: cfg.EnvoyMaxHeapBytes}
	if cfg.PodMaxConnections > 0 {
		boot.RuntimeLayer = xds.RuntimeLayerName
	}
	if cfg.EastWestWaypoint {
		boot.ListenerConnectionLimits = map[string]uint64{tunnel.ListenerName: cfg.WaypointMaxConnections}
	}
	dir := filepath.Join(cfg.StateDir, "envoy")
	if cfg.EnvoyBinary == "" {
		b, err := envoy.Bootstrap(boot)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "bootstrap.json.tmp"), b, 0o644); err != nil {
			return err
		}
		if err := os.Rename(filepath.Join(dir, "bootstrap.json.tmp"), filepath.Join(dir, "bootstrap.json")); err != nil {
			return err
		}
	}
	sup, err := envoy.NewSupervisor(envoy.SupervisorConfig{EnvoyPath: firstNonEmpty(cfg.EnvoyBinary, "-"), Bootstrap: boot, StateDir: dir, Logger: log})
	if err != nil {
		return err
	}
	if cfg.EnvoyBinary != "" {
		go func() {
			if err := sup.Run(ctx); err != nil {
				log.Error("envoy supervisor stopped", "err", err)
			}
		}()
	}
	go watchHealth(ctx, "envoy", ready, log, func(ctx context.Context) error {
		wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		return sup.WaitLive(wctx)
	})
	return nil
}

// installer is the aether-cni installer for cfg's CNI directories and plugin settings.
func installer(cfg Config, log *slog.Logger) *cni.Installer {
	return &cni.Installer{
		ConfDir: cfg.CNIConfDir, BinDir: cfg.CNIBinDir, Binary: cfg.CNIPlugin,
		Plugin: map[string]any{"agentSocket": cfg.CNISocket, "inboundMode": cfg.InboundMode},
		Log:    log.With("part", "cni-install"),
	}
}

// UninstallCNI removes aether-cni from the node (its conflist entry and binary in
// cfg.CNIConfDir and cfg.CNIBinDir) and the node source guard (unless --node-source-guard=false),
// and returns the first error naming --uninstall-cni.
func UninstallCNI(cfg Config) error {
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	if err := installer(cfg, log).Uninstall(); err != nil {
		return fmt.Errorf("--uninstall-cni: %w", err)
	}
	log.Info("aether-cni removed", "conf_dir", cfg.CNIConfDir, "bin_dir", cfg.CNIBinDir)
	if cfg.NodeSourceGuard {
		if err := (capture.NFTGuard{NetnsPath: "/proc/self/ns/net"}).Teardown(); err != nil {
			return fmt.Errorf("--uninstall-cni: %w (--node-source-guard=false leaves the guard)", err)
		}
		log.Info("node source guard removed", "table", "bridge "+capture.GuardTable)
	}
	return nil
}

// kubeDNSAddrs returns the ClusterIPs of kube-system/kube-dns, the cluster DNS service whose port
// 53 capture DNATs to the agent when --cluster-dns is not given.
func kubeDNSAddrs(ctx context.Context, cs kubernetes.Interface) ([]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	svc, err := cs.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("find the cluster DNS service (set --cluster-dns): %w", err)
	}
	var out []netip.Addr
	for _, s := range svc.Spec.ClusterIPs {
		if ip, err := netip.ParseAddr(s); err == nil {
			out = append(out, ip)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("kube-system/kube-dns has no ClusterIP (set --cluster-dns)")
	}
	return out, nil
}

// dnsForFamilies splits the cluster DNS addresses into those the capture rules DNAT to the
// resolver (IPv4, and IPv6 when the resolver also listens on an IPv6 host address) and the IPv6
// ones left alone (capture.Config requires a HostIPv6 for an IPv6 cluster DNS address).
func dnsForFamilies(addrs []netip.Addr, haveIPv6 bool) (use, left []netip.Addr) {
	for _, ip := range addrs {
		if ip.Is6() && !ip.Is4In6() && !haveIPv6 {
			left = append(left, ip)
			continue
		}
		use = append(use, ip)
	}
	return use, left
}

// registryHealthy reads one key linearizably (it needs an etcd quorum) within ctx.
func registryHealthy(ctx context.Context, reg *registry.Registry) error {
	if _, err := reg.Client().Get(ctx, registry.Root, clientv3.WithCountOnly()); err != nil {
		return fmt.Errorf("registry unreachable: %w", err)
	}
	return nil
}

// signal records an event on a one-slot channel without blocking; events that arrive while one
// is pending are merged into it.
func signal(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// forward calls fn for every event signalled on ch until ctx ends.
func forward(ctx context.Context, ch <-chan struct{}, fn func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			fn()
		}
	}
}

// replaceLatest puts m into a one-slot channel, dropping an older value not yet taken.
func replaceLatest(ch chan *model.Mesh, m *model.Mesh) {
	for {
		select {
		case ch <- m:
			return
		default:
			select {
			case <-ch:
			default:
			}
		}
	}
}

// syncEndpointsLoop registers the node's endpoints for every new model, retrying a failed sync
// every 2 s until it succeeds or a newer model arrives, and syncs the last model again when
// asked (endpointRegistrar.requestResync: the partition claim is this cluster's again). A sync
// refused because the partition is not this cluster's (registry.ErrPartitionClaimed,
// registry.ErrClaimUnreadable) is not retried on a timer: every retry would be refused, and
// watchClaim asks for the resync once the claim changes.
func syncEndpointsLoop(ctx context.Context, e *endpointRegistrar, latest chan *model.Mesh, log *slog.Logger) {
	var m *model.Mesh
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case m = <-latest:
		case <-retry.C:
		case <-e.resync:
		}
		if m == nil {
			continue
		}
		err := e.sync(ctx, m)
		switch {
		case err == nil:
		case errors.Is(err, registry.ErrPartitionClaimed) || errors.Is(err, registry.ErrClaimUnreadable):
			log.Warn("endpoint registration waits for the partition claim", "err", err)
			retry.Stop()
		default:
			log.Warn("endpoint registration incomplete; retrying", "err", err)
			retry.Reset(2 * time.Second)
		}
	}
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// seenSet remembers the items of the last model, so that a report is logged once when it
// appears rather than on every rebuild. Not safe for concurrent use (one subscriber's).
type seenSet map[string]struct{}

// update replaces the set with the n items named key(0..n-1) and returns the indexes of those
// that were not in it.
func (s *seenSet) update(n int, key func(int) string) []int {
	var fresh []int
	next := make(seenSet, n)
	for i := range n {
		k := key(i)
		if _, ok := (*s)[k]; !ok {
			if _, dup := next[k]; !dup {
				fresh = append(fresh, i)
			}
		}
		next[k] = struct{}{}
	}
	*s = next
	return fresh
}

// dnsAllowed is the DNS source policy's Allow list: the node's own addresses (--host-ip,
// --host-ip-v6), where host processes and hostNetwork pods query from, and --dns-allow-sources.
// The meshed pods are admitted by the model itself.
func dnsAllowed(cfg Config) []netip.Prefix {
	var out []netip.Prefix
	for _, ip := range []netip.Addr{cfg.HostIP, cfg.HostIPv6} {
		if ip.IsValid() {
			out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
		}
	}
	return append(out, cfg.DNSAllowSources...)
}

// flagGuard is the agent's node source guard: its errors name the flag that turns it off.
type flagGuard struct{ capture.NodeGuard }

func (g flagGuard) Apply(addrs []netip.Addr) (bool, error) {
	changed, err := g.NodeGuard.Apply(addrs)
	if err != nil {
		err = fmt.Errorf("%w (--node-source-guard=false turns the guard off)", err)
	}
	return changed, err
}
