package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/registrar"
)

// TestMain runs the command itself when AETHER_REGISTRAR_MAIN=1, so tests start the real
// aether-registrar (flags, env, main, run) as a child process without a separate build.
func TestMain(m *testing.M) {
	if os.Getenv("AETHER_REGISTRAR_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// proc is a running aether-registrar child process.
type proc struct {
	cmd    *exec.Cmd
	health string
	done   chan error
	log    string
}

func startProc(t testing.TB, args ...string) *proc {
	t.Helper()
	health := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	logPath := filepath.Join(t.TempDir(), "registrar.log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], append([]string{"--health-addr", health, "--metrics-addr", "0"}, args...)...)
	cmd.Env = append(os.Environ(), "AETHER_REGISTRAR_MAIN=1")
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, health: health, done: make(chan error, 1), log: logPath}
	go func() { p.done <- cmd.Wait(); f.Close() }()
	t.Cleanup(func() {
		if p.stop() != nil || t.Failed() {
			b, _ := os.ReadFile(logPath)
			s := string(b)
			if len(s) > 4000 {
				s = s[len(s)-4000:]
			}
			t.Logf("registrar log (tail):\n%s", s)
		}
	})
	return p
}

// stop sends SIGTERM and returns the exit error (nil for status 0).
func (p *proc) stop() error {
	if p.cmd.ProcessState != nil {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		return errors.New("did not stop within 30s of SIGTERM")
	}
}

func (p *proc) ready() error {
	resp, err := http.Get("http://" + p.health + "/readyz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz: %s", resp.Status)
	}
	return nil
}

// memory returns the process's resident set size and its peak (VmRSS, VmHWM), in bytes.
func (p *proc) memory() (rss, peak int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			rss = kb * 1024
		case "VmHWM:":
			peak = kb * 1024
		}
	}
	return rss, peak, sc.Err()
}

func kubeClient(t testing.TB, api *testenv.KubeAPIServer) client.Client {
	s := runtime.NewScheme()
	if err := errors.Join(clientgoscheme.AddToScheme(s), mcsv1beta1.Install(s)); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(api.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"aether-system", "apps"} {
		if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func exportService(ctx context.Context, c client.Client, ns, name string) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if err := c.Create(ctx, svc); err != nil {
		return err
	}
	return c.Create(ctx, &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
}

// TestBinarySingleMachineEmbeddedRegistry runs the real command the single-machine way: no
// --registry-endpoints, so it embeds etcd in --registry-data-dir. An export in its cluster becomes
// a ServiceImport there, /readyz answers 200 and SIGTERM stops it with status 0.
func TestBinarySingleMachineEmbeddedRegistry(t *testing.T) {
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	testenv.InstallCRDs(t, api.Config, "deploy/crds")
	c := kubeClient(t, api)
	p := startProc(t, "--cluster", "solo", "--kubeconfig", api.Kubeconfig,
		"--registry-data-dir", filepath.Join(t.TempDir(), "registry"),
		"--registry-listen", fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t)),
		"--registry-peer-listen", fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t)),
		"--leader-elect-namespace", "aether-system")
	testenv.Eventually(t, 60*time.Second, "/readyz", p.ready)
	ctx := context.Background()
	if err := exportService(ctx, c, "apps", "web"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "ServiceImport apps/web with its VIP", func() error {
		var si mcsv1beta1.ServiceImport
		if err := c.Get(ctx, client.ObjectKey{Namespace: "apps", Name: "web"}, &si); err != nil {
			return err
		}
		if len(si.Spec.IPs) != 1 || len(si.Status.Clusters) != 1 || si.Status.Clusters[0].Cluster != "solo" {
			return fmt.Errorf("import %+v", si.Spec)
		}
		return nil
	})
	if err := p.stop(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
}

