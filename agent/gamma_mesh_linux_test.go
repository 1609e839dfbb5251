//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"
	"github.com/aethermesh/aether/cni/plugin"
	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// This file holds the workloads and plumbing of TestPrivilegedGAMMATraffic: the echo and gRPC
// servers the pods run, the mesh they run in (real agent, Envoy, kube-apiserver, registry, one
// network namespace per pod on a node namespace) and the Gateway API object builders.

// echoReply is what an echoServer answers: which pod served, and the request as it arrived.
type echoReply struct {
	Pod      string      `json:"pod"`
	Method   string      `json:"method"`
	Path     string      `json:"path"`
	RawQuery string      `json:"rawQuery"`
	Host     string      `json:"host"`
	Headers  http.Header `json:"headers"`
}

// header returns the values of request header name the server saw, joined with ",".
func (r echoReply) header(name string) string {
	return strings.Join(r.Headers.Values(name), ",")
}

// echoServer is the HTTP workload of the test's pods. It answers every request with an
// echoReply (JSON) and the response headers X-Served-By (the pod), X-Resp-Set, X-Resp-Add and
// X-Resp-Remove ("server", for the ResponseHeaderModifier checks). It counts the requests it got
// per path (every attempt, whatever it answered) and keeps the Host of the last one. Query
// parameters change the answer: sleep=<duration> waits that long first (or until the request
// is cancelled); fail=<k> answers code=<status> (default 503) to the first k requests of the
// path and the echo after.
type echoServer struct {
	pod string

	mu    sync.Mutex
	hits  map[string]int
	hosts map[string]string
}

func newEchoServer(pod string) *echoServer {
	return &echoServer{pod: pod, hits: map[string]int{}, hosts: map[string]string{}}
}

func (e *echoServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.hits[r.URL.Path]++
	n := e.hits[r.URL.Path]
	e.hosts[r.URL.Path] = r.Host
	e.mu.Unlock()
	q := r.URL.Query()
	if d, err := time.ParseDuration(q.Get("sleep")); err == nil {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("X-Served-By", e.pod)
	if k, err := strconv.Atoi(q.Get("fail")); err == nil && n <= k {
		code, err := strconv.Atoi(q.Get("code"))
		if err != nil {
			code = http.StatusServiceUnavailable
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, "%s: attempt %d of %s fails", e.pod, n, r.URL.Path)
		return
	}
	for _, h := range []string{"X-Resp-Set", "X-Resp-Add", "X-Resp-Remove"} {
		w.Header().Set(h, "server")
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(echoReply{Pod: e.pod, Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery,
		Host: r.Host, Headers: r.Header})
}

// count returns how many requests the server got for path.
func (e *echoServer) count(path string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hits[path]
}

// countPrefix returns how many requests the server got for paths starting with prefix.
func (e *echoServer) countPrefix(prefix string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for p, c := range e.hits {
		if strings.HasPrefix(p, prefix) {
			n += c
		}
	}
	return n
}

// host returns the Host of the last request for path.
func (e *echoServer) host(path string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hosts[path]
}

// serveGRPC serves gRPC (cleartext HTTP/2) on :9090 in ns until the test ends: every method of
// every service (an unknown-service handler, so no generated code is needed) reads one
// google.protobuf.StringValue and answers one saying "<pod> <full method>".
func serveGRPC(t testing.TB, ns *testenv.Netns, pod string) {
	t.Helper()
	l := ns.Listen(t, "0.0.0.0:9090")
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		var in wrapperspb.StringValue
		if err := stream.RecvMsg(&in); err != nil {
			return err
		}
		m, _ := grpc.MethodFromServerStream(stream)
		return stream.SendMsg(wrapperspb.String(pod + " " + m))
	}))
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
}

// gammaMesh is one node of a mesh for the GAMMA traffic tests: the real agent with its Envoy in
// a node network namespace, a real kube-apiserver with the Gateway API CRDs, an embedded etcd
// registry, and pods each in its own network namespace attached to the node by a veth pair and
// to the agent by CNI ADD.
type gammaMesh struct {
	ctx context.Context
	cs  kubernetes.Interface
	gw  gwclient.Interface
	a   *agentProc
	cni *plugin.Client
	// api and etcd are the sources the agent reads.
	api  *testenv.KubeAPIServer
	etcd *testenv.EmbeddedEtcd
	// node is the node's network namespace; pods counts the pods attached (their veth subnets).
	node *testenv.Netns
	pods int
	// echo are the HTTP pods' servers by pod name.
	echo map[string]*echoServer
}

