//go:build linux

package substrate

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aethermesh/aether/images"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/registry"
	"github.com/miekg/dns"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
)

// Options configure Start. The zero value is two clusters ("alpha" 10.244.0.0/16, "beta"
// 10.245.0.0/16) of two nodes each.
type Options struct {
	// Clusters are the clusters to run (default DefaultClusters("10.244.0.0/16", "10.245.0.0/16")).
	Clusters []ClusterSpec
	// ClusterDomain is kube-dns's domain (default cluster.local).
	ClusterDomain string
	// BaseDir is where the run directory <BaseDir>/aesub-<random> is made (default os.TempDir()).
	BaseDir string
	// KeepDir keeps the run directory (logs, certificates) after Stop; everything else still goes.
	KeepDir bool
	// Hooks start aether's processes (agent, Envoy, registrar); nil members do nothing.
	Hooks Hooks
	// CNIPlugins are appended to every node's conflist after bridge (aether-cni's entry).
	CNIPlugins []json.RawMessage
	// CNIBinaries are extra plugin binaries linked into every node's /opt/cni/bin (aether-cni).
	CNIBinaries []string
	// StaticDNS are extra A records every cluster's stub kube-dns answers: lower-case, fully
	// qualified names inside the cluster domain ("registry.cluster.local."); names outside it
	// are never answered.
	StaticDNS map[string][]netip.Addr
	// Logger receives the substrate's log (default: discard).
	Logger *slog.Logger
	// RealNodes runs every node as a real Kubernetes node: containerd with runc, a kubelet and
	// kube-proxy per node, kube-controller-manager, kube-scheduler and CoreDNS (as kube-dns) per
	// cluster, images from the substrate's registry (PushImage). Off, nodes are the fast
	// kubelet stand-in's: pods are processes, images are ignored.
	RealNodes bool
}

// Hooks start the per-cluster and per-node processes of aether. Each runs once, in order: all
// Cluster hooks (after the cluster's API server, Node objects, stub DNS and network are up), then
// all Node hooks (after the node's files exist and before its kubelet stand-in starts, so the
// first pod's CNI ADD already finds the agent). Processes started with Cluster.Start and
// Node.Start are stopped at teardown, before the namespaces go.
type Hooks struct {
	Cluster func(ctx context.Context, c *Cluster) error
	Node    func(ctx context.Context, n *Node) error
}

// Substrate is a running local multi-cluster environment.
type Substrate struct {
	// Dir is the run directory (<BaseDir>/aesub-<random>): logs, certificates, node roots, pods.
	Dir  string
	Plan *Plan
	// CA is the shared development CA of both clusters' agents (one trust domain); CACertFile
	// and CAKeyFile hold it as PEM.
	CA                    *testenv.CA
	CACertFile, CAKeyFile string
	// RegistryEndpoint is the shared registry etcd's client URL on the root namespace's
	// loopback (for processes started by Cluster hooks and for tests): https://, its serving
	// certificate signed by the CA in RegistryCAFile (a CA of its own, not the mesh's), valid
	// for 127.0.0.1 and every cluster's gateway, where the nodes reach it.
	RegistryEndpoint string
	RegistryCAFile   string
	// The registry etcd requires a client certificate signed by its CA (--client-cert-auth);
	// with etcd authentication on it takes the user from the certificate's CN.
	// RegistryRootCertFile and RegistryRootKeyFile are CN root's, for setting up
	// authentication (`aether-registrar setup-registry-auth`) and for operators; each cluster
	// has its own user's (Cluster.RegistryCertFile). The substrate leaves authentication off:
	// turning it on is aether's deployment's job, as on a user's etcd.
	RegistryRootCertFile, RegistryRootKeyFile string
	Clusters                                  []*Cluster
	// Underlay is the router namespace between the clusters' node segments.
	Underlay *testenv.Netns
	// StartupTime is how long Start took.
	StartupTime time.Duration

	opts     Options
	log      *slog.Logger
	netnsDir string
	procs    *procTable
	cancel   context.CancelFunc
	bg       sync.WaitGroup
	fwd      *testenv.Forwarder
	egress   *egressProxy
	images   *images.Registry
	stopOnce sync.Once
	mounted  bool
	// mntnsMounted: <Dir>/mntns is bound (private) for the real nodes' mount namespace files.
	mntnsMounted bool
	failed       bool
}

