package agent

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/aethermesh/aether/deploy"
	"github.com/aethermesh/aether/envoy"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// deployedAgent is the agent DaemonSet of deploy/ with its containers.
type deployedAgent struct {
	spec         corev1.PodSpec
	agent, envoy corev1.Container
}

func loadDeployedAgent(t *testing.T) deployedAgent {
	t.Helper()
	var ds appsv1.DaemonSet
	if err := deploy.Decode("agent/daemonset.yaml", "DaemonSet", &ds); err != nil {
		t.Fatal(err)
	}
	d := deployedAgent{spec: ds.Spec.Template.Spec}
	var err error
	if d.agent, err = deploy.Container(d.spec, "agent"); err != nil {
		t.Fatal(err)
	}
	if d.envoy, err = deploy.Container(d.spec, "envoy"); err != nil {
		t.Fatal(err)
	}
	return d
}

// parseDeployed parses container c's args and environment (configMap data as aether-config, the
// downward API values of a dual-stack node with IPs 10.0.0.1 and fd00::1) with the agent's own
// flag parser.
func parseDeployed(t *testing.T, c corev1.Container, data map[string]string) Config {
	t.Helper()
	env, err := deploy.Env(c, map[string]map[string]string{"aether-config": data},
		map[string]string{"spec.nodeName": "node-1", "status.hostIP": "10.0.0.1", "status.hostIPs": "10.0.0.1,fd00::1", "metadata.namespace": "aether-system"})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseFlags(deploy.Args(c, env), func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("container %s: the agent does not accept its args %q: %v", c.Name, c.Args, err)
	}
	return cfg
}

// configured is deploy/config.yaml with the two settings an operator must fill in.
func configured(t *testing.T) map[string]string {
	t.Helper()
	data, err := deploy.ConfigData()
	if err != nil {
		t.Fatal(err)
	}
	data = maps.Clone(data)
	data["AETHER_CLUSTER"] = "east"
	data["AETHER_REGISTRY_ENDPOINTS"] = "https://10.0.0.2:2379"
	return data
}

