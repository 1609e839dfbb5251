package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// SPIREOptions configure a SPIRE server (StartSPIREServerContext, StartSPIREServer).
type SPIREOptions struct {
	// TrustDomain is the server's trust domain (default "aether.internal").
	TrustDomain string
	// Cluster is the cluster name of k8s_psat node attestation and of the Controller Manager
	// (default "alpha").
	Cluster string
	// SVIDTTL is the server's default_x509_svid_ttl (default 1h).
	SVIDTTL time.Duration
	// AgentSyncInterval is the agents' experimental sync_interval (how often each asks the
	// server for its entries and SVIDs) and the server's experimental cache_reload_interval (how
	// often it reloads the entries it authorizes agents for, with events_based_cache); zero:
	// SPIRE's defaults, 5 s each.
	AgentSyncInterval time.Duration
	// Dir is the server's directory (configuration, data, sockets, logs, and its agents'
	// directories by default); "" creates one under $TMPDIR, which Stop removes. Keep it short:
	// Unix socket paths are limited to 108 bytes.
	Dir string
	// UpstreamCACert and UpstreamCAKey, when both are set, are the PEM files of the server's
	// UpstreamAuthority "disk": that CA signs the server's own signing CA (an intermediate), and
	// the trust bundle is the upstream CA. Servers under one upstream CA trust each other's SVIDs
	// in one trust domain.
	UpstreamCACert, UpstreamCAKey string
	// BundleEndpoint serves the trust domain's bundle to other trust domains' servers
	// (federation, profile https_spiffe) at SPIREServer.BundleEndpointURL.
	BundleEndpoint bool
}

// SPIREServer is a real spire-server (hack/tools.sh) on loopback, with k8s_psat node attestation
// against a real kube-apiserver and the SPIRE Controller Manager registering workloads from
// ClusterSPIFFEID, ClusterStaticEntry and ClusterFederatedTrustDomain resources of that API
// server. Stop ends its processes; their logs are in Dir.
type SPIREServer struct {
	Opts SPIREOptions
	Kube *KubeAPIServer
	Dir  string
	// Socket is the server API's Unix socket (socket_path): the CLI and the Controller Manager
	// use it.
	Socket string
	// Port is the agents' TCP port on 127.0.0.1.
	Port int
	// BundlePath holds the trust bundle (PEM) agents bootstrap from.
	BundlePath string
	// BundleEndpointURL is the federation bundle endpoint, https://127.0.0.1:<port> (with
	// Opts.BundleEndpoint), whose server presents the SVID of ServerID.
	BundleEndpointURL string
	tools             Tools
	server, cm        *process
	releases          []func()
	removeDir         bool
}

// process is a started command and the channel closed when it has exited.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// stop terminates p (Terminate) unless it is nil.
func (p *process) stop(grace time.Duration) {
	if p != nil {
		Terminate(p.cmd, p.done, grace)
	}
}

