package agent

import (
	"errors"
	"flag"
	"fmt"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/aethermesh/aether/dnsd"
	"github.com/aethermesh/aether/envoy"
	"github.com/aethermesh/aether/internal/envflag"
	"github.com/aethermesh/aether/internal/registryflag"
	"github.com/aethermesh/aether/xds"
)

// DefaultDNSRateLimit is --dns-rate-limit's default: 10,000 queries per second from one source
// address. A busy application does tens to hundreds; a resolver loop or a flood does far more. The
// DNS benchmark, which drives about 200,000 per second from one source, sets 0.
const DefaultDNSRateLimit = 10000

// DefaultWaypointMaxConnections is --waypoint-max-connections' default: 20,000 connections on the
// east-west waypoint listener, a fifth of Envoy's global cap (envoy.DefaultMaxConnections), so
// other clusters cannot take all of this node's connections.
const DefaultWaypointMaxConnections = 20000

// DefaultPodMaxConnections is --pod-max-connections' default: 10,000 connections on each of a
// pod's listeners (capture, lane, inbound), a tenth of Envoy's global cap, so no one pod (or
// the clients of one pod's inbound port) can take the node's connections from the others; a busy
// application holds hundreds.
const DefaultPodMaxConnections = 10000

// The node's operator endpoints (docs/agent.md, "Endpoints"): what only root on the node may
// reach is on 0600 unix sockets (Envoy's admin API, which can reconfigure or stop Envoy, and the
// Go profiles); what Prometheus scrapes is on ports that carry nothing else, as Istio's 15020
// and 15090.
const (
	DefaultEnvoyAdmin     = "unix:///var/run/aether/envoy-admin.sock"
	DefaultEnvoyStatsAddr = "0.0.0.0:15090"
	DefaultMetricsAddr    = "0.0.0.0:15020"
	DefaultDebugSocket    = "/var/run/aether/debug.sock"
)

// The values of --identity-source.
const (
	IdentitySPIRE = "spire"
	IdentityDevCA = "dev-ca"
)

// DefaultSPIREAdminSocket is --spire-admin-socket's default: the SPIRE agent's admin_socket_path
// as deploy/ sets it (a host directory the SPIRE agent and the aether agent share).
const DefaultSPIREAdminSocket = "/run/spire/agent-admin/admin.sock"

