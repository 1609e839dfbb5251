//go:build linux

package substrate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/aethermesh/aether/images"
	"github.com/aethermesh/aether/internal/testenv"
)

// Real nodes (Options.RealNodes): each node runs the real containerd (with runc), kubelet and
// kube-proxy, as a kind node does inside its container. A node is its network namespace (as on
// the fast substrate), a mount namespace of its own that is kept bound to a file
// (<Dir>/mntns/<node>) and a cgroup subtree /<run id>/<node> in every cgroup v1 controller.

// realNodeDirs are bound at their real paths in a real node's mount namespace, besides nodeDirs:
// what containerd, the kubelet and kube-proxy keep on a node.
var realNodeDirs = []string{
	"/etc/containerd", "/etc/kubernetes", "/var/lib/kubelet", "/var/lib/containerd", "/run/containerd",
	"/var/log/pods", "/var/log/containers", "/run/netns",
	// containerd's NRI socket (/var/run/nri/nri.sock): shared, two nodes' containerds starting
	// at once raced for it ("bind: address already in use", one of them exiting).
	"/run/nri",
	// The SPIRE agent's sockets (the chart's hostPath /run/spire, identity.mode spire): each node
	// its own agent's.
	"/run/spire",
}

// SandboxImage is the pause image every real node's containerd runs as the pod sandbox
// (containerd's pinned_images.sandbox), served by the substrate's image registry.
const SandboxImage = images.PauseImage

// cgroupBase is where cgroup v1 controllers are mounted. The cgroup2 hierarchy of a hybrid
// layout (cgroupUnified) is left alone but for removing what runc made there for our pods.
const (
	cgroupBase    = "/sys/fs/cgroup"
	cgroupUnified = "unified"
)

// cgroupControllers returns the mounted cgroup v1 hierarchies under /sys/fs/cgroup (cpu, memory,
// pids, the named systemd hierarchy, ...), by directory name.
func cgroupControllers() ([]string, error) {
	ents, err := os.ReadDir(cgroupBase)
	if err != nil {
		return nil, fmt.Errorf("list cgroup controllers: %w", err)
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() || e.Name() == cgroupUnified {
			continue
		}
		if _, err := os.Stat(filepath.Join(cgroupBase, e.Name(), "cgroup.procs")); err == nil {
			out = append(out, e.Name())
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("list cgroup controllers: no cgroup v1 hierarchy under %s (real nodes need the v1 or hybrid layout the kubelet is configured for)", cgroupBase)
	}
	return out, nil
}

// makeCgroup creates rel ("/aesub-x/alpha-node1") in every v1 controller. A new cpuset group
// starts with no CPUs or memory nodes: each level gets its parent's, as the kubelet expects of
// its cgroupRoot.
func makeCgroup(rel string) error {
	ctrls, err := cgroupControllers()
	if err != nil {
		return err
	}
	parts := strings.Split(strings.Trim(rel, "/"), "/")
	for _, c := range ctrls {
		dir := filepath.Join(cgroupBase, c)
		for _, p := range parts {
			parent := dir
			dir = filepath.Join(dir, p)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("create cgroup %s: %w", dir, err)
			}
			if c != "cpuset" {
				continue
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(parent, f))
				if err != nil {
					return fmt.Errorf("create cgroup %s: %w", dir, err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					return fmt.Errorf("create cgroup %s: write %s: %w", dir, f, err)
				}
			}
		}
	}
	return nil
}

// joinCgroup moves pid into rel in every v1 controller (creating rel first).
func joinCgroup(rel string, pid int) error {
	if err := makeCgroup(rel); err != nil {
		return err
	}
	ctrls, err := cgroupControllers()
	if err != nil {
		return err
	}
	for _, c := range ctrls {
		p := filepath.Join(cgroupBase, c, rel, "cgroup.procs")
		if err := os.WriteFile(p, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("move pid %d to %s: %w", pid, p, err)
		}
	}
	return nil
}

