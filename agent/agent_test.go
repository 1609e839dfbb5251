package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
	mcsclient "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/envoy"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

var (
	agentOnce sync.Once
	agentBin  string
	agentErr  error
)

// startSources starts what the agent reads: a real kube-apiserver with aether's CRDs (ServiceExport,
// ServiceImport) and an embedded etcd as the registry, and returns a clientset for the API server.
func startSources(t testing.TB) (*testenv.KubeAPIServer, *testenv.EmbeddedEtcd, *kubernetes.Clientset) {
	t.Helper()
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	testenv.InstallCRDs(t, api.Config, "deploy/crds")
	return api, testenv.StartEmbeddedEtcd(t, nil), kubernetes.NewForConfigOrDie(api.Config)
}

// buildAgent builds the aether-agent binary (cmd/aether-agent, which runs this package) once per
// test run.
func buildAgent(t testing.TB) string {
	t.Helper()
	agentOnce.Do(func() {
		dir, err := os.MkdirTemp("", "aether-agent-bin-")
		if err != nil {
			agentErr = err
			return
		}
		agentBin = filepath.Join(dir, "aether-agent")
		args := []string{"build", "-o", agentBin}
		if raceEnabled {
			args = append(args, "-race")
		}
		root, err := testenv.RepoRoot()
		if err != nil {
			agentErr = err
			return
		}
		out, err := exec.Command("go", append(args, filepath.Join(root, "cmd", "aether-agent"))...).CombinedOutput()
		if err != nil {
			agentErr = fmt.Errorf("go build aether-agent: %v\n%s", err, out)
		}
	})
	if agentErr != nil {
		t.Fatal(agentErr)
	}
	return agentBin
}

// agentProc is a running aether-agent binary.
type agentProc struct {
	cmd    *exec.Cmd
	done   chan struct{}
	health string
	// metrics is --metrics-addr; debugSocket is --debug-socket.
	metrics     string
	debugSocket string
	dnsAddr     string
	logPath     string
	// argv is the agent's command line (run starts it).
	argv []string
	// envoyAdmin is the admin address of the Envoy the agent supervises; stateDir holds its pid.
	envoyAdmin string
	stateDir   string
	cniSocket  string
	client     *http.Client
}

func startAgent(t testing.TB, args ...string) *agentProc {
	t.Helper()
	return startAgentWith(t, agentOpts{}, args...)
}

// agentOpts place the agent elsewhere than the test's own network namespace.
type agentOpts struct {
	// wrap prefixes the command line (e.g. "ip netns exec <name>").
	wrap []string
	// client reaches the agent's health port and Envoy's admin (default http.DefaultClient).
	client *http.Client
	// spireAdmin, when set, is the SPIRE agent's admin socket: the agent runs with
	// --identity-source=spire instead of a development CA.
	spireAdmin string
}