// Config is the agent's whole configuration: every field has a flag and an environment variable
// (the flag wins; ParseFlags reads both). Validate checks it at start and names the flag of
// every bad field.
type Config struct {
	NodeName    string // --node-name, NODE_NAME
	Cluster     string // --cluster, AETHER_CLUSTER
	Region      string // --region, AETHER_REGION (default: registry.DefaultRegion, as the registrar's)
	Zone        string // --zone, AETHER_ZONE
	MeshDomain  string // --mesh-domain, AETHER_MESH_DOMAIN
	TrustDomain string // --trust-domain, AETHER_TRUST_DOMAIN
	// ClustersetTrustDomains (--clusterset-trust-domains, AETHER_CLUSTERSET_TRUST_DOMAINS) are
	// the trust domains of the clusterset's other clusters when each cluster has its own (SPIFFE
	// federation): their callers are mesh callers here (xds.Options.PeerTrustDomains).
	ClustersetTrustDomains []string
	Kubeconfig             string // --kubeconfig, KUBECONFIG (empty: in-cluster)

	Registry         registryflag.Flags // --registry-endpoints, --registry-ca, --registry-cert, --registry-key
	RegistryLeaseTTL time.Duration
	// RegistrySyncGrace (--registry-sync-grace, AETHER_REGISTRY_SYNC_GRACE) is how long a
	// starting agent waits for the registry's endpoints and exports before it serves the
	// last-known registry state persisted in --state-dir (when there is one; without one it
	// waits for the registry however long it takes).
	RegistrySyncGrace time.Duration

	// ImportConfig (--import-config, AETHER_IMPORT_CONFIG) makes the agent apply other
	// clusters' ServiceConfigProjections to the services this cluster imports
	// (docs/projections.md). Off by default: routing by another cluster's config is a
	// trust decision.
	ImportConfig bool
	// ControlCluster (--control-cluster, AETHER_CONTROL_CLUSTER), when set, is the only origin
	// whose projections the agent applies (seed 000, EM3); empty: between origins the oldest
	// ServiceExport's projection applies (model.SelectProjections).
	ControlCluster string

	// IdentitySource (--identity-source, AETHER_IDENTITY_SOURCE) is where the pods' SVIDs come
	// from: "spire" (the node's SPIRE agent, through its Delegated Identity API on
	// --spire-admin-socket) or "dev-ca" (the development CA of --ca-cert and --ca-key, which
	// the agent holds in memory; docs/identity.md).
	IdentitySource string
	// SPIREAdminSocket (--spire-admin-socket, AETHER_SPIRE_ADMIN_SOCKET) is the SPIRE agent's
	// admin API socket, where its Delegated Identity API is served to authorized delegates.
	SPIREAdminSocket string
	CACert           string        // --ca-cert, AETHER_CA_CERT: development CA that signs workload SVIDs
	CAKey            string        // --ca-key, AETHER_CA_KEY
	SVIDTTL          time.Duration // --svid-ttl: lifetime of issued SVIDs (rotated at half-life)
	// CNIRepairInterval (--cni-repair-interval) is how often the CNI server checks and repairs
	// every attachment (rules, listeners, records of gone netns); a rejected Envoy
	// configuration also starts a pass at once.
	CNIRepairInterval time.Duration

	HostIP netip.Addr // --host-ip, HOST_IP: the node IP (DNS listens here; capture DNATs here)
	// HostIPv6 (--host-ip-v6, HOST_IP_V6; else the IPv6 address of --host-ips, HOST_IPS, the
	// downward API's status.hostIPs) is the node's IPv6 address on dual-stack nodes: the
	// resolver listens there too and pods' IPv6 cluster DNS is DNAT'ed to it. Unset: IPv6
	// cluster DNS addresses are left alone.
	HostIPv6  netip.Addr
	DNSPort   int    // --dns-port: 18054
	XDSSocket string // --xds-socket: unix socket of the ADS server
	// EnvoyAdmin (--envoy-admin) is Envoy's admin API: a 0600 unix socket by default
	// (DefaultEnvoyAdmin), or host:port.
	EnvoyAdmin string
	// EnvoyStatsAddr (--envoy-stats-addr) is Envoy's metrics-only listener (envoy.StatsPaths:
	// Prometheus exposition and readiness), "" for none.
	EnvoyStatsAddr string
	// EnvoyMaxConnections (--envoy-max-connections) and EnvoyMaxHeapBytes (--envoy-max-heap,
	// bytes) tune Envoy's overload manager (envoy.BootstrapConfig).
	EnvoyMaxConnections uint64
	EnvoyMaxHeapBytes   uint64
	// WaypointMaxConnections (--waypoint-max-connections) caps the connections of the
	// east-west waypoint listener alone, which other clusters reach (with --east-west-waypoint).
	WaypointMaxConnections uint64
	// PodMaxConnections (--pod-max-connections) caps the connections of each of a pod's
	// listeners (xds.Options.PodMaxConnections, served over RTDS); 0 turns the caps off.
	PodMaxConnections uint64
	EnvoyBinary       string // --envoy-binary
	HealthAddr        string // --health-addr: /healthz, /readyz
	MetricsAddr       string // --metrics-addr: /metrics only ("" for none)
	DebugSocket       string // --debug-socket: /debug/pprof/ on a 0600 unix socket ("" for none)
	StateDir          string // --state-dir: persisted pod attachments
	CNISocket         string // --cni-socket

	// DNSCacheSize (--dns-cache-size, AETHER_DNS_CACHE_SIZE) is how many forwarded answers the
	// resolver caches (0: no cache); DNSCacheMaxTTL and DNSCacheMaxNegativeTTL
	// (--dns-cache-max-ttl, AETHER_DNS_CACHE_MAX_TTL; --dns-cache-max-negative-ttl,
	// AETHER_DNS_CACHE_MAX_NEGATIVE_TTL) cap how long a positive and a negative answer is kept.
	DNSCacheSize                           int
	DNSCacheMaxTTL, DNSCacheMaxNegativeTTL time.Duration
	// DNSCacheServeStale (--dns-cache-serve-stale, AETHER_DNS_CACHE_SERVE_STALE) is the maximum
	// stale age of serve-stale (RFC 8767): how long past its expiry a cached answer may still
	// answer when the upstreams fail or are slow (0: off). DNSCachePrefetch
	// (--dns-cache-prefetch, AETHER_DNS_CACHE_PREFETCH) is the number of hits that makes an entry
	// prefetched before it expires (0: off).
	DNSCacheServeStale time.Duration
	DNSCachePrefetch   int
	// DNSRateLimit (--dns-rate-limit, AETHER_DNS_RATE_LIMIT) is the queries per second the
	// resolver answers one source (0: no limit); DNSAllowSources (--dns-allow-sources,
	// AETHER_DNS_ALLOW_SOURCES) are sources answered besides the node's own addresses and its
	// meshed pods (dnsd.SourcePolicy).
	DNSRateLimit    int
	DNSAllowSources []netip.Prefix

	ClusterDNS []netip.Addr // --cluster-dns: kube-dns ClusterIPs DNAT'ed to the resolver (default: kube-system/kube-dns)
	ResolvConf string       // --resolv-conf: upstreams for names outside the mesh
	// ClusterDomain (--cluster-domain, AETHER_CLUSTER_DOMAIN) is the kubelet's clusterDomain:
	// the resolver answers the pods' first search-list expansion of a mesh name,
	// <name>.<ns>.svc.<ClusterDomain>. Empty: read from --resolv-conf's search list (see
	// clusterDomain), else cluster.local.
	ClusterDomain string
	InboundMode   string // --inbound-mode: strict or permissive
	// AllowCloudMetadata (--allow-cloud-metadata) lets meshed pods reach the cloud metadata
	// service (capture.MetadataAddrs); off by default (capture.Config.AllowCloudMetadata says why).
	AllowCloudMetadata bool
	// NodeSourceGuard (--node-source-guard, on by default) keeps pods from sending with the
	// node's addresses across the pod bridge (capture.NodeGuard); off only for kernels without
	// nf_tables for the bridge family.
	NodeSourceGuard bool

	CaptureBackend string // --capture-backend: nftables, iptables, iptables-nft, iptables-legacy
	// CaptureMode (--capture-mode) is how pods' outbound TCP and DNS are captured: nft (the
	// rules of CaptureBackend), ebpf (bpf/capture's programs, start fails where they cannot run)
	// or auto (eBPF where it can run, else nft; docs/ebpf.md).
	CaptureMode string
	// BPFFSDir (--bpffs-dir) is where the eBPF programs and maps are pinned, so pods stay
	// captured across agent restarts; a bpffs is mounted there when none is.
	BPFFSDir     string
	CNIConfDir   string // --cni-conf-dir: where the primary CNI's conflist lives
	CNIBinDir    string // --cni-bin-dir: where aether-cni is installed
	CNIPlugin    string // --cni-plugin-binary: the aether-cni binary to install ("" skips install)
	UninstallCNI bool   // --uninstall-cni: remove aether-cni from the conflist and exit

	EastWestWaypoint bool // --east-west-waypoint

	// EdgeCertificateNamespace is where the registrar publishes edge Gateways' listener
	// certificates (--edge-certificate-namespace, POD_NAMESPACE; docs/gateway.md); "" turns
	// serving edge Gateways' TLS listeners off (the agent then needs no Secret access).
	EdgeCertificateNamespace string
	// EdgeCrossNamespaceCertificates is --edge-cross-namespace-certificates,
	// AETHER_EDGE_CROSS_NAMESPACE_CERTIFICATES (model.GatewayInputs.CrossNamespaceCertificates);
	// the registrar reads the same setting.
	EdgeCrossNamespaceCertificates bool

	LogLevel slog.Level // --log-level: debug, info, warn, error
}

