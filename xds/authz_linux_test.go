package xds

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// vipSink is the authorization test's TCP service (9100 on the server pod): an echo that counts
// what reaches it.
var vipSink = netip.MustParseAddr("10.96.0.13")

// authzMesh is trafficMesh plus the TCP service sink (10.96.0.13:9100 -> server:9100) and the
// server pod's authorization policies.
func authzMesh(f *meshFixture, version uint64, policies []*model.AuthzPolicy) *model.Mesh {
	base := trafficMesh(f, version)
	sink := model.ServiceKey{Namespace: "web", Name: "sink"}
	services := append(base.Services, &model.Service{Key: sink, Local: true, VIPs: []netip.Addr{vipSink},
		Ports: []model.ServicePort{{Name: "p", Port: 9100, TargetPort: 9100, Protocol: model.ProtocolTCP}}})
	eps := base.Endpoints
	eps[sink] = []model.Endpoint{{Service: sink, Cluster: "c1", PodName: "server", PodUID: "uid-server",
		IPs: []netip.Addr{f.ips["server"]}, NodeName: "node-1", Ports: []model.EndpointPort{{Port: 9100, Protocol: model.ProtocolTCP}},
		SPIFFEID: model.SPIFFEID(f.td, "web", "server"), Healthy: true}}
	for _, p := range base.Pods {
		if p.Name == "server" {
			p.Ports = append(p.Ports, model.PodPort{Port: 9100, Protocol: model.ProtocolTCP})
		}
	}
	m := model.New(version, base.Cluster, base.MeshDomain, base.TrustDomain, base.Node, services, eps, base.Pods)
	if len(policies) > 0 {
		m.Authz = map[string][]*model.AuthzPolicy{"uid-server": policies}
	}
	return m
}

// countingSink serves an echo on l and counts the connections it accepts and the bytes it reads.
type countingSink struct{ conns, bytes atomic.Int64 }

