package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// KubeAPIServerOptions tune StartKubeAPIServer.
type KubeAPIServerOptions struct {
	// Dir holds certificates, etcd data and logs; it must exist.
	Dir string
	// ServiceCIDR is --service-cluster-ip-range (default 10.96.0.0/16).
	ServiceCIDR string
	// ExtraArgs are appended to kube-apiserver's flags.
	ExtraArgs []string
	// ExtraIPs and ExtraNames are added to the serving certificate's subject alternative names
	// (besides localhost, kubernetes, kubernetes.default.svc and 127.0.0.1): the addresses
	// clients elsewhere reach it at, such as the kubernetes Service's ClusterIP.
	ExtraIPs   []net.IP
	ExtraNames []string
	// KubeletClient gives the API server a client certificate for its connections to kubelets
	// (--kubelet-client-certificate: CN kube-apiserver-kubelet-client, group system:masters, as
	// kubeadm issues it), signed by CA, which kubelets trust as their client CA.
	KubeletClient bool
	// AuthorizationModes is --authorization-mode (default RBAC).
	AuthorizationModes []string
}

// KubeAPIServer is a real kube-apiserver with its own etcd process, both on loopback.
type KubeAPIServer struct {
	// Config authenticates as an admin (group system:masters) with a client certificate.
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file holding Config.
	Kubeconfig string
	// EtcdEndpoint is the backing etcd's client URL.
	EtcdEndpoint string
	Dir          string
	// CA signs the serving certificate and is the --client-ca-file: certificates it issues
	// authenticate as their CN (user) and O (groups).
	CA *CA

	procs []*exec.Cmd
	waits []chan struct{}
	// apiserver's command line, kept for RestartAPIServer.
	apiBin  string
	apiArgs []string
	hc      *http.Client
}

// StartKubeAPIServer starts the cached etcd and kube-apiserver binaries (hack/tools.sh) with a fresh
// CA, serving certificate, admin client certificate and service-account keys under opts.Dir, and
// waits (up to ctx's deadline) until /readyz answers 200. Stop it with Stop. Logs are etcd.log and
// kube-apiserver.log in opts.Dir.
func StartKubeAPIServer(ctx context.Context, opts KubeAPIServerOptions) (*KubeAPIServer, error) {
	tl, err := FindTools()
	if err != nil {
		return nil, err
	}
	for _, p := range []string{tl.Etcd, tl.KubeAPIServer} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("start kube-apiserver: %s is missing; install it with: %s", p, InstallHint)
		}
	}
	if opts.ServiceCIDR == "" {
		opts.ServiceCIDR = "10.96.0.0/16"
	}
	authzModes := "RBAC"
	if len(opts.AuthorizationModes) > 0 {
		authzModes = strings.Join(opts.AuthorizationModes, ",")
	}
	d := opts.Dir
	s := &KubeAPIServer{Dir: d}
	ca, err := NewCA("aether-test-kube-ca")
	if err != nil {
		return nil, err
	}
	s.CA = ca
	names := append([]string{"localhost", "kubernetes", "kubernetes.default.svc"}, opts.ExtraNames...)
	servCert, servKey, err := ca.Issue("kube-apiserver", nil, names, append([]net.IP{net.IPv4(127, 0, 0, 1)}, opts.ExtraIPs...))
	if err != nil {
		return nil, err
	}
	admCert, admKey, err := ca.Issue("aether-test-admin", []string{"system:masters"}, nil, nil)
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saKeyPEM, err := keyPEM(saKey)
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"ca.crt": ca.CertPEM, "apiserver.crt": servCert, "apiserver.key": servKey,
		"sa.key": saKeyPEM, "sa.pub": pemBlock("PUBLIC KEY", saPubDER),
	}
	if opts.KubeletClient {
		kcCert, kcKey, err := ca.Issue("kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil)
		if err != nil {
			return nil, err
		}
		files["kubelet-client.crt"], files["kubelet-client.key"] = kcCert, kcKey
		opts.ExtraArgs = append([]string{"--kubelet-client-certificate", filepath.Join(d, "kubelet-client.crt"),
			"--kubelet-client-key", filepath.Join(d, "kubelet-client.key")}, opts.ExtraArgs...)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(d, name), b, 0o600); err != nil {
			return nil, err
		}
	}

	etcdClient, etcdPeer, port, err := freePorts3()
	if err != nil {
		return nil, err
	}
	s.EtcdEndpoint = fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peer := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	if err := s.start(filepath.Join(d, "etcd.log"), tl.Etcd,
		"--name", "default", "--data-dir", filepath.Join(d, "etcd"),
		"--listen-client-urls", s.EtcdEndpoint, "--advertise-client-urls", s.EtcdEndpoint,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "default="+peer, "--log-level", "warn",
		"--quota-backend-bytes", strconv.Itoa(2<<30),
		// A throwaway store: without fsync a loaded CI disk no longer stalls raft applies
		// until etcd answers "etcdserver: request timed out" (a CI run failed on it). A
		// killed etcd still loses nothing: the writes are in the page cache.
		"--unsafe-no-fsync"); err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, http.DefaultClient, s.EtcdEndpoint+"/health"); err != nil {
		s.Stop()
		return nil, fmt.Errorf("etcd for kube-apiserver: %w (log: %s)", err, filepath.Join(d, "etcd.log"))
	}
	args := []string{
		"--etcd-servers", s.EtcdEndpoint,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(port), "--cert-dir", d,
		"--tls-cert-file", filepath.Join(d, "apiserver.crt"), "--tls-private-key-file", filepath.Join(d, "apiserver.key"),
		"--client-ca-file", filepath.Join(d, "ca.crt"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", filepath.Join(d, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(d, "sa.key"),
		"--service-cluster-ip-range", opts.ServiceCIDR,
		"--authorization-mode", authzModes,
		"--endpoint-reconciler-type", "none",
		"--allow-privileged=true",
		"--v", "1",
	}
	args = append(args, opts.ExtraArgs...)
	s.apiBin, s.apiArgs = tl.KubeAPIServer, args
	if err := s.start(filepath.Join(d, "kube-apiserver.log"), tl.KubeAPIServer, args...); err != nil {
		s.Stop()
		return nil, err
	}
	s.Config = &rest.Config{
		Host:            fmt.Sprintf("https://127.0.0.1:%d", port),
		TLSClientConfig: rest.TLSClientConfig{CAData: ca.CertPEM, CertData: admCert, KeyData: admKey},
		QPS:             200, Burst: 400,
	}
	cert, err := tls.X509KeyPair(admCert, admKey)
	if err != nil {
		s.Stop()
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	s.hc = hc
	// Stop waiting when the API server exits (a bad flag ends it at once).
	wctx, wcancel := context.WithCancelCause(ctx)
	defer wcancel(nil)
	exited := s.waits[len(s.waits)-1] // read here: RestartAPIServer appends to s.waits later
	go func() {
		select {
		case <-exited:
			wcancel(fmt.Errorf("kube-apiserver exited"))
		case <-wctx.Done():
		}
	}()
	if err := waitHTTP(wctx, hc, s.Config.Host+"/readyz"); err != nil {
		if cause := context.Cause(wctx); cause != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w: %w", cause, err)
		}
		s.Stop()
		return nil, fmt.Errorf("kube-apiserver: %w (log: %s)", err, filepath.Join(d, "kube-apiserver.log"))
	}
	s.Kubeconfig = filepath.Join(d, "kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: s.Config.Host, CertificateAuthorityData: ca.CertPEM}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: admCert, ClientKeyData: admKey}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "admin"}
	kc.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*kc, s.Kubeconfig); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// StartTestKubeAPIServer is StartKubeAPIServer for a test: it fails the test (naming the install
// command when a binary is missing), waits up to 120 s for readiness and stops both processes
// when the test ends.
func StartTestKubeAPIServer(t testing.TB, opts KubeAPIServerOptions) *KubeAPIServer {
	t.Helper()
	RequireTools(t, ToolEtcd, ToolKubeAPIServer)
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	s, err := StartKubeAPIServer(ctx, opts)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(opts.Dir, "kube-apiserver.log"))
			t.Logf("kube-apiserver log (tail):\n%s", Tail(string(b), 6000))
		}
	})
	return s
}

