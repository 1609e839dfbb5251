package registrar

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/aethermesh/aether/internal/envflag"
	"github.com/aethermesh/aether/internal/registryflag"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar/configexport"
	"github.com/aethermesh/aether/registry"
)

// RunConfig is the registrar process's whole configuration: every field has a flag, most an
// environment variable too (the flag wins). ParseRunConfig validates it, naming the flag of
// every bad field.
type RunConfig struct {
	target
	// RegistryProbe is --registry-probe-interval: how often the registry (and the partition
	// claim) is checked for readiness.
	RegistryProbe time.Duration
	// ClusterIDTimeout is --cluster-id-timeout: how long the registrar waits at start for its
	// cluster's ID (the UID of Namespace kube-system) before it exits, with an external
	// registry. With the embedded registry it waits as long as it takes.
	ClusterIDTimeout time.Duration

	LeaderElect          bool          // --leader-elect
	LeaderElectNamespace string        // --leader-elect-namespace, POD_NAMESPACE
	LeaderElectID        string        // --leader-elect-id
	LeaseDuration        time.Duration // --leader-elect-lease-duration
	RenewDeadline        time.Duration // --leader-elect-renew-deadline
	RetryPeriod          time.Duration // --leader-elect-retry-period
	ReleaseOnCancel      bool          // --leader-elect-release-on-cancel

	// EdgeEnvoyImage is --edge-envoy-image: the Envoy image of the edge Gateways' Deployments
	// (the agent DaemonSet's); empty turns aether's Gateway controller off.
	EdgeEnvoyImage string
	// Namespace is --namespace, POD_NAMESPACE: the registrar's own namespace, where the Gateway
	// controller publishes the edge Gateways' certificates for the agents.
	Namespace string
	// GatewayAddressCIDRs is --gateway-address-cidrs, AETHER_GATEWAY_ADDRESS_CIDRS: the ranges a
	// Gateway's spec.addresses may ask for (they become the edge Service's external IPs); none
	// by default.
	GatewayAddressCIDRs []netip.Prefix
	// EdgeCrossNamespaceCertificates is --edge-cross-namespace-certificates,
	// AETHER_EDGE_CROSS_NAMESPACE_CERTIFICATES (model.GatewayInputs.CrossNamespaceCertificates;
	// the agents read the same setting).
	EdgeCrossNamespaceCertificates bool
	// EdgeReplicas is --edge-replicas, AETHER_EDGE_REPLICAS: edge pods per Gateway (1 to 100).
	EdgeReplicas int
	// GatewayInfrastructureKeys is --gateway-infrastructure-keys,
	// AETHER_GATEWAY_INFRASTRUCTURE_KEYS: the Gateways' spec.infrastructure label and
	// annotation keys (or prefixes ending in "/") the edge objects get; none by default
	// (model.InfrastructureKeyAllowed).
	GatewayInfrastructureKeys []string

	// ControlCluster is --control-cluster, AETHER_CONTROL_CLUSTER: the only cluster that exports
	// config projections ("": each cluster exports its own exported Services' config); an RFC
	// 1123 label.
	ControlCluster string
	// ConfigExportRefresh is --config-export-refresh, AETHER_CONFIG_EXPORT_REFRESH: how often an
	// unchanged config projection is written again (at least configexport.MinRefresh).
	ConfigExportRefresh time.Duration

	MetricsAddr string // --metrics-addr
	HealthAddr  string // --health-addr
	Workers     int    // --workers
	KubeQPS     float64
	KubeBurst   int

	LogLevel slog.Level // --log-level
}

// target is this cluster and its registry: the flags the registrar and its reclaim-partition
// subcommand share.
type target struct {
	Cluster    string // --cluster, AETHER_CLUSTER: this cluster's name (its registry partition)
	Region     string // --region, AETHER_REGION
	Kubeconfig string // --kubeconfig, KUBECONFIG (empty: in-cluster)

	Registry         registryflag.Flags // --registry-endpoints, --registry-ca, --registry-cert, --registry-key
	RegistryUser     string             // --registry-user, AETHER_REGISTRY_USER (etcd auth; password from AETHER_REGISTRY_PASSWORD)
	RegistryPassword string             // AETHER_REGISTRY_PASSWORD only (never a flag: it would show in ps)
	RegistryDataDir  string             // --registry-data-dir, AETHER_REGISTRY_DATA_DIR: embedded etcd's data (no endpoints)
	RegistryListen   string             // --registry-listen: embedded etcd's client URL
	// RegistryServeCert, RegistryServeKey and RegistryServeClientCA are the embedded etcd's TLS
	// (--registry-serve-cert, --registry-serve-key, --registry-serve-client-ca): its serving
	// certificate for an https --registry-listen, and the CA its clients' certificates must be
	// signed by (client certificates required when set).
	RegistryServeCert, RegistryServeKey, RegistryServeClientCA string
	RegistryPeer                                               string // --registry-peer-listen: embedded etcd's peer URL
}

