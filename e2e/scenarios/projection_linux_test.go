package scenarios

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/aethermesh/aether/e2e/substrate"
	"github.com/aethermesh/aether/internal/testenv"
)

// The config projection scenarios (docs/projections.md, issue #26) on the real-nodes pair: B
// exports canary and its two versions, and its producer route canary-export on Service canary
// travels to A as a ServiceConfigProjection; A's agents run with importConfig.
const (
	// exportRoute is B's producer route on canary (every request, 50/50 to canary-v1 and -v2).
	exportRoute = "canary-export"
	// condImported and condDrift are the ServiceImport conditions A's registrar writes.
	condImported = "aether.io/ConfigImported"
	condDrift    = "aether.io/ConfigDrift"
	// projectionRequests is how many requests a split is sampled with: both versions answer
	// (each misses all of them with chance 2^-40).
	projectionRequests = 40
)

// configProjections runs the projection scenarios in order: they share B's exports and route.
func (w *world) configProjections(t *testing.T, nl nodeLifecycle) {
	for _, name := range []string{"canary-v1", "canary-v2"} {
		w.export(t, w.b, name)
	}
	for _, name := range []string{"canary", "canary-v1", "canary-v2"} {
		w.wantImport(t, w.a, name)
	}
	route := httpRoute(ns, exportRoute, serviceParent(ns, "canary", 80),
		serviceBackend(ns, "canary-v1", 80, 1), serviceBackend(ns, "canary-v2", 80, 1))
	w.createRoute(t, w.b, route)
	w.wantAccepted(t, w.b, ns, exportRoute)
	c := w.caller(t, w.a, ns, "client")
	addr, host := w.clustersetVIP(t, w.a, "canary"), "canary."+ns+".svc.clusterset.local"

	t.Run("producer-route-reaches-importer", func(t *testing.T) { w.projectionCanary(t, c, addr, host) })
	t.Run("convergence", func(t *testing.T) { w.projectionConvergence(t, c, addr, host, route) })
	t.Run("local-route-wins", func(t *testing.T) { w.projectionLocalWins(t, c, addr, host) })
	t.Run("drift-condition", func(t *testing.T) { w.projectionDrift(t) })
	t.Run("last-known-through-cut-and-restart", func(t *testing.T) { w.projectionLastKnown(t, c, addr, host) })
	t.Run("control-cluster", func(t *testing.T) { w.projectionControlCluster(t, nl, c, addr, host) })
}

// projectionCanary: A's client, calling canary by its clusterset name, gets B's producer route:
// every answer carries its header, comes from B, and both versions answer. A's ServiceImport
// canary says the projection is applied.
func (w *world) projectionCanary(t *testing.T, c *caller, addr, host string) {
	start := time.Now()
	waitRoute(t, c, addr, host, exportRoute)
	t.Logf("B's route %s applied in A %s after it was accepted in B", exportRoute, time.Since(start).Round(time.Millisecond))
	counts := w.sample(t, c, addr, host, exportRoute, w.b)
	if counts["canary-v1"] == 0 || counts["canary-v2"] == 0 || counts["canary-v1"]+counts["canary-v2"] != projectionRequests {
		t.Errorf("answers %v: want both canary-v1 and canary-v2 (the route's 50/50 split) and nothing else", counts)
	}
	w.wantImportCondition(t, w.a, "canary", condImported, metav1.ConditionTrue, "Applied", w.b)
}