// StopAPIServer terminates kube-apiserver alone (its etcd keeps the data), simulating an API
// outage; RestartAPIServer brings it back on the same address.
func (s *KubeAPIServer) StopAPIServer() {
	i := len(s.procs) - 1
	if i < 1 {
		return // only etcd runs
	}
	_ = s.procs[i].Process.Signal(syscall.SIGTERM)
	select {
	case <-s.waits[i]:
	case <-time.After(20 * time.Second):
		_ = s.procs[i].Process.Kill()
		<-s.waits[i]
	}
	s.procs, s.waits = s.procs[:i], s.waits[:i]
}

// RestartAPIServer starts kube-apiserver again with the same flags after StopAPIServer and waits
// until /readyz answers (up to ctx's deadline).
func (s *KubeAPIServer) RestartAPIServer(ctx context.Context) error {
	if len(s.procs) != 1 {
		return fmt.Errorf("restart kube-apiserver: it is running (or etcd is not)")
	}
	if err := s.start(filepath.Join(s.Dir, "kube-apiserver.log"), s.apiBin, s.apiArgs...); err != nil {
		return err
	}
	return waitHTTP(ctx, s.hc, s.Config.Host+"/readyz")
}

// Stop terminates kube-apiserver, then its etcd, waiting up to 20 s for each.
func (s *KubeAPIServer) Stop() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		_ = s.procs[i].Process.Signal(syscall.SIGTERM)
		select {
		case <-s.waits[i]:
		case <-time.After(20 * time.Second):
			_ = s.procs[i].Process.Kill()
			<-s.waits[i]
		}
	}
	s.procs, s.waits = nil, nil
}

func (s *KubeAPIServer) start(logPath, bin string, args ...string) error {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := StartCmd(cmd); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(done) }()
	s.procs = append(s.procs, cmd)
	s.waits = append(s.waits, done)
	return nil
}

func waitHTTP(ctx context.Context, hc *http.Client, url string) error {
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %s", url, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// freePorts3 reserves three ports (ReservePort) for the rest of the process: the API server and
// its etcd live as long as the test binary.
func freePorts3() (a, b, c int, err error) {
	var ports [3]int
	for i := range ports {
		if ports[i], _, err = ReservePort(); err != nil {
			return 0, 0, 0, err
		}
	}
	return ports[0], ports[1], ports[2], nil
}