// StartSPIREServer starts spire-server and the SPIRE Controller Manager for kube (whose CRDs it
// installs), and waits until the server is healthy and its bundle written. Both stop when the
// test ends; a failed test logs the tails of their logs.
func StartSPIREServer(t testing.TB, kube *KubeAPIServer, opts SPIREOptions) *SPIREServer {
	t.Helper()
	RequireTools(t, ToolSPIRE)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := StartSPIREServerContext(ctx, kube, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"spire-server.log", "spire-controller-manager.log"} {
				b, _ := os.ReadFile(filepath.Join(s.Dir, f))
				t.Logf("%s (tail):\n%s", f, Tail(string(b), 6000))
			}
		}
		s.Stop()
	})
	if err := s.StartControllerManager(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// StartSPIREServerContext starts spire-server for kube's cluster and waits (up to 60 s, or until
// ctx ends) until it is healthy, then writes its trust bundle to BundlePath. Stop ends it; on
// error nothing is left running.
func StartSPIREServerContext(ctx context.Context, kube *KubeAPIServer, opts SPIREOptions) (_ *SPIREServer, err error) {
	tl, err := FindTools()
	if err != nil {
		return nil, fmt.Errorf("start SPIRE server: %w", err)
	}
	if opts.TrustDomain == "" {
		opts.TrustDomain = "aether.internal"
	}
	if opts.Cluster == "" {
		opts.Cluster = "alpha"
	}
	if opts.SVIDTTL == 0 {
		opts.SVIDTTL = time.Hour
	}
	if (opts.UpstreamCACert == "") != (opts.UpstreamCAKey == "") {
		return nil, fmt.Errorf("start SPIRE server: UpstreamCACert %q and UpstreamCAKey %q: want both or neither", opts.UpstreamCACert, opts.UpstreamCAKey)
	}
	s := &SPIREServer{Opts: opts, Kube: kube, Dir: opts.Dir, tools: tl}
	defer func() {
		if err != nil {
			s.Stop()
			err = fmt.Errorf("start SPIRE server of %s: %w", opts.Cluster, err)
		}
	}()
	if s.Dir == "" {
		if s.Dir, err = os.MkdirTemp("", "spire-"); err != nil {
			return s, err
		}
		s.removeDir = true
	}
	s.Socket, s.BundlePath = filepath.Join(s.Dir, "server", "api.sock"), filepath.Join(s.Dir, "bundle.pem")
	if err := os.MkdirAll(filepath.Join(s.Dir, "server", "data"), 0o700); err != nil {
		return s, err
	}
	if s.Port, err = s.reservePort(); err != nil {
		return s, err
	}
	health, err := s.reservePort()
	if err != nil {
		return s, err
	}
	var bundlePort int
	if opts.BundleEndpoint {
		if bundlePort, err = s.reservePort(); err != nil {
			return s, err
		}
		s.BundleEndpointURL = "https://127.0.0.1:" + strconv.Itoa(bundlePort)
	}
	cf := filepath.Join(s.Dir, "server", "server.conf")
	if err := os.WriteFile(cf, []byte(s.serverConf(health, bundlePort)), 0o600); err != nil {
		return s, err
	}
	if s.server, err = startLogged(filepath.Join(s.Dir, "spire-server.log"), nil, tl.SPIREServer, "run", "-config", cf); err != nil {
		return s, err
	}
	if err := waitHealthy(ctx, s.server, "spire-server", tl.SPIREServer, s.Socket); err != nil {
		return s, err
	}
	b, err := s.Bundle(ctx, "", "pem")
	if err != nil {
		return s, err
	}
	return s, os.WriteFile(s.BundlePath, b, 0o600)
}

// serverConf is the server's configuration: its health checks on 127.0.0.1:health and, when
// bundlePort is not zero, its federation bundle endpoint there.
func (s *SPIREServer) serverConf(health, bundlePort int) string {
	data := filepath.Join(s.Dir, "server", "data")
	var b strings.Builder
	fmt.Fprintf(&b, `server {
  bind_address = "127.0.0.1"
  bind_port = "%d"
  socket_path = %q
  trust_domain = %q
  data_dir = %q
  log_level = "DEBUG"
  default_x509_svid_ttl = %q
  ca_ttl = "24h"
`, s.Port, s.Socket, s.Opts.TrustDomain, data, s.Opts.SVIDTTL.String())
	if s.Opts.AgentSyncInterval > 0 {
		fmt.Fprintf(&b, `  experimental {
    events_based_cache = true
    cache_reload_interval = %q
  }
`, s.Opts.AgentSyncInterval.String())
	}
	if bundlePort != 0 {
		fmt.Fprintf(&b, `  federation {
    bundle_endpoint {
      address = "127.0.0.1"
      port = %d
      profile "https_spiffe" {}
    }
  }
`, bundlePort)
	}
	fmt.Fprintf(&b, `}
plugins {
  DataStore "sql" {
    plugin_data {
      database_type = "sqlite3"
      connection_string = %q
    }
  }
  KeyManager "memory" {
    plugin_data {}
  }
  NodeAttestor "k8s_psat" {
    plugin_data {
      clusters = {
        %q = {
          service_account_allow_list = ["spire:spire-agent"]
          kube_config_file = %q
        }
      }
    }
  }
`, filepath.Join(data, "datastore.sqlite3"), s.Opts.Cluster, s.Kube.Kubeconfig)
	if s.Opts.UpstreamCACert != "" {
		fmt.Fprintf(&b, `  UpstreamAuthority "disk" {
    plugin_data {
      cert_file_path = %q
      key_file_path = %q
    }
  }
`, s.Opts.UpstreamCACert, s.Opts.UpstreamCAKey)
	}
	b.WriteString("}\n")
	b.WriteString(healthChecks(health))
	return b.String()
}

// reservePort reserves a loopback port (ReservePort) until Stop.
func (s *SPIREServer) reservePort() (int, error) {
	p, release, err := ReservePort()
	if err != nil {
		return 0, err
	}
	s.releases = append(s.releases, release)
	return p, nil
}

// StartControllerManager installs the SPIRE Controller Manager's CRDs in the server's cluster
// (they must not exist yet) and starts it (no webhook, no leader election) on the server's API
// socket. Stop ends it.
func (s *SPIREServer) StartControllerManager(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("start SPIRE Controller Manager of %s: %w", s.Opts.Cluster, err)
		}
	}()
	if err := CreateCRDs(ctx, s.Kube.Config, s.tools.SPIRECRDs); err != nil {
		return err
	}
	health, err := s.reservePort()
	if err != nil {
		return err
	}
	scm := fmt.Sprintf(`apiVersion: spire.spiffe.io/v1alpha1
kind: ControllerManagerConfig
metrics:
  bindAddress: "0"
health:
  healthProbeBindAddress: "127.0.0.1:%d"
leaderElection:
  leaderElect: false
clusterName: %s
clusterDomain: cluster.local
trustDomain: %s
spireServerSocketPath: %s
ignoreNamespaces: [kube-system, kube-public, spire]
`, health, s.Opts.Cluster, s.Opts.TrustDomain, s.Socket)
	scmf := filepath.Join(s.Dir, "controller-manager.yaml")
	if err := os.WriteFile(scmf, []byte(scm), 0o600); err != nil {
		return err
	}
	s.cm, err = startLogged(filepath.Join(s.Dir, "spire-controller-manager.log"), []string{"ENABLE_WEBHOOKS=false", "KUBECONFIG=" + s.Kube.Kubeconfig},
		s.tools.SPIREControllerManager, "-config", scmf)
	return err
}