// projectionConvergence measures how fast a producer route change in B reaches A's callers, side
// by side with B's own callers (the same change applied in the cluster that made it): B's route
// becomes a ten-rule route whose catch-all rule sends every request to canary-v1 or canary-v2
// with a response header naming the change; each of the changes (AETHER_BENCH_CHANGES, default
// 20; bench/projection.sh runs 100) flips both, and the time from the API write to the first
// answer carrying the new header is taken for B's client and for A's. It logs p50 and p99 of
// both and the size of the projection record in the registry; each change must reach both
// callers within a generous minute (no speed is asserted). original is put back at the end.
func (w *world) projectionConvergence(t *testing.T, c *caller, addr, host string, original *gwv1.HTTPRoute) {
	ctx := context.Background()
	n := 20
	if v := os.Getenv("AETHER_BENCH_CHANGES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("AETHER_BENCH_CHANGES=%q: want a positive number", v)
		}
	}
	routes := w.p.Gateway(w.b).GatewayV1().HTTPRoutes(ns)
	bc := w.caller(t, w.b, ns, "client")
	baddr, bhost := w.vip(t, w.b, "canary"), "canary."+ns+".mesh"
	// setSpec writes spec into the route, again on a conflict (B's registrar writes its status).
	setSpec := func(spec gwv1.HTTPRouteSpec) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := routes.Get(ctx, exportRoute, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Spec = spec
			_, err = routes.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
	}
	defer func() {
		if err := setSpec(original.Spec); err != nil {
			t.Errorf("put %s back: %v", exportRoute, err)
		}
		waitRoute(t, c, addr, host, exportRoute)
	}()
	var local, remote []time.Duration
	for i := range n {
		tag := fmt.Sprintf("change-%d", i)
		version := "canary-v1"
		if i%2 == 1 {
			version = "canary-v2"
		}
		start := time.Now()
		if err := setSpec(tenRuleRoute(version, tag).Spec); err != nil {
			t.Fatal(err)
		}
		follow := func(cl *caller, a, h string) time.Duration {
			deadline := start.Add(time.Minute)
			for {
				r, got, err := cl.get(a, h)
				if err == nil && got == tag && r.Server == version {
					return time.Since(start)
				}
				if time.Now().After(deadline) {
					t.Fatalf("change %d: %s/%s not following B's route within a minute: %s answered with %s %q (%v)", i, cl.ns, cl.pod, r.Server, routeHeader, got, err)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		done := make(chan time.Duration, 1)
		go func() { done <- follow(bc, baddr, bhost) }()
		remote = append(remote, follow(c, addr, host))
		local = append(local, <-done)
	}
	pct := func(ds []time.Duration, p float64) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[min(len(s)-1, int(math.Ceil(p*float64(len(s))))-1)]
	}
	size := -1
	if rw, ok := w.p.(registryWriter); ok {
		if b, err := rw.RegistryValue(ctx, w.b, ns, "canary"); err == nil {
			size = len(b)
		} else {
			t.Errorf("read the projection of %s/canary: %v", ns, err)
		}
	}
	t.Logf("projection convergence over %d changes of a ten-rule route: B's callers (local) p50 %s p99 %s; A's callers (projected) p50 %s p99 %s; projection record %d bytes",
		n, pct(local, 0.5).Round(time.Millisecond), pct(local, 0.99).Round(time.Millisecond),
		pct(remote, 0.5).Round(time.Millisecond), pct(remote, 0.99).Round(time.Millisecond), size)
}

// tenRuleRoute is the spec of B's route in projectionConvergence: nine rules with matches no
// test request has (paths, headers, a query, a method, a regular expression, filters, a timeout
// and a retry: a typical route), then a catch-all rule to version with routeHeader = tag.
func tenRuleRoute(version, tag string) *gwv1.HTTPRoute {
	r := httpRoute(ns, exportRoute, serviceParent(ns, "canary", 80), serviceBackend(ns, version, 80, 1))
	r.Spec.Rules[0].Filters[0].ResponseHeaderModifier.Set[0].Value = tag
	catchAll := r.Spec.Rules[0]
	path := func(t gwv1.PathMatchType, v string) *gwv1.HTTPPathMatch {
		return &gwv1.HTTPPathMatch{Type: ptrTo(t), Value: ptrTo(v)}
	}
	header := func(name, v string) []gwv1.HTTPHeaderMatch {
		return []gwv1.HTTPHeaderMatch{{Type: ptrTo(gwv1.HeaderMatchExact), Name: gwv1.HTTPHeaderName(name), Value: v}}
	}
	to := []gwv1.HTTPBackendRef{serviceBackend(ns, "canary-v1", 80, 1)}
	rule := func(m gwv1.HTTPRouteMatch) gwv1.HTTPRouteRule {
		return gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{m}, BackendRefs: to}
	}
	prefix := gwv1.PathMatchPathPrefix
	r.Spec.Rules = []gwv1.HTTPRouteRule{
		rule(gwv1.HTTPRouteMatch{Path: path(gwv1.PathMatchExact, "/healthz")}),
		rule(gwv1.HTTPRouteMatch{Path: path(prefix, "/api/v2"), Headers: header("x-version", "v2")}),
		rule(gwv1.HTTPRouteMatch{Path: path(prefix, "/api"), Headers: header("x-user", "test")}),
		rule(gwv1.HTTPRouteMatch{Path: path(prefix, "/orders"), Method: ptrTo(gwv1.HTTPMethodPost)}),
		rule(gwv1.HTTPRouteMatch{Path: path(prefix, "/static")}),
		rule(gwv1.HTTPRouteMatch{Path: path(prefix, "/admin"), Headers: header("x-admin", "true")}),
		rule(gwv1.HTTPRouteMatch{Path: path(prefix, "/legacy")}),
		rule(gwv1.HTTPRouteMatch{Path: path(prefix, "/"), QueryParams: []gwv1.HTTPQueryParamMatch{{Type: ptrTo(gwv1.QueryParamMatchExact), Name: "debug", Value: "1"}}}),
		rule(gwv1.HTTPRouteMatch{Path: path(gwv1.PathMatchRegularExpression, "/orders/[a-z0-9]+")}),
		catchAll,
	}
	r.Spec.Rules[4].Filters = []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterResponseHeaderModifier,
		ResponseHeaderModifier: &gwv1.HTTPHeaderFilter{Set: []gwv1.HTTPHeader{{Name: "cache-control", Value: "max-age=60"}}}}}
	r.Spec.Rules[5].Timeouts = &gwv1.HTTPRouteTimeouts{Request: ptrTo(gwv1.Duration("5s"))}
	r.Spec.Rules[6].Filters = []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterURLRewrite,
		URLRewrite: &gwv1.HTTPURLRewriteFilter{Path: &gwv1.HTTPPathModifier{Type: gwv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptrTo("/v1")}}}}
	r.Spec.Rules[8].Retry = &gwv1.HTTPRouteRetry{Attempts: ptrTo(2), Codes: []gwv1.HTTPRouteRetryStatusCode{503}}
	return r
}