// define registers the target's flags (with their environment variables) on ef and fs.
func (c *target) define(ef *envflag.Set, fs *flag.FlagSet, getenv func(string) string) {
	ef.StringVar(&c.Cluster, "cluster", "AETHER_CLUSTER", "", "this cluster's name: its registry partition and MCS cluster name")
	ef.StringVar(&c.Region, "region", "AETHER_REGION", registry.DefaultRegion, "this cluster's region in the registry key layout (the agents' --region must be the same)")
	ef.StringVar(&c.Kubeconfig, "kubeconfig", "KUBECONFIG", "", "kubeconfig path (empty: in-cluster config)")
	c.Registry.Define(ef, registryflag.Usage{Endpoints: "comma-separated etcd client URLs of the registry; empty: run an embedded single-member etcd"})
	ef.StringVar(&c.RegistryUser, "registry-user", "AETHER_REGISTRY_USER", "", "etcd user (password from env AETHER_REGISTRY_PASSWORD)")
	c.RegistryPassword = getenv("AETHER_REGISTRY_PASSWORD")
	ef.StringVar(&c.RegistryDataDir, "registry-data-dir", "AETHER_REGISTRY_DATA_DIR", "/var/lib/aether/registry", "embedded etcd's data directory (used when --registry-endpoints is empty)")
	fs.StringVar(&c.RegistryListen, "registry-listen", "http://127.0.0.1:2379", "embedded etcd's client URL (used when --registry-endpoints is empty); https:// with --registry-serve-cert/--registry-serve-key, plaintext http:// only on loopback unless --registry-insecure")
	ef.StringVar(&c.RegistryServeCert, "registry-serve-cert", "AETHER_REGISTRY_SERVE_CERT", "", "embedded etcd's serving certificate (PEM) for an https --registry-listen")
	ef.StringVar(&c.RegistryServeKey, "registry-serve-key", "AETHER_REGISTRY_SERVE_KEY", "", "embedded etcd's serving key (PEM)")
	ef.StringVar(&c.RegistryServeClientCA, "registry-serve-client-ca", "AETHER_REGISTRY_SERVE_CLIENT_CA", "", "CA bundle (PEM) the embedded etcd requires its clients' certificates to be signed by (with etcd authentication on, a client's user is its certificate's CN)")
	fs.StringVar(&c.RegistryPeer, "registry-peer-listen", "http://127.0.0.1:2380", "embedded etcd's peer URL (used when --registry-endpoints is empty)")
}

// validate names the flag and value of every bad target field.
func (c target) validate() []error {
	var errs []error
	label := func(flagName, v string) {
		if v == "" {
			errs = append(errs, fmt.Errorf("--%s is required", flagName))
		} else if e := validation.IsDNS1123Label(v); len(e) > 0 {
			errs = append(errs, fmt.Errorf("--%s %q: %s", flagName, v, strings.Join(e, "; ")))
		}
	}
	label("cluster", c.Cluster)
	label("region", c.Region)
	for _, e := range c.Registry.Endpoints() {
		if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("--registry-endpoints %q: want http:// or https:// URLs", e))
		}
	}
	if len(c.Registry.Endpoints()) == 0 {
		if c.RegistryDataDir == "" {
			errs = append(errs, errors.New("--registry-endpoints (AETHER_REGISTRY_ENDPOINTS) is empty and there is no --registry-data-dir for an embedded etcd: give the registry's etcd client URLs, or a data directory to run a single-member etcd"))
		}
		for _, f := range []struct{ name, v string }{{"registry-listen", c.RegistryListen}, {"registry-peer-listen", c.RegistryPeer}} {
			u, err := url.Parse(f.v)
			if err != nil || (u.Scheme != "http" && !(u.Scheme == "https" && f.name == "registry-listen")) {
				want := "an http:// URL"
				if f.name == "registry-listen" {
					want = "an http:// or https:// URL"
				}
				errs = append(errs, fmt.Errorf("--%s %q: want %s", f.name, f.v, want))
			} else if _, _, err := net.SplitHostPort(u.Host); err != nil {
				errs = append(errs, fmt.Errorf("--%s %q: want host:port", f.name, f.v))
			}
		}
		errs = append(errs, c.embeddedTLS()...)
	}
	return append(errs, c.Registry.CheckTLS()...)
}

