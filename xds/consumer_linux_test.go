package xds

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"testing"
	"time"

	"github.com/aethermesh/aether/model"
)

// TestPrivilegedGAMMAConsumerRoutes serves, on the real Envoy, a producer route on the traffic
// fixture's HTTP service and a consumer route in namespace front (GEP-1294): front's caller gets
// the consumer route and a 404 where it does not match, the callers in shop get the producer
// route; the consumer route coming and going changes nothing of the callers' connections: a
// keep-alive connection of front's caller opened before it carries every request, with the
// routes in place and after they are gone, and is never closed (a change of the pod's filter
// chains would have Envoy drain it).
func TestPrivilegedGAMMAConsumerRoutes(t *testing.T) {
	f := startTrafficFixture(t, time.Hour, true, Options{})
	f.addPod("delta", true)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		// What Envoy did with listeners, drains and upstreams, for a failure's diagnosis.
		for _, q := range []string{"listener_manager.listener_", "drain", "upstream_rq_5xx", "upstream_cx_connect_fail", "downstream_cx_destroy_remote"} {
			if s, err := f.admin("/stats?filter=" + q); err == nil {
				t.Logf("envoy stats %s:\n%s", q, s)
			}
		}
	})
	web := model.ServiceKey{Namespace: "web", Name: "http"}
	mesh := func(version uint64, routes []model.Route) *model.Mesh {
		base := trafficMesh(f, version)
		delta := &model.LocalPod{UID: "uid-delta", Namespace: "front", Name: "delta", ServiceAccount: "delta",
			NetnsPath: f.pods["delta"].Path, IPs: []netip.Addr{f.ips["delta"]}, Ready: true}
		m := model.New(version, base.Cluster, base.MeshDomain, base.TrustDomain, base.Node, base.Services, base.Endpoints, append(base.Pods, delta))
		return withRoutes(t, m, routes)
	}
	route := func(ns, name, prefix string) model.Route {
		return model.Route{
			RouteRef: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: ns, Name: name},
			Parents:  []model.ParentRef{{Kind: model.ParentService, Service: web, Port: 80}},
			Rules: []model.RouteRule{{
				Matches:  []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: prefix}}},
				Filters:  []model.RouteFilter{{Type: model.FilterResponseHeaderModifier, Headers: &model.HeaderModifier{Set: []model.Header{{Name: "x-route", Value: name}}}}},
				Backends: []model.BackendRef{{Kind: model.BackendService, Service: web, Port: 80, Weight: 1}},
			}},
		}
	}
	producer, consumer := route("web", "producer", "/"), route("front", "consumer", "/c")

	kept := f.pods["delta"].HTTPClient(true)
	kept.Transport.(*http.Transport).MaxConnsPerHost = 1
	alpha := f.pods["alpha"].HTTPClient(false)
	// get sends GET path over c and returns the status, the x-route header and whether the
	// connection was reused.
	get := func(t *testing.T, c *http.Client, path string) (int, string, bool) {
		t.Helper()
		var reused bool
		req, _ := http.NewRequest(http.MethodGet, "http://"+vipHTTP.String()+path, nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.Close && c == kept {
			t.Errorf("GET %s: the proxy asked to close the kept connection", path)
		}
		return resp.StatusCode, resp.Header.Get("x-route"), reused
	}

	f.set(mesh(2, nil))
	if code, _, _ := get(t, kept, "/c"); code != 200 {
		t.Fatalf("before the routes: %d", code)
	}
	f.set(mesh(3, []model.Route{producer, consumer}))
	f.wantNoRejections(t)
	for _, tc := range []struct {
		who    string
		c      *http.Client
		path   string
		code   int
		header string
	}{
		{"front", kept, "/c/x", 200, "consumer"},
		{"front", kept, "/other", 404, ""},
		{"shop", alpha, "/c/x", 200, "producer"},
		{"shop", alpha, "/other", 200, "producer"},
	} {
		code, h, _ := get(t, tc.c, tc.path)
		if code != tc.code || h != tc.header {
			t.Errorf("%s's caller GET %s: %d x-route %q, want %d %q", tc.who, tc.path, code, h, tc.code, tc.header)
		}
	}
	f.set(mesh(4, []model.Route{producer}))
	if code, h, _ := get(t, kept, "/other"); code != 200 || h != "producer" {
		t.Errorf("consumer route gone: front's caller GET /other: %d %q, want the producer route", code, h)
	}
	f.set(mesh(5, nil))
	if code, h, _ := get(t, kept, "/c"); code != 200 || h != "" {
		t.Errorf("routes gone: %d %q, want the default route", code, h)
	}
	// Envoy drains the connections of a changed filter chain for --drain-time-s (5 s, as the
	// supervisor starts it), asking each to close on its next request: requests on the kept
	// connection keep being answered on it, without a close, past that time.
	deadline := time.Now().Add(6 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		code, _, reused := get(t, kept, fmt.Sprintf("/c?i=%d", i))
		if code != 200 || !reused {
			t.Fatalf("request %d on the kept connection: %d, reused %t", i, code, reused)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if s, err := f.admin("/stats?filter=listener_manager.listener_modified"); err == nil {
		t.Logf("%s", s)
	}
}
