//go:build linux

package agent

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/aethermesh/aether/internal/testenv"
)

// TestPrivilegedGAMMATraffic observes GAMMA routing (HTTPRoute and GRPCRoute with a Service
// parentRef) on real traffic: the real agent binary, its Envoy, a real kube-apiserver with the
// Gateway API CRDs and an etcd registry; pods in their own network namespaces, captured by CNI ADD,
// whose requests to Service VIPs go through Envoy over mTLS to the server pods. One setup serves
// every subtest, each one feature seen by the client or counted by a server:
//
//   - shop/web (ports 80 and 8080) selects web-v1 and web-v2; shop/web-v1 and shop/web-v2 each
//     one of them; mirror, flaky and slow have one pod each; all answer with an echo of the
//     request (echoServer); shop/grpc (9090, appProtocol grpc) selects grpc-v1 and grpc-v2
//     (gRPC servers), grpc-v1 and grpc-v2 one each;
//   - callers: shop/client-1 and other/client-1 (a second meshed namespace);
//   - four producer HTTPRoutes on web (every port) and one GRPCRoute on grpc, created once.
//
// The last subtest deletes the routes.
func TestPrivilegedGAMMATraffic(t *testing.T) {
	testenv.RequireRoot(t)
	m := startGAMMAMesh(t)
	ctx := m.ctx

	web1 := m.addEchoPod(t, "web-v1", map[string]string{"app": "web", "version": "v1"})
	m.addEchoPod(t, "web-v2", map[string]string{"app": "web", "version": "v2"})
	mirror := m.addEchoPod(t, "mirror-1", map[string]string{"app": "mirror"})
	flaky := m.addEchoPod(t, "flaky-1", map[string]string{"app": "flaky"})
	m.addEchoPod(t, "slow-1", map[string]string{"app": "slow"})
	for _, v := range []string{"v1", "v2"} {
		ns := m.addPod(t, podSpec{namespace: "shop", name: "grpc-" + v, labels: map[string]string{"app": "grpc", "version": v}, port: 9090, grpc: true})
		serveGRPC(t, ns, "grpc-"+v)
	}
	shopNS := m.addPod(t, podSpec{namespace: "shop", name: "client-1", labels: map[string]string{"app": "client"}, port: 8080})
	otherNS := m.addPod(t, podSpec{namespace: "other", name: "client-1", labels: map[string]string{"app": "client"}, port: 8080})

	vip := map[string]string{
		"web": m.addService(t, "web", map[string]string{"app": "web"}, httpPort("http", 80), httpPort("http-alt", 8080)),
	}
	for _, v := range []string{"v1", "v2"} {
		vip["web-"+v] = m.addService(t, "web-"+v, map[string]string{"app": "web", "version": v}, httpPort("http", 80))
		vip["grpc-"+v] = m.addService(t, "grpc-"+v, map[string]string{"app": "grpc", "version": v}, grpcPort())
	}
	for _, name := range []string{"mirror", "flaky", "slow"} {
		vip[name] = m.addService(t, name, map[string]string{"app": name}, httpPort("http", 80))
	}
	vip["grpc"] = m.addService(t, "grpc", map[string]string{"app": "grpc"}, grpcPort())
	web, web8080 := "http://"+vip["web"], "http://"+vip["web"]+":8080"

	shop := httpClient(shopNS, false)
	get := func(t *testing.T, method, url string, hdr map[string]string) answer {
		t.Helper()
		a, err := do(ctx, shop, method, url, hdr)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("envoy clusters:\n%s", grepLines(m.a.envoy("/clusters"), "::cx_active"))
		}
	})

	// Every backend answers on its own VIP (the default route) before the routes exist: the
	// endpoints went through the registry to EDS.
	for _, name := range []string{"web-v1", "web-v2", "mirror", "flaky", "slow"} {
		want := map[string]string{"web-v1": "web-v1", "web-v2": "web-v2", "mirror": "mirror-1", "flaky": "flaky-1", "slow": "slow-1"}[name]
		testenv.Eventually(t, 90*time.Second, name+" answers on its VIP", func() error {
			a, err := do(ctx, shop, http.MethodGet, "http://"+vip[name]+"/ready", nil)
			if err != nil {
				return err
			}
			if a.status != http.StatusOK || a.echo.Pod != want {
				return fmt.Errorf("%d from %q, want 200 from %s", a.status, a.echo.Pod, want)
			}
			return nil
		})
	}
	grpcShop := grpcConn(t, shopNS, vip["grpc"]+":9090")
	for _, v := range []string{"grpc-v1", "grpc-v2"} {
		conn := grpcConn(t, shopNS, vip[v]+":9090")
		testenv.Eventually(t, 60*time.Second, v+" answers gRPC on its VIP", func() error {
			got, err := callGRPC(ctx, conn, "/aether.test.Echo/Ready")
			if err != nil {
				return err
			}
			if got != v+" /aether.test.Echo/Ready" {
				return fmt.Errorf("answer %q, want %s's", got, v)
			}
			return nil
		})
	}

	createRoutes(t, m)
	// Each route is served once its sentinel answers as the route says (the agent may apply
	// them in one snapshot or several).
	answers := func(path string, want func(answer) error) func() error {
		return func() error {
			a, err := do(ctx, shop, "GET", web+path, nil)
			if err != nil {
				return err
			}
			return want(a)
		}
	}
	for _, s := range []struct {
		what  string
		check func() error
	}{
		{"web-match: /path/exact tagged exact", answers("/path/exact", func(a answer) error { return expectRule(a, "web-v1", "exact") })},
		{"web-split: /zero answers 500", answers("/zero", func(a answer) error { return expectStatus(a, 500) })},
		{"web-filters: /headers sets x-set", answers("/headers", func(a answer) error {
			if a.echo.header("x-set") != "route" {
				return fmt.Errorf("%d, server saw x-set %q", a.status, a.echo.header("x-set"))
			}
			return nil
		})},
		{"web-redirect: /r301 answers 301", answers("/r301", func(a answer) error { return expectStatus(a, 301) })},
		{"grpc-methods: Echo/Hello to grpc-v2", func() error {
			got, err := callGRPC(ctx, grpcShop, "/aether.test.Echo/Hello")
			if err != nil || !strings.HasPrefix(got, "grpc-v2 ") {
				return fmt.Errorf("answer %q, %v", got, err)
			}
			return nil
		}},
	} {
		testenv.Eventually(t, 60*time.Second, "route served: "+s.what, s.check)
	}
	routesAt := time.Now()

	t.Run("CanarySplit90To10", func(t *testing.T) {
		// /canary sends 90 of 100 to web-v1 and 10 to web-v2 (whose backendRef sets x-backend).
		// Over N = 1000 requests the web-v2 count X is Binomial(1000, 0.1): mean 100, sd 9.5.
		// The test accepts 50 <= X <= 150; summed exactly, P(X < 50) + P(X > 150) = 2.8e-7, so a
		// correct split fails this check less than once in a million runs.
		const n, lo, hi = 1000, 50, 150
		kept := httpClient(shopNS, true)
		v2 := 0
		for i := range n {
			a, err := do(ctx, kept, "GET", web+"/canary", nil)
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			switch {
			case a.status != 200:
				t.Fatalf("request %d: %d %s", i, a.status, a.body)
			case a.echo.Pod == "web-v2" && a.echo.header("x-backend") == "v2":
				v2++
			case a.echo.Pod == "web-v1" && a.echo.header("x-backend") == "":
			default:
				t.Fatalf("request %d: served by %q with x-backend %q: want web-v2 with v2 or web-v1 without", i, a.echo.Pod, a.echo.header("x-backend"))
			}
		}
		t.Logf("canary 90/10: web-v2 served %d of %d (accepted %d..%d)", v2, n, lo, hi)
		if v2 < lo || v2 > hi {
			t.Errorf("web-v2 served %d of %d requests, want %d..%d (10%% within the binomial tolerance)", v2, n, lo, hi)
		}
	})

	t.Run("WeightZeroAndSingleBackend", func(t *testing.T) {
		// /only-v2: web-v1 has weight 0 and web-v2 weight 1: every request to web-v2.
		for i := range 50 {
			if a := get(t, "GET", web+"/only-v2", nil); a.status != 200 || a.echo.Pod != "web-v2" {
				t.Fatalf("request %d to /only-v2: %d from %q, want 200 from web-v2", i, a.status, a.echo.Pod)
			}
		}
		// /zero: its only backend has weight 0: no backend, 500 (HTTPRouteRule.backendRefs).
		before := web1.count("/zero")
		for range 5 {
			if err := expectStatus(get(t, "GET", web+"/zero", nil), 500); err != nil {
				t.Fatal(err)
			}
		}
		if n := web1.count("/zero"); n != before {
			t.Errorf("web-v1 got %d requests for /zero (weight 0)", n-before)
		}
	})

	t.Run("InvalidBackendShareGets500", func(t *testing.T) {
		// /invalid: web-v1 and the missing Service nosuch, weight 1 each. The 500 count X over
		// N = 200 is Binomial(200, 0.5): P(X < 65) + P(X > 135) = 3.9e-7.
		const n, lo, hi = 200, 65, 135
		errs := 0
		for i := range n {
			a := get(t, "GET", web+"/invalid", nil)
			switch {
			case a.status == 500:
				errs++
			case a.status == 200 && a.echo.Pod == "web-v1":
			default:
				t.Fatalf("request %d: %d from %q, want 500 or 200 from web-v1", i, a.status, a.echo.Pod)
			}
		}
		t.Logf("invalid backend: %d of %d answered 500 (accepted %d..%d)", errs, n, lo, hi)
		if errs < lo || errs > hi {
			t.Errorf("%d of %d requests answered 500, want %d..%d", errs, n, lo, hi)
		}
	})

	t.Run("PathExactPrefixRegexPrecedence", func(t *testing.T) {
		// The rules are written in the order a first-match proxy would get wrong (/path before
		// /path/longer, the prefixes before the Exact match).
		for _, c := range []struct{ path, pod, rule string }{
			{"/path/exact", "web-v1", "exact"},
			{"/path/exact/x", "web-v2", "prefix"}, // Exact is the whole path
			{"/path", "web-v2", "prefix"},
			{"/path/", "web-v2", "prefix"},
			{"/path/other", "web-v2", "prefix"},
			{"/path/longer", "web-v1", "longer"}, // the longest prefix wins
			{"/path/longer/x", "web-v1", "longer"},
			{"/path/longerx", "web-v2", "prefix"}, // a prefix matches whole path elements
			{"/abc", "web-v1", "abc"},
			{"/abc/", "web-v1", "abc"},
			{"/abc/d", "web-v1", "abc"},
			{"/re/123", "web-v2", "regex"},
			{"/path/r1", "web-v2", "prefix"}, // a prefix match before a regex match (Istio's order)
		} {
			if err := expectRule(get(t, "GET", web+c.path, nil), c.pod, c.rule); err != nil {
				t.Errorf("GET %s: %v", c.path, err)
			}
		}
		for _, p := range []string{"/abcd", "/pathology", "/re/12a", "/re/123/x", "/Path/exact"} {
			if err := expectStatus(get(t, "GET", web+p, nil), 404); err != nil {
				t.Errorf("GET %s (no rule matches): %v", p, err)
			}
		}
	})

	t.Run("HeaderQueryMethodMatches", func(t *testing.T) {
		for _, c := range []struct {
			method, path string
			hdr          map[string]string
			pod, rule    string
		}{
			{"GET", "/hdr", nil, "web-v1", "hdr"},
			{"GET", "/hdr", map[string]string{"X-Version": "v2"}, "web-v2", "hdr-exact"},
			{"GET", "/hdr", map[string]string{"x-version": "v7"}, "web-v2", "hdr-regex"},
			{"GET", "/hdr", map[string]string{"X-Version": "v1"}, "web-v1", "hdr"},
			{"GET", "/hdr", map[string]string{"X-Version": "V2"}, "web-v1", "hdr"}, // values are case-sensitive
			{"GET", "/q", nil, "web-v1", "q"},
			{"GET", "/q?version=v2", nil, "web-v2", "q-v2"},
			{"GET", "/q?other=1&version=v2", nil, "web-v2", "q-v2"},
			{"GET", "/q?version=v3", nil, "web-v1", "q"},
			{"GET", "/m", nil, "web-v1", "m"},
			{"POST", "/m", nil, "web-v2", "m-post"},
			{"PUT", "/m", nil, "web-v1", "m"},
		} {
			if err := expectRule(get(t, c.method, web+c.path, c.hdr), c.pod, c.rule); err != nil {
				t.Errorf("%s %s %v: %v", c.method, c.path, c.hdr, err)
			}
		}
	})

	t.Run("NoMatchIs404OnEveryPort", func(t *testing.T) {
		// The routes bind to both ports of web (no parentRef port): a request no rule matches
		// gets 404 on either, and the rules apply on either.
		for _, base := range []string{web, web8080} {
			if err := expectStatus(get(t, "GET", base+"/nomatch", nil), 404); err != nil {
				t.Errorf("GET %s/nomatch: %v", base, err)
			}
			if err := expectRule(get(t, "GET", base+"/path/exact", nil), "web-v1", "exact"); err != nil {
				t.Errorf("GET %s/path/exact: %v", base, err)
			}
		}
	})

	t.Run("RequestAndResponseHeaderModifiers", func(t *testing.T) {
		a := get(t, "GET", web+"/headers", map[string]string{"X-Set": "client", "X-Add": "client", "X-Remove": "client", "X-Keep": "client"})
		if a.status != 200 || a.echo.Pod != "web-v1" {
			t.Fatalf("GET /headers: %d from %q: %s", a.status, a.echo.Pod, a.body)
		}
		for h, want := range map[string]string{"x-set": "route", "x-add": "client,route", "x-remove": "", "x-keep": "client", "x-new": "route"} {
			if got := a.echo.header(h); got != want {
				t.Errorf("server saw %s %q, want %q", h, got, want)
			}
		}
		for h, want := range map[string]string{"X-Resp-Set": "route", "X-Resp-Add": "server,route", "X-Resp-Remove": "", "X-Served-By": "web-v1"} {
			if got := strings.Join(a.header.Values(h), ","); got != want {
				t.Errorf("client saw %s %q, want %q", h, got, want)
			}
		}
	})

	t.Run("URLRewrite", func(t *testing.T) {
		// The ReplacePrefixMatch rows are the table in HTTPPathModifier's doc (v1.6.3), with
		// /rw/<x> for /foo: element-wise, "/" or "" replacing the prefix leaves one "/".
		for _, c := range []struct{ req, path, query, host string }{
			{"/rw/a/bar", "/xyz/bar", "", ""}, // prefix /rw/a, replace /xyz
			{"/rw/a", "/xyz", "", ""},
			{"/rw/a/", "/xyz/", "", ""},
			{"/rw/a/bar?x=1&y=2", "/xyz/bar", "x=1&y=2", ""},
			{"/rw/b/bar", "/xyz/bar", "", ""}, // prefix /rw/b, replace /xyz/
			{"/rw/c/bar", "/xyz/bar", "", ""}, // prefix /rw/c/, replace /xyz
			{"/rw/d/bar", "/xyz/bar", "", ""}, // prefix /rw/d/, replace /xyz/
			{"/rw/e/bar", "/bar", "", ""},     // prefix /rw/e, replace ""
			{"/rw/e/", "/", "", ""},
			{"/rw/e", "/", "", ""},
			{"/rw/f/", "/", "", ""}, // prefix /rw/f, replace /
			{"/rw/f", "/", "", ""},
			{"/rw/f/bar", "/bar", "", ""},
			{"/full/one/two", "/replaced", "", ""}, // ReplaceFullPath /replaced
			{"/full?q=1", "/replaced", "q=1", ""},
			{"/host/x", "/host/x", "", "rewritten.example"}, // hostname only
		} {
			a := get(t, "GET", web+c.req, nil)
			host := c.host
			if host == "" {
				host = vip["web"]
			}
			if a.status != 200 || a.echo.Pod != "web-v1" || a.echo.Path != c.path || a.echo.RawQuery != c.query || a.echo.Host != host {
				t.Errorf("GET %s: %d from %q, server saw path %q query %q host %q; want 200 from web-v1, %q %q %q",
					c.req, a.status, a.echo.Pod, a.echo.Path, a.echo.RawQuery, a.echo.Host, c.path, c.query, host)
			}
		}
		// path_separated_prefix: /rw/a does not match /rw/ab, which no rule matches.
		if err := expectStatus(get(t, "GET", web+"/rw/ab", nil), 404); err != nil {
			t.Errorf("GET /rw/ab: %v", err)
		}
	})

	t.Run("RequestRedirect", func(t *testing.T) {
		// The client does not follow redirects. Location as HTTPRequestRedirectFilter says, the
		// Service port being the listener port: without a port in the filter, a scheme in it
		// means that scheme's port, else the port the request was sent to; no port is written
		// for http and 80 or https and 443, except on port 8080 without a hostname, where Envoy
		// would keep the Host's ":8080" unless given the port (xds redirectPort).
		ip := vip["web"]
		for _, c := range []struct {
			base, path string
			code       int
			location   string
		}{
			{web, "/r301/x", 301, "http://new.example/r301/x"},
			{web, "/r302", 302, "https://" + ip + "/r302"},
			{web, "/r303/x", 303, "http://" + ip + "/see-other"},
			{web, "/r303/x?y=1", 303, "http://" + ip + "/see-other?y=1"}, // Envoy keeps the query
			{web, "/r307", 307, "http://" + ip + ":8443/r307"},
			{web, "/r308/a/b?c=d", 308, "http://" + ip + "/moved/a/b?c=d"},
			{web, "/r-https-host", 302, "https://secure.example/r-https-host"},
			{web, "/r-https-port", 302, "https://" + ip + ":8443/r-https-port"},
			{web, "/r-http", 302, "http://" + ip + "/r-http"},
			{web8080, "/r301/x", 301, "http://new.example:8080/r301/x"},
			{web8080, "/r302", 302, "https://" + ip + ":443/r302"},
			{web8080, "/r303/x", 303, "http://" + ip + ":8080/see-other"},
			{web8080, "/r307", 307, "http://" + ip + ":8443/r307"},
			{web8080, "/r308/a", 308, "http://" + ip + ":8080/moved/a"},
			{web8080, "/r-https-host", 302, "https://secure.example/r-https-host"},
			{web8080, "/r-http", 302, "http://" + ip + ":80/r-http"},
		} {
			a := get(t, "GET", c.base+c.path, nil)
			if got := a.header.Get("Location"); a.status != c.code || got != c.location {
				t.Errorf("GET %s%s: %d Location %q, want %d %q", c.base, c.path, a.status, got, c.code, c.location)
			}
		}
		// A Host the client chose is the redirect's host.
		a := get(t, "GET", web+"/r302", map[string]string{"Host": "web.shop.svc.cluster.local"})
		if got := a.header.Get("Location"); a.status != 302 || got != "https://web.shop.svc.cluster.local/r302" {
			t.Errorf("GET /r302 with Host web.shop.svc.cluster.local: %d Location %q", a.status, got)
		}
		for name, e := range m.echo {
			if n := e.countPrefix("/r30") + e.countPrefix("/r-"); n != 0 {
				t.Errorf("%s got %d redirected requests", name, n)
			}
		}
	})

	t.Run("RequestMirror", func(t *testing.T) {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("envoy mirror stats:\n%s", grepLines(m.a.envoy("/stats"), "mirror.shop"))
				t.Logf("envoy routes with mirrors:\n%s", grepLines(m.a.envoy("/config_dump?resource=dynamic_route_configs"), "mirror"))
			}
		})
		// /mirror: every request to web-v1 is mirrored to mirror; the client gets web-v1's answer.
		const all = 50
		for i := range all {
			p := fmt.Sprintf("/mirror/all/%d", i)
			if a := get(t, "GET", web+p, nil); a.status != 200 || a.echo.Pod != "web-v1" {
				t.Fatalf("GET %s: %d from %q, want web-v1's answer", p, a.status, a.echo.Pod)
			}
		}
		testenv.Eventually(t, 30*time.Second, "every request seen at the mirror", func() error {
			if n := mirror.countPrefix("/mirror/all/"); n != all {
				return fmt.Errorf("mirror got %d of %d", n, all)
			}
			return nil
		})
		t.Logf("the mirror saw Host %q (the request's: %q)", mirror.host("/mirror/all/0"), vip["web"])
		if h := mirror.host("/mirror/all/0"); !strings.HasPrefix(h, vip["web"]) {
			t.Errorf("the mirror saw Host %q, want the request's %q (Envoy may suffix -shadow)", h, vip["web"])
		}
		// /mirror-frac mirrors 1/4 (fraction). The mirrored count X over N = 400 is
		// Binomial(400, 0.25): mean 100, sd 8.7; P(X < 55) + P(X > 145) = 2.3e-7.
		const n, lo, hi = 400, 55, 145
		for i := range n {
			p := fmt.Sprintf("/mirror-frac/%d", i)
			if a := get(t, "GET", web+p, nil); a.status != 200 || a.echo.Pod != "web-v1" {
				t.Fatalf("GET %s: %d from %q", p, a.status, a.echo.Pod)
			}
		}
		// Mirrored requests are sent alongside: wait until the count stops moving.
		last, stable := -1, 0
		testenv.Eventually(t, 30*time.Second, "the mirror's count settles", func() error {
			n := mirror.countPrefix("/mirror-frac/")
			if n == last {
				stable++
			} else {
				last, stable = n, 0
			}
			if stable < 5 {
				return fmt.Errorf("count %d", n)
			}
			return nil
		})
		t.Logf("mirror fraction 1/4: the mirror got %d of %d (accepted %d..%d)", last, n, lo, hi)
		if last < lo || last > hi {
			t.Errorf("the mirror got %d of %d requests, want %d..%d", last, n, lo, hi)
		}
	})

	t.Run("RequestTimeout504", func(t *testing.T) {
		// /slow has timeouts.request 1s: a backend answering after 50 ms is fine, one answering
		// after 5 s gives the client a 504, not before the second has passed.
		if a := get(t, "GET", web+"/slow/quick?sleep=50ms", nil); a.status != 200 || a.echo.Pod != "slow-1" {
			t.Fatalf("GET /slow/quick: %d from %q, want 200 from slow-1", a.status, a.echo.Pod)
		}
		start := time.Now()
		a := get(t, "GET", web+"/slow/late?sleep=5s", nil)
		took := time.Since(start)
		t.Logf("timeouts.request 1s: %d %q after %s", a.status, a.body, took.Round(time.Millisecond))
		if a.status != http.StatusGatewayTimeout {
			t.Errorf("GET /slow/late: %d %q, want 504", a.status, a.body)
		}
		// Envoy's timers fire on a millisecond clock (a run saw the 504 after 999.97 ms as the
		// client measured it): a few milliseconds early is the timer's resolution, not a shorter
		// timeout.
		if took < time.Second-5*time.Millisecond {
			t.Errorf("the 504 came after %s, before the 1 s timeout", took)
		}
	})

	t.Run("CORS", func(t *testing.T) {
		// /cors has a CORS filter (GEP-1767): a preflight from an allowed origin is answered by
		// the proxy with the origin echoed and the policy's headers; from another origin it gets
		// no Access-Control-Allow-Origin and never reaches web-v1; a simple request from an
		// allowed origin gets the CORS headers on web-v1's answer.
		before := web1.count("/cors")
		for _, origin := range []string{"https://app.example", "https://a.b.shop.example"} {
			a := get(t, "OPTIONS", web+"/cors", map[string]string{"Origin": origin, "Access-Control-Request-Method": "PUT"})
			h := a.header
			if a.status != 200 || h.Get("Access-Control-Allow-Origin") != origin || h.Get("Access-Control-Allow-Methods") != "GET, PUT" ||
				h.Get("Access-Control-Allow-Headers") != "x-token" || h.Get("Access-Control-Max-Age") != "600" || h.Get("Access-Control-Allow-Credentials") != "true" {
				t.Errorf("preflight from %s: %d %v", origin, a.status, h)
			}
		}
		if a := get(t, "OPTIONS", web+"/cors", map[string]string{"Origin": "https://evil.example", "Access-Control-Request-Method": "PUT"}); a.status != 200 || a.header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("preflight from another origin: %d %v, want 200 without Access-Control-Allow-Origin", a.status, a.header)
		}
		if n := web1.count("/cors"); n != before {
			t.Errorf("web-v1 saw %d preflights, want none (the proxy answers them)", n-before)
		}
		a := get(t, "GET", web+"/cors", map[string]string{"Origin": "https://app.example"})
		if a.status != 200 || a.echo.Pod != "web-v1" || a.header.Get("Access-Control-Allow-Origin") != "https://app.example" ||
			a.header.Get("Access-Control-Expose-Headers") != "x-trace" || a.header.Get("Access-Control-Allow-Credentials") != "true" {
			t.Errorf("GET from an allowed origin: %d from %q, %v", a.status, a.echo.Pod, a.header)
		}
	})

	t.Run("RetriesCountedAtBackend", func(t *testing.T) {
		// /flaky retries 503 twice (attempts 2: three tries at most); /noretry has no retry.
		// flaky-1 fails the first <fail> requests of each path with <code>.
		for _, c := range []struct {
			path     string
			status   int
			attempts int
		}{
			{"/flaky/two?fail=2", 200, 3},
			{"/flaky/three?fail=3", 503, 3},
			{"/flaky/five?fail=5", 503, 3},
			{"/flaky/code500?fail=1&code=500", 500, 1}, // 500 is not in codes
			{"/flaky/ok", 200, 1},
			{"/noretry/one?fail=1", 503, 1},
		} {
			a := get(t, "GET", web+c.path, nil)
			p, _, _ := strings.Cut(c.path, "?")
			if got := flaky.count(p); a.status != c.status || got != c.attempts {
				t.Errorf("GET %s: %d after %d attempts at flaky-1, want %d after %d", c.path, a.status, got, c.status, c.attempts)
			}
		}
	})

	t.Run("UnsupportedFilterFailsClosed", func(t *testing.T) {
		// web-split's /ext rule for x-admin: yes has an ExtensionRef filter aether cannot apply:
		// its requests get 500 and do not fall through to the less specific /ext rule
		// (HTTPRouteFilter.type: the filter MUST NOT be skipped); other /ext requests and the
		// route's other rules are served.
		if err := expectStatus(get(t, "GET", web+"/ext", map[string]string{"x-admin": "yes"}), 500); err != nil {
			t.Errorf("GET /ext with x-admin: %v", err)
		}
		if n := web1.count("/ext"); n != 0 {
			t.Errorf("web-v1 got %d requests for /ext", n)
		}
		if a := get(t, "GET", web+"/ext", nil); a.status != 200 || a.echo.Pod != "web-v1" {
			t.Errorf("GET /ext without x-admin: %d from %q, want 200 from web-v1", a.status, a.echo.Pod)
		}
		if a := get(t, "GET", web+"/only-v2", nil); a.status != 200 {
			t.Errorf("GET /only-v2 (the same route): %d", a.status)
		}
	})

	t.Run("GRPCMethodRouting", func(t *testing.T) {
		for _, c := range []struct {
			method string
			md     []string
			pod    string
		}{
			{"/aether.test.Echo/Hello", nil, "grpc-v2"},                       // service and method, Exact
			{"/aether.test.Echo/Bye", nil, "grpc-v1"},                         // the rule without matches
			{"/aether.test.Admin/Reset", nil, "grpc-v2"},                      // service only
			{"/aether.test.Echo/GetThing", nil, "grpc-v2"},                    // method RegularExpression
			{"/aether.test.Echo/Bye", []string{"x-canary", "yes"}, "grpc-v2"}, // header match
			{"/aether.test.Echo/Bye", []string{"x-canary", "no"}, "grpc-v1"},
			{"/other.Svc/Hello", nil, "grpc-v1"},
		} {
			got, err := callGRPC(ctx, grpcShop, c.method, c.md...)
			if err != nil {
				t.Errorf("%s %v: %v", c.method, c.md, err)
				continue
			}
			if want := c.pod + " " + c.method; got != want {
				t.Errorf("%s %v: answer %q, want %q", c.method, c.md, got, want)
			}
		}
	})

	t.Run("ConsumerRouteOnlyForItsNamespace", func(t *testing.T) {
		other := httpClient(otherNS, false)
		otherGet := func(url string) answer {
			t.Helper()
			a, err := do(ctx, other, "GET", url, nil)
			if err != nil {
				t.Fatal(err)
			}
			return a
		}
		// Before: other's callers get the producer routes.
		if err := expectStatus(otherGet(web+"/nomatch"), 404); err != nil {
			t.Fatalf("other, before its consumer route: %v", err)
		}
		consumer := httpRoute("other", "web-consumer", []gwv1.ParentReference{serviceParent("shop", "web", 80)},
			gwv1.HTTPRouteRule{Filters: []gwv1.HTTPRouteFilter{setHeaders("x-consumer", "other")},
				BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: serviceRef("shop", "web-v2", 80)}}}})
		if _, err := m.gw.GatewayV1().HTTPRoutes("other").Create(ctx, consumer, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 60*time.Second, "other's callers follow the consumer route", func() error {
			if a := otherGet(web + "/nomatch"); a.status != 200 || a.echo.Pod != "web-v2" || a.echo.header("x-consumer") != "other" {
				return fmt.Errorf("%d from %q with x-consumer %q", a.status, a.echo.Pod, a.echo.header("x-consumer"))
			}
			return nil
		})
		// The consumer route replaces the producer routes for other's callers on port 80 ...
		for _, p := range []string{"/canary", "/zero", "/path/exact", "/r301"} {
			if a := otherGet(web + p); a.status != 200 || a.echo.Pod != "web-v2" || a.echo.header("x-consumer") != "other" || a.echo.header("x-rule") != "" {
				t.Errorf("other GET %s: %d from %q, x-consumer %q, x-rule %q: want the consumer route's", p, a.status, a.echo.Pod, a.echo.header("x-consumer"), a.echo.header("x-rule"))
			}
		}
		// ... only there (its parentRef names port 80) ...
		if err := expectStatus(otherGet(web8080+"/nomatch"), 404); err != nil {
			t.Errorf("other GET :8080/nomatch (producer routes): %v", err)
		}
		// ... and shop's callers still get the producer routes.
		if err := expectStatus(get(t, "GET", web+"/nomatch", nil), 404); err != nil {
			t.Errorf("shop GET /nomatch: %v", err)
		}
		if err := expectRule(get(t, "GET", web+"/path/exact", nil), "web-v1", "exact"); err != nil {
			t.Errorf("shop GET /path/exact: %v", err)
		}
		if err := m.gw.GatewayV1().HTTPRoutes("other").Delete(ctx, "web-consumer", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 60*time.Second, "other's callers back on the producer routes", func() error {
			return expectStatus(otherGet(web+"/nomatch"), 404)
		})
	})

	t.Run("DeleteRoutesReturnsToDefaultRoute", func(t *testing.T) {
		// One keep-alive connection carries requests before, during and after the routes go:
		// /zero answers 500 (its rule) until the default route (web's endpoints) serves it.
		kept := httpClient(shopNS, true)
		a, err := do(ctx, kept, "GET", web+"/zero", nil)
		if err != nil || a.status != 500 {
			t.Fatalf("GET /zero before the deletion: %v %d", err, a.status)
		}
		// web-split (which holds /zero's rule) goes last: while any route of web is left, a path
		// no rule matches answers 404 (GAMMA), so /zero must keep its rule until the others are
		// gone, whichever model the agent builds between the deletions.
		for _, name := range []string{"web-match", "web-filters", "web-redirect", "web-split"} {
			if err := m.gw.GatewayV1().HTTPRoutes("shop").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		requests := 0
		took := testenv.Eventually(t, 60*time.Second, "/zero on the default route", func() error {
			requests++
			a, err := do(ctx, kept, "GET", web+"/zero", nil)
			if err != nil {
				t.Fatalf("request %d on the kept connection: %v", requests, err)
			}
			if !a.reused {
				t.Fatalf("request %d: a new connection, want the kept one", requests)
			}
			switch {
			case a.status == 200 && (a.echo.Pod == "web-v1" || a.echo.Pod == "web-v2"):
				return nil
			case a.status == 500:
				return fmt.Errorf("still 500")
			}
			t.Fatalf("request %d: %d from %q, want 500 (route) or 200 (default route)", requests, a.status, a.echo.Pod)
			return nil
		})
		t.Logf("the default route served /zero %s after the deletion, request %d on the kept connection", took.Round(time.Millisecond), requests)
		for _, p := range []string{"/nomatch", "/r301", "/ext"} {
			if a, err := do(ctx, kept, "GET", web+p, nil); err != nil || a.status != 200 || !a.reused {
				t.Errorf("GET %s on the kept connection after the deletion: %v %d reused %v, want 200 on it", p, err, a.status, a.reused)
			}
		}
	})
	t.Logf("routes served for %s", time.Since(routesAt).Round(time.Millisecond))
}