// TestDeployAgentArgs parses the DaemonSet's agent container (args, env, envFrom the shipped
// ConfigMap) with the agent's own flag parser, so a renamed or removed flag fails, and checks
// that the parsed configuration fits the pod around it: paths the agent shares with the node
// and with the Envoy container are the same volumes at the same paths, the files it reads come
// from the Secrets mounted there, every path either process writes is on a writable volume
// (their root filesystems are read-only), the ServiceAccount files come from the projected
// volume, the probes hit its health and Envoy's admin addresses, and the agent starts no Envoy
// of its own.
func TestDeployAgentArgs(t *testing.T) {
	d := loadDeployedAgent(t)

	shipped, err := deploy.ConfigData()
	if err != nil {
		t.Fatal(err)
	}
	err = parseDeployed(t, d.agent, shipped).Validate()
	for _, want := range []string{"--cluster is required", "--registry-endpoints is required"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("unconfigured deploy/config.yaml: validate() = %v, want it to say %q", err, want)
		}
	}

	cfg := parseDeployed(t, d.agent, configured(t))
	missing, err := deploy.MissingFiles(cfg.Validate())
	if err != nil {
		t.Fatalf("configured agent: validate: %v", err)
	}
	for _, p := range missing {
		v, _, key, err := deploy.MountedFrom(d.spec, d.agent, p)
		if err != nil || v.Secret == nil || (key != corev1.TLSCertKey && key != corev1.TLSPrivateKeyKey) {
			t.Errorf("agent reads %s, which no Secret of type kubernetes.io/tls supplies (volume %s, key %q, %v)", p, v.Name, key, err)
		}
	}
	if cfg.NodeName != "node-1" || cfg.HostIP != netip.MustParseAddr("10.0.0.1") || cfg.HostIPv6 != netip.MustParseAddr("fd00::1") || cfg.Cluster != "east" {
		t.Errorf("node %q, host IPs %s and %s, cluster %q: want the downward API's node-1, 10.0.0.1 and fd00::1 and the ConfigMap's east", cfg.NodeName, cfg.HostIP, cfg.HostIPv6, cfg.Cluster)
	}
	if cfg.EnvoyBinary != "" {
		t.Errorf("--envoy-binary %q: Envoy runs in its own container; the agent must not start a second one", cfg.EnvoyBinary)
	}
	if cfg.CNIPlugin == "" {
		t.Error("--cni-plugin-binary is empty: the agent would not install aether-cni")
	}
	if !cfg.EastWestWaypoint {
		t.Error("--east-west-waypoint is off in the deployed agent: deploy/config.yaml makes every node a waypoint")
	}
	// deploy/ is the chart's default, SPIRE: the agent asks the SPIRE agent of its node, whose
	// admin socket (deploy/spire/config.yaml) is on the node directory both DaemonSets mount.
	if cfg.IdentitySource != IdentitySPIRE || cfg.CACert != "" || cfg.SPIREAdminSocket != DefaultSPIREAdminSocket {
		t.Errorf("--identity-source %q, --ca-cert %q, --spire-admin-socket %q: want spire, none, %s", cfg.IdentitySource, cfg.CACert, cfg.SPIREAdminSocket, DefaultSPIREAdminSocket)
	}

	// Shared with the node at the same path (the conflist names the CNI socket; Envoy opens the
	// CNI runtime's netns paths), and with the Envoy container.
	sameOnNode := func(c corev1.Container, path, hostPath string) {
		t.Helper()
		v, m, rel, err := deploy.MountedFrom(d.spec, c, path)
		if err != nil || v.HostPath == nil {
			t.Errorf("%s: %s is not on a hostPath volume (%v)", c.Name, path, err)
			return
		}
		if got := filepath.Join(v.HostPath.Path, rel); got != hostPath {
			t.Errorf("%s: %s is the node's %s (volume %s at %s), want %s", c.Name, path, got, v.Name, m.MountPath, hostPath)
		}
	}
	sameOnNode(d.agent, cfg.CNISocket, cfg.CNISocket)
	sameOnNode(d.agent, cfg.XDSSocket, cfg.XDSSocket)
	sameOnNode(d.envoy, cfg.XDSSocket, cfg.XDSSocket)
	sameOnNode(d.agent, cfg.StateDir, cfg.StateDir)
	sameOnNode(d.envoy, filepath.Join(cfg.StateDir, "envoy"), filepath.Join(cfg.StateDir, "envoy"))
	sameOnNode(d.agent, "/var/run/netns/cni-1234", "/var/run/netns/cni-1234")
	sameOnNode(d.envoy, "/var/run/netns/cni-1234", "/var/run/netns/cni-1234")
	sameOnNode(d.agent, cfg.CNIConfDir, "/etc/cni/net.d")
	sameOnNode(d.agent, cfg.CNIBinDir, "/opt/cni/bin")
	sameOnNode(d.agent, cfg.SPIREAdminSocket, cfg.SPIREAdminSocket)
	var spireAgents appsv1.DaemonSet
	if err := deploy.Decode("spire/agent.yaml", "DaemonSet", &spireAgents); err != nil {
		t.Fatal(err)
	}
	sa, err := deploy.Container(spireAgents.Spec.Template.Spec, "spire-agent")
	if err != nil {
		t.Fatal(err)
	}
	if v, _, rel, err := deploy.MountedFrom(spireAgents.Spec.Template.Spec, sa, cfg.SPIREAdminSocket); err != nil || v.HostPath == nil ||
		filepath.Join(v.HostPath.Path, rel) != cfg.SPIREAdminSocket {
		t.Errorf("the SPIRE agent DaemonSet does not put %s on the node's %s (volume %+v, %v)", cfg.SPIREAdminSocket, cfg.SPIREAdminSocket, v.VolumeSource, err)
	}

	probe := func(c corev1.Container, want string) {
		t.Helper()
		p := c.ReadinessProbe
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: no HTTP readiness probe", c.Name)
			return
		}
		if got := net.JoinHostPort(p.HTTPGet.Host, p.HTTPGet.Port.String()); got != want {
			t.Errorf("%s: readiness probe on %s, want %s", c.Name, got, want)
		}
	}
	probe(d.agent, cfg.HealthAddr)
	// Envoy's readiness goes through its stats listener: the admin API is a unix socket, which
	// both containers reach at the same node path.
	_, statsPort, err := net.SplitHostPort(cfg.EnvoyStatsAddr)
	if err != nil {
		t.Fatalf("--envoy-stats-addr %q: %v", cfg.EnvoyStatsAddr, err)
	}
	probe(d.envoy, net.JoinHostPort("127.0.0.1", statsPort))
	admin, ok := strings.CutPrefix(cfg.EnvoyAdmin, "unix://")
	if !ok {
		t.Errorf("--envoy-admin %q: want a unix socket (docs/security.md)", cfg.EnvoyAdmin)
	} else {
		sameOnNode(d.agent, admin, admin)
		sameOnNode(d.envoy, admin, admin)
	}
	if cfg.DebugSocket == "" || cfg.MetricsAddr == "" {
		t.Errorf("--debug-socket %q, --metrics-addr %q: want both", cfg.DebugSocket, cfg.MetricsAddr)
	}

	// Both root filesystems are read-only (TestWorkloadSecurity in deploy/): every path the agent
	// writes, and Envoy's admin socket, is on a volume mounted writable.
	writable := func(c corev1.Container, path string) {
		t.Helper()
		v, m, _, err := deploy.MountedFrom(d.spec, c, path)
		if err != nil || m.ReadOnly || (v.HostPath == nil && v.EmptyDir == nil) {
			t.Errorf("%s writes %s, which is on no writable hostPath or emptyDir volume (%s, read-only %v, %v)", c.Name, path, v.Name, m.ReadOnly, err)
		}
	}
	for _, p := range []string{cfg.StateDir, filepath.Dir(cfg.CNISocket), filepath.Dir(cfg.XDSSocket), filepath.Dir(cfg.DebugSocket), cfg.CNIConfDir, cfg.CNIBinDir} {
		writable(d.agent, p)
	}
	lock := ""
	for _, e := range d.agent.Env {
		if e.Name == "XTABLES_LOCKFILE" {
			lock = e.Value
		}
	}
	if lock == "" {
		t.Error("agent: no XTABLES_LOCKFILE: iptables-legacy would lock /run/xtables.lock on the read-only root")
	} else {
		writable(d.agent, filepath.Dir(lock))
	}
	if admin, ok := strings.CutPrefix(cfg.EnvoyAdmin, "unix://"); ok {
		writable(d.envoy, filepath.Dir(admin))
	}
	// The agent's in-cluster client reads the ServiceAccount files at the standard path: the
	// projected volume that replaces automounting supplies each.
	for _, f := range []string{"token", "ca.crt", "namespace"} {
		v, _, key, err := deploy.MountedFrom(d.spec, d.agent, "/var/run/secrets/kubernetes.io/serviceaccount/"+f)
		if err != nil || v.Projected == nil || !slices.ContainsFunc(v.Projected.Sources, func(s corev1.VolumeProjection) bool {
			switch {
			case s.ServiceAccountToken != nil:
				return s.ServiceAccountToken.Path == key && s.ServiceAccountToken.Audience == ""
			case s.ConfigMap != nil:
				return s.ConfigMap.Name == "kube-root-ca.crt" && slices.ContainsFunc(s.ConfigMap.Items, func(k corev1.KeyToPath) bool { return k.Path == key })
			case s.DownwardAPI != nil:
				return slices.ContainsFunc(s.DownwardAPI.Items, func(i corev1.DownwardAPIVolumeFile) bool {
					return i.Path == key && i.FieldRef != nil && i.FieldRef.FieldPath == "metadata.namespace"
				})
			}
			return false
		}) {
			t.Errorf("agent: %s of the ServiceAccount is not supplied by a projected volume (%s, %v)", f, v.Name, err)
		}
	}

	// The Envoy container reads the bootstrap where the agent writes it (startEnvoy).
	boot := filepath.Join(cfg.StateDir, "envoy", "bootstrap.json")
	if i := slices.Index(d.envoy.Args, "-c"); i < 0 || i+1 >= len(d.envoy.Args) || d.envoy.Args[i+1] != boot {
		t.Errorf("envoy args %q: want -c %s (the bootstrap the agent writes)", d.envoy.Args, boot)
	}
}