// startGAMMAMesh starts the sources and the agent (in its node namespace) and creates the
// meshed namespaces shop and other. The test's context ends after 10 minutes.
func startGAMMAMesh(t *testing.T) *gammaMesh {
	t.Helper()
	return startGAMMAMeshWith(t)
}

// startGAMMAMeshWith is startGAMMAMesh with more agent flags.
// gammaHostIP is the GAMMA mesh node's HOST_IP (on its loopback).
const gammaHostIP = "10.249.0.1"

func startGAMMAMeshWith(t *testing.T, args ...string) *gammaMesh {
	t.Helper()
	api, etcd, cs := startSources(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	createNodeAndMeshNamespace(t, ctx, cs)
	must := mustCreate(t)
	must(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other",
		Labels: map[string]string{model.LabelMeshNamespace: model.MeshNamespaceEnabled}}}, metav1.CreateOptions{}))

	node := testenv.NewNetns(t)
	apiAddr := strings.TrimPrefix(api.Config.Host, "https://")
	etcdAddr := strings.TrimPrefix(etcd.Endpoints[0], "http://")
	node.Forward(t, apiAddr, apiAddr)
	node.Forward(t, etcdAddr, etcdAddr)
	// The node's address (HOST_IP), which its pods reach through their default route: the
	// capture DNATs routed UDP frontends to the node Envoy's listeners there.
	if out, err := node.Command("ip", "addr", "add", gammaHostIP+"/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("node address: %v: %s", err, out)
	}
	a := startAgentWith(t, agentOpts{wrap: []string{"ip", "netns", "exec", node.Name}, client: node.HTTPClient(false)},
		append([]string{"--kubeconfig", api.Kubeconfig, "--registry-endpoints", etcd.Endpoints[0], "--host-ip", gammaHostIP}, args...)...)
	a.waitReady(t, 90*time.Second, "agent ready")
	return &gammaMesh{ctx: ctx, cs: cs, gw: gwclient.NewForConfigOrDie(api.Config), a: a, api: api, etcd: etcd,
		cni: plugin.NewClient(a.cniSocket), node: node, echo: map[string]*echoServer{}}
}

// podSpec is one test pod: its namespace, name, labels (app is also its service account) and
// container port (named http or grpc).
type podSpec struct {
	namespace, name string
	labels          map[string]string
	port            int32
	grpc            bool
}