// ParseConfig reads flags (args without the program name) with environment defaults from getenv,
// then validates the result.
func ParseConfig(args []string, getenv func(string) string) (Config, error) {
	c, err := ParseFlags(args, getenv)
	if err != nil {
		return c, err
	}
	return c, c.Validate()
}

// ParseFlags reads flags and environment without checking the values against each other or the
// filesystem: an unknown flag or a value of the wrong form is an error. The deploy manifests'
// tests parse the DaemonSet's args with it, so a renamed flag fails them.
func ParseFlags(args []string, getenv func(string) string) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("aether-agent", flag.ContinueOnError)
	ef := &envflag.Set{FS: fs, Getenv: getenv}
	ef.StringVar(&c.NodeName, "node-name", "NODE_NAME", "", "this node's name")
	ef.StringVar(&c.Cluster, "cluster", "AETHER_CLUSTER", "", "this cluster's name in the registry")
	ef.StringVar(&c.Region, "region", "AETHER_REGION", "", "this cluster's region: the registry partition the agent writes in and the node's locality region, as the registrar's --region (default: default; the Node's topology.kubernetes.io/region label is not used)")
	ef.StringVar(&c.Zone, "zone", "AETHER_ZONE", "", "zone of this node's endpoints and locality (default: the Node's topology.kubernetes.io/zone label)")
	ef.StringVar(&c.MeshDomain, "mesh-domain", "AETHER_MESH_DOMAIN", "mesh", "DNS domain of mesh names")
	ef.StringVar(&c.TrustDomain, "trust-domain", "AETHER_TRUST_DOMAIN", "aether.internal", "SPIFFE trust domain")
	clustersetTDs := ef.String("clusterset-trust-domains", "AETHER_CLUSTERSET_TRUST_DOMAINS", "", "comma-separated trust domains of the clusterset's other clusters, when each cluster has its own (SPIFFE federation): their workloads are admitted as this cluster's are; empty: one trust domain for the clusterset")
	ef.BoolVar(&c.EdgeCrossNamespaceCertificates, "edge-cross-namespace-certificates", "AETHER_EDGE_CROSS_NAMESPACE_CERTIFICATES", "serve edge listeners' certificateRefs into other namespaces (with a ReferenceGrant); off: the edge pods, in the Gateway's namespace, would hand the key to whoever may run pods there")
	ef.StringVar(&c.EdgeCertificateNamespace, "edge-certificate-namespace", "POD_NAMESPACE", "", "namespace where the registrar publishes edge Gateways' listener certificates (aether's own); empty: HTTPS and TLS-terminating edge listeners are not served from this node")
	ef.StringVar(&c.Kubeconfig, "kubeconfig", "KUBECONFIG", "", "kubeconfig path (empty: in-cluster config)")
	c.Registry.Define(ef, registryflag.Usage{})
	ef.DurationVar(&c.RegistrySyncGrace, "registry-sync-grace", "AETHER_REGISTRY_SYNC_GRACE", 15*time.Second, "how long a starting agent waits for the registry before it serves the last-known registry state persisted in --state-dir (readiness \"registry\" degraded until the registry answers); without a persisted state it waits for the registry")
	ef.BoolVar(&c.ImportConfig, "import-config", "AETHER_IMPORT_CONFIG", "apply other clusters' route config (ServiceConfigProjections in the registry) to the services this cluster imports; off by default: routing by another cluster's config is a trust decision")
	ef.StringVar(&c.ControlCluster, "control-cluster", "AETHER_CONTROL_CLUSTER", "", "the only cluster whose route config projections are applied (an RFC 1123 label; empty: each service's oldest ServiceExport's cluster), as the registrar's --control-cluster")
	fs.DurationVar(&c.RegistryLeaseTTL, "registry-lease-ttl", 15*time.Second, "TTL of this node's endpoint lease; its keepalives (every TTL/3) tell the agent the registry answers (without a lease it reads the registry every TTL/3), and endpoint deletions are held 2 x TTL after a failed round trip")
	ef.StringVar(&c.IdentitySource, "identity-source", "AETHER_IDENTITY_SOURCE", IdentityDevCA, "where pods' SVIDs come from: spire (the node's SPIRE agent, --spire-admin-socket) or dev-ca (the development CA, --ca-cert and --ca-key)")
	ef.StringVar(&c.SPIREAdminSocket, "spire-admin-socket", "AETHER_SPIRE_ADMIN_SOCKET", DefaultSPIREAdminSocket, "the SPIRE agent's admin socket (Delegated Identity API), with --identity-source=spire")
	ef.StringVar(&c.CACert, "ca-cert", "AETHER_CA_CERT", "", "development CA certificate (PEM) that signs workload SVIDs, with --identity-source=dev-ca")
	ef.StringVar(&c.CAKey, "ca-key", "AETHER_CA_KEY", "", "development CA key (PEM), with --identity-source=dev-ca")
	fs.DurationVar(&c.SVIDTTL, "svid-ttl", time.Hour, "lifetime of workload SVIDs the development CA issues; each is renewed at half its lifetime (SPIRE's come from its ClusterSPIFFEID or server setting)")
	fs.DurationVar(&c.CNIRepairInterval, "cni-repair-interval", time.Minute, "how often every pod attachment is checked and repaired (a rejected Envoy configuration also starts a check at once)")
	hostIP := ef.String("host-ip", "HOST_IP", "", "this node's IP: the DNS resolver listens here")
	hostIPv6 := ef.String("host-ip-v6", "HOST_IP_V6", "", "this node's IPv6 address on a dual-stack node: the resolver listens here too and IPv6 cluster DNS is DNAT'ed to it")
	hostIPs := ef.String("host-ips", "HOST_IPS", "", "this node's IPs, comma-separated (the downward API's status.hostIPs, which the DaemonSet sets): when --host-ip-v6 is unset, its IPv6 address is taken from here")
	fs.IntVar(&c.DNSPort, "dns-port", 18054, "DNS port on the host IP (UDP and TCP)")
	ef.IntVar(&c.DNSCacheSize, "dns-cache-size", "AETHER_DNS_CACHE_SIZE", dnsd.DefaultCacheSize, "how many forwarded DNS answers the resolver caches (0: no cache)")
	ef.DurationVar(&c.DNSCacheMaxTTL, "dns-cache-max-ttl", "AETHER_DNS_CACHE_MAX_TTL", dnsd.DefaultCacheMaxTTL, "longest time a positive forwarded answer is cached (whole seconds, at least 1s)")
	ef.DurationVar(&c.DNSCacheMaxNegativeTTL, "dns-cache-max-negative-ttl", "AETHER_DNS_CACHE_MAX_NEGATIVE_TTL", dnsd.DefaultCacheMaxNegativeTTL, "longest time a negative forwarded answer (NXDOMAIN, NODATA) is cached (whole seconds, at least 1s)")
	ef.DurationVar(&c.DNSCacheServeStale, "dns-cache-serve-stale", "AETHER_DNS_CACHE_SERVE_STALE", 0, "serve-stale (RFC 8767): how long past its expiry a cached answer may still answer, with TTL 30, when the upstreams fail or take over 1.8s (whole seconds up to 168h; 24h suggested; 0: off)")
	ef.IntVar(&c.DNSRateLimit, "dns-rate-limit", "AETHER_DNS_RATE_LIMIT", DefaultDNSRateLimit, "DNS queries per second answered to one source address; more get REFUSED (0: no limit)")
	dnsAllow := ef.String("dns-allow-sources", "AETHER_DNS_ALLOW_SOURCES", "", "comma-separated addresses or CIDRs answered by the DNS resolver besides the node's own addresses and its meshed pods (e.g. a cluster DNS server forwarding clusterset.local here); anything else gets REFUSED")
	ef.IntVar(&c.DNSCachePrefetch, "dns-cache-prefetch", "AETHER_DNS_CACHE_PREFETCH", 0, "refresh a cached answer in the background once it has been hit this many times and less than 10% of its TTL is left (0: off)")
	fs.StringVar(&c.XDSSocket, "xds-socket", "/var/run/aether/xds.sock", "unix socket of the ADS server")
	fs.StringVar(&c.EnvoyAdmin, "envoy-admin", DefaultEnvoyAdmin, "Envoy admin API: unix:///path (created 0600) or host:port")
	fs.StringVar(&c.EnvoyStatsAddr, "envoy-stats-addr", DefaultEnvoyStatsAddr, "Envoy's metrics-only listener (GET /stats/prometheus and /ready, nothing else), host:port; empty for none")
	ef.Uint64Var(&c.EnvoyMaxConnections, "envoy-max-connections", "AETHER_ENVOY_MAX_CONNECTIONS", envoy.DefaultMaxConnections, "downstream connections Envoy serves at once over all its listeners; more are closed at accept")
	ef.Uint64Var(&c.PodMaxConnections, "pod-max-connections", "AETHER_POD_MAX_CONNECTIONS", DefaultPodMaxConnections, "connections each of a pod's listeners (capture, lane, inbound mTLS) serves at once; more are closed at accept (0: no per-pod cap). The inbound listener's cap is the pod's server side too: raise it for servers holding more client connections (websockets, gateways)")
	ef.Uint64Var(&c.WaypointMaxConnections, "waypoint-max-connections", "AETHER_WAYPOINT_MAX_CONNECTIONS", DefaultWaypointMaxConnections, "connections the east-west waypoint listener (reached from other clusters) serves at once; more are closed at accept")
	ef.Uint64Var(&c.EnvoyMaxHeapBytes, "envoy-max-heap", "AETHER_ENVOY_MAX_HEAP", envoy.DefaultMaxHeapBytes, "Envoy heap size in bytes its overload manager watches: at 90% it frees memory, at 95% new HTTP requests get 503 (keep it under the Envoy container's memory limit)")
	ef.StringVar(&c.EnvoyBinary, "envoy-binary", "AETHER_ENVOY", "envoy", "Envoy binary the agent starts when none runs (empty: Envoy runs in its own container from the bootstrap the agent writes to <state-dir>/envoy/bootstrap.json)")
	fs.StringVar(&c.HealthAddr, "health-addr", "127.0.0.1:15021", "address of /healthz and /readyz")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", DefaultMetricsAddr, "address of /metrics (Prometheus), serving nothing else; empty for none")
	fs.StringVar(&c.DebugSocket, "debug-socket", DefaultDebugSocket, "unix socket (created 0600) serving /debug/pprof/; empty for none")
	fs.StringVar(&c.StateDir, "state-dir", "/var/lib/aether", "node-local state (pod attachments)")
	fs.StringVar(&c.CNISocket, "cni-socket", "/var/run/aether/cni.sock", "unix socket aether-cni calls")
	clusterDNS := ef.String("cluster-dns", "AETHER_CLUSTER_DNS", "", "comma-separated cluster DNS service IPs whose port 53 is DNAT'ed to the agent (default: the ClusterIPs of kube-system/kube-dns)")
	fs.StringVar(&c.ResolvConf, "resolv-conf", "/etc/resolv.conf", "resolv.conf whose nameservers get every name outside the mesh")
	ef.StringVar(&c.ClusterDomain, "cluster-domain", "AETHER_CLUSTER_DOMAIN", "", "the cluster's DNS domain (the kubelet's clusterDomain), whose search-list expansions of mesh names the resolver answers (default: the svc.<domain> entry of --resolv-conf's search list, else cluster.local)")
	ef.StringVar(&c.InboundMode, "inbound-mode", "AETHER_INBOUND_MODE", "strict", "inbound policy for meshed pods: strict (mTLS only) or permissive (plaintext too)")
	ef.BoolVar(&c.AllowCloudMetadata, "allow-cloud-metadata", "AETHER_ALLOW_CLOUD_METADATA", "let meshed pods reach the cloud metadata service (169.254.169.254, fd00:ec2::254), blocked by default: it hands out the node's credentials")
	ef.BoolVarDefault(&c.NodeSourceGuard, "node-source-guard", "AETHER_NODE_SOURCE_GUARD", true, "drop frames that enter the pod bridge with one of the node's addresses (gateways, HOST_IP) as IPv4/IPv6 source, ARP sender or neighbour-advertisement target, as table bridge aether; false only where the kernel lacks nf_tables for the bridge family")
	ef.StringVar(&c.CaptureBackend, "capture-backend", "AETHER_CAPTURE_BACKEND", "nftables", "capture rules backend: nftables, iptables (the node's mode), iptables-nft or iptables-legacy")
	ef.StringVar(&c.CaptureMode, "capture-mode", "AETHER_CAPTURE_MODE", "nft", "how pods' outbound TCP and DNS are captured: nft (--capture-backend rules), ebpf (cgroup programs; start fails where they cannot run) or auto (eBPF where it can run, else nft)")
	ef.StringVar(&c.BPFFSDir, "bpffs-dir", "AETHER_BPFFS_DIR", "/sys/fs/bpf/aether", "directory in a bpffs where the eBPF capture programs and maps are pinned (a bpffs is mounted there when none is)")
	fs.StringVar(&c.CNIConfDir, "cni-conf-dir", "/etc/cni/net.d", "CNI config directory holding the primary CNI's conflist")
	fs.StringVar(&c.CNIBinDir, "cni-bin-dir", "/opt/cni/bin", "CNI plugin directory aether-cni is installed into")
	ef.StringVar(&c.CNIPlugin, "cni-plugin-binary", "AETHER_CNI_PLUGIN", "", "aether-cni binary to install and append to the conflist (empty: do not install)")
	fs.BoolVar(&c.UninstallCNI, "uninstall-cni", false, "remove aether-cni from the conflist and the CNI bin dir, then exit")
	ef.BoolVar(&c.EastWestWaypoint, "east-west-waypoint", "AETHER_EAST_WEST_WAYPOINT", "make this node an east-west waypoint and send cross-cluster traffic through remote nodes' waypoints")
	level := ef.String("log-level", "AETHER_LOG_LEVEL", "info", "log level: debug, info, warn, error")
	if err := ef.Parse(args); err != nil {
		return c, err
	}
	c.ClustersetTrustDomains = envflag.List(*clustersetTDs)
	for _, s := range envflag.List(*clusterDNS) {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return c, fmt.Errorf("--cluster-dns %q: not an IP address", s)
		}
		c.ClusterDNS = append(c.ClusterDNS, ip)
	}
	for _, s := range envflag.List(*dnsAllow) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			ip, ierr := netip.ParseAddr(s)
			if ierr != nil || ip.Zone() != "" {
				return c, fmt.Errorf("--dns-allow-sources %q: not an IP address or CIDR", s)
			}
			p = netip.PrefixFrom(ip, ip.BitLen())
		}
		if p.Addr().Is4In6() {
			return c, fmt.Errorf("--dns-allow-sources %q: IPv4-mapped; give IPv4 as a.b.c.d or a.b.c.d/n", s)
		}
		c.DNSAllowSources = append(c.DNSAllowSources, p.Masked())
	}
	if *hostIP != "" {
		ip, err := netip.ParseAddr(*hostIP)
		if err != nil {
			return c, fmt.Errorf("--host-ip %q: not an IP address", *hostIP)
		}
		c.HostIP = ip
	}
	if *hostIPv6 == "" {
		for _, a := range envflag.List(*hostIPs) {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				return c, fmt.Errorf("--host-ips %q: %q is not an IP address", *hostIPs, a)
			}
			if ip.Is6() && !ip.Is4In6() {
				c.HostIPv6 = ip
				break
			}
		}
	}
	if *hostIPv6 != "" {
		ip, err := netip.ParseAddr(*hostIPv6)
		if err != nil || !ip.Is6() || ip.Is4In6() {
			return c, fmt.Errorf("--host-ip-v6 %q: not an IPv6 address", *hostIPv6)
		}
		c.HostIPv6 = ip
	}
	if err := c.LogLevel.UnmarshalText([]byte(*level)); err != nil {
		return c, fmt.Errorf("--log-level %q: want debug, info, warn or error", *level)
	}
	return c, nil
}

