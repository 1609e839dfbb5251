package mesh

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/aethermesh/aether/e2e/substrate"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/registry"
)

// Binaries built by Build besides the workloads (substrate.Workloads).
var Binaries = []string{"aether-agent", "aether-cni", "aether-registrar"}

// Options configure StartMesh. The zero value gives two clusters of two nodes ("alpha"
// 10.244.0.0/16 and "beta" 10.245.0.0/16).
type Options struct {
	// IdenticalPodCIDRs gives both clusters 10.244.0.0/16 (Flannel's default).
	IdenticalPodCIDRs bool
	// BaseDir is where the substrate's run directory and the mesh's directory go ("": $TMPDIR).
	BaseDir string
	// KeepDir keeps the directories (logs) after Stop.
	KeepDir bool
	// LeaseTTL is the agents' --registry-lease-ttl (0: 5 s): how long a dead node's endpoints
	// stay in the registry.
	LeaseTTL time.Duration
	// BinDir holds prebuilt binaries (Binaries and substrate.Workloads); "" builds them into the
	// mesh's directory.
	BinDir string
	// Logger receives progress (nil: discard).
	Logger *slog.Logger
	// RealNodes runs the substrate's real nodes and installs aether as a user does: its images
	// in the substrate's registry, the Helm chart (deploy/chart/aether) in each cluster; the
	// agent and Envoy run as the DaemonSet's pods, the registrar as its Deployment.
	RealNodes bool
	// Identity is where workload identities come from ("": IdentityDevCA). With RealNodes the
	// chart installs SPIRE in each cluster (identity.mode spire) in the mode's
	// spire.clusterset.mode; on the kubelet stand-in the mesh runs SPIRE's processes itself.
	Identity Identity
}

// Mesh is a running substrate with aether on it. Stop tears everything down.
type Mesh struct {
	*substrate.Substrate
	// Dir is the mesh's own directory (binaries, CA files).
	Dir string
	// Bins are the binaries' paths by name (Binaries and substrate.Workloads).
	Bins map[string]string
	// CACert and CAKey are the development CA shared by every agent (PEM files), with
	// IdentityDevCA; empty with SPIRE.
	CACert, CAKey string
	// Identity is where the workload identities come from (Options.Identity, resolved).
	Identity Identity
	// UpstreamCACert and UpstreamCAKey are the root CA of IdentitySPIREShared, the SPIRE
	// servers' upstream authority (PEM files in Dir).
	UpstreamCACert, UpstreamCAKey string
	// SPIRE are the SPIRE servers by cluster name and SPIREAgents the SPIRE agents by node name,
	// with a SPIRE identity on the kubelet stand-in (with RealNodes SPIRE runs as the chart's
	// pods).
	SPIRE       map[string]*testenv.SPIREServer
	SPIREAgents map[string]*testenv.SPIREAgent

	opts     Options
	envoy    string
	fwd      *testenv.Forwarder // the nodes' way to the SPIRE servers
	mu       sync.Mutex
	agents   map[string]*substrate.Process // by node name
	restarts map[string]int
	// registryRootPassword is the etcd root user's password setupRegistryAuth set.
	registryRootPassword string
	keepDir              bool
}

// Build builds the aether binaries (Binaries) and the test workloads into dir with the go tool
// (CGO_ENABLED=0) from the repository root and returns their paths by name.
func Build(ctx context.Context, dir string) (map[string]string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, fmt.Errorf("build binaries: %w", err)
	}
	bins, err := substrate.BuildWorkloads(ctx, dir)
	if err != nil {
		return nil, err
	}
	args := []string{"build", "-o", dir + "/"}
	for _, b := range Binaries {
		args = append(args, "./cmd/"+b)
		bins[b] = filepath.Join(dir, b)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build binaries: %w: %s", err, out)
	}
	return bins, nil
}