// embeddedTLS checks the embedded etcd's TLS settings: an https --registry-listen needs a serving
// certificate and key, and the registrar's own client to it needs --registry-ca (and its own
// --registry-cert/--registry-key when clients must present one); the serving flags need https;
// a plaintext --registry-listen off loopback needs --registry-insecure, as a plaintext endpoint
// does (registryflag.CheckTLS). Each error names the flags.
func (c target) embeddedTLS() []error {
	u, err := url.Parse(c.RegistryListen)
	if err != nil {
		return nil // reported with the URL's other checks
	}
	var errs []error
	if u.Scheme == "https" {
		if c.RegistryServeCert == "" || c.RegistryServeKey == "" {
			errs = append(errs, fmt.Errorf("--registry-listen %q: https needs --registry-serve-cert and --registry-serve-key", c.RegistryListen))
		}
		if c.Registry.CA == "" {
			errs = append(errs, fmt.Errorf("--registry-listen %q: the registrar connects to its own etcd over https and needs --registry-ca (the CA of --registry-serve-cert)", c.RegistryListen))
		}
		if c.RegistryServeClientCA != "" && (c.Registry.Cert == "" || c.Registry.Key == "") {
			errs = append(errs, errors.New("--registry-serve-client-ca requires client certificates, so the registrar needs its own: --registry-cert and --registry-key"))
		}
	} else {
		if c.RegistryServeCert != "" || c.RegistryServeKey != "" || c.RegistryServeClientCA != "" {
			errs = append(errs, fmt.Errorf("--registry-serve-cert, --registry-serve-key and --registry-serve-client-ca need an https:// --registry-listen, not %q", c.RegistryListen))
		}
		if !isLoopbackHost(u.Hostname()) && !c.Registry.Insecure {
			errs = append(errs, fmt.Errorf("--registry-listen %q: plaintext off loopback: serve https:// with --registry-serve-cert/--registry-serve-key, or set --registry-insecure", c.RegistryListen))
		}
	}
	// The peer URL of the single member takes no TLS here: it stays on loopback (nothing joins).
	if pu, err := url.Parse(c.RegistryPeer); err == nil && !isLoopbackHost(pu.Hostname()) && !c.Registry.Insecure {
		errs = append(errs, fmt.Errorf("--registry-peer-listen %q: the embedded etcd's peer port is plaintext and has no peers: keep it on loopback, or set --registry-insecure", c.RegistryPeer))
	}
	return append(errs, envflag.CheckFiles(envflag.File{Flag: "registry-serve-cert", Path: c.RegistryServeCert},
		envflag.File{Flag: "registry-serve-key", Path: c.RegistryServeKey}, envflag.File{Flag: "registry-serve-client-ca", Path: c.RegistryServeClientCA})...)
}

// isLoopbackHost reports whether host is a loopback address or "localhost".
func isLoopbackHost(host string) bool {
	ip, err := netip.ParseAddr(host)
	return (err == nil && ip.IsLoopback()) || host == "localhost"
}