// createRoutes creates the producer routes of TestPrivilegedGAMMATraffic: four HTTPRoutes on
// every port of shop/web and a GRPCRoute on shop/grpc.
func createRoutes(t *testing.T, m *gammaMesh) {
	t.Helper()
	parent := []gwv1.ParentReference{serviceParent("", "web", 0)}
	one := func(ms ...gwv1.HTTPRouteMatch) []gwv1.HTTPRouteMatch { return ms }
	hdr := func(path, name, value string, typ gwv1.HeaderMatchType) gwv1.HTTPRouteMatch {
		mm := prefix(path)
		mm.Headers = []gwv1.HTTPHeaderMatch{{Type: new(typ), Name: gwv1.HTTPHeaderName(name), Value: value}}
		return mm
	}
	routes := []*gwv1.HTTPRoute{
		httpRoute("shop", "web-split", parent,
			gwv1.HTTPRouteRule{Matches: one(prefix("/canary")), BackendRefs: []gwv1.HTTPBackendRef{
				to("web-v1", 90), to("web-v2", 10, setHeaders("x-backend", "v2"))}},
			gwv1.HTTPRouteRule{Matches: one(prefix("/only-v2")), BackendRefs: []gwv1.HTTPBackendRef{to("web-v1", 0), to("web-v2", 1)}},
			gwv1.HTTPRouteRule{Matches: one(prefix("/zero")), BackendRefs: []gwv1.HTTPBackendRef{to("web-v1", 0)}},
			gwv1.HTTPRouteRule{Matches: one(prefix("/invalid")), BackendRefs: []gwv1.HTTPBackendRef{to("web-v1", 1), to("nosuch", 1)}},
			gwv1.HTTPRouteRule{Matches: one(hdr("/ext", "x-admin", "yes", gwv1.HeaderMatchExact)), BackendRefs: []gwv1.HTTPBackendRef{to("web-v1", 1)},
				Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterExtensionRef,
					ExtensionRef: &gwv1.LocalObjectReference{Group: "example.com", Kind: "Thing", Name: "x"}}}},
			gwv1.HTTPRouteRule{Matches: one(prefix("/ext")), BackendRefs: []gwv1.HTTPBackendRef{to("web-v1", 1)}},
			gwv1.HTTPRouteRule{Matches: one(prefix("/mirror")), BackendRefs: []gwv1.HTTPBackendRef{to("web-v1", 1)},
				Filters: []gwv1.HTTPRouteFilter{mirrorTo("mirror", 0, 0)}},
			gwv1.HTTPRouteRule{Matches: one(prefix("/mirror-frac")), BackendRefs: []gwv1.HTTPBackendRef{to("web-v1", 1)},
				Filters: []gwv1.HTTPRouteFilter{mirrorTo("mirror", 1, 4)}},
			gwv1.HTTPRouteRule{Matches: one(prefix("/slow")), BackendRefs: []gwv1.HTTPBackendRef{to("slow", 1)},
				Timeouts: &gwv1.HTTPRouteTimeouts{Request: new(gwv1.Duration("1s"))}},
			gwv1.HTTPRouteRule{Matches: one(prefix("/flaky")), BackendRefs: []gwv1.HTTPBackendRef{to("flaky", 1)},
				Retry: &gwv1.HTTPRouteRetry{Attempts: new(2), Codes: []gwv1.HTTPRouteRetryStatusCode{503}, Backoff: new(gwv1.Duration("10ms"))}},
			gwv1.HTTPRouteRule{Matches: one(prefix("/noretry")), BackendRefs: []gwv1.HTTPBackendRef{to("flaky", 1)}},
		),
		// Written in an order a first-match proxy would get wrong: precedence, not order, decides.
		httpRoute("shop", "web-match", parent,
			tagged("prefix", one(prefix("/path")), to("web-v2", 1)),
			tagged("longer", one(prefix("/path/longer")), to("web-v1", 1)),
			tagged("exact", one(pathMatch(gwv1.PathMatchExact, "/path/exact")), to("web-v1", 1)),
			tagged("regex", one(pathMatch(gwv1.PathMatchRegularExpression, "/re/[0-9]+"),
				pathMatch(gwv1.PathMatchRegularExpression, "/path/r[0-9]+")), to("web-v2", 1)),
			tagged("abc", one(prefix("/abc")), to("web-v1", 1)),
			tagged("hdr", one(prefix("/hdr")), to("web-v1", 1)),
			tagged("hdr-exact", one(hdr("/hdr", "X-Version", "v2", gwv1.HeaderMatchExact)), to("web-v2", 1)),
			tagged("hdr-regex", one(hdr("/hdr", "x-version", "v[3-9]", gwv1.HeaderMatchRegularExpression)), to("web-v2", 1)),
			tagged("q", one(prefix("/q")), to("web-v1", 1)),
			tagged("q-v2", one(gwv1.HTTPRouteMatch{Path: prefix("/q").Path,
				QueryParams: []gwv1.HTTPQueryParamMatch{{Name: "version", Value: "v2"}}}), to("web-v2", 1)),
			tagged("m", one(prefix("/m")), to("web-v1", 1)),
			tagged("m-post", one(gwv1.HTTPRouteMatch{Path: prefix("/m").Path, Method: new(gwv1.HTTPMethodPost)}), to("web-v2", 1)),
		),
		httpRoute("shop", "web-filters", parent,
			gwv1.HTTPRouteRule{Matches: one(prefix("/headers")), BackendRefs: []gwv1.HTTPBackendRef{to("web-v1", 1)},
				Filters: []gwv1.HTTPRouteFilter{
					{Type: gwv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gwv1.HTTPHeaderFilter{
						Set:    []gwv1.HTTPHeader{{Name: "X-Set", Value: "route"}, {Name: "x-new", Value: "route"}},
						Add:    []gwv1.HTTPHeader{{Name: "x-add", Value: "route"}},
						Remove: []string{"X-Remove"}}},
					{Type: gwv1.HTTPRouteFilterResponseHeaderModifier, ResponseHeaderModifier: &gwv1.HTTPHeaderFilter{
						Set:    []gwv1.HTTPHeader{{Name: "x-resp-set", Value: "route"}},
						Add:    []gwv1.HTTPHeader{{Name: "X-Resp-Add", Value: "route"}},
						Remove: []string{"x-resp-remove"}}},
				}},
			gwv1.HTTPRouteRule{Matches: one(prefix("/cors")), BackendRefs: []gwv1.HTTPBackendRef{to("web-v1", 1)},
				Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterCORS, CORS: &gwv1.HTTPCORSFilter{
					AllowOrigins: []gwv1.CORSOrigin{"https://app.example", "https://*.shop.example"}, AllowCredentials: new(true),
					AllowMethods: []gwv1.HTTPMethodWithWildcard{"GET", "PUT"}, AllowHeaders: []gwv1.HTTPHeaderName{"x-token"},
					ExposeHeaders: []gwv1.HTTPHeaderName{"x-trace"}, MaxAge: 600}}}},
			rewrite("/rw/a", gwv1.HTTPURLRewriteFilter{Path: replacePrefix("/xyz")}),
			rewrite("/rw/b", gwv1.HTTPURLRewriteFilter{Path: replacePrefix("/xyz/")}),
			rewrite("/rw/c/", gwv1.HTTPURLRewriteFilter{Path: replacePrefix("/xyz")}),
			rewrite("/rw/d/", gwv1.HTTPURLRewriteFilter{Path: replacePrefix("/xyz/")}),
			rewrite("/rw/e", gwv1.HTTPURLRewriteFilter{Path: replacePrefix("")}),
			rewrite("/rw/f", gwv1.HTTPURLRewriteFilter{Path: replacePrefix("/")}),
			rewrite("/full", gwv1.HTTPURLRewriteFilter{Path: replaceFull("/replaced")}),
			rewrite("/host", gwv1.HTTPURLRewriteFilter{Hostname: new(gwv1.PreciseHostname("rewritten.example"))}),
		),
		httpRoute("shop", "web-redirect", parent,
			redirect("/r301", gwv1.HTTPRequestRedirectFilter{StatusCode: new(301), Hostname: new(gwv1.PreciseHostname("new.example"))}),
			redirect("/r302", gwv1.HTTPRequestRedirectFilter{StatusCode: new(302), Scheme: new("https")}),
			redirect("/r303", gwv1.HTTPRequestRedirectFilter{StatusCode: new(303), Path: replaceFull("/see-other")}),
			redirect("/r307", gwv1.HTTPRequestRedirectFilter{StatusCode: new(307), Port: new(gwv1.PortNumber(8443))}),
			redirect("/r308", gwv1.HTTPRequestRedirectFilter{StatusCode: new(308), Path: replacePrefix("/moved")}),
			redirect("/r-https-host", gwv1.HTTPRequestRedirectFilter{Scheme: new("https"), Hostname: new(gwv1.PreciseHostname("secure.example"))}),
			redirect("/r-https-port", gwv1.HTTPRequestRedirectFilter{Scheme: new("https"), Port: new(gwv1.PortNumber(8443))}),
			redirect("/r-http", gwv1.HTTPRequestRedirectFilter{Scheme: new("http")}),
		),
	}
	for _, r := range routes {
		if _, err := m.gw.GatewayV1().HTTPRoutes(r.Namespace).Create(m.ctx, r, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create HTTPRoute %s: %v", r.Name, err)
		}
	}
	canary := gwv1.GRPCRouteMatch{Headers: []gwv1.GRPCHeaderMatch{{Name: "x-canary", Value: "yes"}}}
	g := &gwv1.GRPCRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "grpc-methods"},
		Spec: gwv1.GRPCRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{serviceParent("", "grpc", 9090)}},
			Rules: []gwv1.GRPCRouteRule{
				grpcRule("grpc-v1"),
				grpcRule("grpc-v2", canary),
				grpcRule("grpc-v2", grpcMethod(gwv1.GRPCMethodMatchExact, "aether.test.Echo", "Hello")),
				grpcRule("grpc-v2", grpcMethod(gwv1.GRPCMethodMatchExact, "aether.test.Admin", "")),
				grpcRule("grpc-v2", grpcMethod(gwv1.GRPCMethodMatchRegularExpression, "", "Get.*")),
			}}}
	if _, err := m.gw.GatewayV1().GRPCRoutes("shop").Create(m.ctx, g, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create GRPCRoute: %v", err)
	}
}

// expectStatus says how a differs from an answer with status code.
func expectStatus(a answer, code int) error {
	if a.status != code {
		return fmt.Errorf("%d %.200q, want %d", a.status, a.body, code)
	}
	return nil
}

// expectRule says how a differs from a 200 served by pod through the rule tagged rule (tagged).
func expectRule(a answer, pod, rule string) error {
	if a.status != 200 || a.echo.Pod != pod || a.echo.header("x-rule") != rule {
		return fmt.Errorf("%d from %q by rule %q, want 200 from %s by rule %q", a.status, a.echo.Pod, a.echo.header("x-rule"), pod, rule)
	}
	return nil
}