// projectionLocalWins: a producer route in A on the ServiceImport canary (in canary's namespace)
// replaces the imported config for every caller; the ServiceImport says Overridden and names it;
// once it is deleted, the imported route applies again.
func (w *world) projectionLocalWins(t *testing.T, c *caller, addr, host string) {
	local := httpRoute(ns, "canary-local", importParent(ns, "canary", 80), importBackend(ns, "canary-v1", 80))
	w.createRoute(t, w.a, local)
	waitRoute(t, c, addr, host, local.Name)
	counts := w.sample(t, c, addr, host, local.Name, w.b)
	if counts["canary-v1"] != projectionRequests {
		t.Errorf("with the local route: answers %v, want all from canary-v1", counts)
	}
	w.wantImportCondition(t, w.a, "canary", condImported, metav1.ConditionFalse, "Overridden", local.Name)
	w.wantImportCondition(t, w.a, "canary", condDrift, metav1.ConditionTrue, "Drift", local.Name)
	w.deleteRoute(t, w.a, ns, local.Name)
	waitRoute(t, c, addr, host, exportRoute)
	w.wantImportCondition(t, w.a, "canary", condImported, metav1.ConditionTrue, "Applied", w.b)
}

// projectionDrift: a consumer route in A's namespace frontNS on the ServiceImport canary makes
// A's ServiceImport say ConfigDrift=True naming it; deleting it clears the condition. Callers in
// frontNS get their own route meanwhile, callers elsewhere the imported one.
func (w *world) projectionDrift(t *testing.T) {
	w.wantImportCondition(t, w.a, "canary", condDrift, metav1.ConditionFalse, "NoDrift", "")
	pin := httpRoute(frontNS, "front-pin", importParent(ns, "canary", 80), importBackend(ns, "canary-v2", 80))
	w.createRoute(t, w.a, pin)
	front := w.caller(t, w.a, frontNS, "client")
	addr, host := w.clustersetVIP(t, w.a, "canary"), "canary."+ns+".svc.clusterset.local"
	waitRoute(t, front, addr, host, pin.Name)
	w.wantImportCondition(t, w.a, "canary", condDrift, metav1.ConditionTrue, "Drift", frontNS+"/"+pin.Name)
	w.deleteRoute(t, w.a, frontNS, pin.Name)
	w.wantImportCondition(t, w.a, "canary", condDrift, metav1.ConditionFalse, "NoDrift", "")
	waitRoute(t, front, addr, host, exportRoute)
}

