//go:build linux

package agent

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"maps"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/identity/spire"
	"github.com/aethermesh/aether/internal/testenv"
)

// spireTTL is the pods' SVID TTL (the ClusterSPIFFEID's ttl): SPIRE renews at half of it, so
// several rotations happen within the test.
const spireTTL = 20 * time.Second

// spireSelected labels the pods the test's ClusterSPIFFEID selects.
const spireSelected = "spire-test/identity"

// TestPrivilegedAgentSPIRE runs the real agent with --identity-source=spire on a real SPIRE
// server and agent (k8s_psat node attestation against the real kube-apiserver, entries from the
// SPIRE Controller Manager's ClusterSPIFFEID; aether writes none), two captured pods and the real
// Envoy:
//   - each pod's ADD returns once Envoy serves the SVID SPIRE issued it (the certificate Envoy
//     holds is the one the SPIRE agent hands out for the pod, with the template's SPIFFE ID),
//     and mTLS traffic carries the caller's identity;
//   - across several rotations (TTL 20 s) a long-lived connection's requests and new
//     connections all succeed;
//   - a SPIRE agent restart under traffic fails no request, and readiness names the identity
//     source while the SPIRE agent is away; an agent restart under traffic fails none either;
//   - a selected pod the agent never attached gets no SVID in Envoy;
//   - a process in a pod asking the SPIRE agent's admin API for another pod's SVID (by that pod's
//     selectors) is refused, and the Workload API gives it nothing;
//   - the client taken out of the ClusterSPIFFEID's selector keeps its last SVID until expiry,
//     then is left out of the node proxy: its calls fail.
func TestPrivilegedAgentSPIRE(t *testing.T) {
	testenv.RequireRoot(t)
	api, etcd, cs := startSources(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	createNodeAndMeshNamespace(t, ctx, cs, "web", "client")
	web := createWebService(t, ctx, cs)
	srv, sa := startNodeSPIRE(t, api, testenv.SPIREOptions{Cluster: "a"}, map[string]any{
		"podSelector": map[string]any{"matchLabels": map[string]any{spireSelected: "on"}},
		"ttl":         spireTTL.String(),
	})
	pods := map[string]*corev1.Pod{}
	for _, name := range []string{"web", "client", "idle"} {
		if name == "idle" {
			must := mustCreate(t)
			must(cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}))
		}
		pods[name] = createReadyPod(t, ctx, cs, name+"-1", name, func(p *corev1.Pod) { p.Labels[spireSelected] = "on" })
	}

	etcdAddr := strings.TrimPrefix(etcd.Endpoints[0], "http://")
	tn := startTwoPodNode(t, ctx, api, etcdAddr, etcd.Endpoints[0], agentOpts{spireAdmin: sa.Admin}, pods)
	a, clientNS := tn.a, tn.clientNS
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("envoy certs:\n%s", a.envoy("/certs"))
			t.Logf("SPIRE entries: %s", func() string { s, _ := srv.Entries(""); return s }())
		}
	})

	// Envoy serves the SVID SPIRE issued: the same certificate the SPIRE agent hands the node's
	// delegate for the pod (the test process is root, which the delegate's entry selects).
	d, err := spire.New(spire.Config{AdminSocket: sa.Admin, RetryMin: 100 * time.Millisecond, RetryMax: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d.Start(ctx)
	d.SetPods("test", []identity.Workload{{UID: string(pods["web"].UID)}})
	webID := "spiffe://aether.internal/ns/shop/sa/web"
	testenv.Eventually(t, 30*time.Second, "Envoy's SVID of web is SPIRE's", func() error {
		st, _ := d.Pod(string(pods["web"].UID))
		served := envoySerials(a, webID)
		for _, s := range st.SVIDs {
			if served[serialOf(t, s.CertChainPEM)] {
				return nil
			}
		}
		return fmt.Errorf("Envoy serves %v for %s, SPIRE issued %d SVIDs", served, webID, len(st.SVIDs))
	})

	url := "http://" + web.Spec.ClusterIP + "/"
	wantID := "spiffe://aether.internal/ns/shop/sa/client"
	kept := clientNS.HTTPClient(true)
	kept.Transport.(*http.Transport).MaxConnsPerHost = 1
	fresh := clientNS.HTTPClient(false)
	call := func(c *http.Client, wantReused bool) error { return callAs(ctx, c, url, wantID, wantReused) }
	testenv.Eventually(t, 60*time.Second, "client reaches web through the mesh", func() error { return call(fresh, false) })
	if err := call(kept, false); err != nil {
		t.Fatal(err)
	}
	// traffic calls on the kept connection and on new ones every 100 ms until stop, counting.
	traffic := func(stop <-chan struct{}) (ok, failed *atomic.Int64, firstErr *error, wait func()) {
		ok, failed, firstErr = new(atomic.Int64), new(atomic.Int64), new(error)
		var once sync.Once
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				for _, c := range []struct {
					c      *http.Client
					reused bool
				}{{kept, true}, {fresh, false}} {
					if err := call(c.c, c.reused); err != nil {
						failed.Add(1)
						once.Do(func() { *firstErr = err })
					} else {
						ok.Add(1)
					}
				}
			}
		}()
		return ok, failed, firstErr, wg.Wait
	}

	// underTraffic runs disrupt while requests run on the kept connection and on new ones, and
	// fails the test if any fails.
	underTraffic := func(what string, disrupt func()) {
		t.Helper()
		stop := make(chan struct{})
		okN, failedN, firstErr, wait := traffic(stop)
		disrupt()
		time.Sleep(3 * time.Second)
		close(stop)
		wait()
		t.Logf("across %s: %d requests, %d failed", what, okN.Load(), failedN.Load())
		if failedN.Load() != 0 || okN.Load() == 0 {
			t.Fatalf("%d of %d requests failed across %s; first: %v", failedN.Load(), okN.Load()+failedN.Load(), what, *firstErr)
		}
	}
	// Rotations: SPIRE renews at half the TTL; the web and client SVIDs Envoy serves change
	// at least three times each while requests run.
	underTraffic("three rotations", func() {
		seen := map[string]map[string]bool{webID: {}, wantID: {}}
		testenv.Eventually(t, 5*spireTTL, "three rotations of each SVID in Envoy", func() error {
			for id, set := range seen {
				for s := range envoySerials(a, id) {
					set[s] = true
				}
			}
			for id, set := range seen {
				if len(set) < 4 {
					return fmt.Errorf("%s: %d certificates seen", id, len(set))
				}
			}
			return nil
		})
	})
	// The SPIRE agent restarts under traffic: readiness names the identity source while it is
	// away, no request fails (Envoy keeps the SVIDs it holds).
	underTraffic("the SPIRE agent restart", func() {
		sa.Stop()
		a.waitDegraded(t, "identity")
		time.Sleep(2 * time.Second)
		sa.Start(t)
		a.waitReady(t, 60*time.Second, "ready after the SPIRE agent returned")
	})
	// The agent restarts (killed) under traffic: the Envoy that outlives it keeps serving, and
	// the new agent's first configuration waits for SPIRE's answers for the pods it had, so it
	// does not take their listeners away: no request fails.
	underTraffic("the agent restart", func() {
		time.Sleep(time.Second)
		a.killAndRestart(t)
		a.waitReady(t, 90*time.Second, "ready after the agent restarted")
	})

	// The agent asks SPIRE only for the pods it attached: idle, selected by the ClusterSPIFFEID
	// (SPIRE holds its entry) but never ADDed on this node, has no SVID in Envoy.
	idleID := "spiffe://aether.internal/ns/shop/sa/idle"
	if out, err := srv.Entries(idleID); err != nil || !strings.Contains(out, idleID) {
		t.Fatalf("SPIRE has no entry for %s: %v\n%s", idleID, err, out)
	}
	if got := envoySerials(a, idleID); len(got) != 0 {
		t.Fatalf("Envoy holds %s's SVID, a pod the agent never attached", idleID)
	}

	// A process in the client pod (not root: a pod's processes never are the node agent) asks
	// the admin API for web's SVID by web's selectors: refused; the Workload API gives it
	// nothing either.
	// Twice: as the admin socket's mode has it (root's alone: the socket refuses the connection),
	// and with the socket opened to everyone (SPIRE refuses: not an authorized delegate).
	callerBin := worldExecutable(t, os.Args[0])
	for _, open := range []bool{false, true} {
		if open {
			for path, mode := range map[string]os.FileMode{srv.Dir: 0o755, sa.Admin: 0o777} {
				if err := os.Chmod(path, mode); err != nil {
					t.Fatal(err)
				}
			}
		}
		caller := exec.Command(callerBin)
		caller.Env = append(os.Environ(), spireCallerEnv+"="+sa.Admin+","+string(pods["web"].UID))
		caller.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := caller.CombinedOutput()
		want := "connect: permission denied"
		if open {
			want = "code = PermissionDenied"
		}
		if err != nil || !strings.Contains(string(out), "refused:") || !strings.Contains(string(out), want) {
			t.Fatalf("a pod's process asking for another pod's SVID (socket open to all: %v): %v\n%s; want %q", open, err, out, want)
		}
		t.Logf("a pod's process asking for web's SVID (socket open to all: %v): %s", open, strings.TrimSpace(string(out)))
	}
	fetch := exec.Command(testenv.RequireTools(t, testenv.ToolSPIRE).SPIREAgent, "api", "fetch", "x509", "-socketPath", sa.Socket, "-timeout", "3s")
	fetch.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if out, err := fetch.CombinedOutput(); err == nil || strings.Contains(string(out), webID) || !strings.Contains(string(out), "no identity issued") {
		t.Fatalf("the Workload API to a pod's process: %v\n%s; want no identity issued", err, out)
	} else {
		t.Logf("the Workload API to a pod's process: %s", strings.TrimSpace(string(out)))
	}

	// The client leaves the ClusterSPIFFEID's selector: SPIRE stops renewing its SVID; once the
	// last one expired the client is left out of the node proxy and its calls fail.
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:null}}}`, spireSelected)
	if _, err := cs.CoreV1().Pods("shop").Patch(ctx, pods["client"].Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	left := time.Now()
	testenv.Eventually(t, 3*spireTTL, "client left out once its last SVID expired", func() error {
		if len(envoySerials(a, wantID)) != 0 {
			return fmt.Errorf("Envoy still serves %s", wantID)
		}
		if err := call(fresh, false); err == nil {
			return fmt.Errorf("the client still reaches web")
		}
		return nil
	})
	t.Logf("client refused %s after leaving the selector (TTL %s)", time.Since(left).Round(time.Second), spireTTL)
	if !strings.Contains(mustReadFile(t, a.logPath), "left out of the node proxy until the identity provider has its SVID") {
		t.Error("the agent did not log the pod it left out")
	}
}

// agentDelegateID is the aether agent's SPIFFE ID in the agent tests' SPIRE: the SPIRE agent's
// authorized delegate.
const agentDelegateID = "spiffe://aether.internal/ns/aether-system/sa/aether-agent"

// startNodeSPIRE starts a SPIRE server with opts on api, node-1's SPIRE agent with the aether
// agent as its authorized delegate, the aether agent's own entry (a ClusterStaticEntry; in a
// cluster its pod's k8s selectors, here the agent runs as root on the node: unix:uid:0), and the
// ClusterSPIFFEID "mesh" giving the mesh's IDs (testenv.MeshSPIFFEIDTemplate) with the selectors
// and TTL of spec.
func startNodeSPIRE(t testing.TB, api *testenv.KubeAPIServer, opts testenv.SPIREOptions, spec map[string]any) (*testenv.SPIREServer, *testenv.SPIREAgent) {
	t.Helper()
	srv := testenv.StartSPIREServer(t, api, opts)
	sa := srv.StartAgent(t, "node-1", agentDelegateID)
	srv.Create(t, "ClusterStaticEntry", "aether-agent", map[string]any{"spiffeID": agentDelegateID, "parentID": sa.ID, "selectors": []any{"unix:uid:0"}})
	spec = maps.Clone(spec)
	spec["spiffeIDTemplate"] = testenv.MeshSPIFFEIDTemplate
	srv.Create(t, "ClusterSPIFFEID", "mesh", spec)
	return srv, sa
}

// spireCallerEnv makes the test binary (TestMain) a process of a pod that asks the SPIRE agent's
// admin API (value: "<admin socket>,<pod UID>") for that pod's SVIDs: it prints "refused: <err>"
// and exits 0 when refused, or prints the SVIDs and exits 1.
const spireCallerEnv = "AETHER_TEST_SPIRE_CALLER"

func spireCaller(v string) int {
	sock, uid, _ := strings.Cut(v, ",")
	d, err := spire.New(spire.Config{AdminSocket: sock, RetryMin: 100 * time.Millisecond, RetryMax: time.Second})
	if err != nil {
		fmt.Println("refused:", err)
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d.Start(ctx)
	d.SetPods("caller", []identity.Workload{{UID: uid}})
	for ctx.Err() == nil {
		st, _ := d.Pod(uid)
		if len(st.SVIDs) > 0 {
			fmt.Println("got", st.SVIDs[0].SPIFFEID)
			return 1
		}
		if st.Err != nil {
			fmt.Println("refused:", st.Err)
			return 0
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Println("no answer in 10 s")
	return 1
}

// envoySerials returns the serial numbers (hex, as Envoy's /certs prints them) of the
// certificates with URI SAN id that the agent's Envoy holds.
func envoySerials(a *agentProc, id string) map[string]bool {
	var dump struct {
		Certificates []struct {
			CertChain []struct {
				SerialNumber    string `json:"serial_number"`
				SubjectAltNames []struct {
					URI string `json:"uri"`
				} `json:"subject_alt_names"`
			} `json:"cert_chain"`
		} `json:"certificates"`
	}
	out := map[string]bool{}
	if err := json.Unmarshal([]byte(a.envoy("/certs")), &dump); err != nil {
		return out
	}
	for _, c := range dump.Certificates {
		for _, cc := range c.CertChain {
			for _, san := range cc.SubjectAltNames {
				if san.URI == id {
					out[strings.TrimLeft(strings.ToLower(cc.SerialNumber), "0")] = true
				}
			}
		}
	}
	return out
}

// worldExecutable copies the executable at path into a directory anyone may enter and returns
// the copy's path (the test binary's own directory is root's alone).
func worldExecutable(t testing.TB, path string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "aether-caller-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dst := dir + "/caller"
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// serialOf returns the serial number of the first certificate of chain (PEM), in hex as Envoy
// prints it.
func serialOf(t testing.TB, chain []byte) string {
	t.Helper()
	b, _ := pem.Decode(chain)
	if b == nil {
		t.Fatal("SVID without a PEM certificate")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", (*big.Int)(c.SerialNumber))
}