// ParseRunConfig reads flags (args without the program name) with environment defaults from getenv.
func ParseRunConfig(args []string, getenv func(string) string) (RunConfig, error) {
	var c RunConfig
	fs := flag.NewFlagSet("aether-registrar", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage:\n"+
			"  aether-registrar [flags]                      run the MCS export and import controllers\n"+
			"  aether-registrar %s [flags]  turn etcd authentication on, a user and role per cluster\n"+
			"  aether-registrar %s [flags]    re-claim this cluster's registry partition after a rebuild\n"+
			"(each subcommand's --help lists its flags; docs/registrar.md)\n\nFlags:\n", SetupAuthCommand, ReclaimCommand)
		fs.PrintDefaults()
	}
	ef := &envflag.Set{FS: fs, Getenv: getenv}
	c.target.define(ef, fs, getenv)
	fs.DurationVar(&c.RegistryProbe, "registry-probe-interval", 2*time.Second, "how often readiness probes the registry")
	fs.DurationVar(&c.ClusterIDTimeout, "cluster-id-timeout", 2*time.Minute, "how long to wait at start for this cluster's ID (the UID of Namespace kube-system) before exiting; with the embedded registry (no --registry-endpoints) the registrar waits as long as it takes, serving the registry meanwhile")
	fs.BoolVar(&c.LeaderElect, "leader-elect", true, "elect a leader among replicas (only the leader writes); off with the embedded registry (--registry-endpoints empty), a single replica")
	ef.StringVar(&c.LeaderElectNamespace, "leader-elect-namespace", "POD_NAMESPACE", "aether-system", "namespace of the leader election Lease")
	fs.StringVar(&c.LeaderElectID, "leader-elect-id", "aether-registrar", "name of the leader election Lease")
	fs.DurationVar(&c.LeaseDuration, "leader-elect-lease-duration", 15*time.Second, "how long a standby waits before taking over a lease that was not renewed")
	fs.DurationVar(&c.RenewDeadline, "leader-elect-renew-deadline", 10*time.Second, "how long the leader keeps trying to renew before it steps down")
	fs.DurationVar(&c.RetryPeriod, "leader-elect-retry-period", 2*time.Second, "interval between leader election attempts")
	fs.BoolVar(&c.ReleaseOnCancel, "leader-elect-release-on-cancel", true, "give up the lease at once on a clean shutdown")
	fs.StringVar(&c.EdgeEnvoyImage, "edge-envoy-image", "", "Envoy image of the edge Gateways' Deployments (the agent DaemonSet's Envoy image); empty: aether serves no GatewayClass")
	ef.StringVar(&c.Namespace, "namespace", "POD_NAMESPACE", "aether-system", "the registrar's own namespace: the edge Gateways' certificate copies live there")
	ef.BoolVar(&c.EdgeCrossNamespaceCertificates, "edge-cross-namespace-certificates", "AETHER_EDGE_CROSS_NAMESPACE_CERTIFICATES", "let edge listeners use certificateRefs into other namespaces (with a ReferenceGrant); off: the edge pods, in the Gateway's namespace, would hand the key to whoever may run pods there")
	gwCIDRs := ef.String("gateway-address-cidrs", "AETHER_GATEWAY_ADDRESS_CIDRS", "", "comma-separated CIDRs a Gateway's spec.addresses may ask for; each becomes the edge Service's external IP, which every node answers for, so none is allowed unless listed; a node's address, an address another Service uses, and an address port another Gateway holds are never given (docs/gateway.md)")
	ef.IntVar(&c.EdgeReplicas, "edge-replicas", "AETHER_EDGE_REPLICAS", 1, "edge pods per Gateway (1 to 100); from two on they are spread over nodes (preferred pod anti-affinity)")
	infraKeys := ef.String("gateway-infrastructure-keys", "AETHER_GATEWAY_INFRASTRUCTURE_KEYS", "", "comma-separated label and annotation keys (or prefixes ending in \"/\") of a Gateway's spec.infrastructure its edge Deployment, Service, ServiceAccount and pods get; none unless listed (a Service annotation or label can steer a load balancer); aether.io/ keys never (docs/gateway.md)")
	ef.StringVar(&c.ControlCluster, "control-cluster", "AETHER_CONTROL_CLUSTER", "", "the only cluster whose registrar exports config projections and whose projections importers trust (docs/projections.md); empty: each cluster exports its own exported Services' config")
	ef.DurationVar(&c.ConfigExportRefresh, "config-export-refresh", "AETHER_CONFIG_EXPORT_REFRESH", configexport.DefaultRefresh, "how often an unchanged config projection is written again, so importers can bound its staleness (at least "+configexport.MinRefresh.String()+")")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", ":8080", "address of /metrics (\"0\" disables it)")
	fs.StringVar(&c.HealthAddr, "health-addr", ":8081", "address of /healthz and /readyz")
	fs.IntVar(&c.Workers, "workers", 4, "parallel reconciles per controller")
	fs.Float64Var(&c.KubeQPS, "kube-api-qps", 50, "API server requests per second")
	fs.IntVar(&c.KubeBurst, "kube-api-burst", 100, "API server request burst")
	level := ef.String("log-level", "AETHER_LOG_LEVEL", "info", "log level: debug, info, warn, error")
	if err := ef.Parse(args); err != nil {
		return c, err
	}
	if err := c.LogLevel.UnmarshalText([]byte(*level)); err != nil {
		return c, fmt.Errorf("--log-level %q: want debug, info, warn or error", *level)
	}
	for _, v := range strings.Split(*infraKeys, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		if model.ReservedInfrastructureKey(v) {
			return c, fmt.Errorf("--gateway-infrastructure-keys %q: %q: aether's own keys (aether.io/, %s) are never taken from a Gateway", *infraKeys, v, gwv1.GatewayNameLabelKey)
		}
		c.GatewayInfrastructureKeys = append(c.GatewayInfrastructureKeys, v)
	}
	for _, v := range strings.Split(*gwCIDRs, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return c, fmt.Errorf("--gateway-address-cidrs %q: %q: want a CIDR such as 192.0.2.0/24", *gwCIDRs, v)
		}
		c.GatewayAddressCIDRs = append(c.GatewayAddressCIDRs, p.Masked())
	}
	return c, c.validate()
}