// projectionLastKnown: with the registry cut off from A only, B deletes its route; A keeps
// serving the last-known projection, also after its client node's agent restarts during the cut
// (it starts from the registry state it persisted); once the cut ends, A follows B.
func (w *world) projectionLastKnown(t *testing.T, c *caller, addr, host string) {
	ctx := context.Background()
	if err := w.p.CutRegistry(ctx, w.a); err != nil {
		t.Fatal(err)
	}
	restored := false
	t.Cleanup(func() {
		if !restored {
			_ = w.p.RestoreRegistry(ctx)
		}
	})
	rw, ok := w.p.(registryWriter)
	if !ok {
		t.Fatalf("pair %T cannot read the registry", w.p)
	}
	before, err := rw.RegistryValue(ctx, w.b, ns, "canary")
	if err != nil {
		t.Fatal(err)
	}
	w.deleteRoute(t, w.b, ns, exportRoute)
	// B routes its own callers by the new config at once and its registrar rewrites canary's
	// projection; A cannot hear of it. Sampled a while after the rewrite (A's callers follow a
	// projection within a second here, the convergence subtest): a cut that let the registry's
	// packets reach A's nodes, where an open watch stream would deliver the rewrite, fails here
	// rather than by chance after the agent's restart.
	bc := w.caller(t, w.b, ns, "client")
	waitRoute(t, bc, w.vip(t, w.b, "canary"), "canary."+ns+".mesh", "")
	testenv.Eventually(t, time.Minute, "B's registrar rewriting canary's projection", func() error {
		after, err := rw.RegistryValue(ctx, w.b, ns, "canary")
		if err != nil {
			return err
		}
		if bytes.Equal(after, before) {
			return errors.New("unchanged")
		}
		return nil
	})
	time.Sleep(3 * time.Second)
	w.sample(t, c, addr, host, exportRoute, w.b)
	k, ok := w.p.(agentKiller)
	if !ok {
		t.Fatalf("pair %T cannot restart an agent without waiting for it to be ready", w.p)
	}
	if err := k.KillAgent(ctx, w.a, w.clientNode); err != nil {
		t.Fatal(err)
	}
	// The restarted agent serves its Envoy again (from the persisted registry state after the
	// sync grace): Envoy's xDS stream is up, and the routes are still the last-known ones.
	testenv.Eventually(t, 2*time.Minute, "the restarted agent on "+w.clientNode+" serving xDS", func() error {
		out, err := w.p.EnvoyAdmin(ctx, w.a, w.clientNode, "/stats?filter=^control_plane.connected_state$")
		if err != nil {
			return err
		}
		if !strings.Contains(out, "control_plane.connected_state: 1") {
			return fmt.Errorf("Envoy: %s", strings.TrimSpace(out))
		}
		return nil
	})
	time.Sleep(3 * time.Second) // the first snapshot of the new agent reaches Envoy
	// On a failure, say what Envoy held (a restarted agent serves what its previous run persisted).
	t.Cleanup(func() {
		if t.Failed() {
			out, err := w.p.EnvoyAdmin(ctx, w.a, w.clientNode, "/config_dump?resource=dynamic_route_configs")
			t.Logf("Envoy on %s after the agent's restart, route configs (%v):\n%s", w.clientNode, err, testenv.Tail(out, 8000))
		}
	})
	w.sample(t, c, addr, host, exportRoute, w.b)
	if err := w.p.RestoreRegistry(ctx); err != nil {
		t.Fatal(err)
	}
	restored = true
	waitRoute(t, c, addr, host, "")
	w.wantImportCondition(t, w.a, "canary", condImported, metav1.ConditionTrue, "Applied", w.b)
	// Back for the next scenario.
	w.createRoute(t, w.b, httpRoute(ns, exportRoute, serviceParent(ns, "canary", 80),
		serviceBackend(ns, "canary-v1", 80, 1), serviceBackend(ns, "canary-v2", 80, 1)))
	waitRoute(t, c, addr, host, exportRoute)
}