// envoyEntrypoint returns the path of images/envoy/entrypoint.sh.
func envoyEntrypoint(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "images", "envoy", "entrypoint.sh")
}

// envoyContainerArgs is the Envoy container's args with the bootstrap path replaced by boot.
func envoyContainerArgs(t *testing.T, d deployedAgent, boot string) []string {
	t.Helper()
	args := slices.Clone(d.envoy.Args)
	i := slices.Index(args, "-c")
	if i < 0 || i+1 >= len(args) {
		t.Fatalf("envoy args %q: no -c", args)
	}
	args[i+1] = boot
	return args
}

// TestDeployEnvoyContainerArgs runs the Envoy image's entrypoint with the DaemonSet's Envoy args
// and the real Envoy in validate mode: the entrypoint waits until the bootstrap appears (the
// agent writes it later), then Envoy's own parser accepts every arg and the bootstrap the agent
// would write for that pod.
func TestDeployEnvoyContainerArgs(t *testing.T) {
	tools := testenv.RequireTools(t, testenv.ToolEnvoy)
	d := loadDeployedAgent(t)
	cfg := parseDeployed(t, d.agent, configured(t))
	b, err := envoy.Bootstrap(envoy.BootstrapConfig{NodeID: cfg.NodeName, XDSAddress: "unix://" + cfg.XDSSocket,
		AdminAddress: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))})
	if err != nil {
		t.Fatal(err)
	}
	boot := filepath.Join(t.TempDir(), "envoy", "bootstrap.json")
	cmd := exec.Command("sh", append([]string{envoyEntrypoint(t), "--mode", "validate"}, envoyContainerArgs(t, d, boot)...)...)
	cmd.Env = append(os.Environ(), "AETHER_ENVOY_BIN="+tools.Envoy)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := testenv.StartCmd(cmd); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("the entrypoint did not wait for the bootstrap: exited (%v): %s", err, out.String())
	case <-time.After(1500 * time.Millisecond):
	}
	if err := os.MkdirAll(filepath.Dir(boot), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(boot, b, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil || !strings.Contains(out.String(), "OK") {
			t.Fatalf("envoy --mode validate with the DaemonSet's args: %v\n%s", err, out.String())
		}
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("envoy --mode validate did not finish: %s", out.String())
	}
}

