package registrar_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/registry/embedded"
)

// converge is the generous deadline for anything the tests wait on: several times the expected
// time (sub-second for an import, a lease duration plus a reconcile for a leader change, an etcd
// client reconnect for a registry outage).
const converge = 90 * time.Second

const (
	region      = "r1"
	systemNS    = "aether-system"
	registrarSA = "aether-registrar"
)

func testLogger(t testing.TB, name string) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("registrar", name)
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newScheme(t testing.TB) *runtime.Scheme {
	s := runtime.NewScheme()
	if err := errors.Join(clientgoscheme.AddToScheme(s), mcsv1beta1.Install(s)); err != nil {
		t.Fatal(err)
	}
	return s
}

// cluster is one real kube-apiserver with the MCS CRDs, the aether-system namespace and the
// registrar's RBAC from deploy/registrar applied.
type cluster struct {
	name string
	api  *testenv.KubeAPIServer
	c    client.Client
}

func newCluster(t testing.TB, name string) *cluster {
	t.Helper()
	return newClusterWithCRDs(t, name, "deploy/crds")
}

// newClusterWithCRDs is newCluster with the CRDs of crdDir (testenv.InstallCRDs) instead of
// every CRD aether ships.
func newClusterWithCRDs(t testing.TB, name, crdDir string) *cluster {
	t.Helper()
	api := testenv.StartTestKubeAPIServer(t, testenv.KubeAPIServerOptions{})
	testenv.InstallCRDs(t, api.Config, crdDir)
	c, err := client.New(api.Config, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	cl := &cluster{name: name, api: api, c: c}
	cl.createNS(t, systemNS)
	applyYAML(t, c, "deploy/registrar/rbac.yaml")
	return cl
}

// registrarConfig is the kube config the registrar runs with: impersonating its ServiceAccount,
// so it has exactly the permissions of deploy/registrar/rbac.yaml.
func (cl *cluster) registrarConfig() *rest.Config {
	rc := rest.CopyConfig(cl.api.Config)
	rc.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + systemNS + ":" + registrarSA,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + systemNS, "system:authenticated"},
	}
	return rc
}

func applyYAML(t testing.TB, c client.Client, rel string, opts ...client.CreateOption) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---") {
		var u unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("decode %s: %v", rel, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := c.Create(context.Background(), &u, opts...); err != nil {
			t.Fatalf("apply %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
}

func (cl *cluster) createNS(t testing.TB, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := cl.c.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("%s: create namespace %s: %v", cl.name, name, err)
	}
}

// port is a test Service port: name, port, target port, appProtocol ("" for none).
type port struct {
	name       string
	port, tgt  int32
	appProto   string
	l4Protocol corev1.Protocol
}

func (cl *cluster) createService(t testing.TB, ns, name string, ports ...port) *corev1.Service {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": name}},
	}
	for _, p := range ports {
		sp := corev1.ServicePort{Name: p.name, Port: p.port, TargetPort: intstr.FromInt32(p.tgt), Protocol: p.l4Protocol}
		if p.appProto != "" {
			ap := p.appProto
			sp.AppProtocol = &ap
		}
		svc.Spec.Ports = append(svc.Spec.Ports, sp)
	}
	if err := cl.c.Create(context.Background(), svc); err != nil {
		t.Fatalf("%s: create Service %s/%s: %v", cl.name, ns, name, err)
	}
	return svc
}

func (cl *cluster) export(t testing.TB, ns, name string) {
	t.Helper()
	se := &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := cl.c.Create(context.Background(), se); err != nil {
		t.Fatalf("%s: create ServiceExport %s/%s: %v", cl.name, ns, name, err)
	}
}

func (cl *cluster) unexport(t testing.TB, ns, name string) {
	t.Helper()
	se := &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := cl.c.Delete(context.Background(), se); err != nil {
		t.Fatalf("%s: delete ServiceExport %s/%s: %v", cl.name, ns, name, err)
	}
}

// imported checks that cl holds aether's ServiceImport ns/name and its clusterset Service, wired
// together the way the agents read them (model.Assemble), with the given ports and exporting
// clusters. It returns the ServiceImport.
func (cl *cluster) imported(ns, name string, ports []int32, clusters ...string) (*mcsv1beta1.ServiceImport, error) {
	ctx := context.Background()
	var si mcsv1beta1.ServiceImport
	if err := cl.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &si); err != nil {
		return nil, fmt.Errorf("%s: ServiceImport %s/%s: %w", cl.name, ns, name, err)
	}
	var cs corev1.Service
	if err := cl.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + model.ClustersetServiceSuffix}, &cs); err != nil {
		return nil, fmt.Errorf("%s: clusterset Service: %w", cl.name, err)
	}
	switch {
	case si.Labels[model.LabelManagedBy] != model.ManagedByAether || cs.Labels[model.LabelManagedBy] != model.ManagedByAether:
		return nil, fmt.Errorf("%s: managed-by labels: import %v, service %v", cl.name, si.Labels, cs.Labels)
	case si.Spec.Type != mcsv1beta1.ClusterSetIP:
		return nil, fmt.Errorf("%s: import type %q", cl.name, si.Spec.Type)
	case len(si.Spec.IPs) == 0 || si.Spec.IPs[0] != cs.Spec.ClusterIP:
		return nil, fmt.Errorf("%s: import ips %v, clusterset Service ClusterIP %q", cl.name, si.Spec.IPs, cs.Spec.ClusterIP)
	case cs.Annotations[model.AnnotationMeshService] != ns+"/"+name:
		return nil, fmt.Errorf("%s: %s annotation %q", cl.name, model.AnnotationMeshService, cs.Annotations[model.AnnotationMeshService])
	case len(cs.Spec.Selector) != 0:
		return nil, fmt.Errorf("%s: clusterset Service has a selector %v", cl.name, cs.Spec.Selector)
	}
	var got []int32
	for _, p := range si.Spec.Ports {
		got = append(got, p.Port)
	}
	if fmt.Sprint(got) != fmt.Sprint(ports) {
		return nil, fmt.Errorf("%s: import ports %v, want %v", cl.name, got, ports)
	}
	var gotC []string
	for _, c := range si.Status.Clusters {
		gotC = append(gotC, c.Cluster)
	}
	if fmt.Sprint(gotC) != fmt.Sprint(clusters) {
		return nil, fmt.Errorf("%s: import status.clusters %v, want %v", cl.name, gotC, clusters)
	}
	return &si, nil
}