// TestHelpAndBadFlags: the command and its setup-registry-auth and reclaim-partition subcommands
// print their usage, with each flag's environment variable, and exit 0 on --help; an unknown
// flag exits 2 naming it.
func TestHelpAndBadFlags(t *testing.T) {
	run := func(args ...string) (string, error) {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), "AETHER_REGISTRAR_MAIN=1")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("--help")
	if err != nil {
		t.Fatalf("aether-registrar --help: %v\n%s", err, out)
	}
	// The registry client flags (internal/registryflag), as each command printed them before
	// they were shared with the agent.
	registryFlags := func(endpoints, cert string) []string {
		return []string{
			"-registry-endpoints string\n    \t" + endpoints + " (env AETHER_REGISTRY_ENDPOINTS)\n",
			"-registry-ca string\n    \tCA bundle for the registry's TLS (env AETHER_REGISTRY_CA)\n",
			"-registry-cert string\n    \t" + cert + " (env AETHER_REGISTRY_CERT)\n",
			"-registry-key string\n    \tclient key for the registry (env AETHER_REGISTRY_KEY)\n",
		}
	}
	for _, want := range append([]string{"-cluster", "(env AETHER_CLUSTER)", "aether-registrar " + registrar.SetupAuthCommand + " [flags]", "aether-registrar " + registrar.ReclaimCommand + " [flags]"},
		registryFlags("comma-separated etcd client URLs of the registry; empty: run an embedded single-member etcd", "client certificate for the registry")...) {
		if !strings.Contains(out, want) {
			t.Errorf("aether-registrar --help lacks %q:\n%s", want, out)
		}
	}
	out, err = run(registrar.SetupAuthCommand, "--help")
	if err != nil {
		t.Fatalf("aether-registrar %s --help: %v\n%s", registrar.SetupAuthCommand, err, out)
	}
	for _, want := range registryFlags("comma-separated etcd client URLs of the registry", "client certificate for the registry (with --client-cert-auth, CN root)") {
		if !strings.Contains(out, want) {
			t.Errorf("aether-registrar %s --help lacks %q:\n%s", registrar.SetupAuthCommand, want, out)
		}
	}
	out, err = run(registrar.ReclaimCommand, "--help")
	if err != nil {
		t.Fatalf("aether-registrar %s --help: %v\n%s", registrar.ReclaimCommand, err, out)
	}
	for _, want := range []string{"-previous-cluster-id string", "-cluster string", "(env AETHER_CLUSTER)", "-registry-user string", "-timeout duration"} {
		if !strings.Contains(out, want) {
			t.Errorf("aether-registrar %s --help lacks %q:\n%s", registrar.ReclaimCommand, want, out)
		}
	}
	out, err = run("--no-such-flag")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(out, "no-such-flag") {
		t.Errorf("aether-registrar --no-such-flag: %v, want exit status 2 naming the flag:\n%s", err, out)
	}
}

// TestBinaryEmbeddedRegistryServesWhileAPIServerDown: in the single-machine shape the embedded
// registry is every cluster's, so it serves as soon as the registrar starts, also while this
// cluster's API server does not answer yet, and for as long as it does not answer: the
// registrar waits for its cluster ID past --cluster-id-timeout instead of exiting with the
// registry. Before, the etcd was started only after the cluster ID was read (a host cluster
// whose API server came up late kept the registry of the whole clusterset down), and then the
// registrar exited after 2 minutes, taking the registry down. A registrar with an external
// registry (here the embedded one) still exits after --cluster-id-timeout, naming kube-system.
func TestBinaryEmbeddedRegistryServesWhileAPIServerDown(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	// An API server address nothing listens on.
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: down, cluster: {server: "https://127.0.0.1:%d", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: down, user: u}}]
current-context: c
`, testenv.FreePort(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	listen := fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t))
	host := startProc(t, "--cluster", "solo", "--kubeconfig", kubeconfig, "--cluster-id-timeout", "1s",
		"--registry-data-dir", filepath.Join(dir, "registry"), "--registry-listen", listen,
		"--registry-peer-listen", fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t)))
	cli := etcdClient(t, listen)
	testenv.Eventually(t, 60*time.Second, "embedded registry answers", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := cli.Get(ctx, "/aether/v1/regions/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err
	})

	// A registrar of another cluster using that registry as an external one gives up on its
	// cluster ID after --cluster-id-timeout and exits, naming the Namespace.
	other := startProc(t, "--cluster", "other", "--kubeconfig", kubeconfig, "--cluster-id-timeout", "1s",
		"--registry-endpoints", listen)
	select {
	case err := <-other.done:
		other.done <- err
		if log, _ := os.ReadFile(other.log); err == nil || !strings.Contains(string(log), "kube-system") {
			t.Errorf("registrar with an external registry and no cluster ID: exit %v, want an error naming kube-system; log:\n%s", err, log)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("registrar with an external registry still waits for its cluster ID 2 minutes after --cluster-id-timeout 1s")
	}
	// By then the embedded registry's registrar has waited past its own 1 s as long: it is
	// still running and its registry still answers.
	select {
	case err := <-host.done:
		host.done <- err
		t.Fatalf("registrar with the embedded registry exited while waiting for its cluster ID: %v", err)
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Get(ctx, "/aether/v1/regions/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		t.Errorf("embedded registry after its registrar's --cluster-id-timeout: %v", err)
	}
}

// etcdClient is a client of the etcd at url (an embedded registry's --registry-listen), closed
// when the test ends.
func etcdClient(t *testing.T, url string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