// TestDeployUninstallArgs parses the CNI uninstall DaemonSet's init container with the agent's
// parser: it must uninstall from the same node directories the agent installs into.
func TestDeployUninstallArgs(t *testing.T) {
	d := loadDeployedAgent(t)
	agentCfg := parseDeployed(t, d.agent, configured(t))
	var ds appsv1.DaemonSet
	if err := deploy.Decode("uninstall/cni-uninstall.yaml", "DaemonSet", &ds); err != nil {
		t.Fatal(err)
	}
	c, err := deploy.Container(ds.Spec.Template.Spec, "uninstall-cni")
	if err != nil {
		t.Fatal(err)
	}
	cfg := parseDeployed(t, c, nil)
	if !cfg.UninstallCNI {
		t.Error("the uninstall container does not pass --uninstall-cni")
	}
	for _, p := range []struct{ got, want string }{{cfg.CNIConfDir, agentCfg.CNIConfDir}, {cfg.CNIBinDir, agentCfg.CNIBinDir}} {
		if p.got != p.want {
			t.Errorf("uninstall uses %s, the agent installs into %s", p.got, p.want)
		}
		va, _, _, _ := deploy.MountedFrom(d.spec, d.agent, p.want)
		vu, _, _, err := deploy.MountedFrom(ds.Spec.Template.Spec, c, p.got)
		if err != nil || va.HostPath == nil || vu.HostPath == nil || va.HostPath.Path != vu.HostPath.Path {
			t.Errorf("%s: uninstall's volume %+v is not the agent's %+v (%v)", p.got, vu.VolumeSource, va.VolumeSource, err)
		}
	}
}