// startAgentWith is startAgent with the agent started through o.wrap.
func startAgentWith(t testing.TB, o agentOpts, args ...string) *agentProc {
	t.Helper()
	dir := t.TempDir()
	healthPort, dnsPort, metricsPort := testenv.FreePort(t), testenv.FreePort(t), testenv.FreePort(t)
	resolv := filepath.Join(dir, "resolv.conf")
	// An upstream that does not answer: these tests only ask mesh names.
	if err := os.WriteFile(resolv, []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ca, err := testenv.NewCA("aether-test-mesh-ca")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.key"), ca.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	tools := testenv.RequireTools(t, testenv.ToolEnvoy)
	a := &agentProc{done: make(chan struct{}), health: fmt.Sprintf("127.0.0.1:%d", healthPort),
		metrics: fmt.Sprintf("127.0.0.1:%d", metricsPort), debugSocket: filepath.Join(dir, "debug.sock"),
		dnsAddr: fmt.Sprintf("127.0.0.1:%d", dnsPort), logPath: filepath.Join(dir, "agent.log")}
	// The node source guard is a node netns table: only an agent in its own netns (o.wrap) may
	// write one; the others share the machine's.
	all := []string{
		"--node-source-guard=" + strconv.FormatBool(len(o.wrap) > 0),
		"--node-name", "node-1", "--cluster", "a", "--host-ip", "127.0.0.1",
		"--dns-port", strconv.Itoa(dnsPort), "--health-addr", a.health, "--metrics-addr", a.metrics,
		"--debug-socket", a.debugSocket, "--envoy-stats-addr", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		"--state-dir", filepath.Join(dir, "state"), "--cni-socket", filepath.Join(dir, "cni.sock"),
		"--xds-socket", filepath.Join(dir, "xds.sock"), "--cluster-dns", "10.96.0.10",
		"--resolv-conf", resolv, "--registry-lease-ttl", "5s", "--log-level", "debug",
	}
	if o.spireAdmin != "" {
		all = append(all, "--identity-source=spire", "--spire-admin-socket", o.spireAdmin)
	} else {
		all = append(all, "--ca-cert", filepath.Join(dir, "ca.crt"), "--ca-key", filepath.Join(dir, "ca.key"))
	}
	all = append(append(all, "--envoy-binary", tools.Envoy, "--envoy-admin", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))), args...)
	a.envoyAdmin = all[len(all)-len(args)-1]
	a.stateDir = filepath.Join(dir, "state")
	a.cniSocket = filepath.Join(dir, "cni.sock")
	a.client = o.client
	if a.client == nil {
		a.client = http.DefaultClient
	}
	a.argv = append(append(append([]string{}, o.wrap...), buildAgent(t)), all...)
	a.run(t)
	t.Cleanup(func() {
		testenv.Terminate(a.cmd, a.done, 15*time.Second)
		// Envoy outlives the agent by design: stop every Envoy started for this agent.
		for _, pid := range a.envoyProcesses() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if t.Failed() {
			b, _ := os.ReadFile(a.logPath)
			t.Logf("agent log:\n%s", tailString(string(b), 12000))
		}
	})
	return a
}