// Validate checks c before Run: required fields, addresses, ports that must not collide and the
// CA files; it returns every problem found, joined, each naming the flag and its value.
func (c Config) Validate() error {
	var errs []error
	req := func(flagName, v string) {
		if v == "" {
			errs = append(errs, fmt.Errorf("--%s is required", flagName))
		}
	}
	req("node-name", c.NodeName)
	req("cluster", c.Cluster)
	if len(c.Registry.Endpoints()) == 0 {
		errs = append(errs, errors.New("--registry-endpoints is required (the registrar's embedded etcd, or an external etcd)"))
	}
	if !c.HostIP.IsValid() {
		errs = append(errs, errors.New("--host-ip is required (or env HOST_IP)"))
	}
	for _, ip := range c.ClusterDNS {
		if ip.Is6() && !ip.Is4In6() && !c.HostIPv6.IsValid() {
			errs = append(errs, fmt.Errorf("--cluster-dns %s is IPv6: set --host-ip-v6 (the node's IPv6 address the resolver listens on)", ip))
		}
	}
	if c.DNSPort <= 0 || c.DNSPort > 65535 {
		errs = append(errs, fmt.Errorf("--dns-port %d: want 1-65535", c.DNSPort))
	}
	if c.DNSCacheSize < 0 {
		errs = append(errs, fmt.Errorf("--dns-cache-size %d: want 0 (no cache) or more", c.DNSCacheSize))
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"dns-cache-max-ttl", c.DNSCacheMaxTTL}, {"dns-cache-max-negative-ttl", c.DNSCacheMaxNegativeTTL}} {
		if err := dnsd.CheckCacheTTL(f.d); err != nil {
			errs = append(errs, fmt.Errorf("--%s %s: %w", f.name, f.d, err))
		}
	}
	if c.DNSCacheServeStale != 0 {
		if err := dnsd.CheckServeStale(c.DNSCacheServeStale); err != nil {
			errs = append(errs, fmt.Errorf("--dns-cache-serve-stale %s: %w", c.DNSCacheServeStale, err))
		}
	}
	if c.WaypointMaxConnections == 0 {
		errs = append(errs, errors.New("--waypoint-max-connections 0: want a number of connections above 0"))
	}
	if c.EnvoyMaxConnections == 0 {
		errs = append(errs, errors.New("--envoy-max-connections 0: want a number of connections above 0"))
	}
	if c.DNSRateLimit < 0 {
		errs = append(errs, fmt.Errorf("--dns-rate-limit %d: want 0 (no limit) or queries per second", c.DNSRateLimit))
	}
	if c.DNSCachePrefetch < 0 {
		errs = append(errs, fmt.Errorf("--dns-cache-prefetch %d: want 0 (no prefetch) or a number of hits", c.DNSCachePrefetch))
	}
	errs = append(errs, c.checkPorts()...)
	switch c.IdentitySource {
	case IdentityDevCA:
		if (c.CACert == "") != (c.CAKey == "") {
			errs = append(errs, errors.New("--ca-cert and --ca-key go together"))
		} else if c.CACert == "" {
			errs = append(errs, errors.New("--ca-cert and --ca-key are required with --identity-source=dev-ca (the CA that signs workload SVIDs)"))
		}
	case IdentitySPIRE:
		if c.CACert != "" || c.CAKey != "" {
			errs = append(errs, errors.New("--ca-cert and --ca-key: not with --identity-source=spire (SPIRE signs SVIDs; no CA key belongs on a node)"))
		}
		if c.SPIREAdminSocket == "" {
			errs = append(errs, errors.New("--spire-admin-socket: required with --identity-source=spire"))
		}
	default:
		errs = append(errs, fmt.Errorf("--identity-source %q: want spire or dev-ca", c.IdentitySource))
	}
	if c.CNIRepairInterval < time.Second {
		errs = append(errs, fmt.Errorf("--cni-repair-interval %s: want at least 1s", c.CNIRepairInterval))
	}
	if c.SVIDTTL < 2*time.Minute {
		errs = append(errs, fmt.Errorf("--svid-ttl %s: want at least 2m", c.SVIDTTL))
	}
	errs = append(errs, c.Registry.CheckTLS()...)
	for _, f := range []struct{ name, path string }{{"ca-cert", c.CACert}, {"ca-key", c.CAKey}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			errs = append(errs, fmt.Errorf("--%s %q: %w", f.name, f.path, err))
		}
	}
	switch c.CaptureBackend {
	case "nftables", "iptables", "iptables-nft", "iptables-legacy":
	default:
		errs = append(errs, fmt.Errorf("--capture-backend %q: want nftables, iptables, iptables-nft or iptables-legacy", c.CaptureBackend))
	}
	switch c.CaptureMode {
	case captureNFT, captureEBPF, captureAuto:
	default:
		errs = append(errs, fmt.Errorf("--capture-mode %q: want auto, ebpf or nft", c.CaptureMode))
	}
	if c.CaptureMode != captureNFT && !filepath.IsAbs(c.BPFFSDir) {
		errs = append(errs, fmt.Errorf("--bpffs-dir %q: want an absolute path", c.BPFFSDir))
	}
	if c.InboundMode != "strict" && c.InboundMode != "permissive" {
		errs = append(errs, fmt.Errorf("--inbound-mode %q: want strict or permissive", c.InboundMode))
	}
	if c.RegistryLeaseTTL < 2*time.Second {
		errs = append(errs, fmt.Errorf("--registry-lease-ttl %s: want at least 2s", c.RegistryLeaseTTL))
	}
	if c.RegistrySyncGrace < 0 {
		errs = append(errs, fmt.Errorf("--registry-sync-grace %s: want 0 (serve the persisted state at once) or more", c.RegistrySyncGrace))
	}
	for _, td := range c.ClustersetTrustDomains {
		if _, err := spiffeid.TrustDomainFromString(td); err != nil {
			errs = append(errs, fmt.Errorf("--clusterset-trust-domains %q: %w", td, err))
		}
	}
	if c.ControlCluster != "" {
		if e := validation.IsDNS1123Label(c.ControlCluster); len(e) > 0 {
			errs = append(errs, fmt.Errorf("--control-cluster %q: want a cluster name, an RFC 1123 label: %s", c.ControlCluster, strings.Join(e, "; ")))
		}
	}
	if !isDNSName(c.MeshDomain) {
		errs = append(errs, fmt.Errorf("--mesh-domain %q: not a DNS name", c.MeshDomain))
	}
	if c.ClusterDomain != "" && !isDNSName(strings.TrimSuffix(c.ClusterDomain, ".")) {
		errs = append(errs, fmt.Errorf("--cluster-domain %q: not a DNS name", c.ClusterDomain))
	}
	return errors.Join(errs...)
}