func (s *countingSink) serve(l net.Listener) {
	serveEach(l, func(c net.Conn) {
		s.conns.Add(1)
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			s.bytes.Add(int64(n))
			if n > 0 {
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
}

// authzPolicies are the server pod's policies of TestPrivilegedAuthz:
//   - web/allow: alpha may GET /api (by whole segments) on 8080; every workload of namespace shop
//     may call exactly /public on 8080; alpha may open 9100; alpha and beta may open 9000;
//     nothing allows 2525 (closed by the ALLOW policy);
//   - web/deny-admin: nobody may call /api/admin on 8080, whatever allows it;
//   - web/audit (dry run): would deny alpha on 9000.
func authzPolicies() []*model.AuthzPolicy {
	sa := func(name string) model.AuthzSource {
		return model.AuthzSource{ServiceAccount: &model.AuthzServiceAccount{Namespace: "shop", Name: name}}
	}
	return []*model.AuthzPolicy{
		{Namespace: "web", Name: "allow", Action: model.AuthzAllow, Rules: []model.AuthzRule{
			{Sources: []model.AuthzSource{sa("alpha")}, Ports: []uint32{8080}, Methods: []string{"GET"}, Paths: []model.PathMatch{{Type: model.MatchPathPrefix, Value: "/api"}}},
			{Sources: []model.AuthzSource{{Namespace: "shop"}}, Ports: []uint32{8080}, Paths: []model.PathMatch{{Type: model.MatchExact, Value: "/public"}}},
			{Sources: []model.AuthzSource{sa("alpha")}, Ports: []uint32{9100}},
			{Sources: []model.AuthzSource{sa("alpha"), sa("beta")}, Ports: []uint32{9000}},
		}},
		{Namespace: "web", Name: "audit", Action: model.AuthzDeny, DryRun: true, Rules: []model.AuthzRule{
			{Sources: []model.AuthzSource{sa("alpha")}, Ports: []uint32{9000}},
		}},
		{Namespace: "web", Name: "deny-admin", Action: model.AuthzDeny, Rules: []model.AuthzRule{
			{AnySource: true, Ports: []uint32{8080}, Paths: []model.PathMatch{{Type: model.MatchPathPrefix, Value: "/api/admin"}}},
		}},
	}
}

// TestPrivilegedAuthz enforces AuthorizationPolicies on the real Envoy, callers in their own
// network namespaces with their own SVIDs (alpha and beta, service accounts of namespace shop):
// HTTP callers are allowed and refused (403) by identity, namespace, method and path (Gateway API
// prefix semantics), a DENY wins over an ALLOW; a forged XFCC or identity header changes nothing
// (the caller is its certificate); a TCP caller refused at L4 gets its connection closed and the
// application sees none of its bytes; a port no ALLOW rule covers is closed; a dry-run policy
// counts (Envoy stats) without refusing; a refusal and a dry-run refusal each write an access log
// line naming the caller's SPIFFE ID; a policy change reaches Envoy as ECDS only: kept HTTP and
// TCP connections that stay allowed live on past Envoy's drain time, and the next request on the
// kept HTTP connection is judged by the new policies.
//
// It runs with both xDS protocols: delta (the agent's default, envoy.BootstrapConfig) and
// state of the world: the RBAC configs travel as ECDS resources in both.
func TestPrivilegedAuthz(t *testing.T) {
	for _, delta := range []bool{true, false} {
		t.Run(map[bool]string{true: "delta", false: "sotw"}[delta], func(t *testing.T) { testPrivilegedAuthz(t, delta) })
	}
}

func testPrivilegedAuthz(t *testing.T, delta bool) {
	f := startTrafficFixture(t, time.Hour, delta, Options{})
	sink := &countingSink{}
	sink.serve(f.pods["server"].Listen(t, "0.0.0.0:9100"))
	alpha, beta := f.pods["alpha"], f.pods["beta"]
	alphaID, betaID := model.SPIFFEID(f.td, "shop", "alpha"), model.SPIFFEID(f.td, "shop", "beta")
	f.set(authzMesh(f, 2, nil))
	// Open before the policies exist: the first policy changes the listener (it gains the RBAC
	// filters), which drains this connection; later changes must not.
	f.set(authzMesh(f, 3, authzPolicies()))
	f.wantNoRejections(t)

	do := func(c *http.Client, method, path string, hdr map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+vipHTTP.String()+path, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	t.Run("HTTP by identity, namespace, method and path", func(t *testing.T) {
		for _, tc := range []struct {
			who          string
			c            *http.Client
			method, path string
			want         int
		}{
			{"alpha", alpha.HTTPClient(false), "GET", "/api", 200},
			{"alpha", alpha.HTTPClient(false), "GET", "/api/x?q=1", 200},
			{"alpha", alpha.HTTPClient(false), "POST", "/api/x", 403},       // method
			{"alpha", alpha.HTTPClient(false), "GET", "/apix", 403},         // not a segment of /api
			{"alpha", alpha.HTTPClient(false), "GET", "/api/admin/x", 403},  // DENY over ALLOW
			{"alpha", alpha.HTTPClient(false), "GET", "/api//admin/x", 403}, // merged slashes
			{"alpha", alpha.HTTPClient(false), "GET", "/api/x/../admin", 403},
			{"alpha", alpha.HTTPClient(false), "GET", "/api/admin%2Fx", 403}, // escaped slash: DENY matches it
			{"alpha", alpha.HTTPClient(false), "GET", "/api/x%5cy", 403},     // any escaped (back)slash, for the DENY's callers
			{"alpha", alpha.HTTPClient(false), "GET", "/api/ADMIN/x", 403},   // a DENY's path ignores case
			{"alpha", alpha.HTTPClient(false), "GET", "/api/admin;p=1", 403}, // and path parameters
			{"alpha", alpha.HTTPClient(false), "GET", "/api/x;p/admin", 403}, // in any segment
			{"alpha", alpha.HTTPClient(false), "GET", "/api/..;/admin", 403}, // Tomcat's "..;"
			{"alpha", alpha.HTTPClient(false), "GET", "/api/administrator", 200},
			{"alpha", alpha.HTTPClient(false), "GET", "/api%2Fx", 403}, // ALLOW matches only the exact spelling
			{"alpha", alpha.HTTPClient(false), "get", "/api/x", 400},   // a lowercase method: Envoy's HTTP/1 codec refuses it first
			{"beta", beta.HTTPClient(false), "GET", "/api/x", 403},     // identity
			{"beta", beta.HTTPClient(false), "GET", "/public", 200},    // namespace
			{"beta", beta.HTTPClient(false), "POST", "/public", 200},
			{"beta", beta.HTTPClient(false), "GET", "/public/x", 403}, // exact
		} {
			if code, body := do(tc.c, tc.method, tc.path, nil); code != tc.want {
				t.Errorf("%s %s %s: %d %q, want %d", tc.who, tc.method, tc.path, code, body, tc.want)
			}
		}
	})

	t.Run("a forged identity header is not an identity", func(t *testing.T) {
		forged := map[string]string{
			"X-Forwarded-Client-Cert": "By=" + model.SPIFFEID(f.td, "web", "server") + ";URI=" + alphaID,
			"X-Aether-Identity":       alphaID,
			"X-Forwarded-User":        alphaID,
		}
		if code, body := do(beta.HTTPClient(false), "GET", "/api/x", forged); code != 403 {
			t.Errorf("beta forging alpha's XFCC: %d %q, want 403", code, body)
		}
		// Allowed as itself, it arrives as itself: the forged XFCC is replaced.
		code, body := do(beta.HTTPClient(false), "GET", "/public", forged)
		if code != 200 || xfccURI(body) != betaID {
			t.Errorf("beta forging alpha's XFCC on /public: %d %q, want 200 with XFCC URI %s", code, body, betaID)
		}
	})

	t.Run("TCP refused at L4", func(t *testing.T) {
		if err := echoVia(alpha, vipSink.String()+":9100", "alpha may"); err != nil {
			t.Fatalf("alpha: %v", err)
		}
		before := sink.bytes.Load()
		c, err := beta.Dial(vipSink.String() + ":9100")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = c.Write([]byte("beta may not"))
		n, err := c.Read(make([]byte, 64))
		if err == nil || n > 0 {
			t.Errorf("beta's connection answered %d bytes (%v), want it closed", n, err)
		}
		time.Sleep(200 * time.Millisecond)
		if got := sink.bytes.Load() - before; got != 0 {
			t.Errorf("the application read %d bytes of beta's refused connection, want 0", got)
		}
		t.Logf("the application accepted %d connections in all (alpha's, and the one Envoy opens before it sees beta's first byte)", sink.conns.Load())
	})

	t.Run("a port no ALLOW rule covers is closed", func(t *testing.T) {
		c, err := alpha.Dial(vipBanner.String() + ":25")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = c.Write([]byte("EHLO x\r\n"))
		// A server-first application's banner may reach the caller before its first byte is
		// judged (docs/authorization.md): what must not come back is the echo.
		b, _ := io.ReadAll(c)
		if strings.Contains(string(b), "EHLO") {
			t.Errorf("alpha's bytes reached the banner service on a closed port: read %q", b)
		}
	})

	t.Run("dry run counts without refusing", func(t *testing.T) {
		if err := echoVia(alpha, vipTCP.String()+":9000", "audited"); err != nil {
			t.Fatalf("alpha on 9000 under a dry-run DENY: %v", err)
		}
		testenv.Eventually(t, 10*time.Second, "dry-run stat", func() error {
			return wantStat(f, "authz.web.server.9000.deny.rbac.deny_dry_run.shadow_denied", 1)
		})
		if n, err := statValue(f, "authz.web.server.9000.deny.rbac.denied"); err == nil && n != 0 {
			t.Errorf("a dry run refused: denied = %d", n)
		}
	})

	t.Run("stats per pod and port", func(t *testing.T) {
		for _, s := range []string{
			"http.inbound_http.rbac.authz.web.server.8080.deny.denied",
			"http.inbound_http.rbac.authz.web.server.8080.allow.denied",
			"authz.web.server.9100.allow.rbac.denied",
			"authz.web.server.2525.allow.rbac.denied",
		} {
			if err := wantStat(f, s, 1); err != nil {
				t.Error(err)
			}
		}
	})

	t.Run("access log names the caller", func(t *testing.T) {
		// Envoy flushes its access log files every --file-flush-interval-msecs (10 s by default).
		testenv.Eventually(t, 30*time.Second, "access log lines", func() error {
			lines := authzLogLines(t, f)
			var httpDeny, tcpDeny, dry bool
			for _, l := range lines {
				switch {
				case l["caller"] == betaID && l["port"] == 8080.0 && strings.HasPrefix(fmt.Sprint(l["enforced"]), "rbac_access_denied_matched_policy[none]"):
					httpDeny = true
				case l["caller"] == betaID && l["port"] == 9100.0 && strings.HasPrefix(fmt.Sprint(l["enforced"]), "rbac_access_denied"):
					tcpDeny = true
				case l["caller"] == alphaID && l["port"] == 9000.0 && l["dry_run_deny"] == "denied" && l["dry_run_deny_policy"] == "web/audit#0":
					dry = true
				}
				if l["caller"] == alphaID && l["port"] == 9100.0 {
					return fmt.Errorf("an allowed connection was logged: %v", l)
				}
			}
			if !httpDeny || !tcpDeny || !dry {
				return fmt.Errorf("HTTP denial %t, TCP denial %t, dry-run denial %t in %d lines: %v", httpDeny, tcpDeny, dry, len(lines), lines)
			}
			return nil
		})
		for i, l := range authzLogLines(t, f) {
			if i < 3 {
				b, _ := json.Marshal(l)
				t.Logf("%s", b)
			}
		}
	})

	t.Run("a policy change drains nothing that stays allowed", func(t *testing.T) {
		kept := alpha.HTTPClient(true)
		kept.Transport.(*http.Transport).MaxConnsPerHost = 1
		if code, _ := do(kept, "GET", "/api/admin", nil); code != 403 {
			t.Fatalf("before the change: GET /api/admin %d, want 403", code)
		}
		tcp, err := alpha.Dial(vipSink.String() + ":9100")
		if err != nil {
			t.Fatal(err)
		}
		defer tcp.Close()
		if err := testenv.EchoOnce(tcp, "kept"); err != nil {
			t.Fatal(err)
		}
		// deny-admin goes away: ECDS only, no listener changes.
		modified, err := statValue(f, "listener_manager.listener_modified")
		if err != nil {
			t.Fatal(err)
		}
		ps := authzPolicies()
		f.set(authzMesh(f, 4, ps[:2]))
		f.wantNoRejections(t)
		if n, err := statValue(f, "listener_manager.listener_modified"); err != nil || n != modified {
			t.Errorf("listener_modified %d -> %d (%v): the policy change modified a listener", modified, n, err)
		}
		deadline := time.Now().Add(6 * time.Second) // past --drain-time-s 5
		for i := 0; time.Now().Before(deadline); i++ {
			var reused bool
			req, _ := http.NewRequest(http.MethodGet, "http://"+vipHTTP.String()+"/api/admin?i="+strconv.Itoa(i), nil)
			req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}))
			resp, err := kept.Do(req)
			if err != nil {
				t.Fatalf("request %d on the kept connection: %v", i, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.Close || !reused {
				t.Fatalf("request %d on the kept connection after deny-admin went away: %d (close %t, reused %t), want 200 on the same connection", i, resp.StatusCode, resp.Close, reused)
			}
			time.Sleep(300 * time.Millisecond)
		}
		if err := testenv.EchoOnce(tcp, "still here"); err != nil {
			t.Errorf("the kept TCP connection after the policy change: %v", err)
		}
	})
}

// statValue is Envoy's counter name; an error when Envoy has none of that name.
func statValue(f *meshFixture, name string) (int, error) {
	s, err := f.admin("/stats?filter=^" + strings.ReplaceAll(name, ".", `\.`) + "$")
	if err != nil {
		return 0, err
	}
	_, v, ok := strings.Cut(strings.TrimSpace(s), ": ")
	if !ok {
		return 0, fmt.Errorf("stat %s absent (%q)", name, s)
	}
	return strconv.Atoi(v)
}

// wantStat fails unless Envoy's counter name is at least min.
func wantStat(f *meshFixture, name string, min int) error {
	n, err := statValue(f, name)
	if err != nil {
		return err
	}
	if n < min {
		return fmt.Errorf("stat %s = %d, want >= %d", name, n, min)
	}
	return nil
}

// authzLogLines are the authorization access log lines (JSON with "authz") of Envoy's stdout.
func authzLogLines(t *testing.T, f *meshFixture) []map[string]any {
	t.Helper()
	fh, err := os.Open(filepath.Join(f.dir, "envoy", "envoy.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var out []map[string]any
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["authz"] != nil {
			out = append(out, m)
		}
	}
	return out
}