// gone checks that cl holds neither a ServiceImport ns/name nor its clusterset Service.
func (cl *cluster) gone(ns, name string) error {
	ctx := context.Background()
	if err := cl.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &mcsv1beta1.ServiceImport{}); !apierrors.IsNotFound(err) {
		return fmt.Errorf("%s: ServiceImport %s/%s still there (err %v)", cl.name, ns, name, err)
	}
	if err := cl.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + model.ClustersetServiceSuffix}, &corev1.Service{}); !apierrors.IsNotFound(err) {
		return fmt.Errorf("%s: clusterset Service %s/%s still there (err %v)", cl.name, ns, name, err)
	}
	return nil
}

// exportCond returns the ServiceExport's condition of type typ ("" status when absent).
func (cl *cluster) exportCond(ns, name string, typ mcsv1beta1.ServiceExportConditionType) (metav1.Condition, error) {
	var se mcsv1beta1.ServiceExport
	if err := cl.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &se); err != nil {
		return metav1.Condition{}, err
	}
	for _, c := range se.Status.Conditions {
		if c.Type == string(typ) {
			return c, nil
		}
	}
	return metav1.Condition{}, nil
}

func (cl *cluster) wantCond(ns, name string, typ mcsv1beta1.ServiceExportConditionType, status metav1.ConditionStatus, reason string) error {
	c, err := cl.exportCond(ns, name, typ)
	if err != nil {
		return err
	}
	if c.Status != status || c.Reason != reason {
		return fmt.Errorf("%s: ServiceExport %s/%s condition %s = %s/%s (%s), want %s/%s", cl.name, ns, name, typ, c.Status, c.Reason, c.Message, status, reason)
	}
	return nil
}

// instance is one running registrar.
type instance struct {
	r       *registrar.Registrar
	reg     *registry.Registry
	metrics *prometheus.Registry
	cancel  context.CancelFunc
	done    chan error
}

// startRegistrar runs a registrar for cl against the registry at endpoints, as the registrar's
// ServiceAccount, with short leader election timings; each tune, when given, changes its Config
// first. Stopping it (stop) does not release the lease: a standby takes over only after the lease
// expires, as after a crash.
func startRegistrar(t testing.TB, cl *cluster, endpoints []string, name string, tune ...func(*registrar.Config)) *instance {
	t.Helper()
	log := testLogger(t, name)
	met := prometheus.NewRegistry()
	reg, err := registry.New(registry.Config{Endpoints: endpoints, Region: region, Cluster: cl.name, Logger: log, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cfg := registrar.Config{
		Kube: cl.registrarConfig(), Exports: reg, Endpoints: reg, Probe: registrar.EtcdProbe(reg.Client()),
		ProbeInterval: 300 * time.Millisecond, ProbeTimeout: time.Second,
		LeaderElection: true, LeaderElectionID: "aether-registrar", LeaderElectionNamespace: systemNS,
		LeaseDuration: 5 * time.Second, RenewDeadline: 4 * time.Second, RetryPeriod: 500 * time.Millisecond,
		Metrics: met, SkipNameValidation: true, MaxRetryDelay: 5 * time.Second, Logger: log,
	}
	for _, f := range tune {
		f(&cfg)
	}
	r, err := registrar.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{r: r, reg: reg, metrics: met, cancel: cancel, done: make(chan error, 1)}
	go func() { in.done <- r.Start(ctx) }()
	t.Cleanup(in.stop)
	return in
}

func (in *instance) stop() {
	in.cancel()
	<-in.done
	in.done <- nil // later stops return at once
	_ = in.reg.Close()
}

func (in *instance) waitElected(t testing.TB) {
	t.Helper()
	select {
	case <-in.r.Elected():
	case err := <-in.done:
		t.Fatalf("registrar stopped before it was elected: %v", err)
	case <-time.After(converge):
		t.Fatalf("registrar not elected within %s", converge)
	}
}

// gauge reads one gauge of the instance's metrics (0 when absent).
func (in *instance) gauge(t testing.TB, name string) float64 {
	t.Helper()
	mfs, err := in.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) > 0 {
			return mf.Metric[0].GetGauge().GetValue()
		}
	}
	return 0
}

// registryServer is the shared registry: an embedded etcd that can be stopped and started again
// on the same ports and data.
type registryServer struct {
	t         testing.TB
	cfg       embedded.Config
	emb       *embedded.Server
	Endpoints []string
}

func startRegistryServer(t testing.TB) *registryServer {
	t.Helper()
	dir := t.TempDir()
	u := func() string {
		return (&url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))}).String()
	}
	s := &registryServer{t: t, cfg: embedded.Config{
		DataDir: dir, ClientURL: u(), PeerURL: u(), LogFile: filepath.Join(dir, "etcd.log"), Logger: testLogger(t, "etcd"),
	}}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *registryServer) start() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	emb, err := embedded.Start(ctx, s.cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	s.emb, s.Endpoints = emb, emb.Endpoints
}

func (s *registryServer) stop() {
	if s.emb != nil {
		s.emb.Close()
		s.emb = nil
	}
}