// clusterDomain returns the cluster domain the resolver expands mesh names under and where it
// came from: --cluster-domain when set, else the domain of --resolv-conf's search list
// (dnsd.ClusterDomainFromResolvConf: a hostNetwork agent with dnsPolicy ClusterFirstWithHostNet,
// as deploy/agent/daemonset.yaml runs it, gets the kubelet's list), else dnsd.DefaultClusterDomain.
// It returns an error naming the file when --resolv-conf cannot be read.
func clusterDomain(c Config) (domain, from string, err error) {
	if c.ClusterDomain != "" {
		return strings.ToLower(strings.TrimSuffix(c.ClusterDomain, ".")), "--cluster-domain", nil
	}
	d, err := dnsd.ClusterDomainFromResolvConf(c.ResolvConf)
	if err != nil {
		return "", "", fmt.Errorf("--resolv-conf: %w", err)
	}
	if d != "" {
		return d, "--resolv-conf search list", nil
	}
	return dnsd.DefaultClusterDomain, "default", nil
}

// isDNSName reports whether s is a DNS name of RFC 1123 host labels (letters, digits and
// hyphens, 1 to 63 characters, no hyphen first or last), dot-separated, 253 characters at most.
func isDNSName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, r := range l {
			if !(r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
				return false
			}
		}
	}
	return true
}