// projectionControlCluster: with controlCluster=A on both clusters, B exports no config (its
// projections go) and A's callers no longer get B's route; a projection written by hand (root
// on the registry) under cluster "rogue", outside the pair, is ignored by A's agents and named
// in A's ServiceImport status. Set back at the end.
func (w *world) projectionControlCluster(t *testing.T, nl nodeLifecycle, c *caller, addr, host string) {
	ctx := context.Background()
	upgrade := func(value string) {
		t.Helper()
		for _, cl := range []string{w.a, w.b} {
			if err := nl.UpgradeAether(ctx, cl, "controlCluster="+value); err != nil {
				t.Fatal(err)
			}
		}
		for _, cl := range []string{w.a, w.b} {
			w.waitRolledOut(t, cl)
		}
	}
	t.Cleanup(func() { upgrade("") })
	upgrade(w.a)
	waitRoute(t, c, addr, host, "")
	w.wantImportCondition(t, w.a, "canary", condImported, metav1.ConditionFalse, "NoProjection", "")
	rw, ok := w.p.(registryWriter)
	if !ok {
		t.Fatalf("pair %T cannot write to the registry as root", w.p)
	}
	// Under an origin no registrar of the pair owns (B's own registrar would delete one under
	// B's: with a control cluster elsewhere it keeps its partition free of projections).
	const rogue = "rogue"
	del, err := rw.PutRogueProjection(ctx, rogue, ns, "canary", exportRoute+"-rogue", routeHeader)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := del(); err != nil {
			t.Errorf("delete the rogue projection: %v", err)
		}
	})
	w.wantImportCondition(t, w.a, "canary", condImported, metav1.ConditionFalse, "NotControlCluster", rogue)
	for range 10 {
		if r, h, err := c.get(addr, host); err != nil || h != "" {
			t.Fatalf("with a rogue projection from %s: %s answered with %s %q (%v); want it ignored", w.b, r.Server, routeHeader, h, err)
		}
	}
}

// sample sends projectionRequests requests from c and returns the answers by server; each must
// carry routeHeader = route and come from cluster.
func (w *world) sample(t *testing.T, c *caller, addr, host, route, cluster string) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for i := range projectionRequests {
		r, h, err := c.get(addr, host)
		if err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		if h != route || r.Cluster != cluster {
			t.Fatalf("request %d: answered by %s in %s with %s %q; want route %q from %s", i+1, r.Server, r.Cluster, routeHeader, h, route, cluster)
		}
		counts[r.Server]++
	}
	return counts
}

// importParent is a parentRef to port of the ServiceImport namespace/name (GEP-1748).
func importParent(namespace, name string, port int32) gwv1.ParentReference {
	p := serviceParent(namespace, name, port)
	p.Group, p.Kind = ptrTo(gwv1.Group("multicluster.x-k8s.io")), ptrTo(gwv1.Kind("ServiceImport"))
	return p
}

