package scenarios

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/aethermesh/aether/e2e/substrate"
	"github.com/aethermesh/aether/internal/testenv"
)

// The authorization scenario (issue #32): an AuthorizationPolicy in B on an exported Service,
// enforced by the destination node's Envoy on its inbound mTLS chains, for callers of B and of
// A (through B's node waypoint, with the caller's own certificate).
const (
	// authzSA is the ServiceAccount of A's authzPod, in ns: the one caller the policy allows.
	authzSA = "client"
	// authzPod is a client pod in A's ns, on the client's node, running as authzSA. A's
	// "client" pod (ServiceAccount default) is the other alpha workload.
	authzPod = "authz-client"
	// guardedSvc is B's exported Service the policy targets, over the one echo pod guardedPod
	// on B's second node (B's client, on the first node, calls it across nodes).
	guardedSvc = "guarded"
	guardedPod = "guarded-1"
	// authzPolicy is the policy's name, in B's ns.
	authzPolicy = "guarded-from-client"
	// rbacDenied is the body of Envoy's HTTP RBAC refusal (a 403).
	rbacDenied = "RBAC: access denied"
)

var authorizationPolicies = schema.GroupVersionResource{Group: "security.aether.io", Version: "v1alpha1", Resource: "authorizationpolicies"}

// authzCaller is one caller of the scenario: a pod, the address (VIP:port) and Host it calls
// guardedSvc by, and the identity B's pod must see.
type authzCaller struct {
	what             string // for messages
	cluster, ns, pod string
	httpAddr, host   string // VIP:80 and the Host header
	tcpAddr          string // VIP:9000
	id               string
}

// authzHTTP GETs / from c (a new connection from inside its pod, so its capture applies) and
// returns the status, the body and, for a 200, the echo's reply.
func (w *world) authzHTTP(c authzCaller) (int, string, reply, error) {
	var r reply
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return w.p.Dial(ctx, c.cluster, c.ns, c.pod, addr)
		},
		DisableKeepAlives:  true,
		DisableCompression: true,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	req, err := http.NewRequest(http.MethodGet, "http://"+c.httpAddr+"/", nil)
	if err != nil {
		return 0, "", r, err
	}
	req.Host = c.host
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", r, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, "", r, fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, &r); err != nil || r.Server == "" {
			return resp.StatusCode, string(body), r, fmt.Errorf("answer %q: not the echo's (%v)", body, err)
		}
	}
	return resp.StatusCode, string(body), r, nil
}

// allowedHTTP returns the echo's reply when c's GET is answered 200 by guardedPod in B seeing c's identity.
func (w *world) allowedHTTP(c authzCaller) (reply, error) {
	code, body, r, err := w.authzHTTP(c)
	if err != nil {
		return r, err
	}
	if code != http.StatusOK {
		return r, fmt.Errorf("%s: answer %d %q, want 200", c.what, code, body)
	}
	if r.Server != guardedPod || r.Cluster != w.b || r.CallerID != c.id {
		return r, fmt.Errorf("%s: answered by %s in %s seeing caller %q (xfcc %q); want %s in %s seeing %s", c.what, r.Server, r.Cluster, r.CallerID, r.XFCC, guardedPod, w.b, c.id)
	}
	return r, nil
}

// refusedHTTP returns nil when c's GET is answered 403 with Envoy's RBAC body.
func (w *world) refusedHTTP(c authzCaller) error {
	code, body, r, err := w.authzHTTP(c)
	if err != nil {
		return err
	}
	if code != http.StatusForbidden || strings.TrimSpace(body) != rbacDenied {
		return fmt.Errorf("%s: answer %d %q (server %s, caller %q), want 403 %q", c.what, code, body, r.Server, r.CallerID, rbacDenied)
	}
	return nil
}