// Cluster is one cluster of the substrate.
type Cluster struct {
	Name string
	Plan ClusterPlan
	// API is the cluster's kube-apiserver (and its own etcd) on the root namespace's loopback.
	API *testenv.KubeAPIServer
	// Kubeconfig (admin) and Config reach the API server from the root namespace.
	Kubeconfig string
	Config     *rest.Config
	Client     kubernetes.Interface
	// NodeKubeconfig is the admin kubeconfig for processes in node namespaces: server
	// https://<gateway>:6443 (forwarded to the API server), TLS server name "localhost".
	NodeKubeconfig string
	// NodeRegistryEndpoint is the registry etcd as node processes reach it (https://<gateway>:2379);
	// RegistryCAFile holds the CA that signed its certificate (Substrate.RegistryCAFile).
	NodeRegistryEndpoint string
	RegistryCAFile       string
	// RegistryCertFile and RegistryKeyFile are this cluster's registry client certificate: CN
	// registry.UserName of (default region, this cluster), its etcd user once authentication is
	// on.
	RegistryCertFile, RegistryKeyFile string
	Nodes                             []*Node

	s       *Substrate
	stopAPI func()
	dns     []*dns.Server
	svcLst  listersv1.ServiceLister
	podLst  listersv1.PodLister
}

// Node is one node: a network namespace on the underlay and a root directory of node files that
// node processes see at their real paths.
type Node struct {
	Name    string
	Plan    NodePlan
	Cluster *Cluster
	// Netns is the node's network namespace (host network of its pods and processes).
	Netns *testenv.Netns
	// Root holds the node's files: <Root>/etc/cni/net.d, /opt/cni/bin, /run/flannel/subnet.env,
	// /run/aether, /run/spire, /var/lib/cni, /var/lib/aether, /dev/shm, /etc/resolv.conf. Node processes, CNI plugins
	// and hostNetwork pods see them at their real paths (see Binds).
	Root string

	kubelet *kubelet
	real    *realNode
}

// nodeDirs are the node directories bound at their real paths in every node process. /dev/shm is
// among them because every Envoy keeps its hot-restart shared memory there under a name derived
// from --base-id: per-node directories let each node's Envoy use the default base ID, as on real
// nodes, and leave nothing in the machine's /dev/shm. /run/spire holds a node's SPIRE agent
// (its sockets, the admin socket the aether agent asks), as a SPIRE agent DaemonSet's hostPath
// does.
var nodeDirs = []string{"/etc/cni/net.d", "/opt/cni/bin", "/run/flannel", "/run/aether", "/run/spire", "/var/lib/cni", "/var/lib/aether", "/dev/shm"}

// Binds returns the [host path, path in the node] pairs mounted in every node process's own mount
// namespace: the node directories and the node's resolv.conf.
func (n *Node) Binds() [][2]string {
	var out [][2]string
	for _, d := range nodeDirs {
		out = append(out, [2]string{n.hostPath(d), d})
	}
	return append(out, [2]string{n.hostPath("/etc/resolv.conf"), "/etc/resolv.conf"})
}

func (n *Node) hostPath(p string) string { return filepath.Join(n.Root, p) }

// Substrate returns the substrate the cluster is part of (for hooks, which run before Start
// returns it).
func (c *Cluster) Substrate() *Substrate { return c.s }

// HostPath is where a node path under one of the node's own directories (nodeDirs: /run/aether,
// /var/lib/aether, ...) is seen from the root mount namespace, e.g. a node agent's
// /var/run/aether/envoy-admin.sock.
func (n *Node) HostPath(p string) string {
	if rest, ok := strings.CutPrefix(p, "/var/run/"); ok {
		p = "/run/" + rest
	}
	return n.hostPath(p)
}

