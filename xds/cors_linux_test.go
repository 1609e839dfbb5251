package xds

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/model"
)

// TestPrivilegedGAMMACORS serves HTTPRoute rules with CORS filters (GEP-1767) on the traffic
// fixture's HTTP service and checks, on the real Envoy, what HTTPCORSFilter asks for: preflights
// from allowed origins (exact, "*." over several labels, "*") are answered by the proxy with the
// request's Origin echoed, the configured methods, headers, max age and credentials; "*" methods
// and headers echo the preflight's requested ones; a preflight from another origin gets no
// Access-Control-Allow-Origin and never reaches the backend; simple requests get the origin and
// the exposed headers added to the backend's answer; a route without CORS adds nothing.
func TestPrivilegedGAMMACORS(t *testing.T) {
	f := startTrafficFixture(t, time.Hour, true, Options{})
	web := model.ServiceKey{Namespace: "web", Name: "http"}
	backend := []model.BackendRef{{Kind: model.BackendService, Service: web, Port: 80, Weight: 1}}
	prefix := func(p string) []model.RouteMatch {
		return []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: p}}}
	}
	cors := func(c model.CORS) []model.RouteFilter { return []model.RouteFilter{{Type: model.FilterCORS, CORS: &c}} }
	m := trafficMesh(f, 2)
	m = withRoutes(t, m, []model.Route{{
		RouteRef: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: "web", Name: "cors"},
		Parents:  []model.ParentRef{{Kind: model.ParentService, Service: web, Port: 80}},
		Rules: []model.RouteRule{{
			Matches: prefix("/cors-1"), Backends: backend,
			Filters: cors(model.CORS{AllowOrigins: []string{"https://www.foo.com", "https://*.bar.com"}, AllowMethods: []string{"GET", "OPTIONS"},
				AllowHeaders: []string{"x-header-1", "x-header-2"}, ExposeHeaders: []string{"x-header-3", "x-header-4"}, AllowCredentials: true, MaxAge: 3600}),
		}, {
			Matches: prefix("/cors-2"), Backends: backend,
			Filters: cors(model.CORS{AllowOrigins: []string{"https://www.foo.com"}, AllowMethods: []string{"*"}, MaxAge: 5}),
		}, {
			Matches: prefix("/cors-any"), Backends: backend,
			Filters: cors(model.CORS{AllowOrigins: []string{"*"}, AllowMethods: []string{"*"}, AllowHeaders: []string{"*"}, ExposeHeaders: []string{"*"},
				AllowCredentials: true, MaxAge: 5}),
		}, {
			Matches: prefix("/"), Backends: backend,
		}},
	}})
	f.set(m)
	f.wantNoRejections(t)

	client := f.pods["alpha"].HTTPClient(false)
	do := func(t *testing.T, method, path string, hdr map[string]string) (int, http.Header, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+vipHTTP.String()+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	// want checks each header: a value, or "" for absent.
	want := func(t *testing.T, h http.Header, want map[string]string) {
		t.Helper()
		for k, v := range want {
			got, ok := h[http.CanonicalHeaderKey(k)]
			switch {
			case v == "" && ok:
				t.Errorf("%s = %q, want it absent", k, got)
			case v != "" && strings.Join(got, ",") != v:
				t.Errorf("%s = %q, want %q", k, got, v)
			}
		}
	}
	preflight := func(origin, method, headers string) map[string]string {
		h := map[string]string{"Origin": origin, "Access-Control-Request-Method": method}
		if headers != "" {
			h["Access-Control-Request-Headers"] = headers
		}
		return h
	}

	for _, origin := range []string{"https://www.foo.com", "https://www.bar.com", "https://xpto.www.bar.com"} {
		t.Run("preflight allowed "+origin, func(t *testing.T) {
			code, h, body := do(t, http.MethodOptions, "/cors-1", preflight(origin, "GET", "x-header-1, x-header-2"))
			if code != 200 || body != "" {
				t.Errorf("preflight: %d %q, want 200 answered by the proxy (empty body)", code, body)
			}
			want(t, h, map[string]string{"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Methods": "GET, OPTIONS",
				"Access-Control-Allow-Headers": "x-header-1, x-header-2", "Access-Control-Max-Age": "3600", "Access-Control-Allow-Credentials": "true"})
		})
	}
	t.Run("preflight from another origin", func(t *testing.T) {
		for _, origin := range []string{"https://foobar.com", "https://bar.com", "http://www.foo.com", "https://www.foo.com:8443"} {
			code, h, body := do(t, http.MethodOptions, "/cors-1", preflight(origin, "GET", ""))
			if code != 200 || body != "" {
				t.Errorf("preflight from %s: %d %q, want 200 from the proxy, not forwarded", origin, code, body)
			}
			want(t, h, map[string]string{"Access-Control-Allow-Origin": ""})
		}
	})
	t.Run("simple request from an allowed origin", func(t *testing.T) {
		code, h, body := do(t, http.MethodGet, "/cors-1", map[string]string{"Origin": "https://www.bar.com"})
		if code != 200 || !strings.HasPrefix(body, "xfcc=") {
			t.Fatalf("GET: %d %q, want the backend's answer", code, body)
		}
		want(t, h, map[string]string{"Access-Control-Allow-Origin": "https://www.bar.com", "Access-Control-Allow-Credentials": "true",
			"Access-Control-Expose-Headers": "x-header-3, x-header-4"})
	})
	t.Run("simple request from another origin", func(t *testing.T) {
		code, h, _ := do(t, http.MethodGet, "/cors-1", map[string]string{"Origin": "https://foobar.com"})
		if code != 200 {
			t.Fatalf("GET: %d", code)
		}
		want(t, h, map[string]string{"Access-Control-Allow-Origin": "", "Access-Control-Expose-Headers": ""})
	})
	t.Run("wildcard methods without credentials", func(t *testing.T) {
		code, h, _ := do(t, http.MethodOptions, "/cors-2", preflight("https://www.foo.com", "POST", ""))
		if code != 200 {
			t.Fatalf("preflight: %d", code)
		}
		want(t, h, map[string]string{"Access-Control-Allow-Origin": "https://www.foo.com", "Access-Control-Allow-Methods": "POST",
			"Access-Control-Allow-Credentials": "", "Access-Control-Max-Age": "5"})
	})
	t.Run("wildcards with credentials echo the request", func(t *testing.T) {
		code, h, _ := do(t, http.MethodOptions, "/cors-any", preflight("https://foobar.com:12345", "PUT", "x-header-1, x-header-2"))
		if code != 200 {
			t.Fatalf("preflight: %d", code)
		}
		want(t, h, map[string]string{"Access-Control-Allow-Origin": "https://foobar.com:12345", "Access-Control-Allow-Methods": "PUT",
			"Access-Control-Allow-Headers": "x-header-1, x-header-2", "Access-Control-Allow-Credentials": "true"})
		_, h, _ = do(t, http.MethodGet, "/cors-any", map[string]string{"Origin": "https://other.foo.com", "Authorization": "Bearer x"})
		want(t, h, map[string]string{"Access-Control-Allow-Origin": "https://other.foo.com", "Access-Control-Allow-Credentials": "true",
			"Access-Control-Expose-Headers": ""})
	})
	t.Run("a route without CORS adds nothing", func(t *testing.T) {
		code, h, body := do(t, http.MethodOptions, "/other", preflight("https://www.foo.com", "GET", ""))
		if code != 200 || !strings.HasPrefix(body, "xfcc=") {
			t.Errorf("preflight on a rule without CORS: %d %q, want it forwarded to the backend", code, body)
		}
		want(t, h, map[string]string{"Access-Control-Allow-Origin": "", "Access-Control-Allow-Methods": ""})
	})
	if s, err := f.admin("/stats?filter=cors"); err == nil {
		t.Logf("cors stats:\n%s", s)
	}
}
