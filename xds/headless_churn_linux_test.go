package xds

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	dto "github.com/prometheus/client_model/go"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

var (
	vipChurnHTTP  = netip.MustParseAddr("10.96.0.30")
	vipChurnTCP   = netip.MustParseAddr("10.96.0.40")
	vipChurnExtra = netip.MustParseAddr("10.96.0.50")
)

// churnMesh is the model of TestPrivilegedHeadlessChurnKeepsConnections: the client alpha and
// the servers srv1, srv2, srv3 (HTTP on 8080+i under the name "web", TCP on 7000+i under
// "raft") and srv4 (on srv1's ports); web (VIP, HTTP 80) and db (VIP, TCP 5432) are served by srv1; the headless peers
// (HTTP 80 to "web", TCP 7000 to "raft") has the given members as endpoints; with extra, the
// unrelated VIP service extra (TCP 6379) served by srv3 exists too.
func churnMesh(f *meshFixture, version uint64, members []string, extra bool) *model.Mesh {
	k := func(name string) model.ServiceKey { return model.ServiceKey{Namespace: "web", Name: name} }
	web, db, peers, ext := k("web"), k("db"), k("peers"), k("extra")
	httpPort := model.ServicePort{Name: "http", Port: 80, TargetPort: 8080, TargetPortName: "web", Protocol: model.ProtocolHTTP}
	raftPort := model.ServicePort{Name: "raft", Port: 7000, TargetPort: 7000, TargetPortName: "raft", Protocol: model.ProtocolTCP}
	dbPort := model.ServicePort{Name: "db", Port: 5432, TargetPort: 7000, TargetPortName: "raft", Protocol: model.ProtocolTCP}
	extraPort := model.ServicePort{Name: "redis", Port: 6379, TargetPort: 7002, TargetPortName: "raft", Protocol: model.ProtocolTCP}
	services := []*model.Service{
		{Key: web, Local: true, VIPs: []netip.Addr{vipChurnHTTP}, Ports: []model.ServicePort{httpPort}},
		{Key: db, Local: true, VIPs: []netip.Addr{vipChurnTCP}, Ports: []model.ServicePort{dbPort}},
		{Key: peers, Local: true, Headless: true, Ports: []model.ServicePort{httpPort, raftPort}},
	}
	// srv4 serves on srv1's ports: its joining adds no target port.
	idx := map[string]uint32{"srv1": 0, "srv2": 1, "srv3": 2, "srv4": 0}
	ep := func(svc model.ServiceKey, pod string, ports ...string) model.Endpoint {
		e := model.Endpoint{Service: svc, Cluster: "c1", PodName: pod, PodUID: "uid-" + pod, IPs: []netip.Addr{f.ips[pod]}, NodeName: "node-1",
			SPIFFEID: model.SPIFFEID(f.td, "web", "server"), Healthy: true}
		for _, p := range ports {
			if p == "web" {
				e.Ports = append(e.Ports, model.EndpointPort{Name: "http", Port: 8080 + idx[pod], Protocol: model.ProtocolHTTP})
			} else {
				e.Ports = append(e.Ports, model.EndpointPort{Name: p, Port: 7000 + idx[pod], Protocol: model.ProtocolTCP})
			}
		}
		return e
	}
	eps := map[model.ServiceKey][]model.Endpoint{
		web: {ep(web, "srv1", "web")},
		db:  {ep(db, "srv1", "db")},
	}
	for _, m := range members {
		eps[peers] = append(eps[peers], ep(peers, m, "web", "raft"))
	}
	if extra {
		services = append(services, &model.Service{Key: ext, Local: true, VIPs: []netip.Addr{vipChurnExtra}, Ports: []model.ServicePort{extraPort}})
		eps[ext] = []model.Endpoint{ep(ext, "srv3", "redis")}
	}
	pod := func(name, ns, sa string, ports ...model.PodPort) *model.LocalPod {
		return &model.LocalPod{UID: "uid-" + name, Namespace: ns, Name: name, ServiceAccount: sa,
			NetnsPath: f.pods[name].Path, IPs: []netip.Addr{f.ips[name]}, Ready: true, Ports: ports}
	}
	pods := []*model.LocalPod{pod("alpha", "shop", "alpha")}
	for name, i := range idx {
		pods = append(pods, pod(name, "web", "server", model.PodPort{Name: "web", Port: 8080 + i, Protocol: model.ProtocolHTTP},
			model.PodPort{Name: "raft", Port: 7000 + i, Protocol: model.ProtocolTCP}))
	}
	return model.New(version, "c1", "mesh", f.td, model.Node{Name: "node-1", IP: netip.MustParseAddr("10.44.0.1")}, services, eps, pods)
}