// Start runs argv as a node process: in the node's network namespace with the node's files at
// their real paths, logging to <Dir>/logs/<node>/<name>.log; env nil means the substrate's
// environment. It is stopped at teardown.
func (n *Node) Start(name string, argv, env []string) (*Process, error) {
	s := n.Cluster.s
	return s.procs.start("node/"+n.Name+"/"+name, nsWrap(n.Netns.Path, n.Binds(), "", argv), env,
		filepath.Join(s.Dir, "logs", n.Name, name+".log"))
}

// Exec runs argv to completion like Start would and returns its stdout; a failure returns an
// error holding stderr.
func (n *Node) Exec(ctx context.Context, argv ...string) ([]byte, error) {
	return runWrapped(ctx, n.Wrap(argv))
}

// Wrap returns the command line that runs argv as a node process, as Exec does: in the node's
// network namespace with the node's files at their real paths. The wrapper execs argv, so the
// process it starts ends up being argv's own.
func (n *Node) Wrap(argv []string) []string {
	if n.real != nil {
		return n.nsenter(argv)
	}
	return nsWrap(n.Netns.Path, n.Binds(), "", argv)
}

// Start runs argv as a cluster process in the root namespaces (it reaches the API server at
// Config.Host and the registry at RegistryEndpoint), logging to <Dir>/logs/<cluster>/<name>.log.
// It is stopped at teardown.
func (c *Cluster) Start(name string, argv, env []string) (*Process, error) {
	return c.s.procs.start("cluster/"+c.Name+"/"+name, argv, env, filepath.Join(c.s.Dir, "logs", c.Name, name+".log"))
}

// Node returns the node named name.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Sandbox returns the sandbox of a pod running in the cluster.
func (c *Cluster) Sandbox(ns, name string) (*PodSandbox, *Node, bool) {
	for _, n := range c.Nodes {
		if n.kubelet == nil {
			continue
		}
		if sb, ok := n.kubelet.sandbox(ns, name); ok {
			return sb, n, true
		}
	}
	return nil, nil, false
}

// ExecInPod runs argv inside a running pod's namespaces (like kubectl exec: its network
// namespace, its resolv.conf and hosts, its hostname) and returns stdout; a failure returns an
// error holding stderr.
func (c *Cluster) ExecInPod(ctx context.Context, ns, name string, argv ...string) ([]byte, error) {
	if c.s.opts.RealNodes {
		return c.execInPodAPI(ctx, ns, name, "", argv)
	}
	sb, _, ok := c.Sandbox(ns, name)
	if !ok {
		return nil, fmt.Errorf("exec in pod %s/%s of %s: no such running pod", ns, name, c.Name)
	}
	return c.s.execIn(ctx, sb, argv)
}

// ExecInContainer runs argv in container of a pod on real nodes (Options.RealNodes) through the
// API server's pods/exec, as kubectl exec -c does, and returns stdout; a failure returns an error
// holding stderr. The kubelet stand-in has no containers: an error there.
func (c *Cluster) ExecInContainer(ctx context.Context, ns, name, container string, argv ...string) ([]byte, error) {
	if !c.s.opts.RealNodes {
		return nil, fmt.Errorf("exec in container %s of pod %s/%s of %s: the kubelet stand-in has no containers (Options.RealNodes is off)", container, ns, name, c.Name)
	}
	return c.execInPodAPI(ctx, ns, name, container, argv)
}

func (s *Substrate) execIn(ctx context.Context, sb *PodSandbox, argv []string) ([]byte, error) {
	var netnsPath string
	binds := [][2]string{{filepath.Join(sb.Dir, "resolv.conf"), "/etc/resolv.conf"}, {filepath.Join(sb.Dir, "hosts"), "/etc/hosts"}}
	if sb.Netns != nil {
		netnsPath = sb.Netns.Path
	} else {
		for _, c := range s.Clusters {
			if _, n, ok := c.Sandbox(sb.Namespace, sb.Name); ok {
				netnsPath = n.Netns.Path
				binds = append(n.Binds(), binds...)
			}
		}
	}
	return runWrapped(ctx, nsWrap(netnsPath, binds, sb.Name, argv))
}