// authzTCP opens a connection from c's pod to its tcpAddr, sends one line and reads one line
// back (10 s at most). It returns what came back and the error that ended the read.
func (w *world) authzTCP(c authzCaller, msg string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := w.p.Dial(ctx, c.cluster, c.ns, c.pod, c.tcpAddr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintln(conn, msg); err != nil {
		return "", err
	}
	return bufio.NewReader(conn).ReadString('\n')
}

// allowedTCP returns nil when c's line comes back from guardedPod in B.
func (w *world) allowedTCP(c authzCaller) error {
	line, err := w.authzTCP(c, "hello")
	if err != nil {
		return fmt.Errorf("%s: TCP %s: %q, %w", c.what, c.tcpAddr, line, err)
	}
	var r reply
	if err := json.Unmarshal([]byte(line), &r); err != nil || r.Message != "hello" || r.Server != guardedPod || r.Cluster != w.b {
		return fmt.Errorf("%s: TCP %s answered %q (%v), want %s in %s echoing hello", c.what, c.tcpAddr, line, err, guardedPod, w.b)
	}
	return nil
}

// refusedTCP returns nil when c's connection is closed (end of stream or reset) without a
// single byte back; a timeout is not a refusal.
func (w *world) refusedTCP(c authzCaller) error {
	line, err := w.authzTCP(c, "hello")
	if err == nil || line != "" {
		return fmt.Errorf("%s: TCP %s answered %q (%v), want the connection closed without data", c.what, c.tcpAddr, line, err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%s: TCP %s: %w, want the connection closed, not a timeout", c.what, c.tcpAddr, err)
	}
	if !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "connection reset") {
		return fmt.Errorf("%s: TCP %s: %w, want the connection closed (EOF or reset)", c.what, c.tcpAddr, err)
	}
	return nil
}

// authzStats returns the authorization counters of guardedPod (docs/authorization.md,
// "Counters") from the Envoy of its node, by name.
func (w *world) authzStats(t *testing.T) map[string]int {
	t.Helper()
	node := w.nodesB[1]
	filter := `authz\.` + ns + `\.` + regexp.QuoteMeta(guardedPod) + `\.`
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	page, err := w.p.EnvoyAdmin(ctx, w.b, node, "/stats?filter="+url.QueryEscape(filter))
	if err != nil {
		t.Fatalf("%s's Envoy stats: %v", node, err)
	}
	out := map[string]int{}
	for _, line := range strings.Split(page, "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
			out[k] = n
		}
	}
	return out
}

// authzPolicyObject is the scenario's policy: on Service guardedSvc, ALLOW callers running as
// ServiceAccount ns/authzSA (in any cluster of the clusterset), dry run or not.
func authzPolicyObject(dryRun bool) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "security.aether.io/v1alpha1", "kind": "AuthorizationPolicy",
		"metadata": map[string]any{"namespace": ns, "name": authzPolicy},
		"spec": map[string]any{
			"targetRefs": []any{map[string]any{"group": "", "kind": "Service", "name": guardedSvc}},
			"action":     "ALLOW",
			"dryRun":     dryRun,
			"rules": []any{map[string]any{"sources": []any{map[string]any{
				"type": "ServiceAccount", "serviceAccount": map[string]any{"namespace": ns, "name": authzSA}}}}},
		},
	}}
}

// wantPolicyAccepted waits until B's registrar has written Accepted=True (reason Accepted) at
// the policy's generation and targets naming Service guardedSvc.
func (w *world) wantPolicyAccepted(t *testing.T) {
	t.Helper()
	testenv.Eventually(t, 90*time.Second, "AuthorizationPolicy "+ns+"/"+authzPolicy+" Accepted with its target in "+w.b, func() error {
		u, err := w.p.Dynamic(w.b).Resource(authorizationPolicies).Namespace(ns).Get(context.Background(), authzPolicy, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		var accepted map[string]any
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Accepted" {
				accepted = m
			}
		}
		gen, _ := accepted["observedGeneration"].(int64)
		if accepted == nil || accepted["status"] != "True" || accepted["reason"] != "Accepted" || gen != u.GetGeneration() {
			return fmt.Errorf("Accepted condition %v at generation %d", accepted, u.GetGeneration())
		}
		targets, _, _ := unstructured.NestedSlice(u.Object, "status", "targets")
		if len(targets) != 1 {
			return fmt.Errorf("status.targets %v, want Service %s", targets, guardedSvc)
		}
		tg, _ := targets[0].(map[string]any)
		if g, _ := tg["group"].(string); g != "" || tg["kind"] != "Service" || tg["name"] != guardedSvc {
			return fmt.Errorf("status.targets %v, want Service %s", targets, guardedSvc)
		}
		t.Logf("policy status: Accepted %q, targets %v", accepted["message"], targets)
		return nil
	})
}