// addPod creates the pod in the API server (on node-1, Ready), gives it a network namespace
// joined to the node by a veth pair (10.250.<i>.2/24, the node side 10.250.<i>.1), attaches it
// through CNI ADD to the agent, and returns its namespace. The ServiceAccount is created when
// it does not exist.
func (m *gammaMesh) addPod(t *testing.T, p podSpec) *testenv.Netns {
	t.Helper()
	m.pods++
	sa := p.labels["app"]
	if _, err := m.cs.CoreV1().ServiceAccounts(p.namespace).Get(m.ctx, sa, metav1.GetOptions{}); err != nil {
		mustCreate(t)(m.cs.CoreV1().ServiceAccounts(p.namespace).Create(m.ctx,
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}))
	}
	portName := "http"
	if p.grpc {
		portName = "grpc"
	}
	pod, err := m.cs.CoreV1().Pods(p.namespace).Create(m.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: p.labels},
		Spec: corev1.PodSpec{NodeName: "node-1", ServiceAccountName: sa, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "app", Image: sa, Ports: []corev1.ContainerPort{{Name: portName, ContainerPort: p.port}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if pod, err = m.cs.CoreV1().Pods(p.namespace).UpdateStatus(m.ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns := testenv.NewNetns(t)
	nodeSide := netip.MustParsePrefix(fmt.Sprintf("10.250.%d.1/24", m.pods))
	podSide := netip.MustParsePrefix(fmt.Sprintf("10.250.%d.2/24", m.pods))
	testenv.Veth(t, m.node, fmt.Sprintf("vp%d", m.pods), nodeSide, ns, "eth0", podSide)
	ns.DefaultRoute(t, nodeSide.Addr())
	if _, err := m.cni.Add(m.ctx, cniv1.Request{Network: "test", Attachment: cniv1.PodAttachment{
		ContainerID: "ctr-" + p.namespace + "-" + p.name, PodUID: string(pod.UID), Namespace: p.namespace, Name: p.name,
		NetnsPath: ns.Path, IPs: []netip.Addr{podSide.Addr()}, Interface: "eth0"}}); err != nil {
		t.Fatalf("CNI ADD %s/%s: %v", p.namespace, p.name, err)
	}
	return ns
}

// addEchoPod adds an HTTP pod (port 8080) in shop serving an echoServer.
func (m *gammaMesh) addEchoPod(t *testing.T, name string, labels map[string]string) *echoServer {
	t.Helper()
	ns := m.addPod(t, podSpec{namespace: "shop", name: name, labels: labels, port: 8080})
	e := newEchoServer(name)
	ns.ServeHTTP(t, "0.0.0.0:8080", e)
	m.echo[name] = e
	return e
}

// addService creates Service shop/<name> selecting selector with the given ports and returns its
// cluster IP.
func (m *gammaMesh) addService(t *testing.T, name string, selector map[string]string, ports ...corev1.ServicePort) string {
	t.Helper()
	s, err := m.cs.CoreV1().Services("shop").Create(m.ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Selector: selector, Ports: ports}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s.Spec.ClusterIP
}

// httpPort is an HTTP Service port to target port 8080.
func httpPort(name string, port int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, TargetPort: intstr.FromInt32(8080)}
}

// grpcPort is the Service port grpc 9090 (appProtocol grpc) to target port 9090.
func grpcPort() corev1.ServicePort {
	return corev1.ServicePort{Name: "grpc", Port: 9090, TargetPort: intstr.FromInt32(9090), AppProtocol: new("grpc")}
}

// answer is what a client got for one HTTP request.
type answer struct {
	status int
	header http.Header
	body   string
	// echo is the body parsed as an echoReply (zero when it is none).
	echo   echoReply
	reused bool
}

// httpClient returns a client whose connections start in ns; it never follows redirects. keep
// reuses one keep-alive connection.
func httpClient(ns *testenv.Netns, keep bool) *http.Client {
	c := ns.HTTPClient(keep)
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if keep {
		c.Transport.(*http.Transport).MaxConnsPerHost = 1
	}
	return c
}

// do sends one request with the given headers ("Host" sets the Host) and reads the answer.
func do(ctx context.Context, c *http.Client, method, url string, hdr map[string]string) (answer, error) {
	var a answer
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { a.reused = i.Reused }}), method, url, nil)
	if err != nil {
		return a, err
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return a, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return a, fmt.Errorf("%s %s: read body: %w", method, url, err)
	}
	a.status, a.header, a.body = resp.StatusCode, resp.Header, string(b)
	_ = json.Unmarshal(b, &a.echo)
	return a, nil
}

// grpcConn returns a gRPC client connection (h2c) from ns to addr, closed when the test ends.
func grpcConn(t testing.TB, ns *testenv.Netns, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(_ context.Context, a string) (net.Conn, error) { return ns.Dial(a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// callGRPC invokes fullMethod ("/<service>/<method>") on conn with metadata md (name, value
// pairs) and returns the answer ("<pod> <method>").
func callGRPC(ctx context.Context, conn *grpc.ClientConn, fullMethod string, md ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if len(md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
	}
	var out wrapperspb.StringValue
	if err := conn.Invoke(ctx, fullMethod, wrapperspb.String("hello"), &out); err != nil {
		return "", fmt.Errorf("invoke %s: %w", fullMethod, err)
	}
	return out.GetValue(), nil
}

// Gateway API object builders.

// serviceParent is a parentRef to Service <ns>/<name> (ns "" for the route's namespace), on
// port (0 for every port).
func serviceParent(ns, name string, port int32) gwv1.ParentReference {
	p := gwv1.ParentReference{Group: new(gwv1.Group("")), Kind: new(gwv1.Kind("Service")), Name: gwv1.ObjectName(name)}
	if ns != "" {
		p.Namespace = new(gwv1.Namespace(ns))
	}
	if port != 0 {
		p.Port = new(gwv1.PortNumber(port))
	}
	return p
}

// serviceRef is a reference to port of Service <ns>/<name> (ns "" for the route's namespace).
func serviceRef(ns, name string, port int32) gwv1.BackendObjectReference {
	r := gwv1.BackendObjectReference{Group: new(gwv1.Group("")), Kind: new(gwv1.Kind("Service")), Name: gwv1.ObjectName(name),
		Port: new(gwv1.PortNumber(port))}
	if ns != "" {
		r.Namespace = new(gwv1.Namespace(ns))
	}
	return r
}

// to is a backendRef to port 80 of Service <name> in the route's namespace with weight.
func to(name string, weight int32, filters ...gwv1.HTTPRouteFilter) gwv1.HTTPBackendRef {
	return gwv1.HTTPBackendRef{BackendRef: gwv1.BackendRef{BackendObjectReference: serviceRef("", name, 80), Weight: new(weight)},
		Filters: filters}
}

// pathMatch is a match on the path alone.
func pathMatch(typ gwv1.PathMatchType, value string) gwv1.HTTPRouteMatch {
	return gwv1.HTTPRouteMatch{Path: &gwv1.HTTPPathMatch{Type: new(typ), Value: new(value)}}
}

// prefix is a PathPrefix match.
func prefix(value string) gwv1.HTTPRouteMatch { return pathMatch(gwv1.PathMatchPathPrefix, value) }

// setHeaders is a RequestHeaderModifier that sets name: value pairs.
func setHeaders(kv ...string) gwv1.HTTPRouteFilter {
	h := &gwv1.HTTPHeaderFilter{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set = append(h.Set, gwv1.HTTPHeader{Name: gwv1.HTTPHeaderName(kv[i]), Value: kv[i+1]})
	}
	return gwv1.HTTPRouteFilter{Type: gwv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: h}
}

// tagged is a rule with matches, sending to backends, that sets the request header x-rule: tag
// so the server's echo names the rule that routed the request.
func tagged(tag string, matches []gwv1.HTTPRouteMatch, backends ...gwv1.HTTPBackendRef) gwv1.HTTPRouteRule {
	return gwv1.HTTPRouteRule{Matches: matches, Filters: []gwv1.HTTPRouteFilter{setHeaders("x-rule", tag)}, BackendRefs: backends}
}

// httpRoute is HTTPRoute <ns>/<name> with parents and rules.
func httpRoute(ns, name string, parents []gwv1.ParentReference, rules ...gwv1.HTTPRouteRule) *gwv1.HTTPRoute {
	return &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: gwv1.HTTPRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: parents}, Rules: rules}}
}