func (c RunConfig) validate() error {
	errs := c.target.validate()
	if c.RegistryProbe <= 0 {
		errs = append(errs, fmt.Errorf("--registry-probe-interval %s: want a positive duration", c.RegistryProbe))
	}
	if c.ClusterIDTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--cluster-id-timeout %s: want a positive duration", c.ClusterIDTimeout))
	}
	if c.LeaderElect {
		if c.LeaderElectNamespace == "" {
			errs = append(errs, errors.New("--leader-elect-namespace is required with --leader-elect"))
		}
		if c.LeaderElectID == "" {
			errs = append(errs, errors.New("--leader-elect-id is required with --leader-elect"))
		}
		if c.RetryPeriod <= 0 || c.RenewDeadline <= c.RetryPeriod || c.LeaseDuration <= c.RenewDeadline {
			errs = append(errs, fmt.Errorf("--leader-elect-lease-duration %s, --leader-elect-renew-deadline %s, --leader-elect-retry-period %s: want lease > renew > retry > 0",
				c.LeaseDuration, c.RenewDeadline, c.RetryPeriod))
		}
	}
	if c.EdgeEnvoyImage != "" {
		if c.Namespace == "" {
			errs = append(errs, errors.New("--namespace (POD_NAMESPACE) is required with --edge-envoy-image"))
		} else if e := validation.IsDNS1123Label(c.Namespace); len(e) > 0 {
			errs = append(errs, fmt.Errorf("--namespace %q: %s", c.Namespace, strings.Join(e, "; ")))
		}
		if strings.ContainsAny(c.EdgeEnvoyImage, " \t\n") {
			errs = append(errs, fmt.Errorf("--edge-envoy-image %q: want an image reference (no spaces)", c.EdgeEnvoyImage))
		}
	}
	if c.EdgeReplicas < 1 || c.EdgeReplicas > 100 {
		errs = append(errs, fmt.Errorf("--edge-replicas %d: want 1 to 100", c.EdgeReplicas))
	}
	if c.ControlCluster != "" {
		if e := validation.IsDNS1123Label(c.ControlCluster); len(e) > 0 {
			errs = append(errs, fmt.Errorf("--control-cluster %q: want a cluster name (an RFC 1123 label) or empty: %s", c.ControlCluster, strings.Join(e, "; ")))
		}
	}
	if c.ConfigExportRefresh < configexport.MinRefresh {
		errs = append(errs, fmt.Errorf("--config-export-refresh %s: want at least %s", c.ConfigExportRefresh, configexport.MinRefresh))
	}
	if c.Workers < 1 {
		errs = append(errs, fmt.Errorf("--workers %d: want at least 1", c.Workers))
	}
	if c.KubeQPS <= 0 || c.KubeBurst < 1 {
		errs = append(errs, fmt.Errorf("--kube-api-qps %v, --kube-api-burst %d: want positive values", c.KubeQPS, c.KubeBurst))
	}
	return errors.Join(errs...)
}