// authzTwoClusters is the two-cluster authorization scenario (issue #32). In B, an ALLOW
// AuthorizationPolicy on the exported Service guardedSvc names one source, ServiceAccount
// ns/authzSA, which in A runs authzPod. With the policy enforced:
//   - authzPod in A, through B's node waypoint (its per-service counter grows), gets 200 and B's
//     pod sees its SPIFFE ID in XFCC; its TCP line comes back;
//   - A's client (ServiceAccount default) gets 403 "RBAC: access denied", and its TCP
//     connection is closed without a byte back;
//   - B's client (ServiceAccount default; the same namespace name, so only the ServiceAccount
//     tells it from the allowed one) gets 403 and its TCP connection closed;
//   - the allow filter's denied counters of guardedPod grow on its node's Envoy.
//
// B's registrar writes Accepted=True with the Service as target. Once a caller is refused, every
// later call of its is, also on connections its node Envoy pooled before the policy (for
// drainWait: the first policy of a pod changes only ECDS resources, never the listener, whose
// old chains would otherwise serve those connections without RBAC until they drained). Then
// the policy turns dry run: every caller gets through
// again, HTTP and TCP, while the allow filter's shadow_denied counters (HTTP and TCP) grow. Then
// it is deleted: every caller gets through.
func (w *world) authzTwoClusters(t *testing.T) {
	ctx := context.Background()
	// The clusterset VIP of guardedSvc in A, and its own VIP in B.
	var importVIP string
	testenv.Eventually(t, 90*time.Second, "ServiceImport "+guardedSvc+" and its clusterset Service in "+w.a, func() error {
		if _, err := w.p.Dynamic(w.a).Resource(serviceImports).Namespace(ns).Get(ctx, guardedSvc, metav1.GetOptions{}); err != nil {
			return err
		}
		s, err := w.p.Kube(w.a).CoreV1().Services(ns).Get(ctx, guardedSvc+"-clusterset", metav1.GetOptions{})
		if err != nil {
			return err
		}
		importVIP = s.Spec.ClusterIP
		return nil
	})
	localVIP := w.clusterIP(t, w.b, guardedSvc)
	remote := func(what, pod, id string) authzCaller {
		return authzCaller{what: what, cluster: w.a, ns: ns, pod: pod, id: id,
			httpAddr: net.JoinHostPort(importVIP, "80"), host: guardedSvc + "." + ns + ".svc.clusterset.local",
			tcpAddr: net.JoinHostPort(importVIP, strconv.Itoa(substrate.EchoTCPPort))}
	}
	authzCallerID := w.id(w.a, ns, authzSA)
	allowed := remote(w.a+"/"+ns+"/"+authzPod+" (sa "+authzSA+")", authzPod, authzCallerID)
	otherA := remote(w.a+"/"+ns+"/client (sa default)", "client", w.callerID())
	otherB := authzCaller{what: w.b + "/" + ns + "/client (sa default)", cluster: w.b, ns: ns, pod: "client", id: w.id(w.b, ns, "default"),
		httpAddr: net.JoinHostPort(localVIP, "80"), host: guardedSvc + "." + ns + ".mesh",
		tcpAddr: net.JoinHostPort(localVIP, strconv.Itoa(substrate.EchoTCPPort))}
	everyone := []authzCaller{allowed, otherA, otherB}

	// everyoneThrough waits until every caller gets 200 from guardedPod with its own identity
	// and its TCP line back.
	everyoneThrough := func(phase string) {
		t.Helper()
		for _, c := range everyone {
			testenv.Eventually(t, 2*time.Minute, phase+": "+c.what+" answered", func() error {
				if _, err := w.allowedHTTP(c); err != nil {
					return err
				}
				return w.allowedTCP(c)
			})
		}
	}
	everyoneThrough("before the policy")

	policies := w.p.Dynamic(w.b).Resource(authorizationPolicies).Namespace(ns)
	if _, err := policies.Create(ctx, authzPolicyObject(false), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create AuthorizationPolicy %s/%s in %s: %v", ns, authzPolicy, w.b, err)
	}
	t.Cleanup(func() {
		if err := policies.Delete(context.Background(), authzPolicy, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete AuthorizationPolicy %s/%s in %s: %v", ns, authzPolicy, w.b, err)
		}
	})
	w.wantPolicyAccepted(t)

	before := w.authzStats(t)
	for _, c := range []authzCaller{otherA, otherB} {
		testenv.Eventually(t, 2*time.Minute, "enforced: "+c.what+" refused (HTTP 403)", func() error { return w.refusedHTTP(c) })
		// TCP: the verdict is taken per connection; new connections only.
		testenv.Eventually(t, time.Minute, "enforced: "+c.what+" refused (TCP closed without data)", func() error { return w.refusedTCP(c) })
	}
	// Every chain carries its RBAC filters before any policy (docs/authorization.md, "Changing
	// policies"): once refused, a caller stays refused, also on the connections its node Envoy
	// pooled before the policy, through what would be the drain time of a listener change.
	passed := 0
	for start := time.Now(); time.Since(start) < drainWait; time.Sleep(200 * time.Millisecond) {
		for _, c := range []authzCaller{otherA, otherB} {
			if code, _, r, err := w.authzHTTP(c); err == nil && code == http.StatusOK {
				passed++
				t.Errorf("enforced, %s after the refusals: %s answered 200 by %s", time.Since(start).Round(time.Millisecond), c.what, r.Server)
			}
		}
	}
	if passed > 0 {
		t.Fatalf("enforced: %d of the refused callers' requests passed during the %s after their first refusals", passed, drainWait)
	}
	// Every later call must keep its verdict: three of each, now. A's allowed calls cross through
	// B's node waypoints (the per-service counter grows).
	wpBefore := w.waypointRxBytes(t, guardedSvc)
	for range 3 {
		r, err := w.allowedHTTP(allowed)
		if err != nil {
			t.Fatalf("enforced: %v", err)
		}
		if !strings.Contains(r.XFCC, authzCallerID) {
			t.Errorf("enforced: XFCC %q seen by %s does not name %s", r.XFCC, r.Server, authzCallerID)
		}
		if err := w.allowedTCP(allowed); err != nil {
			t.Fatalf("enforced: %v", err)
		}
		for _, c := range []authzCaller{otherA, otherB} {
			if err := w.refusedHTTP(c); err != nil {
				t.Fatalf("enforced: %v", err)
			}
			if err := w.refusedTCP(c); err != nil {
				t.Fatalf("enforced: %v", err)
			}
		}
	}
	wpAfter := w.waypointRxBytes(t, guardedSvc)
	t.Logf("enforced: %s answered by %s in %s seeing %s (HTTP and TCP); B's waypoint bytes received for %s/%s, by node: before %v, after %v",
		allowed.what, guardedPod, w.b, authzCallerID, ns, guardedSvc, wpBefore, wpAfter)
	if wpAfter[w.nodesB[1]] <= wpBefore[w.nodesB[1]] {
		t.Errorf("enforced: %s's waypoint received no bytes for %s/%s (before %v, after %v): A's calls did not go through it", w.nodesB[1], ns, guardedSvc, wpBefore, wpAfter)
	}
	after := w.authzStats(t)
	for _, stat := range []string{
		fmt.Sprintf("http.inbound_http.rbac.authz.%s.%s.%d.allow.denied", ns, guardedPod, substrate.EchoHTTPPort),
		fmt.Sprintf("authz.%s.%s.%d.allow.rbac.denied", ns, guardedPod, substrate.EchoTCPPort),
	} {
		// At least the 4 refusals of each kind above (2 callers, 1 + 3 calls).
		if after[stat]-before[stat] < 4 {
			t.Errorf("enforced: %s went from %d to %d, want 4 more at least", stat, before[stat], after[stat])
		}
		t.Logf("enforced: %s %d -> %d", stat, before[stat], after[stat])
	}

	// Dry run: the same policy only counts.
	patch := []byte(`{"spec":{"dryRun":true}}`)
	if _, err := policies.Patch(ctx, authzPolicy, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("dry run: patch %s: %v", authzPolicy, err)
	}
	w.wantPolicyAccepted(t)
	shadows := []string{
		fmt.Sprintf("http.inbound_http.rbac.authz.%s.%s.%d.allow.dry_run.shadow_denied", ns, guardedPod, substrate.EchoHTTPPort),
		fmt.Sprintf("authz.%s.%s.%d.allow.rbac.allow_dry_run.shadow_denied", ns, guardedPod, substrate.EchoTCPPort),
	}
	dryBefore := w.authzStats(t)
	for _, c := range []authzCaller{otherA, otherB} {
		testenv.Eventually(t, 2*time.Minute, "dry run: "+c.what+" answered", func() error {
			if _, err := w.allowedHTTP(c); err != nil {
				return err
			}
			return w.allowedTCP(c)
		})
	}
	// Dry run changes no listener (only the RBAC configurations): no drain, every verdict holds.
	for range 3 {
		for _, c := range everyone {
			if _, err := w.allowedHTTP(c); err != nil {
				t.Fatalf("dry run: %v", err)
			}
			if err := w.allowedTCP(c); err != nil {
				t.Fatalf("dry run: %v", err)
			}
		}
	}
	dryAfter := w.authzStats(t)
	for _, stat := range shadows {
		// otherA and otherB: 3 calls each at least, counted after the switch reached the node.
		if dryAfter[stat]-dryBefore[stat] < 6 {
			t.Errorf("dry run: %s went from %d to %d, want 6 more at least", stat, dryBefore[stat], dryAfter[stat])
		}
		t.Logf("dry run: every caller answered; %s %d -> %d", stat, dryBefore[stat], dryAfter[stat])
	}

	// Deleted: everyone through again.
	if err := policies.Delete(ctx, authzPolicy, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete AuthorizationPolicy %s/%s in %s: %v", ns, authzPolicy, w.b, err)
	}
	everyoneThrough("policy deleted")
}