// nodePort is one port of the node's port plan (DESIGN.md, ports): a flag's, or a fixed one.
type nodePort struct {
	name string // "--dns-port", or "the capture listener's port" for a fixed one
	port int
}

// fixedPorts are the node's ports no flag sets: the pod netns listeners and the east-west
// tunnel listener (DESIGN.md, ports).
var fixedPorts = []nodePort{
	{"the capture listener's port", xds.CapturePort},
	{"the inbound mTLS port", xds.InboundPort},
	{"the explicit HTTP lane's port", xds.LanePort},
	{"the east-west tunnel port", xds.WaypointPort},
}

// checkPorts refuses two ports of the node's plan with the same number: --dns-port,
// --envoy-admin's, --health-addr's, --metrics-addr's and --envoy-stats-addr's ports and the fixed
// ones. Each port is one role, whatever
// address it is bound on, so that a rule or probe matching a port number means one listener.
// Port 0 (a port the kernel picks) and a unix socket (--envoy-admin unix:///path; xDS is always
// one) take no number. Each error names both ports and the number; an address that does not
// parse is an error naming its flag.
func (c Config) checkPorts() []error {
	var errs []error
	ports := []nodePort{{"--dns-port", c.DNSPort}}
	for _, f := range []struct{ name, addr string }{{"--envoy-admin", c.EnvoyAdmin}, {"--health-addr", c.HealthAddr},
		{"--metrics-addr", c.MetricsAddr}, {"--envoy-stats-addr", c.EnvoyStatsAddr}} {
		if strings.HasPrefix(f.addr, "unix://") || f.addr == "" && f.name != "--health-addr" && f.name != "--envoy-admin" {
			continue
		}
		_, p, err := net.SplitHostPort(f.addr)
		var n int
		if err == nil {
			n, err = net.LookupPort("tcp", p)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want host:port", f.name, f.addr))
			continue
		}
		ports = append(ports, nodePort{f.name, n})
	}
	ports = append(ports, fixedPorts...)
	for i, a := range ports {
		for _, b := range ports[i+1:] {
			if a.port != 0 && a.port == b.port {
				errs = append(errs, fmt.Errorf("%s and %s are both %d: each needs its own port", a.name, b.name, a.port))
			}
		}
	}
	return errs
}