// cgroupPids lists every process in rel and below it, in every hierarchy (v1 controllers and
// the unified one).
func cgroupPids(rel string) []int {
	seen := map[int]bool{}
	ents, _ := os.ReadDir(cgroupBase)
	for _, e := range ents {
		root := filepath.Join(cgroupBase, e.Name(), rel)
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	out := make([]int, 0, len(seen))
	for pid := range seen {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}

// removeCgroup kills every process in rel and below (containers, containerd's shims, which
// outlive containerd, and whatever else a node ran), then removes the groups, deepest first, in
// every hierarchy. It gives up after timeout and says what is left.
func removeCgroup(rel string, timeout time.Duration) error {
	if strings.Trim(rel, "/") == "" {
		return fmt.Errorf("remove cgroup: refusing the root cgroup")
	}
	deadline := time.Now().Add(timeout)
	for {
		pids := cgroupPids(rel)
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: processes %v still in it after %s", rel, pids, timeout)
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var errs []error
	ents, _ := os.ReadDir(cgroupBase)
	for _, e := range ents {
		root := filepath.Join(cgroupBase, e.Name(), rel)
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		// Deepest first: WalkDir lists parents before children.
		for i := len(dirs) - 1; i >= 0; i-- {
			var err error
			for try := 0; try < 50; try++ {
				if err = unix.Rmdir(dirs[i]); err == nil || errors.Is(err, unix.ENOENT) {
					err = nil
					break
				}
				// A group whose last task just exited can be busy for a moment.
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// privateMount bind-mounts dir onto itself with private propagation: mount namespace files can
// only be bound on a mount that does not propagate (unshare(1) --mount=<file>).
func privateMount(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return fmt.Errorf("make %s private: %w", dir, err)
	}
	return nil
}

// realNode is what Options.RealNodes adds to a Node.
type realNode struct {
	// mntns is the file the node's mount namespace is bound to.
	mntns string
	// cgroup is the node's cgroup subtree ("/aesub-x/alpha-node1"), the kubelet's cgroupRoot.
	cgroup string
}

// nsenter returns argv run in the real node's network and mount namespaces.
func (n *Node) nsenter(argv []string) []string {
	return append([]string{"nsenter", "--net=" + n.Netns.Path, "--mount=" + n.real.mntns, "--"}, argv...)
}

// realBinds are the [host path, node path] pairs of a real node's mount namespace.
func (n *Node) realBinds() [][2]string {
	out := n.Binds()
	for _, d := range realNodeDirs {
		out = append(out, [2]string{n.hostPath(d), d})
	}
	return out
}

// makeMountNamespace creates the node's mount namespace, bound to file, with the node's
// directories bound at their real paths and every mount shared within it (as systemd makes /
// rshared on a real host): the kubelet's volume mounts and containerd's pod network namespaces
// then reach containers that ask for HostToContainer propagation. The namespace is a slave of
// the root one, so nothing made in it propagates back.
func (n *Node) makeMountNamespace(ctx context.Context, file string) error {
	if f, err := os.Create(file); err != nil {
		return fmt.Errorf("mount namespace of %s: %w", n.Name, err)
	} else {
		f.Close()
	}
	if out, err := exec.CommandContext(ctx, "unshare", "--mount="+file, "--propagation", "slave", "true").CombinedOutput(); err != nil {
		return fmt.Errorf("mount namespace of %s: unshare: %w: %s", n.Name, err, out)
	}
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, b := range n.realBinds() {
		fmt.Fprintf(&script, "mount --bind %s %s\n", shQuote(b[0]), shQuote(b[1]))
	}
	script.WriteString("mount --make-rshared /\n")
	cmd := exec.CommandContext(ctx, "nsenter", "--mount="+file, "--", "sh", "-c", script.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mount namespace of %s: %w: %s", n.Name, err, out)
	}
	n.real.mntns = file
	return nil
}

// startRealNode lays out and starts one real node: its mount namespace and cgroups, then
// containerd, the kubelet and kube-proxy.
func (s *Substrate) startRealNode(ctx context.Context, n *Node, tl testenv.Tools, api *testenv.KubeAPIServer) error {
	c := n.Cluster
	n.real = &realNode{cgroup: "/" + filepath.Base(s.Dir) + "/" + n.Name}
	for _, d := range append(realNodeDirs, "/etc/kubernetes/manifests", "/etc/kubernetes/pki") {
		if err := os.MkdirAll(n.hostPath(d), 0o755); err != nil {
			return fmt.Errorf("real node %s: %w", n.Name, err)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create bind target %s: %w", d, err)
		}
	}
	gw := c.Plan.Gateway.String()
	server := "https://" + net.JoinHostPort(gw, strconv.Itoa(APIServerPort))
	files := map[string][]byte{
		n.hostPath("/etc/containerd/config.toml"):                 containerdConfig(tl.Runc),
		n.hostPath("/etc/containerd/certs.d/_default/hosts.toml"): registryHosts(net.JoinHostPort(gw, strconv.Itoa(ImageRegistryPort))),
		n.hostPath("/etc/kubernetes/kubelet.yaml"):                kubeletConfig(n, c),
		n.hostPath("/etc/kubernetes/kube-proxy.yaml"):             kubeProxyConfig(n, c),
		n.hostPath("/etc/kubernetes/pki/ca.crt"):                  api.CA.CertPEM,
	}
	for user, groups := range map[string][]string{"system:node:" + n.Name: {"system:nodes"}, "system:kube-proxy": nil} {
		certPEM, keyPEM, err := api.CA.Issue(user, groups, nil, nil)
		if err != nil {
			return err
		}
		kc := clientcmdapi.NewConfig()
		kc.Clusters[c.Name] = &clientcmdapi.Cluster{Server: server, TLSServerName: "localhost", CertificateAuthorityData: api.CA.CertPEM}
		kc.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
		kc.Contexts[c.Name] = &clientcmdapi.Context{Cluster: c.Name, AuthInfo: user}
		kc.CurrentContext = c.Name
		b, err := clientcmd.Write(*kc)
		if err != nil {
			return err
		}
		name := "kubelet.kubeconfig"
		if user == "system:kube-proxy" {
			name = "kube-proxy.kubeconfig"
		}
		files[n.hostPath("/etc/kubernetes/"+name)] = b
	}
	if err := writeFiles(files); err != nil {
		return fmt.Errorf("real node %s: %w", n.Name, err)
	}
	if err := n.makeMountNamespace(ctx, filepath.Join(s.Dir, "mntns", n.Name)); err != nil {
		return err
	}
	if err := makeCgroup(n.real.cgroup); err != nil {
		return err
	}
	env := append(os.Environ(), "PATH="+tl.ContainerdDir+":"+filepath.Dir(tl.Runc)+":"+os.Getenv("PATH"))
	start := func(name string, argv []string) error {
		p, err := n.startReal(name, argv, env)
		if err != nil {
			return err
		}
		return joinCgroup(n.real.cgroup+"/system", p.Pid())
	}
	if err := start("containerd", []string{filepath.Join(tl.ContainerdDir, "containerd"), "--config", "/etc/containerd/config.toml"}); err != nil {
		return err
	}
	sock := n.hostPath("/run/containerd/containerd.sock")
	if err := waitFor(ctx, 30*time.Second, func() bool { _, err := os.Stat(sock); return err == nil }); err != nil {
		return fmt.Errorf("real node %s: containerd did not open %s (log: %s): %w", n.Name, sock, s.logPath(n, "containerd"), err)
	}
	if err := start("kubelet", []string{filepath.Join(tl.KubernetesDir, "kubelet"),
		"--config", "/etc/kubernetes/kubelet.yaml", "--kubeconfig", "/etc/kubernetes/kubelet.kubeconfig",
		"--node-ip", n.Plan.IP.String(), "--hostname-override", n.Name, "--v", "1"}); err != nil {
		return err
	}
	return start("kube-proxy", []string{filepath.Join(tl.KubernetesDir, "kube-proxy"), "--config", "/etc/kubernetes/kube-proxy.yaml", "--v", "1"})
}

// startReal runs argv in the real node's namespaces as a substrate process (stopped at teardown,
// killed with the substrate), logging to <Dir>/logs/<node>/<name>.log.
func (n *Node) startReal(name string, argv, env []string) (*Process, error) {
	s := n.Cluster.s
	return s.procs.start("node/"+n.Name+"/"+name, n.nsenter(argv), env, s.logPath(n, name))
}

func (s *Substrate) logPath(n *Node, name string) string {
	return filepath.Join(s.Dir, "logs", n.Name, name+".log")
}

// stopRealNode stops the kubelet and kube-proxy, kills everything in the node's cgroups (pods,
// shims, containerd) and removes them, then releases the node's mount namespace.
func (s *Substrate) stopRealNode(n *Node) error {
	if n.real == nil {
		return nil
	}
	s.procs.stopAll("node/"+n.Name+"/kubelet", 5*time.Second)
	s.procs.stopAll("node/"+n.Name+"/kube-proxy", 5*time.Second)
	var errs []error
	if err := removeCgroup(n.real.cgroup, 20*time.Second); err != nil {
		errs = append(errs, err)
	}
	s.procs.stopAll("node/"+n.Name+"/", 5*time.Second)
	if n.real.mntns != "" {
		if err := unix.Unmount(n.real.mntns, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("release mount namespace of %s: %w", n.Name, err))
		}
	}
	return errors.Join(errs...)
}

// waitFor polls cond every 50 ms until it holds, ctx ends or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// containerdConfig is a real node's /etc/containerd/config.toml (containerd 2, config version
// 3): default paths (bound per node), runc from the tool cache with cgroupfs, the substrate's
// registry for every image (certs.d/_default), and restrict_oom_score_adj, because root here
// lacks CAP_SYS_RESOURCE and runc fails to lower a container's oom_score_adj below its own
// ("can't get final child's PID from pipe").
func containerdConfig(runc string) []byte {
	return fmt.Appendf(nil, `version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = %q
      SystemdCgroup = false

[plugins.'io.containerd.cri.v1.images']
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "/etc/containerd/certs.d"
`, runc, SandboxImage)
}

// registryHosts is containerd's certs.d/_default/hosts.toml: every registry a manifest names
// (docker.io, registry.k8s.io, ...) is pulled from the substrate's registry at addr, over plain
// HTTP inside the underlay; nothing is pulled from outside the machine.
func registryHosts(addr string) []byte {
	return fmt.Appendf(nil, `server = "http://%s"

[host."http://%s"]
  capabilities = ["pull", "resolve"]
`, addr, addr)
}

// kubeletConfig is a real node's KubeletConfiguration (kubelet.config.k8s.io/v1beta1). On this
// machine's cgroup v1 layout the kubelet needs failCgroupV1: false and the cgroupfs driver; its
// cgroupRoot is the node's own subtree. Eviction thresholds are low: the nodes share one disk.
func kubeletConfig(n *Node, c *Cluster) []byte {
	return fmt.Appendf(nil, `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %s
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: %s
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
failSwapOn: false
clusterDNS: [%s]
clusterDomain: %s
resolvConf: /etc/resolv.conf
staticPodPath: /etc/kubernetes/manifests
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: /etc/kubernetes/pki/ca.crt}
authorization: {mode: Webhook}
serializeImagePulls: false
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`, n.real.cgroup, n.Plan.IP, KubeletPort, c.Plan.DNSIP, c.s.Plan.ClusterDomain)
}

// kubeProxyConfig is a real node's KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1):
// nftables mode, the cluster's pod CIDR, and conntrack left as it is (its limits are not the
// node namespace's to set).
func kubeProxyConfig(n *Node, c *Cluster) []byte {
	return fmt.Appendf(nil, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: /etc/kubernetes/kube-proxy.kubeconfig
mode: nftables
clusterCIDR: %s
hostnameOverride: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, c.Plan.PodCIDR, n.Name)
}

// realNodeTools are the binaries Options.RealNodes needs from the tool cache.
func realNodeTools(tl testenv.Tools) []string {
	out := []string{tl.Runc, tl.CoreDNS}
	for _, b := range []string{"kubelet", "kube-proxy", "kube-controller-manager", "kube-scheduler"} {
		out = append(out, filepath.Join(tl.KubernetesDir, b))
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2"} {
		out = append(out, filepath.Join(tl.ContainerdDir, b))
	}
	return out
}

// startRealNodes brings up what Options.RealNodes adds once the clusters are set up: the
// substrate's own images (pause, CoreDNS) in its registry, each cluster's controllers and
// CoreDNS, then every node; it returns when every node is Ready and kube-dns answers.
func (s *Substrate) startRealNodes(ctx context.Context, tl testenv.Tools) error {
	if err := privateMount(filepath.Join(s.Dir, "mntns")); err != nil {
		return err
	}
	s.mntnsMounted = true
	if err := s.buildAndPush(ctx, SandboxImage); err != nil {
		return err
	}
	coredns, err := images.BuildImage([]images.Layer{{Files: []images.File{{Src: tl.CoreDNS, Dst: "/coredns"}}}},
		images.Config{Entrypoint: []string{"/coredns"}})
	if err != nil {
		return fmt.Errorf("image %s: %w", CoreDNSImage, err)
	}
	if err := s.PushImage(ctx, CoreDNSImage, coredns); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, c := range s.Clusters {
		g.Go(func() error { return s.startControlPlane(gctx, c, tl) })
		for _, n := range c.Nodes {
			g.Go(func() error { return s.startRealNode(gctx, n, tl, c.API) })
		}
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for _, c := range s.Clusters {
		if err := c.waitRealNodes(ctx); err != nil {
			return err
		}
	}
	return nil
}

// waitRealNodes waits (up to 3 minutes) for every node of the cluster to be Ready and for
// CoreDNS to have a ready replica.
func (c *Cluster) waitRealNodes(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var last string
	for {
		ready := 0
		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, n := range nodes.Items {
				for _, cond := range n.Status.Conditions {
					if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
						ready++
					}
				}
			}
			last = fmt.Sprintf("%d of %d nodes Ready", ready, len(c.Nodes))
		}
		if ready == len(c.Nodes) {
			d, err := c.Client.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
			if err == nil && d.Status.ReadyReplicas > 0 {
				return nil
			}
			last += ", CoreDNS not ready"
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("real nodes of %s: %s after 3 minutes (logs: %s/logs/<node>/)", c.Name, last, c.s.Dir)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// PushWorkloadImages builds the test workloads' image (images.WorkloadsImage: echo, client and
// serverfirst in /usr/local/bin, on the PATH) and pushes it to the substrate's registry.
func (s *Substrate) PushWorkloadImages(ctx context.Context) error {
	return s.buildAndPush(ctx, images.WorkloadsImage)
}

// buildAndPush builds the images of refs (their images.Images() definitions; binaries and
// layers cached in the tool cache) and pushes them to the substrate's registry.
func (s *Substrate) buildAndPush(ctx context.Context, refs ...string) error {
	tl, err := testenv.FindTools()
	if err != nil {
		return err
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	var defs []images.Image
	for _, im := range images.Images() {
		if slices.Contains(refs, im.Ref) {
			defs = append(defs, im)
		}
	}
	if len(defs) != len(refs) {
		return fmt.Errorf("build images %v: not all are images.Images()", refs)
	}
	built, err := images.Build(ctx, images.Options{Root: root, CacheDir: filepath.Join(tl.Dir, "images"), Envoy: tl.Envoy,
		Tools: images.ToolPaths(tl.SPIREServer, tl.SPIREAgent, tl.SPIREControllerManager), Log: s.log}, defs)
	if err != nil {
		return err
	}
	return s.PushImages(ctx, built)
}

// MountNamespace is the file a real node's mount namespace is bound to ("" on the fast
// substrate): `nsenter --net=<Netns.Path> --mount=<MountNamespace> crictl ps` looks inside the node.
func (n *Node) MountNamespace() string {
	if n.real == nil {
		return ""
	}
	return n.real.mntns
}

// Kill takes a real node down as a power cut would: its kubelet, kube-proxy, containerd, pods
// and anything else in its cgroups are killed (SIGKILL) and its mount namespace is released;
// its network namespace stays. It is not started again.
func (n *Node) Kill() error {
	if n.real == nil {
		return fmt.Errorf("kill node %s: not a real node", n.Name)
	}
	s := n.Cluster.s
	for _, p := range []string{"kubelet", "kube-proxy", "containerd"} {
		s.procs.stopAll("node/"+n.Name+"/"+p, 0)
	}
	return s.stopRealNode(n)
}

// Reboot restarts a real node as a reboot would: everything on it is killed (Kill), what lives
// in tmpfs on a real node is gone (/run: containerd's state, pod network namespaces, the
// agent's sockets), its Flannel conflist is written again as Flannel's install-cni step does at
// every start (dropping whatever chained plugins were appended to it), and containerd, the
// kubelet and kube-proxy start again. /var/lib (images, the kubelet's state) persists. The
// kubelet then recreates the pods bound to the node.
func (n *Node) Reboot(ctx context.Context) error {
	if err := n.Kill(); err != nil {
		return fmt.Errorf("reboot %s: %w", n.Name, err)
	}
	for _, d := range []string{"/run/containerd", "/run/netns", "/run/aether", "/run/nri"} {
		if err := os.RemoveAll(n.hostPath(d)); err != nil {
			return fmt.Errorf("reboot %s: %w", n.Name, err)
		}
	}
	if err := os.MkdirAll(n.hostPath("/run/aether"), 0o755); err != nil {
		return err
	}
	s := n.Cluster.s
	conf, err := NodeConflist(n.Plan, n.Cluster.Plan, s.opts.CNIPlugins)
	if err != nil {
		return err
	}
	if err := writeFiles(map[string][]byte{n.hostPath("/etc/cni/net.d/" + ConflistFile): conf}); err != nil {
		return fmt.Errorf("reboot %s: %w", n.Name, err)
	}
	tl, err := testenv.FindTools()
	if err != nil {
		return err
	}
	if err := s.startRealNode(ctx, n, tl, n.Cluster.API); err != nil {
		return fmt.Errorf("reboot %s: %w", n.Name, err)
	}
	return nil
}
