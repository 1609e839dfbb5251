package xds

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// repin returns m as version with every endpoint of service k claiming the SPIFFE ID id
// (the registry's word for who serves k), everything else unchanged.
func repin(m *model.Mesh, version uint64, k model.ServiceKey, id string) *model.Mesh {
	eps := map[model.ServiceKey][]model.Endpoint{}
	for key, list := range m.Endpoints {
		list = append([]model.Endpoint(nil), list...)
		if key == k {
			for i := range list {
				list[i].SPIFFEID = id
			}
		}
		eps[key] = list
	}
	return model.New(version, m.Cluster, m.MeshDomain, m.TrustDomain, m.Node, m.Services, eps, m.Pods)
}

// sanFailures returns the outbound cluster's upstream ssl.fail_verify_san counter (Envoy's
// "cluster.<name>.ssl.fail_verify_san", with the ':' of the cluster name turned into '_' in the
// stat name: the peer's certificate chained to the trust bundle but none of its SANs matched
// match_typed_subject_alt_names) and fails the test when Envoy has no such stat, naming the ssl
// stats it has.
func sanFailures(t testing.TB, stats map[string]int, cluster string) int {
	t.Helper()
	name := "cluster." + strings.ReplaceAll(cluster, ":", "_") + ".ssl.fail_verify_san"
	n, ok := stats[name]
	if !ok {
		var have []string
		for k := range stats {
			if strings.HasPrefix(k, "cluster.") && strings.Contains(k, ".ssl.fail_verify") {
				have = append(have, k)
			}
		}
		sort.Strings(have)
		t.Fatalf("no stat %s; Envoy has %v", name, have)
	}
	return n
}

// TestPrivilegedSANPin shows, through the real Envoy 1.40, that the caller's Envoy refuses a
// server whose certificate chains to the trust bundle but whose SPIFFE ID is not the one the
// registry gave for the destination (the outbound cluster's match_typed_subject_alt_names, built
// by upstreamTLS/upstreamTLSFor from peerIDs). The server pod runs as web/sa/server and its
// inbound listener presents that SVID. With the model's endpoints claiming web/sa/server, HTTP to
// the service VIP and TCP to the floor service are served; with them claiming web/sa/web the
// same calls fail (HTTP 503, the TCP echo breaks), the application sees nothing and the clusters'
// ssl.fail_verify_san counters move; back on the true ID they are served again. The same holds
// through the waypoint socket (SNI <port>.<svc>.<ns>.<meshDomain>, same SAN pin): a's Envoy
// refuses b's pods behind b's node tunnel listeners when a's registry view claims another ID.
func TestPrivilegedSANPin(t *testing.T) {
	for _, c := range []struct {
		name  string
		build Options
	}{
		{"on-demand-selector", Options{}},
		{"transport-socket-matcher", Options{CertSelection: CertMatcher}},
	} {
		t.Run(c.name, func(t *testing.T) { testSANPin(t, c.build) })
	}
	t.Run("waypoint", testSANPinWaypoint)
}