// heldConn is a long-lived client connection through capture: TCP to a "who" server (first
// line, then echo) or HTTP/1.1 keep-alive requests on one connection.
type heldConn struct {
	name string
	c    net.Conn
	r    *bufio.Reader
	http bool
	n    int
}

func holdConn(t *testing.T, ns *testenv.Netns, name, addr string, http bool, wantFirst string) *heldConn {
	t.Helper()
	c, err := ns.Dial(addr)
	if err != nil {
		t.Fatalf("%s: dial %s: %v", name, addr, err)
	}
	t.Cleanup(func() { c.Close() })
	h := &heldConn{name: name, c: c, r: bufio.NewReader(c), http: http}
	if !http {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		line, err := h.r.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != wantFirst {
			t.Fatalf("%s: first line %q %v, want %q", name, line, err, wantFirst)
		}
	}
	return h
}

// exchange sends on the held connection and reads the answer: an echoed line, or an HTTP
// response whose body starts with wantPrefix and that does not ask to close the connection (what
// an HTTP connection manager on a draining chain does).
func (h *heldConn) exchange(wantPrefix string) error {
	h.n++
	_ = h.c.SetDeadline(time.Now().Add(10 * time.Second))
	if !h.http {
		msg := fmt.Sprintf("%s ping %d\n", h.name, h.n)
		if _, err := io.WriteString(h.c, msg); err != nil {
			return fmt.Errorf("%s: write: %w", h.name, err)
		}
		got, err := h.r.ReadString('\n')
		if err != nil || got != msg {
			return fmt.Errorf("%s: echo %q %v, want %q", h.name, got, err, msg)
		}
		return nil
	}
	if _, err := io.WriteString(h.c, "GET / HTTP/1.1\r\nHost: held.test\r\n\r\n"); err != nil {
		return fmt.Errorf("%s: write: %w", h.name, err)
	}
	resp, err := http.ReadResponse(h.r, nil)
	if err != nil {
		return fmt.Errorf("%s: read response: %w", h.name, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || !strings.HasPrefix(string(b), wantPrefix) {
		return fmt.Errorf("%s: %d %q %v, want 200 %q...", h.name, resp.StatusCode, b, err, wantPrefix)
	}
	if resp.Close {
		return fmt.Errorf("%s: response asks to close the connection (draining)", h.name)
	}
	return nil
}

// envoyStats reads the named counters and gauges from Envoy's admin API (0 when absent).
func envoyStats(f *meshFixture, names ...string) (map[string]int, error) {
	out := map[string]int{}
	for _, n := range names {
		s, err := f.admin("/stats?filter=^" + strings.ReplaceAll(n, ".", `\.`) + "$")
		if err != nil {
			return nil, err
		}
		if _, v, ok := strings.Cut(strings.TrimSpace(s), ": "); ok {
			if out[n], err = strconv.Atoi(v); err != nil {
				return nil, fmt.Errorf("stat %s: %q: %w", n, s, err)
			}
		}
	}
	return out, nil
}

// churnStats are the Envoy stats TestPrivilegedHeadlessChurnKeepsConnections reports per change.
var churnStats = []string{
	"listener_manager.listener_in_place_updated",
	"listener_manager.listener_modified",
	"listener_manager.listener_added",
	"listener_manager.listener_removed",
	"listener_manager.total_listeners_draining",
	"listener_manager.total_filter_chains_draining",
	"listener.127.0.0.1_15001.downstream_cx_destroy",
	"listener.127.0.0.1_15001.downstream_cx_active",
}

// TestPrivilegedHeadlessChurnKeepsConnections (real Envoy, delta xDS, the supervisor's drain time
// of 5 s with the immediate drain strategy, so a drain shows within the test): long-lived
// connections from a client through capture to a headless pod (TCP and HTTP keep-alive) and to
// VIP services (TCP and HTTP) keep working, without a drain, through every kind of change:
//
//   - a member joins on target ports the headless Service already had (srv4): only the ECDS
//     resource HeadlessFilterName and the headless route table CaptureHeadlessRouteName change,
//     no capture listener and not the VIP route table CaptureRouteName are sent;
//   - a member joins with a new target port (srv3): its floor chain joins the capture listeners'
//     chains and matcher, which Envoy 1.40 applies in place (filter_chains and
//     filter_chain_matcher are among the fields ListenerMessageUtil::filterChainOnlyChange
//     ignores) and every unchanged chain keeps its connections;
//   - another member leaves (srv2), and an unrelated VIP service is added: in place likewise.
//
// Every membership change sends the headless route table and not the VIP one (its version stays,
// so delta xDS does not send it), a TCP VIP service neither. New connections reach the new
// members over mTLS (HTTP over the capture chain captureHeadlessChain) and the new service, and
// the removed member is passed through. A connection to the removed member's own target port (its floor chain left
// the listeners) is drained and closed, which shows the test sees drains.
func TestPrivilegedHeadlessChurnKeepsConnections(t *testing.T) {
	f := newMeshFixture(t, time.Hour, true, Options{}, "--drain-strategy", "immediate")
	alpha, _ := f.addPod("alpha", true)
	for i, name := range []string{"srv1", "srv2", "srv3", "srv4"} {
		ns, _ := f.addPod(name, false)
		ns.ServeHTTP(t, fmt.Sprintf("0.0.0.0:%d", 8080+i%3), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "pod=%s", name)
		}))
		serveWho(ns.Listen(t, fmt.Sprintf("0.0.0.0:%d", 7000+i%3)), name)
	}
	f.set(churnMesh(f, 2, []string{"srv1", "srv2"}, false))
	t.Run("no NACK", f.wantNoRejections)

	srv := func(name string, port int) string { return fmt.Sprintf("%s:%d", f.ips[name], port) }
	held := []*heldConn{
		holdConn(t, alpha, "headless TCP srv1:7000", srv("srv1", 7000), false, "srv1 127.0.0.1"),
		holdConn(t, alpha, "headless HTTP srv1:8080", srv("srv1", 8080), true, ""),
		holdConn(t, alpha, "VIP TCP db", vipChurnTCP.String()+":5432", false, "srv1 127.0.0.1"),
		holdConn(t, alpha, "VIP HTTP web", vipChurnHTTP.String()+":80", true, ""),
	}
	gone := holdConn(t, alpha, "headless TCP srv2:7001", srv("srv2", 7001), false, "srv2 127.0.0.1")
	check := func(t *testing.T) {
		t.Helper()
		for _, h := range held {
			if err := h.exchange("pod=srv1"); err != nil {
				t.Error(err)
			}
		}
	}
	check(t)
	if err := gone.exchange(""); err != nil {
		t.Fatal(err)
	}
	sentOf := func(url string) float64 {
		var mf dto.Metric
		if err := f.srv.sent.WithLabelValues(url).Write(&mf); err != nil {
			t.Fatal(err)
		}
		return mf.GetCounter().GetValue()
	}
	listenersSent := func() float64 { return sentOf(resource.ListenerType) }

	captures := 5 // alpha, srv1, srv2, srv3, srv4
	// change serves m and checks the held connections; captureUpdates says whether the change
	// updates every capture listener (in place) or none, headlessRoutes whether it changes the
	// headless route table (then the one route table sent) or no route table.
	change := func(t *testing.T, what string, m *model.Mesh, captureUpdates, headlessRoutes bool) {
		t.Helper()
		before, err := envoyStats(f, churnStats...)
		if err != nil {
			t.Fatal(err)
		}
		sent, routesSent := listenersSent(), sentOf(resource.RouteType)
		vipRoute, headlessRoute := servedVersion(f.srv, resource.RouteType, CaptureRouteName), servedVersion(f.srv, resource.RouteType, CaptureHeadlessRouteName)
		f.set(m)
		if headlessRoutes {
			// WaitForAck covers listeners and clusters; the route table may follow them.
			testenv.Eventually(t, time.Minute, "headless route table sent", func() error {
				if n := sentOf(resource.RouteType) - routesSent; n == 0 {
					return fmt.Errorf("no route table sent yet")
				}
				return nil
			})
		}
		if v := servedVersion(f.srv, resource.RouteType, CaptureRouteName); v != vipRoute || v == "" {
			t.Errorf("%s: %s version %q -> %q, want the same (not sent again)", what, CaptureRouteName, vipRoute, v)
		}
		if v := servedVersion(f.srv, resource.RouteType, CaptureHeadlessRouteName); (v != headlessRoute) != headlessRoutes || v == "" {
			t.Errorf("%s: %s version %q -> %q, want changed %v", what, CaptureHeadlessRouteName, headlessRoute, v, headlessRoutes)
		}
		// A drained chain's connections close after the drain time (5 s): wait until no chain
		// drains any more before checking the held connections.
		testenv.Eventually(t, time.Minute, "no filter chain draining", func() error {
			s, err := envoyStats(f, "listener_manager.total_filter_chains_draining")
			if err == nil && s["listener_manager.total_filter_chains_draining"] != 0 {
				err = fmt.Errorf("%d filter chains draining", s["listener_manager.total_filter_chains_draining"])
			}
			return err
		})
		after, err := envoyStats(f, churnStats...)
		if err != nil {
			t.Fatal(err)
		}
		var d []string
		for _, n := range churnStats {
			d = append(d, fmt.Sprintf("%s %+d (now %d)", strings.TrimPrefix(n, "listener_manager."), after[n]-before[n], after[n]))
		}
		sent, routesSent = listenersSent()-sent, sentOf(resource.RouteType)-routesSent
		t.Logf("%s: listeners sent %v, route tables sent %v, %s", what, sent, routesSent, strings.Join(d, ", "))
		if want := map[bool]float64{false: 0, true: 1}[headlessRoutes]; routesSent != want {
			t.Errorf("%s: %v route tables sent, want %v (the headless one only when it changed)", what, routesSent, want)
		}
		inPlace := after["listener_manager.listener_in_place_updated"] - before["listener_manager.listener_in_place_updated"]
		modified := after["listener_manager.listener_modified"] - before["listener_manager.listener_modified"]
		if modified != inPlace {
			t.Errorf("%s: %d listeners modified, %d of them in place; want every modification in place", what, modified, inPlace)
		}
		switch {
		case captureUpdates && (inPlace < captures || sent < float64(captures)):
			t.Errorf("%s: %v listeners sent, %d updated in place; want at least the %d capture listeners", what, sent, inPlace, captures)
		case !captureUpdates && sent > 1:
			// At most the joining member's inbound listener (its chains name its services).
			t.Errorf("%s: %v listeners sent, want no capture listener", what, sent)
		}
		if n := after["listener_manager.total_listeners_draining"]; n != 0 {
			t.Errorf("%s: %d listeners draining, want 0", what, n)
		}
		if n := after["listener_manager.listener_removed"] - before["listener_manager.listener_removed"]; n != 0 {
			t.Errorf("%s: %d listeners removed, want 0", what, n)
		}
		check(t)
	}

	t.Run("headless member added on existing ports", func(t *testing.T) {
		change(t, "srv4 joins peers", churnMesh(f, 3, []string{"srv1", "srv2", "srv4"}, false), false, true)
		if got, err := askWho(alpha, srv("srv4", 7000)); err != nil || got != "srv4 127.0.0.1" {
			t.Errorf("new connection to srv4:7000: %q %v, want through its inbound listener", got, err)
		}
		code, body, _, err := getBody(alpha.HTTPClient(false), "http://"+srv("srv4", 8080)+"/", nil)
		if err != nil || code != 200 || body != "pod=srv4" {
			t.Errorf("GET srv4:8080: %d %q %v", code, body, err)
		}
	})

	t.Run("headless member added with a new target port", func(t *testing.T) {
		change(t, "srv3 joins peers", churnMesh(f, 4, []string{"srv1", "srv2", "srv3", "srv4"}, false), true, true)
		if got, err := askWho(alpha, srv("srv3", 7002)); err != nil || got != "srv3 127.0.0.1" {
			t.Errorf("new connection to srv3:7002: %q %v, want through its inbound listener", got, err)
		}
		code, body, _, err := getBody(alpha.HTTPClient(false), "http://"+srv("srv3", 8082)+"/", nil)
		if err != nil || code != 200 || body != "pod=srv3" {
			t.Errorf("GET srv3:8082: %d %q %v", code, body, err)
		}
		if err := gone.exchange(""); err != nil {
			t.Errorf("srv2 still a member: %v", err)
		}
	})

	t.Run("another headless member removed", func(t *testing.T) {
		change(t, "srv2 leaves peers", churnMesh(f, 5, []string{"srv1", "srv3", "srv4"}, false), true, true)
		if got, err := askWho(alpha, srv("srv2", 7001)); err != nil || got != "srv2 "+f.ips["alpha"].String() {
			t.Errorf("new connection to srv2:7001: %q %v, want passed through (from alpha's address)", got, err)
		}
		// Its floor chain (peers' port 7000 on target port 7001) left every capture listener:
		// drained, so the connection on it is closed.
		_ = gone.c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := gone.r.ReadString('\n'); err == nil {
			t.Errorf("connection to the removed member's own target port: still open, want drained")
		}
	})

	t.Run("headless member on existing ports removed", func(t *testing.T) {
		change(t, "srv4 leaves peers", churnMesh(f, 6, []string{"srv1", "srv3"}, false), false, true)
		if got, err := askWho(alpha, srv("srv4", 7000)); err != nil || got != "srv4 "+f.ips["alpha"].String() {
			t.Errorf("new connection to srv4:7000: %q %v, want passed through (from alpha's address)", got, err)
		}
	})

	t.Run("unrelated VIP service added", func(t *testing.T) {
		change(t, "extra VIP service added", churnMesh(f, 7, []string{"srv1", "srv3"}, true), true, false)
		if got, err := askWho(alpha, vipChurnExtra.String()+":6379"); err != nil || got != "srv3 127.0.0.1" {
			t.Errorf("new connection to extra's VIP: %q %v", got, err)
		}
	})

	t.Run("no NACK at the end", f.wantNoRejections)
}
