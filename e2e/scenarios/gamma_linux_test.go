package scenarios

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/aethermesh/aether/internal/testenv"
)

// The GAMMA scenarios (issue #23): HTTPRoutes attached to Services, created through the pair's
// Gateway API client, served by the caller's node Envoy on the capture path, with route status
// written by the cluster's registrar. Each route sets the response header routeHeader to its own
// name (ResponseHeaderModifier), so every answer says whether the caller's node applied it.
const (
	// routeHeader is the response header every scenario route adds, valued with its name.
	routeHeader = "X-Aether-Route"
	// gatewayController is the controllerName of aether's route status entries
	// (model.GatewayControllerName; the scenarios do not import aether's packages).
	gatewayController = "aether.io/gateway-controller"
	// canaryRequests and canaryV2Weight: the producer canary counts canaryRequests answers of a
	// split of canaryV2Weight percent to canary-v2 (the rest to canary-v1).
	canaryRequests = 1000
	canaryV2Weight = 10
	// canaryFalseFailure bounds the chance that a split Envoy applies exactly still fails the
	// scenario (binomialBounds).
	canaryFalseFailure = 1e-6
	// drainWait is how long the route-delete scenario keeps using its connection after the
	// deletion reached the node: longer than the node Envoy's --drain-time-s (5 s), after which
	// a drained connection would have been closed.
	drainWait = 8 * time.Second
)

func ptrTo[T any](v T) *T { return &v }

// serviceParent is a parentRef to port of Service namespace/name (GEP-1294 mesh binding).
func serviceParent(namespace, name string, port int32) gwv1.ParentReference {
	return gwv1.ParentReference{Group: ptrTo(gwv1.Group("")), Kind: ptrTo(gwv1.Kind("Service")),
		Namespace: ptrTo(gwv1.Namespace(namespace)), Name: gwv1.ObjectName(name), Port: ptrTo(gwv1.PortNumber(port))}
}

// serviceBackend is a backendRef to port of Service namespace/name with weight.
func serviceBackend(namespace, name string, port, weight int32) gwv1.HTTPBackendRef {
	return gwv1.HTTPBackendRef{BackendRef: gwv1.BackendRef{Weight: ptrTo(weight), BackendObjectReference: gwv1.BackendObjectReference{
		Group: ptrTo(gwv1.Group("")), Kind: ptrTo(gwv1.Kind("Service")), Namespace: ptrTo(gwv1.Namespace(namespace)),
		Name: gwv1.ObjectName(name), Port: ptrTo(gwv1.PortNumber(port))}}}
}

// importBackend is a backendRef to port of the ServiceImport namespace/name (GEP-1748: the
// service's clusterset endpoints).
func importBackend(namespace, name string, port int32) gwv1.HTTPBackendRef {
	b := serviceBackend(namespace, name, port, 1)
	b.Group, b.Kind = ptrTo(gwv1.Group("multicluster.x-k8s.io")), ptrTo(gwv1.Kind("ServiceImport"))
	return b
}

// httpRoute is HTTPRoute namespace/name with one parentRef and one rule (no match: every
// request) sending to backends and setting the response header routeHeader to name.
func httpRoute(namespace, name string, parent gwv1.ParentReference, backends ...gwv1.HTTPBackendRef) *gwv1.HTTPRoute {
	return &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: gwv1.HTTPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{parent}},
			Rules: []gwv1.HTTPRouteRule{{
				BackendRefs: backends,
				Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterResponseHeaderModifier,
					ResponseHeaderModifier: &gwv1.HTTPHeaderFilter{Set: []gwv1.HTTPHeader{{Name: routeHeader, Value: name}}}}},
			}},
		},
	}
}

// createRoute creates route in cluster and deletes it when t ends (if it still exists).
func (w *world) createRoute(t *testing.T, cluster string, route *gwv1.HTTPRoute) {
	t.Helper()
	routes := w.p.Gateway(cluster).GatewayV1().HTTPRoutes(route.Namespace)
	if _, err := routes.Create(context.Background(), route, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create HTTPRoute %s/%s in %s: %v", route.Namespace, route.Name, cluster, err)
	}
	t.Cleanup(func() {
		if err := routes.Delete(context.Background(), route.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete HTTPRoute %s/%s in %s: %v", route.Namespace, route.Name, cluster, err)
		}
	})
}

// deleteRoute deletes HTTPRoute namespace/name in cluster.
func (w *world) deleteRoute(t *testing.T, cluster, namespace, name string) {
	t.Helper()
	if err := w.p.Gateway(cluster).GatewayV1().HTTPRoutes(namespace).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete HTTPRoute %s/%s in %s: %v", namespace, name, cluster, err)
	}
}