func runWrapped(ctx context.Context, argv []string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("run %s: %w: %s", argv[len(argv)-1], err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Cluster returns the cluster named name, or nil.
func (s *Substrate) Cluster(name string) *Cluster {
	for _, c := range s.Clusters {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Start brings the substrate up and returns when every cluster's API server answers, every node
// is wired and every kubelet stand-in watches its pods. It needs root and the cached tools
// (hack/tools.sh). On error it tears down what it made. Stop it with Stop.
func Start(ctx context.Context, opts Options) (_ *Substrate, err error) {
	t0 := time.Now()
	if opts.Clusters == nil {
		opts.Clusters = DefaultClusters("10.244.0.0/16", "10.245.0.0/16")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	plan, err := NewPlan(opts.Clusters, opts.ClusterDomain)
	if err != nil {
		return nil, err
	}
	tl, err := testenv.FindTools()
	if err != nil {
		return nil, err
	}
	for _, p := range []string{tl.Etcd, tl.KubeAPIServer, filepath.Join(tl.CNIBinDir, "bridge"), filepath.Join(tl.CNIBinDir, "host-local")} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("start substrate: %s is missing; install it with: %s", p, testenv.InstallHint)
		}
	}
	if opts.RealNodes {
		for _, p := range realNodeTools(tl) {
			if _, err := os.Stat(p); err != nil {
				return nil, fmt.Errorf("start substrate: %s is missing; install it with: %s", p, testenv.InstallHint)
			}
		}
	}
	if opts.BaseDir == "" {
		opts.BaseDir = os.TempDir()
	}
	dir, err := os.MkdirTemp(opts.BaseDir, Prefix)
	if err != nil {
		return nil, fmt.Errorf("start substrate: %w", err)
	}
	s := &Substrate{Dir: dir, Plan: plan, opts: opts, log: opts.Logger, netnsDir: filepath.Join(dir, "netns"), fwd: &testenv.Forwarder{}}
	defer func() {
		if err != nil {
			// Keep the logs of a failed start; Clean removes the directory later.
			s.failed = true
			s.Stop()
			err = fmt.Errorf("%w (logs kept in %s; make e2e-clean removes them)", err, dir)
		}
	}()
	if st, err := procStartTime(os.Getpid()); err == nil {
		_ = os.WriteFile(filepath.Join(dir, "owner.pid"), fmt.Appendf(nil, "%d %d\n", os.Getpid(), st), 0o644)
	}
	if err := sharedMount(s.netnsDir); err != nil {
		return s, err
	}
	s.mounted = true
	if s.procs, err = newProcTable(filepath.Join(dir, "pids")); err != nil {
		return s, err
	}
	if s.CA, err = testenv.NewCA("aether-substrate-dev-ca"); err != nil {
		return s, err
	}
	s.CACertFile, s.CAKeyFile = filepath.Join(dir, "ca", "ca.crt"), filepath.Join(dir, "ca", "ca.key")
	if err := writeFiles(map[string][]byte{s.CACertFile: s.CA.CertPEM, s.CAKeyFile: s.CA.KeyPEM}); err != nil {
		return s, err
	}
	for _, cp := range plan.Clusters {
		s.Clusters = append(s.Clusters, &Cluster{Name: cp.Name, Plan: cp, s: s})
	}

	var egressConfig string
	if opts.RealNodes {
		if egressConfig, err = s.startEgressProxy(); err != nil {
			return s, err
		}
		if err := s.startImageRegistry(); err != nil {
			return s, err
		}
	}

	// The API servers, the registry and the network come up in parallel.
	g, gctx := errgroup.WithContext(ctx)
	for _, c := range s.Clusters {
		g.Go(func() error {
			d := filepath.Join(dir, c.Name, "apiserver")
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
			apiOpts := testenv.KubeAPIServerOptions{Dir: d, ServiceCIDR: c.Plan.ServiceCIDR.String()}
			if opts.RealNodes {
				// Pods reach the API server through the kubernetes Service (its first address)
				// and the forwarder on their cluster's gateway.
				apiOpts.ExtraArgs = realAPIServerArgs(egressConfig)
				apiOpts.KubeletClient = true
				apiOpts.AuthorizationModes = []string{"Node", "RBAC"}
				apiOpts.ExtraIPs = []net.IP{c.Plan.Gateway.AsSlice(), c.Plan.ServiceCIDR.Addr().Next().AsSlice()}
				apiOpts.ExtraNames = []string{"kubernetes.default", "kubernetes.default.svc." + plan.ClusterDomain}
			}
			api, stop, err := startAPIServerPinned(gctx, apiOpts)
			if err != nil {
				return fmt.Errorf("start API server of %s: %w", c.Name, err)
			}
			c.API, c.stopAPI, c.Config, c.Kubeconfig = api, stop, api.Config, api.Kubeconfig
			return nil
		})
	}
	g.Go(func() error { return s.startRegistry(gctx, tl.Etcd) })
	g.Go(func() error { return s.buildNetwork() })
	if err := g.Wait(); err != nil {
		return s, err
	}

	bgctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	g, gctx = errgroup.WithContext(ctx)
	for _, c := range s.Clusters {
		g.Go(func() error { return s.setupCluster(gctx, bgctx, c, tl.CNIBinDir) })
	}
	if err := g.Wait(); err != nil {
		return s, err
	}
	for _, c := range s.Clusters {
		if opts.Hooks.Cluster != nil {
			if err := opts.Hooks.Cluster(ctx, c); err != nil {
				return s, fmt.Errorf("run cluster hook of %s: %w", c.Name, err)
			}
		}
	}
	for _, c := range s.Clusters {
		for _, n := range c.Nodes {
			if opts.Hooks.Node != nil {
				if err := opts.Hooks.Node(ctx, n); err != nil {
					return s, fmt.Errorf("run node hook of %s: %w", n.Name, err)
				}
			}
		}
	}
	if opts.RealNodes {
		if err := s.startRealNodes(ctx, tl); err != nil {
			return s, err
		}
	} else {
		for _, c := range s.Clusters {
			for _, n := range c.Nodes {
				n.kubelet = newKubelet(n, c.Client, s.log)
				s.bg.Go(func() { n.kubelet.run(bgctx) })
			}
		}
	}
	s.StartupTime = time.Since(t0)
	s.log.Info("substrate up", "dir", dir, "startup", s.StartupTime)
	return s, nil
}

func writeFiles(files map[string][]byte) error {
	for p, b := range files {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// startAPIServerPinned starts a kube-apiserver and its etcd (testenv.StartKubeAPIServer) from a
// goroutine locked to its own OS thread that lives until stop is called: both processes get
// Pdeathsig from that thread (see pinnedThread). stop stops both and ends the thread.
func startAPIServerPinned(ctx context.Context, opts testenv.KubeAPIServerOptions) (*testenv.KubeAPIServer, func(), error) {
	type result struct {
		api *testenv.KubeAPIServer
		err error
	}
	res := make(chan result, 1)
	stopc, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		runtime.LockOSThread()
		api, err := testenv.StartKubeAPIServer(ctx, opts)
		res <- result{api, err}
		if err != nil {
			return
		}
		<-stopc
		api.Stop()
		close(stopped)
	}()
	r := <-res
	if r.err != nil {
		return nil, nil, r.err
	}
	var once sync.Once
	return r.api, func() { once.Do(func() { close(stopc); <-stopped }) }, nil
}

// startRegistry starts the shared registry etcd: the cached etcd binary (the same one the API
// servers use) as its own process on free loopback ports.
func (s *Substrate) startRegistry(ctx context.Context, etcdBin string) error {
	var ports [2]int
	for i := range ports {
		// Held for the process's life: the registry lives as long as the substrate.
		p, _, err := testenv.ReservePort()
		if err != nil {
			return fmt.Errorf("start registry etcd: %w", err)
		}
		ports[i] = p
	}
	ca, err := testenv.NewCA("aether-substrate-registry-ca")
	if err != nil {
		return fmt.Errorf("start registry etcd: %w", err)
	}
	ips := []net.IP{net.IPv4(127, 0, 0, 1)}
	for _, c := range s.Clusters {
		ips = append(ips, c.Plan.Gateway.AsSlice())
	}
	certPEM, keyPEM, err := ca.Issue("aether-registry", nil, []string{"localhost"}, ips)
	if err != nil {
		return fmt.Errorf("start registry etcd: %w", err)
	}
	tlsDir := filepath.Join(s.Dir, "registry-tls")
	s.RegistryCAFile = filepath.Join(tlsDir, "ca.crt")
	certFile, keyFile := filepath.Join(tlsDir, "server.crt"), filepath.Join(tlsDir, "server.key")
	files := map[string][]byte{s.RegistryCAFile: ca.CertPEM, certFile: certPEM, keyFile: keyPEM}
	// Client certificates: root's, and one per cluster whose CN is the cluster's etcd user
	// (registry.UserName: the agents and the registrar run in the default region).
	issueClient := func(cn string) (string, string, error) {
		c, k, err := ca.Issue(cn, nil, nil, nil)
		if err != nil {
			return "", "", err
		}
		cf, kf := filepath.Join(tlsDir, cn+".crt"), filepath.Join(tlsDir, cn+".key")
		files[cf], files[kf] = c, k
		return cf, kf, nil
	}
	if s.RegistryRootCertFile, s.RegistryRootKeyFile, err = issueClient("root"); err != nil {
		return fmt.Errorf("start registry etcd: %w", err)
	}
	for _, c := range s.Clusters {
		if c.RegistryCertFile, c.RegistryKeyFile, err = issueClient(registry.UserName(registry.Origin{Region: registry.DefaultRegion, Cluster: c.Name})); err != nil {
			return fmt.Errorf("start registry etcd: %w", err)
		}
	}
	if err := writeFiles(files); err != nil {
		return fmt.Errorf("start registry etcd: %w", err)
	}
	s.RegistryEndpoint = fmt.Sprintf("https://127.0.0.1:%d", ports[0])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	argv := []string{etcdBin, "--name", "registry", "--data-dir", filepath.Join(s.Dir, "registry-etcd"),
		"--listen-client-urls", s.RegistryEndpoint, "--advertise-client-urls", s.RegistryEndpoint,
		"--cert-file", certFile, "--key-file", keyFile, "--client-cert-auth", "--trusted-ca-file", s.RegistryCAFile,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "registry=" + peer, "--log-level", "warn"}
	log := filepath.Join(s.Dir, "logs", "registry-etcd.log")
	p, err := s.procs.start("registry-etcd", argv, nil, log)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM)
	rootCert, err := tls.X509KeyPair(files[s.RegistryRootCertFile], files[s.RegistryRootKeyFile])
	if err != nil {
		return fmt.Errorf("start registry etcd: %w", err)
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{rootCert}}}}
	for {
		resp, err := hc.Get(s.RegistryEndpoint + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("start registry etcd: not ready (log: %s): %w", log, ctx.Err())
		case <-p.Done():
			return fmt.Errorf("start registry etcd: exited: %v (log: %s)", p.ExitErr(), log)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// buildNetwork creates the underlay namespace and every node namespace and wires them (see
// setupUnderlay, setupNode, routePeer, announceGatewayPools).
func (s *Substrate) buildNetwork() error {
	ul, err := createNetns(s.netnsDir, "underlay")
	if err != nil {
		return err
	}
	s.Underlay = ul
	if err := setupUnderlay(ul, s.Plan); err != nil {
		return err
	}
	for _, c := range s.Clusters {
		for _, np := range c.Plan.Nodes {
			ns, err := createNetns(s.netnsDir, np.Name)
			if err != nil {
				return err
			}
			n := &Node{Name: np.Name, Plan: np, Cluster: c, Netns: ns, Root: filepath.Join(s.Dir, c.Name, np.Name)}
			c.Nodes = append(c.Nodes, n)
			if err := setupNode(ul, ns, c.Plan, np); err != nil {
				return err
			}
		}
		for _, n := range c.Nodes {
			for _, peer := range c.Plan.Nodes {
				if peer.Name != n.Name {
					if err := routePeer(n.Netns, peer); err != nil {
						return err
					}
				}
			}
		}
	}
	return announceGatewayPools(ul, s.Plan)
}

// Stop tears everything down: pods (containers stopped, CNI DEL run, namespaces deleted), hook
// processes, DNS and forwarders, node and underlay namespaces, API servers and etcds, the
// namespace mount and (unless KeepDir) the run directory. It is safe to call more than once and
// after a failed Start; it logs what it could not remove and leaves that for Clean.
func (s *Substrate) Stop() {
	s.stopOnce.Do(s.stop)
}

func (s *Substrate) stop() {
	if s.cancel != nil {
		s.cancel() // kubelets tear their pods down before they return
	}
	for _, c := range s.Clusters {
		for _, srv := range c.dns {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = srv.ShutdownContext(ctx)
			cancel()
		}
	}
	if s.images != nil {
		_ = s.images.Close()
	}
	if s.egress != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = s.egress.srv.Shutdown(ctx)
		cancel()
	}
	var nwg sync.WaitGroup
	for _, c := range s.Clusters {
		for _, n := range c.Nodes {
			nwg.Go(func() {
				if err := s.stopRealNode(n); err != nil {
					s.log.Warn("stop real node", "node", n.Name, "err", err)
				}
			})
		}
	}
	nwg.Wait()
	if s.opts.RealNodes {
		if err := removeCgroup("/"+filepath.Base(s.Dir), 10*time.Second); err != nil {
			s.log.Warn("remove cgroups", "err", err)
		}
		if s.mntnsMounted {
			if err := unix.Unmount(filepath.Join(s.Dir, "mntns"), unix.MNT_DETACH); err != nil {
				s.log.Warn("unmount mntns dir", "err", err)
			}
		}
	}
	s.bg.Wait()
	if s.procs != nil {
		s.procs.stopAll("pod/", 2*time.Second)
		s.procs.stopAll("node/", 10*time.Second)
		s.procs.stopAll("cluster/", 10*time.Second)
	}
	s.fwd.Close()
	var wg sync.WaitGroup
	for _, c := range s.Clusters {
		if c.stopAPI != nil {
			wg.Go(c.stopAPI)
		}
	}
	if s.procs != nil {
		wg.Go(func() { s.procs.stopAll("", 10*time.Second) })
	}
	wg.Wait()
	if s.procs != nil {
		s.procs.thread.close()
	}
	if s.mounted {
		entries, _ := os.ReadDir(s.netnsDir)
		for _, e := range entries {
			if err := deleteNetns(filepath.Join(s.netnsDir, e.Name())); err != nil {
				s.log.Warn("delete netns", "err", err)
			}
		}
		if err := unix.Unmount(s.netnsDir, unix.MNT_DETACH); err != nil {
			s.log.Warn("unmount netns dir", "dir", s.netnsDir, "err", err)
		}
	}
	if !s.opts.KeepDir && !s.failed {
		if err := os.RemoveAll(s.Dir); err != nil {
			s.log.Warn("remove run dir", "dir", s.Dir, "err", err)
		}
	}
}

// Memory returns the resident memory of the substrate in bytes: every process it started (API
// servers, etcds, hook processes, pods: the processes it tracks, those whose command line names
// the run directory and those in one of its network namespaces) plus the calling process
// (kubelets, DNS, forwarders), and the same per process ("comm[pid]").
func (s *Substrate) Memory() (total int64, perProcess map[string]int64, err error) {
	pids, err := runProcesses(s.Dir)
	if err != nil {
		return 0, nil, err
	}
	pids = append(pids, s.procs.pids()...)
	if s.opts.RealNodes {
		// Pods, containerd's shims and the node daemons, all in the run's cgroup subtree.
		pids = append(pids, cgroupPids("/"+filepath.Base(s.Dir))...)
	}
	slices.Sort(pids)
	perProcess = map[string]int64{}
	for _, pid := range slices.Compact(append(pids, os.Getpid())) {
		rss, err := procRSS(pid)
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		name := fmt.Sprintf("%s[%d]", strings.TrimSpace(string(comm)), pid)
		perProcess[name] = rss
		total += rss
	}
	return total, perProcess, nil
}
