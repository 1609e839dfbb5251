package xds

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// TestPrivilegedGAMMAMirror serves, on the real Envoy, a route on service rec-a that mirrors
// every request to rec-b and sets a header whose value has a "%": each request reaches rec-a
// and a copy reaches rec-b over mTLS with the caller's own identity (the mirror cluster of the
// caller's identity; Envoy gives a mirrored copy no filter state), neither application sees the
// mirror header the route sets, and the header value arrives as written.
func TestPrivilegedGAMMAMirror(t *testing.T) {
	f := startTrafficFixture(t, time.Hour, true, Options{})
	recNS, _ := f.addPod("rec", false)
	type seen struct{ xfcc, pct, mirrorHeader, host string }
	var mu sync.Mutex
	got := map[string][]seen{}
	for _, port := range []string{"8080", "8081"} {
		recNS.ServeHTTP(t, "0.0.0.0:"+port, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got[port] = append(got[port], seen{xfccURI("xfcc=" + r.Header.Get("X-Forwarded-Client-Cert")), r.Header.Get("x-pct"), r.Header.Get(MirrorHeader(0)), r.Host})
			mu.Unlock()
			fmt.Fprint(w, "rec "+port)
		}))
	}
	recA := model.ServiceKey{Namespace: "web", Name: "rec-a"}
	recB := model.ServiceKey{Namespace: "web", Name: "rec-b"}
	vipA, vipB := netip.MustParseAddr("10.96.0.30"), netip.MustParseAddr("10.96.0.31")
	base := trafficMesh(f, 2)
	rec := &model.LocalPod{UID: "uid-rec", Namespace: "web", Name: "rec", ServiceAccount: "rec", NetnsPath: recNS.Path, IPs: []netip.Addr{f.ips["rec"]},
		Ready: true, Ports: []model.PodPort{{Port: 8080, Protocol: model.ProtocolHTTP}, {Port: 8081, Protocol: model.ProtocolHTTP}}}
	services := append(base.Services,
		&model.Service{Key: recA, Local: true, VIPs: []netip.Addr{vipA}, Ports: []model.ServicePort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: model.ProtocolHTTP}}},
		&model.Service{Key: recB, Local: true, VIPs: []netip.Addr{vipB}, Ports: []model.ServicePort{{Name: "http", Port: 80, TargetPort: 8081, Protocol: model.ProtocolHTTP}}})
	eps := map[model.ServiceKey][]model.Endpoint{}
	for k, v := range base.Endpoints {
		eps[k] = v
	}
	for k, port := range map[model.ServiceKey]uint32{recA: 8080, recB: 8081} {
		eps[k] = []model.Endpoint{{Service: k, Cluster: "c1", PodName: "rec", PodUID: "uid-rec", IPs: []netip.Addr{f.ips["rec"]}, NodeName: "node-1",
			Ports: []model.EndpointPort{{Port: port, Protocol: model.ProtocolHTTP}}, SPIFFEID: model.SPIFFEID(f.td, "web", "rec"), Healthy: true}}
	}
	m := model.New(2, base.Cluster, base.MeshDomain, base.TrustDomain, base.Node, services, eps, append(base.Pods, rec))
	m = withRoutes(t, m, []model.Route{{
		RouteRef: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: "web", Name: "mirror"},
		Parents:  []model.ParentRef{{Kind: model.ParentService, Service: recA, Port: 80}},
		Rules: []model.RouteRule{{
			Matches: []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/"}}},
			Filters: []model.RouteFilter{
				{Type: model.FilterRequestHeaderModifier, Headers: &model.HeaderModifier{Set: []model.Header{{Name: "x-pct", Value: "100% %DOWNSTREAM_REMOTE_ADDRESS%"}}}},
				{Type: model.FilterRequestMirror, Mirror: &model.Mirror{Backend: model.BackendRef{Kind: model.BackendService, Service: recB, Port: 80}, Numerator: 1, Denominator: 1}},
			},
			Backends: []model.BackendRef{{Kind: model.BackendService, Service: recA, Port: 80, Weight: 1}},
		}},
	}})
	f.set(m)
	f.wantNoRejections(t)

	alpha := f.pods["alpha"]
	alphaID := model.SPIFFEID(f.td, "shop", "alpha")
	const n = 20
	for i := 0; i < n; i++ {
		// A client-sent mirror header must not choose the mirror cluster (the route overwrites it).
		code, body, _, err := getBody(alpha.HTTPClient(false), fmt.Sprintf("http://%s/r%d", vipA, i), map[string]string{MirrorHeader(0): "mirror|spiffe://" + f.td + "/ns/web/sa/rec|web.mesh"})
		if err != nil || code != 200 || body != "rec 8080" {
			l, _ := f.admin("/listeners")
			c, _ := f.admin("/clusters")
			t.Logf("listeners:\n%s\nclusters:\n%s", l, grepLines(c, "rec"))
			t.Fatalf("request %d: %d %q %v", i, code, body, err)
		}
	}
	testenv.Eventually(t, 30*time.Second, "every request mirrored to rec-b", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(got["8081"]) < n {
			return fmt.Errorf("rec-b got %d of %d", len(got["8081"]), n)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(got["8080"]) != n || len(got["8081"]) != n {
		t.Errorf("rec-a got %d, rec-b %d; want %d each", len(got["8080"]), len(got["8081"]), n)
	}
	for port, ss := range got {
		for _, s := range ss {
			if s.xfcc != alphaID || s.pct != "100% %DOWNSTREAM_REMOTE_ADDRESS%" || s.mirrorHeader != "" {
				t.Errorf("%s saw XFCC URI %q, x-pct %q, %s %q; want %s, the literal value, no mirror header", port, s.xfcc, s.pct, MirrorHeader(0), s.mirrorHeader, alphaID)
				break
			}
		}
	}
	t.Logf("mirrored Host: %q", got["8081"][0].host)
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