// TestPrivilegedDeployedAgentRunsAsItsServiceAccount installs deploy/'s namespace, agent RBAC
// and the agent's admission policy in a real kube-apiserver and runs the real agent binary with a
// token of the aether-agent ServiceAccount bound to a pod on node-1 (as the kubelet mints it, so
// it carries the node-name claim the policy checks), in the DaemonSet's Envoy arrangement: the
// agent starts no Envoy (--envoy-binary=), the Envoy image's entrypoint starts the real Envoy
// with the DaemonSet's args once the agent has written the bootstrap. Each process is confined
// as its container's securityContext says (confined): a read-only root with only its
// container's writable volumes writable, and only its container's capabilities. The agent must
// become ready (its informers list and watch Nodes, Pods, Services, Namespaces and
// ServiceImports; it reads kube-system/kube-dns), delete a meshed pod of its node that runs
// without capture, and the ServiceAccount must be refused what the agent never does.
func TestPrivilegedDeployedAgentRunsAsItsServiceAccount(t *testing.T) {
	testenv.RequireRoot(t)
	tools := testenv.RequireTools(t, testenv.ToolEnvoy)
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	testenv.InstallCRDs(t, api.Config, "deploy/crds")
	etcd := testenv.StartEmbeddedEtcd(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cl, err := client.New(api.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"namespace.yaml", "agent/rbac.yaml", "agent/policy.yaml"} {
		objs, err := deploy.Objects(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if err := cl.Create(ctx, o); err != nil {
				t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
	}
	const sa = "system:serviceaccount:aether-system:aether-agent"
	cs := kubernetes.NewForConfigOrDie(api.Config)
	must := mustCreate(t)
	must(cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}}}, metav1.CreateOptions{}))
	must(cs.CoreV1().Services("kube-system").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kube-dns"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}}}}, metav1.CreateOptions{}))
	must(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop",
		Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}, metav1.CreateOptions{}))
	must(cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}))
	// A meshed pod running on the node without capture (it started before the agent).
	stray, err := cs.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "stray"},
		Spec: corev1.PodSpec{NodeName: "node-1", AutomountServiceAccountToken: new(false),
			Containers: []corev1.Container{{Name: "app", Image: "app"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stray.Status.Phase, stray.Status.PodIP = corev1.PodRunning, "10.250.0.9"
	stray.Status.PodIPs = []corev1.PodIP{{IP: "10.250.0.9"}}
	if _, err := cs.CoreV1().Pods("shop").UpdateStatus(ctx, stray, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The DaemonSet's agent pod on node-1 and the token the kubelet would mount into it.
	agentPod, err := cs.CoreV1().Pods("aether-system").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "aether-agent-node1"},
		Spec: corev1.PodSpec{NodeName: "node-1", ServiceAccountName: "aether-agent", AutomountServiceAccountToken: new(false),
			Containers: []corev1.Container{{Name: "agent", Image: "aether-agent:dev"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts("aether-system").CreateToken(ctx, "aether-agent", &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		ExpirationSeconds: new(int64(3600)),
		BoundObjectRef:    &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: agentPod.Name, UID: agentPod.UID}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.LoadFromFile(api.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		*ai = clientcmdapi.AuthInfo{Token: tr.Status.Token}
	}
	asAgent := filepath.Join(t.TempDir(), "kubeconfig-agent")
	if err := clientcmd.WriteToFile(*kc, asAgent); err != nil {
		t.Fatal(err)
	}

	// The agent as the DaemonSet runs it: no Envoy of its own, kube-dns from the API, its
	// sockets and state where the DaemonSet's run and state volumes are (stand-ins here), and
	// confined as its container.
	d := loadDeployedAgent(t)
	node := t.TempDir()
	run, state := filepath.Join(node, "run"), filepath.Join(node, "state")
	standIns := map[string]string{"/var/run/aether": run, "/var/lib/aether": state}
	admin := filepath.Join(run, "envoy-admin.sock")
	a := startAgentWith(t, agentOpts{wrap: confined(t, d.agent, standIns)}, "--kubeconfig", asAgent,
		"--registry-endpoints", etcd.Endpoints[0], "--cluster-dns=", "--envoy-binary=", "--node-source-guard=false",
		"--state-dir", state, "--xds-socket", filepath.Join(run, "xds.sock"), "--cni-socket", filepath.Join(run, "cni.sock"),
		"--debug-socket", filepath.Join(run, "debug.sock"), "--envoy-admin", "unix://"+admin)
	boot := filepath.Join(state, "envoy", "bootstrap.json")
	envoyLog := filepath.Join(t.TempDir(), "envoy.log")
	logf, err := os.Create(envoyLog)
	if err != nil {
		t.Fatal(err)
	}
	argv := slices.Concat(confined(t, d.envoy, standIns), []string{"sh", envoyEntrypoint(t)}, envoyContainerArgs(t, d, boot))
	envoy := exec.Command(argv[0], argv[1:]...)
	envoy.Env = append(os.Environ(), "AETHER_ENVOY_BIN="+tools.Envoy)
	envoy.Stdout, envoy.Stderr = logf, logf
	if err := testenv.StartCmd(envoy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = envoy.Process.Signal(syscall.SIGKILL)
		_ = envoy.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(envoyLog)
			t.Logf("envoy container log (tail):\n%s", tailString(string(b), 6000))
		}
	})

	a.waitReady(t, 90*time.Second, "agent ready as its ServiceAccount, with Envoy from its own 'container'")
	adminc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", admin)
	}}}
	info := "(no answer)"
	if resp, err := adminc.Get("http://envoy/server_info"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		info = string(b)
	}
	if !strings.Contains(info, `"state": "LIVE"`) {
		t.Errorf("Envoy started from the agent's bootstrap is not LIVE: %s", tailString(info, 500))
	}
	checkConfined(t, d.agent, a.cmd.Process.Pid)
	checkConfined(t, d.envoy, envoy.Process.Pid)
	testenv.Eventually(t, 60*time.Second, "the uncaptured meshed pod deleted", func() error {
		p, err := cs.CoreV1().Pods("shop").Get(ctx, "stray", metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil) {
			return nil
		}
		return fmt.Errorf("pod shop/stray still running (%v)", err)
	})

	// The ServiceAccount has what the agent needs and nothing it does not use.
	for _, c := range []struct {
		group, resource, sub, verb, ns string
		allowed                        bool
	}{
		{"", "nodes", "", "watch", "", true},
		{"", "pods", "", "get", "shop", true},
		{"", "pods", "", "delete", "shop", true}, // on its own node only: deploy/agent/policy.yaml
		{"", "services", "", "list", "", true},
		{"", "namespaces", "", "get", "", true},
		{"multicluster.x-k8s.io", "serviceimports", "", "watch", "", true},
		{"gateway.networking.k8s.io", "httproutes", "", "watch", "", true},
		{"gateway.networking.k8s.io", "grpcroutes", "", "list", "", true},
		{"gateway.networking.k8s.io", "httproutes", "status", "update", "shop", false},
		{"gateway.networking.k8s.io", "grpcroutes", "", "update", "shop", false},
		{"", "events", "", "create", "shop", true},
		{"", "pods", "eviction", "create", "shop", false},
		{"", "pods", "", "deletecollection", "shop", false},
		{"", "services", "", "update", "shop", false},
		{"", "services", "", "delete", "shop", false},
		{"", "services", "", "create", "shop", false},
		{"gateway.networking.k8s.io", "gateways", "", "list", "", true},
		{"gateway.networking.k8s.io", "gatewayclasses", "", "watch", "", true},
		{"gateway.networking.k8s.io", "referencegrants", "", "list", "", true},
		{"gateway.networking.k8s.io", "tcproutes", "", "watch", "", true},
		{"gateway.networking.k8s.io", "tlsroutes", "", "list", "", true},
		{"gateway.networking.k8s.io", "udproutes", "", "watch", "", true},
		{"gateway.networking.k8s.io", "gateways", "status", "update", "shop", false},
		// The edge Gateways' certificate copies live in the release namespace; no other Secret.
		{"", "secrets", "", "get", "aether-system", true},
		{"", "secrets", "", "watch", "aether-system", true},
		{"", "secrets", "", "create", "aether-system", false},
		{"", "secrets", "", "get", "shop", false},
		{"", "secrets", "", "list", "", false},
		{"", "configmaps", "", "list", "", false},
		{"", "nodes", "", "update", "", false},
		{"multicluster.x-k8s.io", "serviceexports", "", "list", "", false},
	} {
		r, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authv1.SubjectAccessReview{Spec: authv1.SubjectAccessReviewSpec{
			User: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:aether-system", "system:authenticated"},
			ResourceAttributes: &authv1.ResourceAttributes{Group: c.group, Resource: c.resource, Subresource: c.sub, Verb: c.verb, Namespace: c.ns},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status.Allowed != c.allowed {
			t.Errorf("aether-agent %s %s/%s (group %q, namespace %q): allowed %v, want %v", c.verb, c.resource, c.sub, c.group, c.ns, r.Status.Allowed, c.allowed)
		}
	}
}

// confineScript starts a program the way a container's securityContext would confine it, in
// the mount namespace of its own that unshare --mount --propagation private gives it: the root
// filesystem read-only except the directories in $2 (colon-separated; the stand-ins of the
// container's writable volumes), only the capabilities in $1 (setpriv's list, e.g.
// ",+net_admin,+sys_admin"; uid 0 keeps exactly its bounding set across exec), and no_new_privs
// when $3 is "nnp".
const confineScript = `set -eu
caps=$1 rw=$2 nnp=$3
shift 3
IFS=:
for d in $rw; do
  mkdir -p "$d"
  mount --bind "$d" "$d"
done
unset IFS
mount -o remount,bind,ro /
if [ "$nnp" = nnp ]; then
  set -- --no-new-privs "$@"
fi
exec setpriv --bounding-set="-all$caps" --inh-caps=-all "$@"`

// capBits are the capability numbers (linux/capability.h) of the capabilities deploy/ adds.
var capBits = map[string]uint{"NET_ADMIN": 12, "NET_RAW": 13, "SYS_ADMIN": 21}

// confined returns the command prefix that runs a program confined as container c of the
// DaemonSet (confineScript): its capabilities, read-only root (c must have one) with c's
// writable volume mounts writable at their stand-ins (standIns maps a mountPath to the test's
// directory; mounts without one are left out), and no_new_privs when c sets
// allowPrivilegeEscalation false. It needs unshare, setpriv and mount (util-linux).
func confined(t *testing.T, c corev1.Container, standIns map[string]string) []string {
	t.Helper()
	for _, tool := range []string{"unshare", "setpriv", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("confine container %s: %s not found (util-linux)", c.Name, tool)
		}
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Fatalf("confine container %s: securityContext %+v, want a read-only root and capabilities drop [ALL]", c.Name, sc)
	}
	var caps string
	for _, a := range sc.Capabilities.Add {
		caps += ",+" + strings.ToLower(strings.TrimPrefix(string(a), "CAP_"))
	}
	var rw []string
	for _, m := range c.VolumeMounts {
		if dir, ok := standIns[m.MountPath]; ok && !m.ReadOnly {
			rw = append(rw, dir)
		}
	}
	nnp := "-"
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		nnp = "nnp"
	}
	return []string{"unshare", "--mount", "--propagation", "private", "sh", "-c", confineScript, "confine", caps, strings.Join(rw, ":"), nnp}
}

// checkConfined checks that process pid runs with exactly container c's capabilities and a
// read-only root filesystem, so a test that passes did pass confined.
func checkConfined(t *testing.T, c corev1.Container, pid int) {
	t.Helper()
	var want uint64
	for _, a := range c.SecurityContext.Capabilities.Add {
		bit, ok := capBits[strings.TrimPrefix(string(a), "CAP_")]
		if !ok {
			t.Fatalf("container %s: capability %s has no number in capBits", c.Name, a)
		}
		want |= 1 << bit
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			if got, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err != nil || got != want {
				t.Errorf("container %s (pid %d): effective capabilities %s, want %#x", c.Name, pid, strings.TrimSpace(v), want)
			}
		}
	}
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(mi), "\n") {
		// "id parent major:minor root mountpoint options ...": the root mount's options.
		if f := strings.Fields(l); len(f) > 5 && f[4] == "/" && !slices.Contains(strings.Split(f[5], ","), "ro") {
			t.Errorf("container %s (pid %d): root filesystem mounted %s, want ro", c.Name, pid, f[5])
		}
	}
}