func testSANPin(t *testing.T, build Options) {
	f := startTrafficFixture(t, time.Hour, false, build)
	alpha := f.pods["alpha"]
	httpKey, tcpKey := model.ServiceKey{Namespace: "web", Name: "http"}, model.ServiceKey{Namespace: "web", Name: "tcp"}
	truth := model.SPIFFEID(f.td, "web", "server")
	m := trafficMesh(f, 1)
	httpCluster, tcpCluster := ClusterName(m, httpKey, 80), ClusterName(m, tcpKey, 9000)

	served := func(t *testing.T, when string) {
		t.Helper()
		code, body, _, err := getBody(alpha.HTTPClient(false), "http://"+vipHTTP.String()+"/", nil)
		if err != nil || code != 200 || !strings.HasPrefix(body, "xfcc=") {
			t.Fatalf("%s: GET http VIP: %d %q %v, want 200 from the application", when, code, body, err)
		}
		c, err := alpha.Dial(vipTCP.String() + ":9000")
		if err != nil {
			t.Fatalf("%s: dial tcp VIP: %v", when, err)
		}
		defer c.Close()
		if err := testenv.EchoOnce(c, "pinned"); err != nil {
			t.Fatalf("%s: TCP echo through the floor: %v", when, err)
		}
	}

	served(t, "endpoints claim the server's own ID")

	wrong := model.SPIFFEID(f.td, "web", "web")
	m2 := repin(repin(trafficMesh(f, 2), 2, httpKey, wrong), 2, tcpKey, wrong)
	f.set(m2)
	for _, cl := range []string{httpCluster, tcpCluster} {
		cds, err := f.admin("/config_dump?resource=dynamic_active_clusters&name_regex=" + regexp.QuoteMeta(cl))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(cds, `"exact": "`+wrong+`"`) || strings.Contains(cds, `"exact": "`+truth+`"`) {
			t.Fatalf("Envoy's cluster %s does not pin %s alone:\n%s", cl, wrong, cds)
		}
	}
	before := f.stats()
	for i := 0; i < 3; i++ {
		code, body, _, err := getBody(alpha.HTTPClient(false), "http://"+vipHTTP.String()+"/", nil)
		if err == nil && (code == 200 || strings.HasPrefix(body, "xfcc=")) {
			t.Errorf("GET http VIP with the pin on %s: %d %q, want the server refused", wrong, code, body)
		} else {
			t.Logf("refused as wanted: %d %q %v", code, body, err)
		}
	}
	c, err := alpha.Dial(vipTCP.String() + ":9000")
	if err != nil {
		t.Fatal(err) // the capture listener accepts; the upstream leg is what fails
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := testenv.EchoOnce(c, "pinned"); err == nil {
		t.Errorf("TCP echo with the pin on %s succeeded, want the server refused", wrong)
	}
	c.Close()
	testenv.Eventually(t, time.Minute, "fail_verify_san counters", func() error {
		after := f.stats()
		for _, cl := range []string{httpCluster, tcpCluster} {
			if got := sanFailures(t, after, cl) - sanFailures(t, before, cl); got < 1 {
				return fmt.Errorf("%s ssl.fail_verify_san moved by %d, want at least 1", cl, got)
			}
		}
		return nil
	})

	f.set(trafficMesh(f, 3))
	served(t, "endpoints claim the server's own ID again")
}

// testSANPinWaypoint: a's view of b's exported web/echo claims web/sa/web while b's pods run as
// echo-1 and echo-2. The connection crosses b's tunnel listener (which never decrypts), reaches
// the pod's inbound listener, and a's Envoy refuses the pod's certificate.
func testSANPinWaypoint(t *testing.T) {
	w := newWaypointTopo(t, false)
	w.set(1, true, false)
	echo := model.ServiceKey{Namespace: "web", Name: "echo"}
	client := w.a.pods["client"]
	const cx = "tcp.waypoint.web.echo.downstream_cx_total"
	get := func() (int, string, error) {
		code, body, _, err := getBody(client.HTTPClient(false), "http://"+vipEchoSet.String()+"/", nil)
		return code, body, err
	}
	if code, body, err := get(); err != nil || code != 200 || xfccURI(body) != model.SPIFFEID(w.a.td, "shop", "client") {
		t.Fatalf("through the waypoint with the true IDs: %d %q %v, want 200 with the caller's ID", code, body, err)
	}

	a, _, _ := w.meshes(2, true, false)
	wrong := model.SPIFFEID(w.a.td, "web", "web")
	am := repin(a, 2, echo, wrong)
	cluster := ClusterName(am, echo, 80)
	w.a.set(am)
	beforeA, beforeB1, beforeB2 := w.a.stats(), w.b1.stats(), w.b2.stats()
	for i := 0; i < 4; i++ {
		code, body, err := get()
		if err == nil && (code == 200 || strings.HasPrefix(body, "xfcc=")) {
			t.Errorf("through the waypoint with the pin on %s: %d %q, want refused", wrong, code, body)
		}
	}
	testenv.Eventually(t, time.Minute, "fail_verify_san through the waypoint", func() error {
		afterA := w.a.stats()
		if got := sanFailures(t, afterA, cluster) - sanFailures(t, beforeA, cluster); got < 1 {
			return fmt.Errorf("a's %s ssl.fail_verify_san moved by %d, want at least 1", cluster, got)
		}
		return nil
	})
	// The refused handshakes went through b's tunnel listeners: the pin is checked end to end
	// against the pod's certificate, not by the waypoint.
	afterB1, afterB2 := w.b1.stats(), w.b2.stats()
	if afterB1[cx]+afterB2[cx] <= beforeB1[cx]+beforeB2[cx] {
		t.Errorf("b's waypoint %s did not move (b1 %d->%d, b2 %d->%d): the refused connections should have crossed it",
			cx, beforeB1[cx], afterB1[cx], beforeB2[cx], afterB2[cx])
	}

	w.set(3, true, false)
	if code, body, err := get(); err != nil || code != 200 {
		t.Fatalf("through the waypoint with the true IDs again: %d %q %v", code, body, err)
	}
}