// Stop ends the Controller Manager, then the server (SIGTERM, SIGKILL after 10 s), releases
// their ports and removes Dir when StartSPIREServerContext made it. The agents are stopped by
// their own Stop.
func (s *SPIREServer) Stop() {
	s.cm.stop(10 * time.Second)
	s.server.stop(10 * time.Second)
	s.cm, s.server = nil, nil
	for _, r := range s.releases {
		r()
	}
	s.releases = nil
	if s.removeDir {
		_ = os.RemoveAll(s.Dir)
	}
}

// healthChecks is the health_checks block of a SPIRE server or agent configuration: /live and
// /ready on 127.0.0.1:port.
func healthChecks(port int) string {
	return fmt.Sprintf("health_checks {\n  listener_enabled = true\n  bind_address = \"127.0.0.1\"\n  bind_port = \"%d\"\n  live_path = \"/live\"\n  ready_path = \"/ready\"\n}\n", port)
}

// waitHealthy runs `<bin> healthcheck -socketPath socket` until it succeeds (up to 60 s), p
// exits or ctx ends.
func waitHealthy(ctx context.Context, p *process, what, bin, socket string) error {
	_, err := Poll(ctx, 60*time.Second, what+" healthy", func() error {
		select {
		case <-p.done:
			return errors.New("exited")
		default:
		}
		out, err := exec.CommandContext(ctx, bin, "healthcheck", "-socketPath", socket).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	return err
}

// ServerID is the SPIFFE ID of the server (and of its federation bundle endpoint).
func (s *SPIREServer) ServerID() string {
	return "spiffe://" + s.Opts.TrustDomain + "/spire/server"
}

// AgentID is the SPIFFE ID k8s_psat gives the SPIRE agent of the node with uid (the parent ID
// the Controller Manager gives the node's pods' entries).
func (s *SPIREServer) AgentID(nodeUID string) string {
	return "spiffe://" + s.Opts.TrustDomain + "/spire/agent/k8s_psat/" + s.Opts.Cluster + "/" + nodeUID
}

// Bundle returns the server's bundle of trustDomain ("" for its own; another for a federated
// one it holds) in format "pem" or "spiffe" (the SPIFFE bundle JSON a
// ClusterFederatedTrustDomain's trustDomainBundle takes).
func (s *SPIREServer) Bundle(ctx context.Context, trustDomain, format string) ([]byte, error) {
	args := []string{"bundle", "show", "-socketPath", s.Socket, "-format", format}
	if trustDomain != "" {
		args = []string{"bundle", "list", "-socketPath", s.Socket, "-format", format, "-id", "spiffe://" + trustDomain}
	}
	out, err := exec.CommandContext(ctx, s.tools.SPIREServer, args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("spire-server %s: %w: %s", strings.Join(args[:2], " "), err, out)
	}
	return out, nil
}

// Entries returns `spire-server entry show` for spiffeID ("" for every entry).
func (s *SPIREServer) Entries(spiffeID string) (string, error) {
	args := []string{"entry", "show", "-socketPath", s.Socket}
	if spiffeID != "" {
		args = append(args, "-spiffeID", spiffeID)
	}
	out, err := exec.Command(s.tools.SPIREServer, args...).CombinedOutput()
	return string(out), err
}

// Create creates the cluster-scoped SPIRE Controller Manager resource of kind (ClusterSPIFFEID,
// ClusterStaticEntry, ClusterFederatedTrustDomain) named name with spec, trying again while its
// CRD is not served yet (up to 30 s). An error fails the test.
func (s *SPIREServer) Create(t testing.TB, kind, name string, spec map[string]any) {
	t.Helper()
	if err := s.CreateContext(context.Background(), kind, name, spec); err != nil {
		t.Fatal(err)
	}
}

// CreateContext is Create for code without a test: it returns the last error after 30 s, or
// when ctx ends.
func (s *SPIREServer) CreateContext(ctx context.Context, kind, name string, spec map[string]any) error {
	dyn, err := dynamic.NewForConfig(s.Kube.Config)
	if err != nil {
		return fmt.Errorf("create %s %s: %w", kind, name, err)
	}
	plural := strings.ToLower(kind) + "s"
	if base, ok := strings.CutSuffix(strings.ToLower(kind), "y"); ok {
		plural = base + "ies"
	}
	gvr := schema.GroupVersionResource{Group: "spire.spiffe.io", Version: "v1alpha1", Resource: plural}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "spire.spiffe.io/v1alpha1", "kind": kind, "metadata": map[string]any{"name": name}, "spec": spec}}
	_, err = Poll(ctx, 30*time.Second, "create "+kind+" "+name, func() error {
		_, err := dyn.Resource(gvr).Create(ctx, obj, metav1.CreateOptions{})
		return err
	})
	return err
}