// export creates the ServiceExport of Service ns/name in cluster and deletes it when t ends.
func (w *world) export(t *testing.T, cluster, name string) {
	t.Helper()
	res := w.p.Dynamic(cluster).Resource(serviceExports).Namespace(ns)
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
		"metadata": map[string]any{"name": name, "namespace": ns}}}
	if _, err := res.Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("export %s/%s from %s: %v", ns, name, cluster, err)
	}
	t.Cleanup(func() {
		if err := res.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete ServiceExport %s/%s in %s: %v", ns, name, cluster, err)
		}
	})
}

// wantImport waits for the ServiceImport ns/name and its clusterset Service in cluster.
func (w *world) wantImport(t *testing.T, cluster, name string) {
	t.Helper()
	testenv.Eventually(t, 90*time.Second, "ServiceImport "+name+" in "+cluster, func() error {
		_, err := w.p.Kube(cluster).CoreV1().Services(ns).Get(context.Background(), name+"-clusterset", metav1.GetOptions{})
		return err
	})
}

// clustersetVIP returns the clusterset VIP of ns/name in cluster as "ip:80".
func (w *world) clustersetVIP(t *testing.T, cluster, name string) string {
	t.Helper()
	return net.JoinHostPort(w.clusterIP(t, cluster, name+"-clusterset"), "80")
}