// run starts the agent process from a.argv, appending to its log.
func (a *agentProc) run(t testing.TB) {
	t.Helper()
	a.cmd = exec.Command(a.argv[0], a.argv[1:]...)
	logf, err := os.OpenFile(a.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	if err := testenv.StartCmd(a.cmd); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	a.done = done
	cmd := a.cmd
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
}

// killAndRestart kills the agent with SIGKILL (no shutdown code runs) and starts it again with
// the same flags, state directory and ports.
func (a *agentProc) killAndRestart(t testing.TB) {
	t.Helper()
	_ = a.cmd.Process.Kill()
	<-a.done
	a.run(t)
}

// envoyPID returns the pid in the agent's Envoy pid file (0 when there is none).
func (a *agentProc) envoyPID() int {
	b, err := os.ReadFile(filepath.Join(a.stateDir, "envoy", "envoy.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// envoyProcesses returns the pids of the running Envoy processes started for this agent (their
// command line names a file in its state directory).
func (a *agentProc) envoyProcesses() []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if strings.HasSuffix(args[0], "envoy") && strings.Contains(string(b), a.stateDir+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

func tailString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// waitReady waits up to d until /readyz answers 200.
func (a *agentProc) waitReady(t testing.TB, d time.Duration, what string) {
	t.Helper()
	testenv.Eventually(t, d, what, func() error {
		if code, body := a.get("/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz %d: %s", code, body)
		}
		return nil
	})
}

// waitDegraded waits up to a minute until /readyz answers 503 naming source.
func (a *agentProc) waitDegraded(t testing.TB, source string) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, "readiness naming "+source, func() error {
		if code, body := a.get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, source) {
			return fmt.Errorf("/readyz %d: %s", code, body)
		}
		return nil
	})
}

// get returns the status and body of a health endpoint.
func (a *agentProc) get(path string) (int, string) { return a.getAt(a.health, path) }

// getMetrics returns the status and body of the metrics endpoint's /metrics.
func (a *agentProc) getMetrics() (int, string) { return a.getAt(a.metrics, "/metrics") }

// debug returns the status and body of a --debug-socket path (over the unix socket).
func (a *agentProc) debug(path string) (int, string) {
	c, base := envoy.AdminClient("unix://" + a.debugSocket)
	c.Timeout = time.Minute
	resp, err := c.Get(base + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// getAt returns the status and body of GET http://addr/path.
func (a *agentProc) getAt(addr, path string) (int, string) {
	resp, err := a.client.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric returns the value of an unlabelled metric from /metrics.
func (a *agentProc) metric(name string) float64 {
	_, body := a.getMetrics()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` ([0-9.e+]+)$`).FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// lookup asks the agent's resolver for name's A records; it returns the rcode and the addresses.
func (a *agentProc) lookup(name string) (int, []string) { return a.lookupAt(a.dnsAddr, name) }

// lookupAt is lookup through the resolver address addr (host:port).
func (a *agentProc) lookupAt(addr, name string) (int, []string) {
	c := &dns.Client{Timeout: 2 * time.Second}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		return -1, nil
	}
	var ips []string
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			ips = append(ips, a.A.String())
		}
	}
	return r.Rcode, ips
}

// envoy GETs a path from the supervised Envoy's admin API.
func (a *agentProc) envoy(path string) string {
	resp, err := a.client.Get("http://" + a.envoyAdmin + path)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// envoyHas waits-friendly checks that an admin page contains (or lacks) a string.
func (a *agentProc) envoyHas(path, want string, present bool) func() error {
	return func() error {
		if body := a.envoy(path); strings.Contains(body, want) != present {
			return fmt.Errorf("envoy %s: contains %q = %v, want %v", path, want, !present, present)
		}
		return nil
	}
}

// TestAgentModelFollowsSources runs the real agent binary against a real kube-apiserver and a real
// etcd registry and checks, through its DNS answers, Envoy's clusters, readiness and metrics,
// that the model follows Kubernetes and the registry (Services, ServiceImports and endpoints
// appear and go), survives an API server outage and a registry outage with the last model, and
// converges after each returns (a Service created after the API outage, an endpoint registered
// during the registry outage).
func TestAgentModelFollowsSources(t *testing.T) {
	api, etcd, cs := startSources(t)
	regProxy := testenv.NewCutProxy(t, strings.TrimPrefix(etcd.Endpoints[0], "http://"))
	mcs := mcsclient.NewForConfigOrDie(api.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{model.LabelRegion: "eu"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	// The Node's region label is eu, but with no --region the agent registers under region
	// "default", the registrar's default, inside the partition the registrar claims (not under
	// regions/eu/...), and in zone eu-1 (no zone label).
	a := startAgent(t, "--kubeconfig", api.Kubeconfig, "--registry-endpoints", regProxy.URL(), "--host-ip-v6", "::1",
		"--zone", "eu-1")
	a.waitReady(t, 60*time.Second, "agent ready")

	// A local mesh Service: its name answers with its ClusterIP.
	web, err := cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantA := func(name, ip string) func() error {
		return func() error {
			rc, ips := a.lookup(name)
			if rc != dns.RcodeSuccess || len(ips) != 1 || ips[0] != ip {
				return fmt.Errorf("%s: rcode %d, A %v; want %s", name, rc, ips, ip)
			}
			return nil
		}
	}
	wantNX := func(name string) func() error {
		return func() error {
			if rc, ips := a.lookup(name); rc != dns.RcodeNameError {
				return fmt.Errorf("%s: rcode %d, A %v; want NXDOMAIN", name, rc, ips)
			}
			return nil
		}
	}
	testenv.Eventually(t, 30*time.Second, "web.shop.mesh", wantA("web.shop.mesh", web.Spec.ClusterIP))
	testenv.Eventually(t, 30*time.Second, "web.mesh", wantA("web.mesh", web.Spec.ClusterIP))
	// The resolver also answers on the node's IPv6 address (--host-ip-v6).
	_, dnsPort, _ := net.SplitHostPort(a.dnsAddr)
	if rc, ips := a.lookupAt(net.JoinHostPort("::1", dnsPort), "web.shop.mesh"); rc != dns.RcodeSuccess || len(ips) != 1 || ips[0] != web.Spec.ClusterIP {
		t.Errorf("web.shop.mesh through [::1]:%s: rcode %d, A %v; want %s", dnsPort, rc, ips, web.Spec.ClusterIP)
	}
	testenv.Eventually(t, 30*time.Second, "web's EDS cluster in Envoy", a.envoyHas("/clusters", "web.shop.mesh:80::", true))
	// Locality: endpoints another node of this cluster registers under the same origin region
	// come first in this node's zone (priority 0), then in another zone (priority 1), whatever
	// the Node's region label says.
	peer, err := registry.New(registry.Config{Endpoints: etcd.Endpoints, Region: "default", Cluster: "a", LeaseTTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	for i, zone := range []string{"eu-1", "eu-2"} {
		uid := fmt.Sprintf("web-uid-%d", i)
		if err := peer.RegisterEndpoint(ctx, &registryv1.ServiceEndpoint{
			Service: &registryv1.ServiceRef{Namespace: "shop", Name: "web"}, Addresses: []string{fmt.Sprintf("10.244.7.%d", i+1)},
			Ports: []*registryv1.EndpointPort{{Name: "http", Port: 80, Protocol: registryv1.Protocol_PROTOCOL_HTTP}}, Zone: zone,
			SpiffeId: "spiffe://aether.internal/ns/shop/sa/web", Health: registryv1.Health_HEALTH_HEALTHY,
			Kubernetes: &registryv1.KubernetesMetadata{NodeName: "node-2", PodName: "web-" + zone, PodUid: uid, NodeIp: "172.30.0.12"},
		}); err != nil {
			t.Fatal(err)
		}
		defer peer.DeregisterEndpoint(ctx, "shop", "web", uid)
	}
	testenv.Eventually(t, 30*time.Second, "web's same-zone endpoint at priority 0", a.envoyHas("/clusters", "web.shop.mesh:80::10.244.7.1:15008::priority::0", true))
	testenv.Eventually(t, 30*time.Second, "web's other-zone endpoint at priority 1", a.envoyHas("/clusters", "web.shop.mesh:80::10.244.7.2:15008::priority::1", true))

	// A Service the model cannot hold in full (80/SCTP beside 80/TCP): the SCTP port is left out,
	// counted in aether_agent_model_skipped_fields and logged once, not on every later rebuild.
	if _, err := cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "odd"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}, {Name: "sctp", Port: 80, Protocol: corev1.ProtocolSCTP}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "odd's SCTP port counted as skipped", func() error {
		if got := a.metric("aether_agent_model_skipped_fields"); got != 1 {
			return fmt.Errorf("aether_agent_model_skipped_fields = %v, want 1", got)
		}
		return nil
	})
	testenv.Eventually(t, 30*time.Second, "odd's cluster in Envoy", a.envoyHas("/clusters", "odd.shop.mesh:80::", true))
	other, err := cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "other"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "other.shop.mesh (a later rebuild)", wantA("other.shop.mesh", other.Spec.ClusterIP))
	if logged, err := os.ReadFile(a.logPath); err != nil {
		t.Fatal(err)
	} else if n := strings.Count(string(logged), "left out of the mesh model"); n != 1 {
		t.Errorf("the skipped SCTP port was logged %d times over several rebuilds, want once", n)
	}
	for _, name := range []string{"odd", "other"} {
		if err := cs.CoreV1().Services("shop").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 30*time.Second, "nothing skipped once odd is gone", func() error {
		if got := a.metric("aether_agent_model_skipped_fields"); got != 0 {
			return fmt.Errorf("aether_agent_model_skipped_fields = %v, want 0", got)
		}
		return nil
	})
	// The agent's metrics: model version, model build time, last successful push, events by source.
	for name, want := range map[string]float64{
		"aether_agent_model_version":                            2,
		"aether_agent_model_build_seconds_count":                2,
		"aether_agent_last_push_timestamp_seconds":              float64(began.Unix()),
		`aether_agent_source_events_total{source="kubernetes"}`: 1,
	} {
		if got := a.metric(name); got < want {
			t.Errorf("%s = %v, want at least %v", name, got, want)
		}
	}
	if _, body := a.getMetrics(); !regexp.MustCompile(`aether_agent_build_info\{commit_time="[^"]*",go_version="go[^"]+",revision="[^"]*",started="[^"]+"\} 1`).MatchString(body) {
		t.Errorf("no aether_agent_build_info with the build's labels in /metrics")
	}
	// Each endpoint carries only its own: the metrics port nothing but /metrics, the health port
	// no metrics and no profiles, the profiles only on the 0600 debug socket (docs/agent.md).
	if code, _ := a.getAt(a.metrics, "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("--metrics-addr /debug/pprof/: %d, want 404", code)
	}
	if code, _ := a.getAt(a.metrics, "/readyz"); code != http.StatusNotFound {
		t.Errorf("--metrics-addr /readyz: %d, want 404", code)
	}
	if code, _ := a.get("/metrics"); code != http.StatusNotFound {
		t.Errorf("--health-addr /metrics: %d, want 404", code)
	}
	if code, _ := a.get("/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("--health-addr /debug/pprof/: %d, want 404", code)
	}
	if code, body := a.debug("/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("--debug-socket /debug/pprof/: %d %.100q", code, body)
	}
	if fi, err := os.Stat(a.debugSocket); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("--debug-socket mode: %v %v, want 0600", fi, err)
	}

	// Cluster b exports pay and registers an endpoint; cluster a imports it.
	b, err := registry.New(registry.Config{Endpoints: etcd.Endpoints, Region: "eu", Cluster: "b", LeaseTTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Export(ctx, &registryv1.ExportMark{Service: &registryv1.ServiceRef{Namespace: "shop", Name: "pay"},
		Ports:      []*registryv1.ServicePort{{Name: "grpc", Port: 9000, TargetPort: 9090, Protocol: registryv1.Protocol_PROTOCOL_GRPC}},
		CreateTime: time.Now().UTC().Format(time.RFC3339Nano)}); err != nil {
		t.Fatal(err)
	}
	if _, err := mcs.MulticlusterV1beta1().ServiceImports("shop").Create(ctx, &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Name: "pay"},
		Spec: mcsv1beta1.ServiceImportSpec{Type: mcsv1beta1.ClusterSetIP, IPs: []string{"10.96.77.7"}, Ports: []mcsv1beta1.ServicePort{{Name: "grpc", Port: 9000, Protocol: corev1.ProtocolTCP}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "pay clusterset name", wantA("pay.shop.svc.clusterset.local", "10.96.77.7"))
	if err := b.RegisterEndpoint(ctx, &registryv1.ServiceEndpoint{
		Service: &registryv1.ServiceRef{Namespace: "shop", Name: "pay"}, Addresses: []string{"10.245.9.9"},
		Ports:    []*registryv1.EndpointPort{{Name: "grpc", Port: 9090, Protocol: registryv1.Protocol_PROTOCOL_GRPC}},
		SpiffeId: "spiffe://aether.internal/ns/shop/sa/pay", Health: registryv1.Health_HEALTH_HEALTHY,
		Kubernetes: &registryv1.KubernetesMetadata{NodeName: "b-node-1", PodName: "pay-1", PodUid: "pay-uid-1", NodeIp: "172.30.1.11"},
	}); err != nil {
		t.Fatal(err)
	}
	// Cluster b's endpoint reaches Envoy's EDS (direct to the pod's inbound port: no waypoint).
	testenv.Eventually(t, 30*time.Second, "pay's remote endpoint in Envoy", a.envoyHas("/clusters", "pay.shop.mesh:9000::10.245.9.9:15008::", true))
	if err := b.DeregisterEndpoint(ctx, "shop", "pay", "pay-uid-1"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "pay's endpoint gone from Envoy", a.envoyHas("/clusters", "10.245.9.9:15008", false))

	// Deleting the Service removes its names.
	if err := cs.CoreV1().Services("shop").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "web.shop.mesh gone", wantNX("web.shop.mesh"))
	testenv.Eventually(t, 30*time.Second, "web's cluster gone from Envoy", a.envoyHas("/clusters", "web.shop.mesh:80::", false))
	if stats := a.envoy("/stats?filter=update_rejected"); regexp.MustCompile(`update_rejected: [1-9]`).MatchString(stats) {
		t.Fatalf("Envoy rejected an update:\n%s", stats)
	}

	// API server outage: readiness degrades with the reason; DNS keeps answering the last model.
	api.StopAPIServer()
	a.waitDegraded(t, "kubernetes")
	if err := wantA("pay.shop.svc.clusterset.local", "10.96.77.7")(); err != nil {
		t.Fatalf("during the API outage: %v", err)
	}
	if err := api.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	api2, err := cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "api"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, "a Service created after the outage", wantA("api.shop.mesh", api2.Spec.ClusterIP))
	a.waitReady(t, 60*time.Second, "ready again")

	// Registry outage: the last model stays; readiness names the registry.
	regProxy.Cut()
	a.waitDegraded(t, "registry")
	if err := wantA("pay.shop.svc.clusterset.local", "10.96.77.7")(); err != nil {
		t.Fatalf("during the registry outage: %v", err)
	}
	// Meanwhile cluster b (which reaches etcd itself) registers another endpoint of pay.
	if err := b.RegisterEndpoint(ctx, &registryv1.ServiceEndpoint{
		Service: &registryv1.ServiceRef{Namespace: "shop", Name: "pay"}, Addresses: []string{"10.245.9.10"},
		Ports:    []*registryv1.EndpointPort{{Name: "grpc", Port: 9090, Protocol: registryv1.Protocol_PROTOCOL_GRPC}},
		SpiffeId: "spiffe://aether.internal/ns/shop/sa/pay", Health: registryv1.Health_HEALTH_HEALTHY,
		Kubernetes: &registryv1.KubernetesMetadata{NodeName: "b-node-1", PodName: "pay-2", PodUid: "pay-uid-2", NodeIp: "172.30.1.11"},
	}); err != nil {
		t.Fatal(err)
	}
	regProxy.Restore()
	a.waitReady(t, 60*time.Second, "ready after the registry returns")
	// The model converges: the endpoint registered during the outage reaches Envoy.
	testenv.Eventually(t, 60*time.Second, "pay's endpoint registered during the outage in Envoy", a.envoyHas("/clusters", "pay.shop.mesh:9000::10.245.9.10:15008::", true))

	// Deleting the ServiceImport removes the clusterset name and the imported service's cluster.
	if err := mcs.MulticlusterV1beta1().ServiceImports("shop").Delete(ctx, "pay", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "pay's clusterset name gone", wantNX("pay.shop.svc.clusterset.local"))
	testenv.Eventually(t, 30*time.Second, "pay's cluster gone from Envoy", a.envoyHas("/clusters", "pay.shop.mesh:9000::", false))

	// A storm of 1000 Service changes is coalesced into few rebuilds.
	before := a.metric("aether_agent_model_rebuilds_total")
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for w := 0; w < 20; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < 1000; i += 20 {
				_, err := cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("storm-%d", i)},
					Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
				if err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	took := time.Since(start)
	testenv.Eventually(t, 60*time.Second, "the last storm Service", func() error {
		if rc, _ := a.lookup("storm-999.shop.mesh"); rc != dns.RcodeSuccess {
			return fmt.Errorf("rcode %d", rc)
		}
		return nil
	})
	time.Sleep(time.Second) // let a trailing rebuild land
	rebuilds := a.metric("aether_agent_model_rebuilds_total") - before
	elapsed := time.Since(start)
	t.Logf("1000 Service creations over %s caused %.0f model rebuilds", took.Round(time.Millisecond), rebuilds)
	// The coalescer's contract: two rebuilds are at least its quiet period (50 ms) apart, so the
	// count is bounded by the time the storm took, whatever the API server's pace; and a storm of
	// 1000 changes never costs 1000 rebuilds. (How many it costs on an idle machine is a number
	// for the note, not an assertion: it depends on the load.)
	limit := float64(elapsed/(50*time.Millisecond)) + 2
	if rebuilds < 1 || rebuilds > limit || rebuilds >= 1000 {
		t.Errorf("1000 changes over %s caused %.0f rebuilds, want between 1 and %.0f (one per 50 ms at most) and fewer than 1000", elapsed, rebuilds, limit)
	}
}

// mustCreate fails the test on a create call's error (for client-go calls whose object the test
// does not need).
func mustCreate(t testing.TB) func(any, error) {
	return func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// createNodeAndMeshNamespace creates Node node-1 (InternalIP 127.0.0.1), the meshed namespace
// shop and the given service accounts in it: what every agent test's node needs.
func createNodeAndMeshNamespace(t testing.TB, ctx context.Context, cs kubernetes.Interface, serviceAccounts ...string) {
	t.Helper()
	must := mustCreate(t)
	must(cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}}}, metav1.CreateOptions{}))
	must(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop",
		Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}, metav1.CreateOptions{}))
	for _, sa := range serviceAccounts {
		must(cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}))
	}
}

