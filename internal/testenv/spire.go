package testenv

import (
	"context"
	"fmt"
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// SPIREOptions configure StartSPIREServer.
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
}

// SPIREServer is a real spire-server (hack/tools.sh) on loopback, with k8s_psat node attestation
// against a real kube-apiserver and the SPIRE Controller Manager registering workloads from
// ClusterSPIFFEID and ClusterStaticEntry resources of that API server. Its processes stop when
// the test ends; their logs are in Dir.
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
	tools      Tools
}

// StartSPIREServer starts spire-server and the SPIRE Controller Manager for kube (whose CRDs it
// installs), and waits until the server is healthy and its bundle written.
func StartSPIREServer(t testing.TB, kube *KubeAPIServer, opts SPIREOptions) *SPIREServer {
	t.Helper()
	tl := RequireTools(t, ToolSPIRE)
	if opts.TrustDomain == "" {
		opts.TrustDomain = "aether.internal"
	}
	if opts.Cluster == "" {
		opts.Cluster = "alpha"
	}
	if opts.SVIDTTL == 0 {
		opts.SVIDTTL = time.Hour
	}
	// Short: Unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "spire-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	s := &SPIREServer{Opts: opts, Kube: kube, Dir: dir, Socket: filepath.Join(dir, "server", "api.sock"),
		Port: FreePort(t), BundlePath: filepath.Join(dir, "bundle.pem"), tools: tl}
	if err := os.MkdirAll(filepath.Join(dir, "server", "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	health := FreePort(t)
	cacheReload := ""
	if opts.AgentSyncInterval > 0 {
		cacheReload = fmt.Sprintf("\n  experimental {\n    events_based_cache = true\n    cache_reload_interval = %q\n  }", opts.AgentSyncInterval.String())
	}
	conf := fmt.Sprintf(`server {
  bind_address = "127.0.0.1"
  bind_port = "%d"
  socket_path = %q
  trust_domain = %q
  data_dir = %q
  log_level = "DEBUG"
  default_x509_svid_ttl = %q
  ca_ttl = "24h"%s
}
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
}
`+healthChecks(health), s.Port, s.Socket, opts.TrustDomain, filepath.Join(dir, "server", "data"), opts.SVIDTTL.String(), cacheReload,
		filepath.Join(dir, "server", "data", "datastore.sqlite3"), opts.Cluster, kube.Kubeconfig)
	cf := filepath.Join(dir, "server", "server.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	StartLogged(t, filepath.Join(dir, "spire-server.log"), nil, tl.SPIREServer, "run", "-config", cf)
	Eventually(t, 60*time.Second, "spire-server healthy", func() error {
		out, err := exec.Command(tl.SPIREServer, "healthcheck", "-socketPath", s.Socket).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	out, err := exec.Command(tl.SPIREServer, "bundle", "show", "-socketPath", s.Socket).Output()
	if err != nil {
		t.Fatalf("spire-server bundle show: %v", err)
	}
	if err := os.WriteFile(s.BundlePath, out, 0o600); err != nil {
		t.Fatal(err)
	}

	// The Controller Manager, with its CRDs, no webhook and no leader election.
	InstallCRDs(t, kube.Config, tl.SPIRECRDs)
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
`, FreePort(t), opts.Cluster, opts.TrustDomain, s.Socket)
	scmf := filepath.Join(dir, "controller-manager.yaml")
	if err := os.WriteFile(scmf, []byte(scm), 0o600); err != nil {
		t.Fatal(err)
	}
	StartLogged(t, filepath.Join(dir, "spire-controller-manager.log"), []string{"ENABLE_WEBHOOKS=false", "KUBECONFIG=" + kube.Kubeconfig},
		tl.SPIREControllerManager, "-config", scmf)
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"spire-server.log", "spire-controller-manager.log"} {
				b, _ := os.ReadFile(filepath.Join(dir, f))
				t.Logf("%s (tail):\n%s", f, Tail(string(b), 6000))
			}
		}
	})
	return s
}

// healthChecks is the health_checks block of a SPIRE server or agent configuration: /live and
// /ready on 127.0.0.1:port.
func healthChecks(port int) string {
	return fmt.Sprintf("health_checks {\n  listener_enabled = true\n  bind_address = \"127.0.0.1\"\n  bind_port = \"%d\"\n  live_path = \"/live\"\n  ready_path = \"/ready\"\n}\n", port)
}

// AgentID is the SPIFFE ID k8s_psat gives the SPIRE agent of the node with uid (the parent ID
// the Controller Manager gives the node's pods' entries).
func (s *SPIREServer) AgentID(nodeUID string) string {
	return "spiffe://" + s.Opts.TrustDomain + "/spire/agent/k8s_psat/" + s.Opts.Cluster + "/" + nodeUID
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
// CRD is not served yet (up to 30 s).
func (s *SPIREServer) Create(t testing.TB, kind, name string, spec map[string]any) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(s.Kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	plural := strings.ToLower(kind) + "s"
	if base, ok := strings.CutSuffix(strings.ToLower(kind), "y"); ok {
		plural = base + "ies"
	}
	gvr := schema.GroupVersionResource{Group: "spire.spiffe.io", Version: "v1alpha1", Resource: plural}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "spire.spiffe.io/v1alpha1", "kind": kind, "metadata": map[string]any{"name": name}, "spec": spec}}
	Eventually(t, 30*time.Second, "create "+kind+" "+name, func() error {
		_, err := dyn.Resource(gvr).Create(context.Background(), obj, metav1.CreateOptions{})
		return err
	})
}

// MeshSPIFFEIDTemplate is the ClusterSPIFFEID template of the IDs aether gives pods:
// spiffe://<trust domain>/ns/<namespace>/sa/<service account>.
const MeshSPIFFEIDTemplate = "spiffe://{{ .TrustDomain }}/ns/{{ .PodMeta.Namespace }}/sa/{{ .PodSpec.ServiceAccountName }}"

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
	cmd    *exec.Cmd
	done   chan struct{}
	tools  Tools
}

// StartAgent starts a spire-agent for node (the Node is created when it does not exist) whose
// admin socket admits the authorized delegates, with the unix workload attestor, and waits until
// it is attested and healthy. It stops when the test ends.
func (s *SPIREServer) StartAgent(t testing.TB, node string, authorizedDelegates ...string) *SPIREAgent {
	t.Helper()
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(s.Kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		if n, err = cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range []func() error{
		func() error {
			_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "spire"}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.CoreV1().ServiceAccounts("spire").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "spire-agent"}}, metav1.CreateOptions{})
			return err
		},
	} {
		if err := o(); err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Fatal(err)
		}
	}
	pod, err := cs.CoreV1().Pods("spire").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "spire-agent-" + node},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "spire-agent",
			Containers: []corev1.Container{{Name: "spire-agent", Image: "spire-agent"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	exp := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts("spire").CreateToken(ctx, "spire-agent", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences: []string{"spire-server"}, ExpirationSeconds: &exp,
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(s.Dir, "agent-"+node)
	for _, d := range []string{"data", "public", "admin"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	a := &SPIREAgent{Node: n, Dir: dir, Socket: filepath.Join(dir, "public", "agent.sock"), Admin: filepath.Join(dir, "admin", "admin.sock"),
		ID: s.AgentID(string(n.UID)), log: filepath.Join(dir, "spire-agent.log"), tools: s.tools}
	quoted := make([]string, len(authorizedDelegates))
	for i, d := range authorizedDelegates {
		quoted[i] = strconv.Quote(d)
	}
	health := FreePort(t)
	syncInterval := ""
	if s.Opts.AgentSyncInterval > 0 {
		syncInterval = fmt.Sprintf("\n  experimental {\n    sync_interval = %q\n  }", s.Opts.AgentSyncInterval.String())
	}
	conf := fmt.Sprintf(`agent {
  data_dir = %q
  log_level = "DEBUG"
  server_address = "127.0.0.1"
  server_port = "%d"
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
`+healthChecks(health), filepath.Join(dir, "data"), s.Port, a.Socket, a.Admin, s.BundlePath, s.Opts.TrustDomain, strings.Join(quoted, ", "), syncInterval,
		s.Opts.Cluster, token)
	a.conf = filepath.Join(dir, "agent.conf")
	if err := os.WriteFile(a.conf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	a.Start(t)
	t.Cleanup(func() {
		a.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(a.log)
			t.Logf("spire-agent %s (tail):\n%s", node, Tail(string(b), 6000))
		}
	})
	return a
}

// Start starts the agent (again, after Stop, with its data and so its SVID kept) and waits until
// it is healthy.
func (a *SPIREAgent) Start(t testing.TB) {
	t.Helper()
	a.cmd, a.done = startLogged(t, a.log, nil, a.tools.SPIREAgent, "run", "-config", a.conf)
	Eventually(t, 60*time.Second, "spire-agent healthy on "+a.Node.Name, func() error {
		out, err := exec.Command(a.tools.SPIREAgent, "healthcheck", "-socketPath", a.Socket).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
}

// Stop terminates the agent (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (a *SPIREAgent) Stop() {
	if a.cmd == nil {
		return
	}
	Terminate(a.cmd, a.done, 10*time.Second)
	a.cmd = nil
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
	cmd, done := startLogged(t, logPath, env, bin, args...)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
}

func startLogged(t testing.TB, logPath string, env []string, bin string, args ...string) (*exec.Cmd, chan struct{}) {
	t.Helper()
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	if err := StartCmd(cmd); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", filepath.Base(bin), err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(done) }()
	return cmd, done
}