// wantAccepted waits until cluster's registrar has written, in HTTPRoute namespace/name's
// status.parents, aether's entry (controllerName gatewayController) for its first parentRef with
// Accepted=True and ResolvedRefs=True at the route's generation.
func (w *world) wantAccepted(t *testing.T, cluster, namespace, name string) {
	t.Helper()
	what := fmt.Sprintf("HTTPRoute %s/%s in %s Accepted by %s", namespace, name, cluster, gatewayController)
	testenv.Eventually(t, 90*time.Second, what, func() error {
		r, err := w.p.Gateway(cluster).GatewayV1().HTTPRoutes(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, ps := range r.Status.Parents {
			if ps.ControllerName != gatewayController || ps.ParentRef.Name != r.Spec.ParentRefs[0].Name {
				continue
			}
			for _, typ := range []gwv1.RouteConditionType{gwv1.RouteConditionAccepted, gwv1.RouteConditionResolvedRefs} {
				c := meta.FindStatusCondition(ps.Conditions, string(typ))
				if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != r.Generation {
					return fmt.Errorf("condition %s = %+v at generation %d", typ, c, r.Generation)
				}
			}
			return nil
		}
		return fmt.Errorf("no status entry of %s in %+v", gatewayController, r.Status.Parents)
	})
}

// caller sends HTTP/1.1 requests from inside a pod (ClusterPair.Dial, so the pod's capture
// applies) over keep-alive connections to a Service VIP; the Host header is the mesh name.
type caller struct {
	ns, pod string
	id      string // its SPIFFE ID (every client pod runs as its namespace's default)
	client  *http.Client
}

// caller returns a caller from pod podNS/pod in cluster; its connections close when t ends.
func (w *world) caller(t *testing.T, cluster, podNS, pod string) *caller {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return w.p.Dial(ctx, cluster, podNS, pod, addr)
		},
		MaxIdleConnsPerHost: 1,
		DisableCompression:  true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &caller{ns: podNS, pod: pod, id: w.id(cluster, podNS, "default"), client: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// get GETs / from addr (VIP:port) with Host host and returns the echo's reply and the value of
// routeHeader in the answer. A status other than 200, a reply that is not the echo's, or one
// whose caller is not the pod's identity is an error.
func (c *caller) get(addr, host string) (reply, string, error) {
	var r reply
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	if err != nil {
		return r, "", err
	}
	req.Host = host
	resp, err := c.client.Do(req)
	if err != nil {
		return r, "", err
	}
	defer resp.Body.Close()
	r, err = decodeAnswer(resp)
	if err == nil && r.CallerID != c.id {
		err = fmt.Errorf("%s saw caller %q (xfcc %q), want %s", r.Server, r.CallerID, r.XFCC, c.id)
	}
	return r, resp.Header.Get(routeHeader), err
}

// decodeAnswer reads resp's body, which must be a 200 with the echo's JSON reply.
func decodeAnswer(resp *http.Response) (reply, error) {
	var r reply
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return r, fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return r, fmt.Errorf("answer %s: %q", resp.Status, body)
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Server == "" {
		return r, fmt.Errorf("answer %q: not the echo's (%v)", body, err)
	}
	return r, nil
}

// vip returns Service svc's ClusterIP in cluster as "ip:80".
func (w *world) vip(t *testing.T, cluster, svc string) string {
	t.Helper()
	return net.JoinHostPort(w.clusterIP(t, cluster, svc), "80")
}

// waitRoute waits until c's answers from addr carry routeHeader = want ("": none, the route is
// gone) and returns the first such answer.
func waitRoute(t *testing.T, c *caller, addr, host, want string) reply {
	t.Helper()
	var got reply
	testenv.Eventually(t, 90*time.Second, fmt.Sprintf("%s/%s's answers from %s with %s %q", c.ns, c.pod, addr, routeHeader, want), func() error {
		r, h, err := c.get(addr, host)
		if err != nil {
			return err
		}
		if h != want {
			return fmt.Errorf("%s answered with %s %q", r.Server, routeHeader, h)
		}
		got = r
		return nil
	})
	return got
}

// gammaProducerCanary: in B, HTTPRoute canary-split in the namespace of the exported Service
// canary (a producer route, GEP-1324: it applies to every caller) with parentRef canary:80 sends
// 90% to Service canary-v1 and 10% to canary-v2. B's registrar writes Accepted=True for aether's
// controllerName; B's client, calling canary's VIP, sees the route's header on every answer and
// canary-v2 in a share of canaryRequests answers inside the binomial interval at
// canaryFalseFailure (Binomial(1000, 0.1): [57, 149], false-failure chance 8.4e-7;
// TestBinomialBounds checks the arithmetic). Without the route the two pods share the calls
// about evenly, which never lands there.
//
// Callers in A reach canary through its ServiceImport and do not get B's producer route: routes
// go to other clusters only with the config projections (issue #26), so this checks B's callers.
func (w *world) gammaProducerCanary(t *testing.T) {
	route := httpRoute(ns, "canary-split", serviceParent(ns, "canary", 80),
		serviceBackend(ns, "canary-v1", 80, 100-canaryV2Weight), serviceBackend(ns, "canary-v2", 80, canaryV2Weight))
	w.createRoute(t, w.b, route)
	w.wantAccepted(t, w.b, ns, route.Name)
	c := w.caller(t, w.b, ns, "client")
	addr, host := w.vip(t, w.b, "canary"), "canary."+ns+".mesh"
	waitRoute(t, c, addr, host, route.Name)

	counts := map[string]int{}
	start := time.Now()
	for i := range canaryRequests {
		r, h, err := c.get(addr, host)
		if err != nil {
			t.Fatalf("request %d of %d: %v", i+1, canaryRequests, err)
		}
		if h != route.Name || r.Cluster != w.b {
			t.Fatalf("request %d of %d: answered by %s in %s with %s %q; want the route applied in %s", i+1, canaryRequests, r.Server, r.Cluster, routeHeader, h, w.b)
		}
		counts[r.Server]++
	}
	lo, hi, tail := binomialBounds(canaryRequests, canaryV2Weight/100.0, canaryFalseFailure)
	v2 := counts["canary-v2"]
	t.Logf("%d requests in %s: %v; canary-v2 %d, want %d..%d (Binomial(%d, %.2f), false-failure chance %.2g)",
		canaryRequests, time.Since(start).Round(time.Millisecond), counts, v2, lo, hi, canaryRequests, canaryV2Weight/100.0, tail)
	if counts["canary-v1"]+v2 != canaryRequests {
		t.Errorf("answers from pods other than canary-v1 and canary-v2: %v", counts)
	}
	if v2 < lo || v2 > hi {
		t.Errorf("canary-v2 answered %d of %d requests; a %d%% split gives %d..%d", v2, canaryRequests, canaryV2Weight, lo, hi)
	}
}

// gammaConsumerRoute: in A, HTTPRoute echo-to-alt in namespace frontNS with parentRef Service
// shop/echo:80 (a consumer route, GEP-1324) sends every request to Service shop/alt (a backend
// in another namespace needs no ReferenceGrant for mesh routes, GEP-1294). A's registrar accepts
// it; the client in frontNS, calling echo's VIP, is answered by alt-1 with the route's header;
// the client in shop on the same node (the same Envoy) still gets echo's own pods, without the
// header.
func (w *world) gammaConsumerRoute(t *testing.T) {
	addr, host := w.vip(t, w.a, "echo"), "echo."+ns+".mesh"
	front, shop := w.caller(t, w.a, frontNS, "client"), w.caller(t, w.a, ns, "client")
	// Before: both namespaces get echo's pods (frontNS is meshed: the reply names its caller).
	for _, c := range []*caller{front, shop} {
		if r := waitRoute(t, c, addr, host, ""); !strings.HasPrefix(r.Server, "echo-") {
			t.Fatalf("before the route %s/client was answered by %s", c.ns, r.Server)
		}
	}
	route := httpRoute(frontNS, "echo-to-alt", serviceParent(ns, "echo", 80), serviceBackend(ns, "alt", 80, 1))
	w.createRoute(t, w.a, route)
	w.wantAccepted(t, w.a, frontNS, route.Name)
	waitRoute(t, front, addr, host, route.Name)
	const n = 20
	seen := map[string]map[string]int{front.ns: {}, shop.ns: {}}
	for range n {
		for _, c := range []*caller{front, shop} {
			r, h, err := c.get(addr, host)
			if err != nil {
				t.Fatalf("%s/client: %v", c.ns, err)
			}
			seen[c.ns][r.Server+" "+routeHeader+"="+h]++
		}
	}
	t.Logf("%d requests from each namespace: %v", n, seen)
	if want := map[string]int{"alt-1 " + routeHeader + "=" + route.Name: n}; !maps.Equal(seen[frontNS], want) {
		t.Errorf("%s/client (the consumer route's namespace) got %v, want %v", frontNS, seen[frontNS], want)
	}
	for k := range seen[ns] {
		if k != "echo-1 "+routeHeader+"=" && k != "echo-2 "+routeHeader+"=" {
			t.Errorf("%s/client (no consumer route) got %q: want echo's own pods without the route", ns, k)
		}
	}
}

// gammaImportBackend: in A, HTTPRoute hop-to-remote on A's own Service hop (over A's echo pods)
// has one backendRef, the ServiceImport of B's exported service remote (group
// multicluster.x-k8s.io). A's client calling hop by its mesh name is answered by B's pods with
// its own identity; pod CIDRs do not route between the clusters, and B's node waypoints count
// the bytes (the tunnel listener's per-service tcp_proxy counter
// tcp.waypoint.<ns>.remote.downstream_cx_rx_bytes_total grows on B's nodes).
func (w *world) gammaImportBackend(t *testing.T) {
	testenv.Eventually(t, 90*time.Second, "ServiceImport remote in "+w.a, func() error {
		_, err := w.p.Dynamic(w.a).Resource(serviceImports).Namespace(ns).Get(context.Background(), "remote", metav1.GetOptions{})
		return err
	})
	target := "http://hop." + ns + ".mesh/"
	if r := w.wantHTTP(t, target, w.a); !strings.HasPrefix(r.Server, "echo-") {
		t.Fatalf("before the route hop was answered by %s", r.Server)
	}
	before := w.waypointRxBytes(t, "remote")
	route := httpRoute(ns, "hop-to-remote", serviceParent(ns, "hop", 80), importBackend(ns, "remote", 80))
	w.createRoute(t, w.a, route)
	w.wantAccepted(t, w.a, ns, route.Name)
	r := w.wantHTTP(t, target, w.b)
	servers := map[string]int{r.Server: 1}
	for range 9 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := w.get(ctx, target)
		cancel()
		if err != nil || r.Cluster != w.b || r.CallerID != w.callerID() {
			t.Fatalf("GET %s: %+v, %v; want an answer from %s seeing %s", target, r, err, w.b, w.callerID())
		}
		servers[r.Server]++
	}
	after := w.waypointRxBytes(t, "remote")
	t.Logf("10 requests to %s answered by %v; B's waypoint bytes received for %s/remote, by node: before %v, after %v", target, servers, ns, before, after)
	sum := func(m map[string]int) (s int) {
		for _, v := range m {
			s += v
		}
		return s
	}
	if sum(after) <= sum(before) {
		t.Errorf("B's waypoints received no bytes for %s/remote (before %v, after %v): the requests did not go through them", ns, before, after)
	}
}

// waypointRxBytes returns, for each of B's nodes, the bytes its tunnel listener received from
// callers of B's service svc (the per-service tcp_proxy counter
// tcp.waypoint.<ns>.<svc>.downstream_cx_rx_bytes_total, docs/waypoint.md; 0 before the first).
func (w *world) waypointRxBytes(t *testing.T, svc string) map[string]int {
	t.Helper()
	stat := "tcp.waypoint." + ns + "." + svc + ".downstream_cx_rx_bytes_total"
	out := map[string]int{}
	for _, n := range w.nodesB {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		page, err := w.p.EnvoyAdmin(ctx, w.b, n, "/stats?filter="+url.QueryEscape("^"+regexp.QuoteMeta(stat)+"$"))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(page, "\n") {
			if k, v, ok := strings.Cut(line, ": "); ok && k == stat {
				if out[n], err = strconv.Atoi(strings.TrimSpace(v)); err != nil {
					t.Fatalf("%s's Envoy: %q", n, line)
				}
			}
		}
	}
	return out
}

// gammaRouteDelete: a route's deletion returns callers to the default route without touching
// their open connections. For a producer route in B (HTTPRoute canary-pin in the Service's
// namespace, all to canary-v2: a change of the capture route table only), one keep-alive
// connection from B's client carries every request: before the route, while it is applied (all
// to canary-v2, with the route's header), after its deletion reached the node (no header, the
// Service's own pods answer, and not only canary-v2) and for drainWait after. Every request must
// be answered 200 on that connection and no answer may ask to close it.
//
// The same for a consumer route in A (HTTPRoute front-pin in frontNS, all to shop/alt), from
// frontNS's client to echo's VIP. It fails today: the namespace's pods get and then lose their
// own capture chain, and Envoy drains their open connections (docs/routing.md, known gaps).
func (w *world) gammaRouteDelete(t *testing.T) {
	t.Run("producer", func(t *testing.T) {
		route := httpRoute(ns, "canary-pin", serviceParent(ns, "canary", 80), serviceBackend(ns, "canary-v2", 80, 1))
		w.routeDeleteKeepsConnection(t, w.b, ns, route, w.vip(t, w.b, "canary"), "canary."+ns+".mesh", "canary-v2", []string{"canary-v1", "canary-v2"})
	})
	t.Run("consumer", func(t *testing.T) {
		route := httpRoute(frontNS, "front-pin", serviceParent(ns, "echo", 80), serviceBackend(ns, "alt", 80, 1))
		w.routeDeleteKeepsConnection(t, w.a, frontNS, route, w.vip(t, w.a, "echo"), "echo."+ns+".mesh", "alt-1", []string{"echo-1", "echo-2"})
	})
}

// routeDeleteKeepsConnection runs gammaRouteDelete's sequence for route, from pod podNS/client
// in cluster to addr (Host host): pinned is the pod the route sends everything to, owners the
// Service's own pods.
func (w *world) routeDeleteKeepsConnection(t *testing.T, cluster, podNS string, route *gwv1.HTTPRoute, addr, host, pinned string, owners []string) {
	ctx := context.Background()
	conn, err := w.p.Dial(ctx, cluster, podNS, "client", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rd := bufio.NewReader(conn)
	sent := 0
	// send writes one GET on conn and reads its answer: any failure ends the test, since the
	// connection cannot be trusted after it.
	send := func(phase string) (reply, string) {
		t.Helper()
		sent++
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		req, err := http.NewRequest(http.MethodGet, "http://"+host+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := req.Write(conn); err != nil {
			t.Fatalf("%s: request %d on the connection: write: %v", phase, sent, err)
		}
		resp, err := http.ReadResponse(rd, req)
		if err != nil {
			t.Fatalf("%s: request %d on the connection: %v (the connection was closed or broken)", phase, sent, err)
		}
		r, err := decodeAnswer(resp)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: request %d on the connection: %v", phase, sent, err)
		}
		if resp.Close {
			t.Fatalf("%s: request %d on the connection: answered by %s with Connection: close (the connection is being drained)", phase, sent, r.Server)
		}
		if want := w.id(cluster, podNS, "default"); r.CallerID != want {
			t.Fatalf("%s: request %d: %s saw caller %q, want %s", phase, sent, r.Server, r.CallerID, want)
		}
		return r, resp.Header.Get(routeHeader)
	}
	// until sends a request every 200 ms until done accepts an answer, for at most 90 s.
	until := func(phase string, done func(r reply, h string) bool) {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			if r, h := send(phase); done(r, h) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not reached in 90 s (%d requests on the connection)", phase, sent)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	until("before the route", func(_ reply, h string) bool { return h == "" })
	w.createRoute(t, cluster, route)
	applied := time.Now()
	until("route applied", func(r reply, h string) bool { return h == route.Name && r.Server == pinned })
	t.Logf("route %s/%s applied on the caller's node after %s", route.Namespace, route.Name, time.Since(applied).Round(time.Millisecond))
	for range 20 {
		if r, h := send("route in place"); r.Server != pinned || h != route.Name {
			t.Fatalf("route in place: answered by %s with %s %q; want %s and %q", r.Server, routeHeader, h, pinned, route.Name)
		}
	}
	w.deleteRoute(t, cluster, route.Namespace, route.Name)
	deleted := time.Now()
	until("route deletion reached the node", func(_ reply, h string) bool { return h == "" })
	t.Logf("route deletion reached the caller's node after %s", time.Since(deleted).Round(time.Millisecond))
	// The default route is the Service's own cluster, whose endpoints Envoy takes in locality
	// order (the caller's node first, docs/node-proxy.md): a pod other than the pinned one
	// must answer.
	seen := map[string]int{}
	for len(seen) == 0 || len(seen) == 1 && seen[pinned] > 0 {
		r, h := send("default route")
		if h != "" || !slices.Contains(owners, r.Server) {
			t.Fatalf("default route: answered by %s with %s %q; want one of %v without the header", r.Server, routeHeader, h, owners)
		}
		seen[r.Server]++
		if sent > 1000 {
			t.Fatalf("default route: after %d requests only %v answered", sent, seen)
		}
	}
	for end := time.Now().Add(drainWait); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		r, h := send("after the deletion")
		if h != "" || !slices.Contains(owners, r.Server) {
			t.Fatalf("after the deletion: answered by %s with %s %q", r.Server, routeHeader, h)
		}
		seen[r.Server]++
	}
	t.Logf("%d requests on one connection from %s/client; after the deletion (and %s more) answered by %v", sent, podNS, drainWait, seen)
}