// TestHelpAndBadFlags: the real binary prints its usage, with each flag's environment variable,
// and exits 0 on --help; an unknown flag, an unreadable variable or two node ports with one
// number exits 2 naming them.
func TestHelpAndBadFlags(t *testing.T) {
	bin := buildAgent(t)
	out, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("aether-agent --help: %v\n%s", err, out)
	}
	for _, want := range []string{"-node-name", "(env NODE_NAME)", "-region", "(env AETHER_REGION)", "-capture-backend", "(env AETHER_CAPTURE_BACKEND)",
		"-host-ips string", "(env HOST_IPS)",
		"-dns-cache-size int", "(env AETHER_DNS_CACHE_SIZE)", "-dns-cache-max-ttl duration", "(env AETHER_DNS_CACHE_MAX_TTL)",
		"-dns-cache-max-negative-ttl duration", "(env AETHER_DNS_CACHE_MAX_NEGATIVE_TTL)",
		"-dns-cache-serve-stale duration", "(env AETHER_DNS_CACHE_SERVE_STALE)", "-dns-cache-prefetch int", "(env AETHER_DNS_CACHE_PREFETCH)",
		// The registry client flags (internal/registryflag), as the agent printed them before
		// they were shared with the registrar.
		"-registry-endpoints string\n    \tcomma-separated etcd client URLs of the registry (env AETHER_REGISTRY_ENDPOINTS)\n",
		"-registry-ca string\n    \tCA bundle for the registry's TLS (env AETHER_REGISTRY_CA)\n",
		"-registry-cert string\n    \tclient certificate for the registry (env AETHER_REGISTRY_CERT)\n",
		"-registry-key string\n    \tclient key for the registry (env AETHER_REGISTRY_KEY)\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("aether-agent --help lacks %q:\n%s", want, out)
		}
	}
	for _, c := range []struct {
		args []string
		env  string
		want string
	}{
		{args: []string{"--no-such-flag"}, want: "no-such-flag"},
		{env: "AETHER_EAST_WEST_WAYPOINT=yes", want: `env AETHER_EAST_WEST_WAYPOINT "yes"`},
		{args: []string{"--dns-port", "15008"}, want: "--dns-port and the inbound mTLS port are both 15008"},
		{args: []string{"--envoy-admin", "127.0.0.1:9000", "--health-addr", ":9000"}, want: "--envoy-admin and --health-addr are both 9000"},
	} {
		cmd := exec.Command(bin, c.args...)
		cmd.Env = append(os.Environ(), c.env)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("aether-agent %v with %s: %v, want exit status 2 and %q in:\n%s", c.args, c.env, err, c.want, out)
		}
	}
}