// MeshSPIFFEIDTemplate is the ClusterSPIFFEID template of the IDs aether gives pods:
// spiffe://<trust domain>/ns/<namespace>/sa/<service account>.
const MeshSPIFFEIDTemplate = "spiffe://{{ .TrustDomain }}/ns/{{ .PodMeta.Namespace }}/sa/{{ .PodSpec.ServiceAccountName }}"

// SPIREAgentOptions configure StartAgentContext.
type SPIREAgentOptions struct {
	// AuthorizedDelegates are the SPIFFE IDs the admin socket's Delegated Identity API serves.
	AuthorizedDelegates []string
	// Dir holds the agent's configuration, token, data, log and sockets (public/agent.sock,
	// admin/admin.sock); "" is <server Dir>/agent-<node>.
	Dir string
	// ServerAddress is the server as the agent reaches it, host:port (default 127.0.0.1:Port).
	ServerAddress string
	// Wrap, when set, returns the command line that runs the agent's argv elsewhere (in a
	// node's namespaces, say). The wrapper must exec argv, so that the process it starts is the
	// agent.
	Wrap func(argv []string) []string
	// PlaceholderCommand, when set, is the command of the agent's placeholder Pod (which its
	// token is bound to), run on the host network: for a cluster whose kubelet runs every pod of
	// its node. Unset, the Pod has no command (an API server without kubelets).
	PlaceholderCommand []string
}