// redirect is a rule on PathPrefix path answering with the redirect f.
func redirect(path string, f gwv1.HTTPRequestRedirectFilter) gwv1.HTTPRouteRule {
	return gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{prefix(path)},
		Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &f}}}
}

// rewrite is a rule on PathPrefix path to web-v1 rewriting the URL with f.
func rewrite(path string, f gwv1.HTTPURLRewriteFilter) gwv1.HTTPRouteRule {
	return gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{prefix(path)},
		Filters:     []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterURLRewrite, URLRewrite: &f}},
		BackendRefs: []gwv1.HTTPBackendRef{to("web-v1", 1)}}
}

// replacePrefix and replaceFull are HTTPPathModifiers.
func replacePrefix(v string) *gwv1.HTTPPathModifier {
	return &gwv1.HTTPPathModifier{Type: gwv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: new(v)}
}

func replaceFull(v string) *gwv1.HTTPPathModifier {
	return &gwv1.HTTPPathModifier{Type: gwv1.FullPathHTTPPathModifier, ReplaceFullPath: new(v)}
}

// mirrorTo is a RequestMirror to port 80 of Service name, of num/den of the requests (den 0:
// every request).
func mirrorTo(name string, num, den int32) gwv1.HTTPRouteFilter {
	f := &gwv1.HTTPRequestMirrorFilter{BackendRef: serviceRef("", name, 80)}
	if den != 0 {
		f.Fraction = &gwv1.Fraction{Numerator: num, Denominator: new(den)}
	}
	return gwv1.HTTPRouteFilter{Type: gwv1.HTTPRouteFilterRequestMirror, RequestMirror: f}
}

// grpcRule is a GRPCRoute rule with matches to port 9090 of Service backend.
func grpcRule(backend string, matches ...gwv1.GRPCRouteMatch) gwv1.GRPCRouteRule {
	return gwv1.GRPCRouteRule{Matches: matches, BackendRefs: []gwv1.GRPCBackendRef{{BackendRef: gwv1.BackendRef{
		BackendObjectReference: serviceRef("", backend, 9090)}}}}
}

// grpcMethod is a GRPCRouteMatch on service and method ("" for any) of type typ.
func grpcMethod(typ gwv1.GRPCMethodMatchType, service, method string) gwv1.GRPCRouteMatch {
	mm := &gwv1.GRPCMethodMatch{Type: new(typ)}
	if service != "" {
		mm.Service = new(service)
	}
	if method != "" {
		mm.Method = new(method)
	}
	return gwv1.GRPCRouteMatch{Method: mm}
}