// StartMesh builds (unless Options.BinDir is set) and starts the substrate with aether: MCS
// CRDs in each cluster (cluster hook), an aether-agent per node that is ready and has installed
// aether-cni into the node's conflist before the node's kubelet starts (node hook), and an
// aether-registrar per cluster. It returns once every agent and registrar runs. On error
// everything started is torn down.
func StartMesh(ctx context.Context, opts Options) (_ *Mesh, err error) {
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	switch opts.Identity {
	case "":
		opts.Identity = IdentityDevCA
	case IdentityDevCA:
	case IdentitySPIREShared, IdentitySPIREFederated:
	default:
		return nil, fmt.Errorf("start mesh: Identity %q: want %q, %q or %q", opts.Identity, IdentityDevCA, IdentitySPIREShared, IdentitySPIREFederated)
	}
	tools, err := testenv.FindTools()
	if err != nil {
		return nil, fmt.Errorf("start mesh: %w", err)
	}
	dir, err := os.MkdirTemp(opts.BaseDir, "aemesh-")
	if err != nil {
		return nil, fmt.Errorf("start mesh: %w", err)
	}
	m := &Mesh{Dir: dir, Identity: opts.Identity, opts: opts, envoy: tools.Envoy, fwd: &testenv.Forwarder{},
		agents: map[string]*substrate.Process{}, restarts: map[string]int{}, keepDir: opts.KeepDir,
		SPIRE: map[string]*testenv.SPIREServer{}, SPIREAgents: map[string]*testenv.SPIREAgent{}}
	defer func() {
		if err != nil {
			m.Stop()
		}
	}()
	if opts.BinDir != "" {
		m.Bins = map[string]string{}
		for _, b := range append(append([]string{}, Binaries...), substrate.Workloads...) {
			m.Bins[b] = filepath.Join(opts.BinDir, b)
			if _, err := os.Stat(m.Bins[b]); err != nil {
				return nil, fmt.Errorf("start mesh: BinDir: %w", err)
			}
		}
	} else {
		opts.Logger.Info("building aether binaries and workloads")
		if m.Bins, err = Build(ctx, filepath.Join(dir, "bin")); err != nil {
			return nil, fmt.Errorf("start mesh: %w", err)
		}
	}
	switch m.Identity {
	case IdentityDevCA:
		if err := m.writeDevCA(); err != nil {
			return nil, fmt.Errorf("start mesh: %w", err)
		}
	case IdentitySPIREShared:
		if err := m.writeUpstreamCA(); err != nil {
			return nil, fmt.Errorf("start mesh: %w", err)
		}
	}
	podB := "10.245.0.0/16"
	if opts.IdenticalPodCIDRs {
		podB = "10.244.0.0/16"
	}
	if opts.RealNodes {
		return m, m.startNodesMesh(ctx, podB)
	}
	opts.Logger.Info("starting the substrate with aether", "identity", m.Identity)
	s, err := substrate.Start(ctx, substrate.Options{
		Clusters: substrate.DefaultClusters("10.244.0.0/16", podB),
		BaseDir:  opts.BaseDir, KeepDir: opts.KeepDir, Logger: opts.Logger,
		Hooks: substrate.Hooks{
			Cluster: func(ctx context.Context, c *substrate.Cluster) error {
				if err := m.setupRegistryAuth(ctx, c); err != nil {
					return err
				}
				if err := testenv.CreateCRDs(ctx, c.Config, "deploy/crds"); err != nil {
					return err
				}
				if m.spire() {
					return m.startSPIREServer(ctx, c)
				}
				return nil
			},
			Node: func(ctx context.Context, n *substrate.Node) error {
				if m.spire() {
					if err := m.startSPIREAgent(ctx, n); err != nil {
						return err
					}
				}
				return m.startAgent(ctx, n)
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("start mesh: %w", err)
	}
	m.Substrate = s
	for _, c := range s.Clusters {
		if _, err := c.Start("aether-registrar", []string{m.Bins["aether-registrar"],
			"--cluster", c.Name, "--kubeconfig", c.Kubeconfig, "--registry-endpoints", s.RegistryEndpoint,
			"--registry-ca", s.RegistryCAFile, "--registry-cert", c.RegistryCertFile, "--registry-key", c.RegistryKeyFile,
			"--leader-elect=false", "--metrics-addr", "0", "--health-addr", "127.0.0.1:0"}, nil); err != nil {
			return nil, fmt.Errorf("start mesh: %w", err)
		}
	}
	return m, nil
}

// writeDevCA makes the development CA of IdentityDevCA in the mesh's directory.
func (m *Mesh) writeDevCA() error {
	ca, err := testenv.NewCA("aether-e2e-mesh-ca")
	if err != nil {
		return err
	}
	m.CACert, m.CAKey = filepath.Join(m.Dir, "ca.crt"), filepath.Join(m.Dir, "ca.key")
	if err := os.WriteFile(m.CACert, ca.CertPEM, 0o644); err != nil {
		return err
	}
	return os.WriteFile(m.CAKey, ca.KeyPEM, 0o600)
}

// agentArgs is the aether-agent command line for node n: the substrate's registry over TLS at
// the node's gateway, as its cluster's own etcd user (the client certificate's CN), as a user's
// would be (docs/security.md); the identity from the shared development CA, or from the node's
// SPIRE agent (its admin socket in the node's /run/spire, the cluster's trust domain, and with
// federation the other clusters' as the clusterset's).
func (m *Mesh) agentArgs(n *substrate.Node) []string {
	args := []string{m.Bins["aether-agent"],
		"--node-name", n.Name, "--cluster", n.Cluster.Name, "--host-ip", n.Plan.IP.String(),
		"--kubeconfig", n.Cluster.NodeKubeconfig, "--registry-endpoints", n.Cluster.NodeRegistryEndpoint,
		"--registry-ca", n.Cluster.RegistryCAFile, "--registry-cert", n.Cluster.RegistryCertFile, "--registry-key", n.Cluster.RegistryKeyFile,
		"--registry-lease-ttl", m.opts.LeaseTTL.String(), "--cluster-domain", n.Cluster.Domain(),
		"--envoy-binary", m.envoy,
		"--cni-plugin-binary", m.Bins["aether-cni"], "--east-west-waypoint", "--import-config", "--log-level", "debug"}
	if m.spire() {
		args = append(args, "--identity-source", "spire", "--spire-admin-socket", SPIREAdminSocket,
			"--trust-domain", m.TrustDomain(n.Cluster.Name))
		// With federation the other clusters' trust domains are the clusterset's: their
		// workloads are admitted as this cluster's.
		if others := m.otherTrustDomains(n.Cluster.Substrate(), n.Cluster.Name); len(others) > 0 {
			args = append(args, "--clusterset-trust-domains", strings.Join(others, ","))
		}
		return args
	}
	return append(args, "--ca-cert", m.CACert, "--ca-key", m.CAKey)
}

// setupRegistryAuth creates cluster c's etcd user and role on the registry and turns etcd
// authentication on, with `aether-registrar setup-registry-auth` as root (the substrate's root
// client certificate and a root password of this mesh), as an operator does before a cluster's
// aether writes to a shared registry (docs/registrar.md). Run again for the next cluster, it
// adds that cluster's user.
func (m *Mesh) setupRegistryAuth(ctx context.Context, c *substrate.Cluster) error {
	s := c.Substrate()
	m.mu.Lock()
	if m.registryRootPassword == "" {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			m.mu.Unlock()
			return err
		}
		m.registryRootPassword = hex.EncodeToString(b)
	}
	pw := m.registryRootPassword
	m.mu.Unlock()
	cmd := exec.CommandContext(ctx, m.Bins["aether-registrar"], "setup-registry-auth",
		"--registry-endpoints", s.RegistryEndpoint, "--registry-ca", s.RegistryCAFile,
		"--registry-cert", s.RegistryRootCertFile, "--registry-key", s.RegistryRootKeyFile,
		"--clusters", registry.DefaultRegion+"/"+c.Name)
	cmd.Env = append(os.Environ(), "AETHER_REGISTRY_ROOT_PASSWORD="+pw)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("set up registry auth for %s: %w\n%s", c.Name, err, out)
	}
	return nil
}

// startAgent starts node n's agent and waits until it has appended aether-cni to the node's
// conflist (it does so once its CNI server answers).
func (m *Mesh) startAgent(ctx context.Context, n *substrate.Node) error {
	m.mu.Lock()
	name := "aether-agent"
	if r := m.restarts[n.Name]; r > 0 {
		name += "-" + strconv.Itoa(r)
	}
	m.restarts[n.Name]++
	m.mu.Unlock()
	p, err := n.Start(name, m.agentArgs(n), nil)
	if err != nil {
		return fmt.Errorf("start agent on %s: %w", n.Name, err)
	}
	m.mu.Lock()
	m.agents[n.Name] = p
	m.mu.Unlock()
	conflist := filepath.Join(n.Root, "etc/cni/net.d/10-flannel.conflist")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if b, err := os.ReadFile(conflist); err == nil && bytes.Contains(b, []byte("aether-cni")) {
			return nil
		}
		select {
		case <-p.Done():
			return fmt.Errorf("start agent on %s: exited: %v (log %s)", n.Name, p.ExitErr(), p.Log)
		case <-ctx.Done():
			return fmt.Errorf("start agent on %s: aether-cni not in %s (log %s): %w", n.Name, conflist, p.Log, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("start agent on %s: aether-cni not in %s after 2m (log %s)", n.Name, conflist, p.Log)
		}
	}
}

// node finds a node by name in any cluster.
func (m *Mesh) node(name string) (*substrate.Node, error) {
	for _, c := range m.Clusters {
		if n := c.Node(name); n != nil {
			return n, nil
		}
	}
	return nil, fmt.Errorf("no node %q", name)
}

// AgentLog returns the path of node's current agent log.
func (m *Mesh) AgentLog(node string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.agents[node]; p != nil {
		return p.Log
	}
	return ""
}

// RestartAgent stops node's agent (SIGTERM, its Envoy keeps running) and starts a new one, which
// adopts the running Envoy and repairs the node's pods.
func (m *Mesh) RestartAgent(ctx context.Context, node string) error {
	n, err := m.node(node)
	if err != nil {
		return fmt.Errorf("restart agent: %w", err)
	}
	m.mu.Lock()
	p := m.agents[node]
	m.mu.Unlock()
	if p != nil {
		p.Stop(10 * time.Second)
	}
	return m.startAgent(ctx, n)
}

// envoyPid is the pid of node n's Envoy from the agent's pid file (0 if none).
func envoyPid(n *substrate.Node) int {
	b, err := os.ReadFile(filepath.Join(n.Root, "var/lib/aether/envoy/envoy.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// StopNode takes node out as a dead node would go: its agent and Envoy are killed (SIGKILL; the
// registry lease of its endpoints then expires), its SPIRE agent stopped, and its Node object
// is deleted. Its pods keep running but nothing reaches them through the mesh any more.
func (m *Mesh) StopNode(ctx context.Context, node string) error {
	n, err := m.node(node)
	if err != nil {
		return fmt.Errorf("stop node: %w", err)
	}
	m.mu.Lock()
	p := m.agents[node]
	delete(m.agents, node)
	m.mu.Unlock()
	if p != nil {
		p.Stop(0)
	}
	if pid := envoyPid(n); pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	m.stopSPIREAgent(node)
	if err := n.Cluster.Client.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("stop node: delete Node %s: %w", node, err)
	}
	return nil
}

// envoyAdminSocket is each node Envoy's admin API in the node's files: the agent's --envoy-admin
// default (agentArgs leaves it so), a 0600 unix socket.
const envoyAdminSocket = "/var/run/aether/envoy-admin.sock"

// EnvoyAdmin GETs path (with its query) from node's Envoy admin API over its unix socket and
// returns the body. A status other than 200 is an error holding the body.
func (m *Mesh) EnvoyAdmin(ctx context.Context, node, path string) (string, error) {
	n, err := m.node(node)
	if err != nil {
		return "", fmt.Errorf("get Envoy admin %s: %w", path, err)
	}
	sock := n.HostPath(envoyAdminSocket)
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://envoy"+path, nil)
	if err != nil {
		return "", fmt.Errorf("get %s's Envoy admin %s: %w", node, path, err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("get %s's Envoy admin %s: %w", node, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("get %s's Envoy admin %s: %w", node, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("get %s's Envoy admin %s: %s: %s", node, path, resp.Status, bytes.TrimSpace(b))
	}
	return string(b), nil
}

// cutTable is the nftables table CutRegistry adds in the underlay namespace.
const cutTable = "aemesh-registry-cut"

// CutRegistry cuts the nodes of the named clusters (every cluster when none is named) off the
// registry: nftables rules in the underlay namespace drop packets to those clusters' registry
// forwarders (their gateway address, port substrate.RegistryPort; a pod's packets leave its node
// masqueraded, so the registrar is cut too) and the forwarders' packets back, so open
// connections hang like they do when a network partitions. Cuts add up; RestoreRegistry removes them all.
func (m *Mesh) CutRegistry(clusters ...string) error {
	to, from := "", ""
	if len(clusters) > 0 {
		var gws []string
		for _, name := range clusters {
			c := m.Cluster(name)
			if c == nil {
				return fmt.Errorf("cut registry: no cluster %q", name)
			}
			gws = append(gws, c.Plan.Gateway.String())
		}
		set := "{ " + strings.Join(gws, ", ") + " } "
		to, from = "ip daddr "+set, "ip saddr "+set
	}
	// Both directions, as a partition does: dropping only the packets to the registry leaves an
	// open watch stream delivering the registry's changes to the cut-off nodes (the data
	// arrives although its acknowledgements are lost), which no partition does.
	rules := fmt.Sprintf("table inet %[1]s {\n chain input {\n  type filter hook input priority -10; policy accept;\n  %[2]stcp dport %[4]d drop\n }\n"+
		" chain output {\n  type filter hook output priority -10; policy accept;\n  %[3]stcp sport %[4]d drop\n }\n}\n",
		cutTable, to, from, substrate.RegistryPort)
	cmd := exec.Command("nsenter", "--net="+m.Underlay.Path, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("cut registry: %w: %s", err, out)
	}
	return nil
}

// RestoreRegistry undoes CutRegistry.
func (m *Mesh) RestoreRegistry() error {
	if out, err := exec.Command("nsenter", "--net="+m.Underlay.Path, "nft", "delete", "table", "inet", cutTable).CombinedOutput(); err != nil {
		return fmt.Errorf("restore registry: %w: %s", err, out)
	}
	return nil
}

// Stop tears down the SPIRE agents, the substrate (pods first, while the agents still answer CNI
// DEL), then the SPIRE servers and the Envoys the agents started (they outlive their agents by
// design), then the mesh's directory unless Options.KeepDir.
func (m *Mesh) Stop() {
	m.mu.Lock()
	var nodes []string
	for n := range m.SPIREAgents {
		nodes = append(nodes, n)
	}
	m.mu.Unlock()
	for _, n := range nodes {
		m.stopSPIREAgent(n)
	}
	var pids []int
	if m.Substrate != nil {
		for _, c := range m.Clusters {
			for _, n := range c.Nodes {
				if pid := envoyPid(n); pid > 0 {
					pids = append(pids, pid)
				}
			}
		}
		m.Substrate.Stop()
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	m.fwd.Close()
	for _, srv := range m.SPIRE {
		srv.Stop()
	}
	if !m.keepDir && m.Dir != "" {
		_ = os.RemoveAll(m.Dir)
	}
}