// TestAgentDNSBeforeRegistry: the agent's resolver listens before the agent waits for the
// registry, and until the first model it forwards names that cannot be mesh names: with the
// registry unreachable at start (an agent restarted during a registry outage) the node's pods
// still get their cluster and external names forwarded, and mesh names answer SERVFAIL without
// reaching an upstream. Before, nothing listened until the registry answered.
func TestAgentDNSBeforeRegistry(t *testing.T) {
	api, _, cs := startSources(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	createNodeAndMeshNamespace(t, ctx, cs)
	dead := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	a := startAgent(t, "--kubeconfig", api.Kubeconfig, "--registry-endpoints", dead)
	// The upstream (127.0.0.1:53 from the test's resolv.conf) refuses: a forwarded query is
	// counted as a network failure of that upstream, a query answered locally is not.
	forwarded := func() float64 {
		_, body := a.getMetrics()
		var n float64
		for _, m := range regexp.MustCompile(`(?m)^aether_dns_upstream_failures_total\{[^}]*upstream="127\.0\.0\.1:53"[^}]*\} ([0-9.e+]+)$`).FindAllStringSubmatch(body, -1) {
			v, _ := strconv.ParseFloat(m[1], 64)
			n += v
		}
		return n
	}
	testenv.Eventually(t, 60*time.Second, "the resolver answers", func() error {
		if rcode, _ := a.lookup("example.org"); rcode != dns.RcodeServerFailure {
			return fmt.Errorf("example.org: rcode %d, want SERVFAIL from the refusing upstream", rcode)
		}
		return nil
	})
	if code, body := a.get("/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz %d with the registry unreachable: %s", code, body)
	}
	before := forwarded()
	if before < 1 {
		t.Errorf("example.org was not forwarded before the first model (upstream failures %v)", before)
	}
	if rcode, _ := a.lookup("web.shop.mesh"); rcode != dns.RcodeServerFailure {
		t.Errorf("web.shop.mesh before the first model: rcode %d, want SERVFAIL", rcode)
	}
	if rcode, _ := a.lookup("kubernetes.default.svc.cluster.local"); rcode != dns.RcodeServerFailure {
		t.Errorf("kubernetes.default.svc.cluster.local: rcode %d, want SERVFAIL from the refusing upstream", rcode)
	}
	if got := forwarded(); got != before+1 {
		t.Errorf("upstream failures went from %v to %v; want one more (the cluster name forwarded, the mesh name not)", before, got)
	}
}