// wantImportCondition waits until ServiceImport ns/name in cluster has condition typ with status
// and reason and a message containing msg.
func (w *world) wantImportCondition(t *testing.T, cluster, name, typ string, status metav1.ConditionStatus, reason, msg string) {
	t.Helper()
	what := fmt.Sprintf("ServiceImport %s/%s in %s: %s=%s %s (%q)", ns, name, cluster, typ, status, reason, msg)
	testenv.Eventually(t, 90*time.Second, what, func() error {
		u, err := w.p.Dynamic(cluster).Resource(serviceImports).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var si mcsv1beta1.ServiceImport
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &si); err != nil {
			return err
		}
		c := meta.FindStatusCondition(si.Status.Conditions, typ)
		if c == nil || c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msg) {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
}

// waitRolledOut waits until cluster's agent DaemonSet and registrar Deployment run their latest
// spec on every pod, ready.
func (w *world) waitRolledOut(t *testing.T, cluster string) {
	t.Helper()
	kube := w.p.Kube(cluster)
	ctx := context.Background()
	testenv.Eventually(t, 4*time.Minute, "aether rolled out in "+cluster, func() error {
		ds, err := kube.AppsV1().DaemonSets(aetherNamespace).Get(ctx, agentDaemonSet, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !rolledOut(ds) {
			return fmt.Errorf("agent DaemonSet: status %+v at generation %d", ds.Status, ds.Generation)
		}
		d, err := kube.AppsV1().Deployments(aetherNamespace).Get(ctx, registrarDeployment, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := d.Status
		if st.ObservedGeneration < d.Generation || d.Spec.Replicas == nil || st.UpdatedReplicas != *d.Spec.Replicas ||
			st.ReadyReplicas != *d.Spec.Replicas || st.Replicas != *d.Spec.Replicas {
			return fmt.Errorf("registrar Deployment: status %+v at generation %d", st, d.Generation)
		}
		return nil
	})
}

// mcsPortConflict: Service perport is exported from A (first, over its pod perport-1) and from B (a
// second later, over B's remote pods); they agree on port http (80) and disagree on port tcp: A
// serves it on substrate.EchoTCPPort, B on the next number. KEP-1645: the ServiceImport has the
// union of the ports with the oldest export's definition of tcp, in both clusters, stable; both
// exports say Conflict=True PortConflict. aether's rule: each port's traffic reaches only the
// clusters that define it the winning way. A's callers prefer A's own endpoints, so the rule
// shows once perport-1 is gone: http then spills over to B, tcp does not (B's endpoints do not
// define tcp the winning way) and fails.
func (w *world) mcsPortConflict(t *testing.T) {
	ctx := context.Background()
	echoCmd, echoImg := w.p.Command("echo")
	pod := substrate.EchoPod(ns, "perport-1", w.nodesA[1], w.a, echoCmd)
	pod.Spec.Containers[0].Image = echoImg
	pods := w.p.Kube(w.a).CoreV1().Pods(ns)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pods.Delete(context.Background(), pod.Name, metav1.DeleteOptions{}) })
	svcA, svcB := echoService("perport", "perport-1"), echoService("perport", "remote")
	svcB.Spec.Ports[1].Port = substrate.EchoTCPPort + 1
	for _, s := range []struct {
		cluster string
		svc     *corev1.Service
	}{{w.a, svcA}, {w.b, svcB}} {
		if _, err := w.p.Kube(s.cluster).CoreV1().Services(ns).Create(ctx, s.svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = w.p.Kube(s.cluster).CoreV1().Services(ns).Delete(context.Background(), "perport", metav1.DeleteOptions{})
		})
	}
	w.export(t, w.a, "perport")
	w.wantImport(t, w.b, "perport")
	time.Sleep(1100 * time.Millisecond) // creationTimestamp has one-second resolution
	w.export(t, w.b, "perport")
	want := fmt.Sprintf("http/80 tcp/%d", substrate.EchoTCPPort)
	for _, c := range []string{w.a, w.b} {
		testenv.Eventually(t, 90*time.Second, "ServiceImport perport's ports in "+c, func() error {
			if got := w.importPorts(t, c, "perport"); got != want {
				return fmt.Errorf("ports %s, want %s", got, want)
			}
			return nil
		})
		testenv.Eventually(t, 90*time.Second, "Conflict on ServiceExport perport in "+c, func() error {
			u, err := w.p.Dynamic(c).Resource(serviceExports).Namespace(ns).Get(ctx, "perport", metav1.GetOptions{})
			if err != nil {
				return err
			}
			var se mcsv1beta1.ServiceExport
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &se); err != nil {
				return err
			}
			cond := meta.FindStatusCondition(se.Status.Conditions, string(mcsv1beta1.ServiceExportConditionConflict))
			if cond == nil || cond.Status != metav1.ConditionTrue || !strings.Contains(cond.Reason, string(mcsv1beta1.ServiceExportReasonPortConflict)) || !strings.Contains(cond.Message, "tcp") {
				return fmt.Errorf("Conflict %+v", cond)
			}
			return nil
		})
	}
	host := "perport." + ns + ".svc.clusterset.local"
	addr := net.JoinHostPort(host, fmt.Sprint(substrate.EchoTCPPort))
	w.wantHTTP(t, "http://"+host+"/", w.a)
	w.wantTCP(t, addr, w.a)
	// Without A's pod: http spills over to B; tcp has no endpoint that defines it the winning way.
	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(0))}); err != nil {
		t.Fatal(err)
	}
	w.wantHTTP(t, "http://"+host+"/", w.b)
	for i := range 10 {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		r, err := w.tcp(rctx, addr, "hello")
		cancel()
		if err == nil {
			t.Fatalf("tcp request %d to %s with perport-1 gone answered %+v: only A defines tcp the winning way, B's pods must not get it", i+1, addr, r)
		}
	}
	for _, c := range []string{w.a, w.b} {
		if got := w.importPorts(t, c, "perport"); got != want {
			t.Errorf("ServiceImport perport in %s has ports %s after the traffic, want %s", c, got, want)
		}
	}
}

// importPorts returns ServiceImport ns/name's ports in cluster as "name/port ...", sorted by
// name.
func (w *world) importPorts(t *testing.T, cluster, name string) string {
	t.Helper()
	u, err := w.p.Dynamic(cluster).Resource(serviceImports).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	var si mcsv1beta1.ServiceImport
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &si); err != nil {
		t.Fatal(err)
	}
	var ps []string
	for _, p := range si.Spec.Ports {
		ps = append(ps, fmt.Sprintf("%s/%d", p.Name, p.Port))
	}
	slices.Sort(ps)
	return strings.Join(ps, " ")
}