// SPIREAgent is a real spire-agent on one node, attested by k8s_psat as the Pod spire/spire-agent-
// <node> (created with the Node when absent) with a projected service account token.
type SPIREAgent struct {
	Node   *corev1.Node
	Dir    string
	Socket string // the Workload API socket
	Admin  string // the admin socket (Delegated Identity API)
	ID     string // the agent's SPIFFE ID
	conf   string
	log    string
	wrap   func([]string) []string
	proc   *process
	tools  Tools
}

// StartAgent starts a spire-agent for node (the Node is created when it does not exist) whose
// admin socket admits the authorized delegates, with the unix workload attestor, and waits until
// it is attested and healthy. It stops when the test ends.
func (s *SPIREServer) StartAgent(t testing.TB, node string, authorizedDelegates ...string) *SPIREAgent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, err := s.StartAgentContext(ctx, node, SPIREAgentOptions{AuthorizedDelegates: authorizedDelegates})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(a.log)
			t.Logf("spire-agent %s (tail):\n%s", node, Tail(string(b), 6000))
		}
	})
	return a
}

// StartAgentContext is StartAgent for code without a test: it creates the Node when it does not
// exist, namespace spire, ServiceAccount spire/spire-agent and the agent's placeholder Pod, writes
// a token bound to that Pod and the agent's configuration, starts the agent and waits until it is
// attested and healthy (StartContext). Stop ends it.
func (s *SPIREServer) StartAgentContext(ctx context.Context, node string, opts SPIREAgentOptions) (_ *SPIREAgent, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("start SPIRE agent on %s: %w", node, err)
		}
	}()
	cs, err := kubernetes.NewForConfig(s.Kube.Config)
	if err != nil {
		return nil, err
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		if n, err = cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "spire"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	if _, err := cs.CoreV1().ServiceAccounts("spire").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "spire-agent"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	ctr := corev1.Container{Name: "spire-agent", Image: "spire-agent", Command: opts.PlaceholderCommand}
	pod, err := cs.CoreV1().Pods("spire").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "spire-agent-" + node},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "spire-agent", HostNetwork: len(opts.PlaceholderCommand) > 0,
			Containers: []corev1.Container{ctr}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	exp := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts("spire").CreateToken(ctx, "spire-agent", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences: []string{"spire-server"}, ExpirationSeconds: &exp,
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	dir := opts.Dir
	if dir == "" {
		dir = filepath.Join(s.Dir, "agent-"+node)
	}
	for _, d := range []string{"data", "public", "admin"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte(tr.Status.Token), 0o600); err != nil {
		return nil, err
	}
	a := &SPIREAgent{Node: n, Dir: dir, Socket: filepath.Join(dir, "public", "agent.sock"), Admin: filepath.Join(dir, "admin", "admin.sock"),
		ID: s.AgentID(string(n.UID)), log: filepath.Join(dir, "spire-agent.log"), wrap: opts.Wrap, tools: s.tools}
	quoted := make([]string, len(opts.AuthorizedDelegates))
	for i, d := range opts.AuthorizedDelegates {
		quoted[i] = strconv.Quote(d)
	}
	health, err := s.reservePort()
	if err != nil {
		return nil, err
	}
	syncInterval := ""
	if s.Opts.AgentSyncInterval > 0 {
		syncInterval = fmt.Sprintf("\n  experimental {\n    sync_interval = %q\n  }", s.Opts.AgentSyncInterval.String())
	}
	serverHost, serverPort := "127.0.0.1", strconv.Itoa(s.Port)
	if opts.ServerAddress != "" {
		if serverHost, serverPort, err = net.SplitHostPort(opts.ServerAddress); err != nil {
			return nil, fmt.Errorf("ServerAddress %q: %w", opts.ServerAddress, err)
		}
	}
	conf := fmt.Sprintf(`agent {
  data_dir = %q
  log_level = "DEBUG"
  server_address = %q
  server_port = "%s"
  socket_path = %q
  admin_socket_path = %q
  trust_bundle_path = %q
  trust_domain = %q
  authorized_delegates = [%s]%s
}
plugins {
  NodeAttestor "k8s_psat" {
    plugin_data {
      cluster = %q
      token_path = %q
    }
  }
  KeyManager "memory" {
    plugin_data {}
  }
  WorkloadAttestor "unix" {
    plugin_data {}
  }
}
`+healthChecks(health), filepath.Join(dir, "data"), serverHost, serverPort, a.Socket, a.Admin, s.BundlePath, s.Opts.TrustDomain,
		strings.Join(quoted, ", "), syncInterval, s.Opts.Cluster, token)
	a.conf = filepath.Join(dir, "agent.conf")
	if err := os.WriteFile(a.conf, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	return a, a.StartContext(ctx)
}

// Start starts the agent (again, after Stop, with its data and so its SVID kept) and waits until
// it is healthy. An error fails the test.
func (a *SPIREAgent) Start(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := a.StartContext(ctx); err != nil {
		t.Fatal(err)
	}
}

// StartContext is Start for code without a test: it waits up to 60 s (or until ctx ends) for
// the agent to be healthy, and stops it when it is not.
func (a *SPIREAgent) StartContext(ctx context.Context) error {
	argv := []string{a.tools.SPIREAgent, "run", "-config", a.conf}
	if a.wrap != nil {
		argv = a.wrap(argv)
	}
	p, err := startLogged(a.log, nil, argv[0], argv[1:]...)
	if err != nil {
		return fmt.Errorf("start spire-agent on %s: %w", a.Node.Name, err)
	}
	a.proc = p
	if err := waitHealthy(ctx, p, "spire-agent on "+a.Node.Name, a.tools.SPIREAgent, a.Socket); err != nil {
		a.Stop()
		return fmt.Errorf("%w (log %s)", err, a.log)
	}
	return nil
}

// FetchX509 returns what `spire-agent api fetch x509` prints for the calling process (this one,
// attested by the unix workload attestor) on the agent's Workload API: the SPIFFE IDs of its
// SVIDs among it.
func (a *SPIREAgent) FetchX509(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, a.tools.SPIREAgent, "api", "fetch", "x509", "-socketPath", a.Socket).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("spire-agent api fetch x509 on %s: %w: %s", a.Node.Name, err, out)
	}
	return string(out), nil
}

// Stop terminates the agent (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (a *SPIREAgent) Stop() {
	a.proc.stop(10 * time.Second)
	a.proc = nil
}

// Terminate sends cmd SIGTERM and waits for done (closed when cmd has exited), then kills it
// and waits again when grace passes first.
func Terminate(cmd *exec.Cmd, done <-chan struct{}, grace time.Duration) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
	}
}

// StartLogged starts bin with args (and env added to the test's) through StartCmd, its output
// appended to logPath, and kills it when the test ends.
func StartLogged(t testing.TB, logPath string, env []string, bin string, args ...string) {
	t.Helper()
	p, err := startLogged(logPath, env, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
}

// startLogged starts bin with args (env added to this process's) through StartCmd, its output
// appended to logPath.
func startLogged(logPath string, env []string, bin string, args ...string) (*process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	if err := StartCmd(cmd); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}
