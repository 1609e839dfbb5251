package xds

import (
	"bytes"
	"encoding/pem"
	"fmt"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"net/netip"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	sfslistenerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/set_filter_state/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/model"
)

// goldenVariant is goldenMesh with one change applied to fresh copies of its parts (as the model
// assembler makes every model from scratch).
func goldenVariant(change func(svcs []*model.Service, eps map[model.ServiceKey][]model.Endpoint, pods []*model.LocalPod) ([]*model.Service, []*model.LocalPod), node model.Node) *model.Mesh {
	g := goldenMesh()
	svcs, eps, pods := g.Services, g.Endpoints, g.Pods
	if change != nil {
		svcs, pods = change(svcs, eps, pods)
	}
	if node.Name == "" {
		node = g.Node
	}
	return model.New(g.Version+1, g.Cluster, g.MeshDomain, g.TrustDomain, node, svcs, eps, pods)
}

var (
	webKey   = model.ServiceKey{Namespace: "shop", Name: "web"}
	dbKey    = model.ServiceKey{Namespace: "shop", Name: "db"}
	apiKey   = model.ServiceKey{Namespace: "edge", Name: "api"}
	peersKey = model.ServiceKey{Namespace: "shop", Name: "peers"}
)

// builderSteps is a sequence of models, each one change away from the one before.
func builderSteps() []struct {
	name string
	mesh *model.Mesh
} {
	type svcs = []*model.Service
	type eps = map[model.ServiceKey][]model.Endpoint
	type pods = []*model.LocalPod
	return []struct {
		name string
		mesh *model.Mesh
	}{
		{"first", goldenVariant(nil, model.Node{})},
		{"same model again", goldenVariant(nil, model.Node{})},
		{"one endpoint turns healthy", goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			e[webKey][1].Healthy = true
			return s, p
		}, model.Node{})},
		{"local endpoint gains a port", goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			e[webKey][1].Healthy = true
			e[dbKey][0].Ports = append(e[dbKey][0].Ports, model.EndpointPort{Port: 3307, Protocol: model.ProtocolTCP})
			return s, p
		}, model.Node{})},
		{"headless endpoint moves to another IP and port", goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			e[peersKey][1].IPs = []netip.Addr{netip.MustParseAddr("10.244.2.10")}
			e[peersKey][1].Ports[0].Port = 8082
			return s, p
		}, model.Node{})},
		{"a headless endpoint's readiness flips after it moved", goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			e[peersKey][1].IPs = []netip.Addr{netip.MustParseAddr("10.244.2.10")}
			e[peersKey][1].Ports[0].Port = 8082
			e[peersKey][0].Healthy = !e[peersKey][0].Healthy
			return s, p
		}, model.Node{})},
		{"the headless Service's HTTP port loses its endpoints", goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			noPeersHTTP(e)
			return s, p
		}, model.Node{})},
		{"a headless Service with more endpoints than the ECDS map holds", goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			manyPeers(e)
			return s, p
		}, model.Node{})},
		{"and one of them moves", goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			manyPeers(e)
			e[peersKey][3].IPs = []netip.Addr{netip.MustParseAddr("10.250.9.9")}
			return s, p
		}, model.Node{})},
		{"named target port on one number in every pod", goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			e[peersKey][1].Ports[0].Port = 8080
			return s, p
		}, model.Node{})},
		{"web's HTTP targetPort named", goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			nameWebTarget(s, e)
			return s, p
		}, model.Node{})},
		{"a web pod resolves the name to another port", goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			nameWebTarget(s, e)
			e[webKey][1].Ports[0].Port = 8081
			return s, p
		}, model.Node{})},
		{"imported api's port matched by name", goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			importAPIByName(s, e)
			return s, p
		}, model.Node{})},
		{"a remote api pod resolves the name to another port", goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			importAPIByName(s, e)
			e[apiKey][1].Ports[0].Port = 8001
			return s, p
		}, model.Node{})},
		{"service gains a VIP", goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			for _, x := range s {
				if x.Key == dbKey {
					x.VIPs = append(x.VIPs, netip.MustParseAddr("10.96.0.12"))
				}
			}
			return s, p
		}, model.Node{})},
		{"service removed", goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			delete(e, apiKey)
			return slices.DeleteFunc(s, func(x *model.Service) bool { return x.Key == apiKey }), p
		}, model.Node{})},
		{"pod added", goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			delete(e, apiKey)
			return slices.DeleteFunc(s, func(x *model.Service) bool { return x.Key == apiKey }),
				append(p, &model.LocalPod{UID: "uid-new", Namespace: "shop", Name: "new", ServiceAccount: "new", NetnsPath: "/var/run/netns/cni-new",
					IPs: []netip.Addr{netip.MustParseAddr("10.244.1.30")}, Ready: true, Ports: []model.PodPort{{Port: 8080}}})
		}, model.Node{})},
		{"pod removed", goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			return s, p[1:]
		}, model.Node{})},
		{"node moved to another zone", goldenVariant(nil, model.Node{Name: "n1", Region: "r1", Zone: "z2"})},
		{"back to the first model", goldenVariant(nil, model.Node{})},
	}
}

// noPeersHTTP leaves peers' endpoints serving only its TCP port: no headless HTTP route, so no
// headless capture chain and route table.
func noPeersHTTP(e map[model.ServiceKey][]model.Endpoint) {
	for i := range e[peersKey] {
		e[peersKey][i].Ports = slices.DeleteFunc(e[peersKey][i].Ports, func(p model.EndpointPort) bool { return p.Protocol == model.ProtocolHTTP })
	}
}

// nameWebTarget makes web's HTTP port's targetPort the name "web", which its endpoints registered
// under the port's name "http" (8080 in both pods).
func nameWebTarget(s []*model.Service, e map[model.ServiceKey][]model.Endpoint) {
	for _, x := range s {
		for i := range x.Ports {
			if x.Key == webKey && x.Ports[i].Name == "http" {
				x.Ports[i].TargetPortName = "web"
			}
		}
	}
	for i := range e[webKey] {
		e[webKey][i].Ports[0].Name = "http"
	}
}

// importAPIByName makes api's port an imported one (model.ServicePort.FromImport: endpoints serve
// it on the number registered under the port's name "http", 8000 in every pod).
func importAPIByName(s []*model.Service, e map[model.ServiceKey][]model.Endpoint) {
	for _, x := range s {
		if x.Key == apiKey {
			x.Ports[0].FromImport = true
		}
	}
	for i := range e[apiKey] {
		e[apiKey][i].Ports[0].Name = "http"
	}
}

// TestBuilderMatchesBuild: a Builder fed a sequence of models returns, at every step, exactly what
// a fresh Build returns for that model, for every option set.
func TestBuilderMatchesBuild(t *testing.T) {
	for _, opts := range []struct {
		name string
		o    Options
	}{
		{"default", Options{}},
		{"upstream-netns", Options{UpstreamNetns: "/var/run/netns/node"}},
		{"east-west-waypoint", Options{EastWestWaypoint: true}},
		{"transport-socket-matcher", Options{CertSelection: CertMatcher}},
	} {
		t.Run(opts.name, func(t *testing.T) {
			bl := NewBuilder(opts.o)
			for _, step := range builderSteps() {
				m := step.mesh
				got, err := bl.Build(m, fakeSVIDs(m), fakeBundles(m))
				if err != nil {
					t.Fatalf("%s: %v", step.name, err)
				}
				if err := got.ValidateAll(); err != nil {
					t.Fatalf("%s: ValidateAll: %v", step.name, err)
				}
				want, err := Build(m, fakeSVIDs(m), fakeBundles(m), opts.o)
				if err != nil {
					t.Fatal(err)
				}
				for _, kind := range differingKinds(t, got, want) {
					t.Errorf("%s: %s differ from a fresh Build", step.name, kind)
				}
			}
		})
	}
}

// TestBuilderReusesUnchanged: after a change to one service's endpoints, the other services'
// clusters and EDS resources and every pod listener are the values of the previous build, and
// ValidateAll skips them; the changed service's EDS resource is new.
func TestBuilderReusesUnchanged(t *testing.T) {
	steps := builderSteps()
	bl := NewBuilder(Options{})
	m0 := steps[0].mesh
	r0, err := bl.Build(m0, fakeSVIDs(m0), fakeBundles(m0))
	if err != nil {
		t.Fatal(err)
	}
	if err := r0.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	m1 := steps[2].mesh // web.shop's second endpoint turns healthy
	r1, err := bl.Build(m1, fakeSVIDs(m1), fakeBundles(m1))
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range r1.Clusters {
		if same := c == r0.Clusters[i]; !same {
			t.Errorf("cluster %s rebuilt, want the previous value (its peers did not change)", c.GetName())
		}
		if !r1.isKnown(c) {
			t.Errorf("cluster %s not known valid", c.GetName())
		}
	}
	for i, e := range r1.Endpoints {
		changed := strings.HasPrefix(e.GetClusterName(), "web.shop.mesh:")
		if same := e == r0.Endpoints[i]; same == changed {
			t.Errorf("EDS %s: reused=%v, want reused only when unchanged", e.GetClusterName(), same)
		}
	}
	for i, l := range r1.Listeners {
		if l != r0.Listeners[i] {
			t.Errorf("listener %s rebuilt, want the previous value", l.GetName())
		}
	}
	if r1.Routes[0] != r0.Routes[0] || r1.Routes[1] != r0.Routes[1] {
		t.Error("route tables rebuilt, want the previous values (no routing changed)")
	}
}

// TestBuilderHeadlessReadiness: a headless Service's endpoint that turns not ready (or ready)
// changes that service's EDS resources only: every listener and route table is the previous value
// (its entries follow the endpoints' addresses, not their health), so delta xDS sends no
// listener. An endpoint that moves to another address changes the ECDS filter HeadlessFilterName
// and the headless route table, and no capture listener and no other route table.
func TestBuilderHeadlessReadiness(t *testing.T) {
	bl := NewBuilder(Options{})
	build := func(m *model.Mesh) *Resources {
		t.Helper()
		r, err := bl.Build(m, fakeSVIDs(m), fakeBundles(m))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.ValidateAll(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	type svcs = []*model.Service
	type eps = map[model.ServiceKey][]model.Endpoint
	type pods = []*model.LocalPod
	r0 := build(goldenVariant(nil, model.Node{}))
	r1 := build(goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
		e[peersKey][0].Healthy = !e[peersKey][0].Healthy
		return s, p
	}, model.Node{}))
	for i, l := range r1.Listeners {
		if l != r0.Listeners[i] {
			t.Errorf("readiness flip: listener %s rebuilt, want the previous value", l.GetName())
		}
	}
	for i, rt := range r1.Routes {
		if rt != r0.Routes[i] {
			t.Errorf("readiness flip: route table %s rebuilt, want the previous value", rt.GetName())
		}
	}
	for i, e := range r1.Endpoints {
		changed := strings.HasPrefix(e.GetClusterName(), "peers.shop.mesh:")
		if same := e == r0.Endpoints[i]; same == changed {
			t.Errorf("readiness flip: EDS %s reused=%v, want reused only when unchanged", e.GetClusterName(), same)
		}
	}
	r2 := build(goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
		e[peersKey][0].Healthy = !e[peersKey][0].Healthy
		e[peersKey][1].IPs = []netip.Addr{netip.MustParseAddr("10.244.2.10")}
		return s, p
	}, model.Node{}))
	for i, l := range r2.Listeners {
		if strings.HasPrefix(l.GetName(), "capture|") && !proto.Equal(l, r1.Listeners[i]) {
			t.Errorf("headless endpoint moved: capture listener %s changed, want the same (the map is in the ECDS filter)", l.GetName())
		}
	}
	for i, x := range r2.Extensions {
		if changed := x.GetName() == HeadlessFilterName; changed == proto.Equal(x, r1.Extensions[i]) {
			t.Errorf("headless endpoint moved: extension config %s changed=%v, want only %s changed", x.GetName(), !proto.Equal(x, r1.Extensions[i]), HeadlessFilterName)
		}
	}
	for i, rt := range r2.Routes {
		if changed := rt.GetName() == CaptureHeadlessRouteName; changed == (rt == r1.Routes[i]) {
			t.Errorf("headless endpoint moved: route table %s reused=%v, want only the headless route rebuilt", rt.GetName(), rt == r1.Routes[i])
		}
	}
}

// TestBuilderHeadlessRoutesApart: the headless Services' HTTP routes have a route table of their
// own (CaptureHeadlessRouteName, on the capture chain captureHeadlessChain), so a headless
// endpoint change leaves the VIP route table CaptureRouteName the previous value, known valid
// and with the same delta version (not sent again), also when it changes the capture listeners
// (a new target port); a VIP change leaves the headless route table and filter likewise; and the
// headless table and chain are there only while a headless HTTP port has an endpoint.
func TestBuilderHeadlessRoutesApart(t *testing.T) {
	type svcs = []*model.Service
	type eps = map[model.ServiceKey][]model.Endpoint
	type pods = []*model.LocalPod
	variant := func(change func(s svcs, e eps)) *model.Mesh {
		return goldenVariant(func(s svcs, e eps, p pods) (svcs, pods) {
			change(s, e)
			return s, p
		}, model.Node{})
	}
	gainVIP := func(k model.ServiceKey, vip string) func(s svcs, e eps) {
		return func(s svcs, e eps) {
			for _, x := range s {
				if x.Key == k {
					x.VIPs = append(x.VIPs, netip.MustParseAddr(vip))
				}
			}
		}
	}
	cases := []struct {
		name string
		mesh *model.Mesh
		// captureSame and headlessSame: the route table is the previous value; headlessGone:
		// there is none (nor its chain); capturesSame: the capture listeners are the previous values.
		captureSame, headlessSame, headlessGone, capturesSame bool
	}{
		// peers' endpoint 0 is peer-2's, a pod on another node (endpoint 1 is the local pod
		// web-1's, whose own listeners follow its endpoints).
		{name: "headless endpoint moves", mesh: variant(func(s svcs, e eps) {
			e[peersKey][0].IPs = []netip.Addr{netip.MustParseAddr("10.244.2.10")}
		}), captureSame: true, capturesSame: true},
		{name: "headless endpoint moves to a new target port", mesh: variant(func(s svcs, e eps) {
			e[peersKey][0].IPs = []netip.Addr{netip.MustParseAddr("10.244.2.10")}
			e[peersKey][0].Ports[0].Port = 8082
		}), captureSame: true},
		{name: "headless HTTP port loses its endpoints", mesh: variant(func(s svcs, e eps) { noPeersHTTP(e) }),
			captureSame: true, headlessGone: true},
		{name: "HTTP service gains a VIP", mesh: variant(gainVIP(webKey, "10.96.0.11")), headlessSame: true},
		{name: "TCP service gains a VIP", mesh: variant(gainVIP(dbKey, "10.96.0.12")), captureSame: true, headlessSame: true},
	}
	named := func(r *Resources, name string) *routev3.RouteConfiguration {
		for _, rt := range r.Routes {
			if rt.GetName() == name {
				return rt
			}
		}
		return nil
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bl, memo := NewBuilder(Options{}), &hashMemo{}
			r0, s0 := buildSnapshot(t, bl, goldenMesh(), memo)
			if err := r0.ValidateAll(); err != nil {
				t.Fatal(err)
			}
			r1, s1 := buildSnapshot(t, bl, c.mesh, memo) // a route table without its chain, or the reverse, fails
			check := func(name string, same, gone bool) {
				t.Helper()
				before, after := named(r0, name), named(r1, name)
				v0, v1 := s0.GetVersionMap(resource.RouteType)[name], s1.GetVersionMap(resource.RouteType)[name]
				switch {
				case gone:
					if after != nil {
						t.Errorf("%s still served, want none", name)
					}
				case after == nil:
					t.Errorf("%s not served", name)
				case same && (after != before || !r1.isKnown(after) || v1 != v0):
					t.Errorf("%s: same value %v, known valid %v, version %s -> %s; want the previous value, known valid, same version", name, after == before, r1.isKnown(after), v0, v1)
				case !same && (after == before || v1 == v0):
					t.Errorf("%s: same value %v, version %s -> %s; want a new table", name, after == before, v0, v1)
				}
			}
			check(CaptureRouteName, c.captureSame, false)
			check(CaptureHeadlessRouteName, c.headlessSame, c.headlessGone)
			if same := r1.Extensions[0] == r0.Extensions[0]; same != c.headlessSame {
				t.Errorf("headless filter: previous value %v, want %v", same, c.headlessSame)
			}
			for i, l := range r1.Listeners {
				if !strings.HasPrefix(l.GetName(), "capture|") {
					continue
				}
				if same := l == r0.Listeners[i]; same != c.capturesSame {
					t.Errorf("%s: previous value %v, want %v", l.GetName(), same, c.capturesSame)
				}
				hasChain := slices.ContainsFunc(l.GetFilterChains(), func(fc *listenerv3.FilterChain) bool { return fc.GetName() == captureHeadlessChain })
				if hasChain == c.headlessGone {
					t.Errorf("%s: chain %s present %v, want %v", l.GetName(), captureHeadlessChain, hasChain, !c.headlessGone)
				}
			}
			if err := r1.ValidateAll(); err != nil {
				t.Fatal(err)
			}
			want, err := Build(c.mesh, fakeSVIDs(c.mesh), fakeBundles(c.mesh), Options{})
			if err != nil {
				t.Fatal(err)
			}
			for _, kind := range differingKinds(t, r1, want) {
				t.Errorf("%s differ from a fresh Build", kind)
			}
		})
	}
}

// manyPeers gives peers maxHeadlessMap/2+1 more endpoints in this cluster (each serving both of
// its ports): more entries than headlessFilter's map holds.
func manyPeers(e map[model.ServiceKey][]model.Endpoint) {
	for i := 0; i <= maxHeadlessMap/2; i++ {
		ep := e[peersKey][1]
		ep.PodName, ep.PodUID = fmt.Sprintf("many-%d", i), fmt.Sprintf("uid-many-%d", i)
		ep.IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 250, byte(i >> 8), byte(i)})}
		e[peersKey] = append(e[peersKey], ep)
	}
}

// TestHeadlessMapLimit: with more headless entries than maxHeadlessMap, the ECDS filter sets
// nothing (no CEL value) and the endpoints' addresses are entries of the capture matcher (as before the filter);
// with fewer, the reverse.
func TestHeadlessMapLimit(t *testing.T) {
	for _, many := range []bool{false, true} {
		m := goldenVariant(func(s []*model.Service, e map[model.ServiceKey][]model.Endpoint, p []*model.LocalPod) ([]*model.Service, []*model.LocalPod) {
			if many {
				manyPeers(e)
			}
			return s, p
		}, model.Node{})
		r, err := Build(m, fakeSVIDs(m), fakeBundles(m), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.ValidateAll(); err != nil {
			t.Fatal(err)
		}
		var capture *listenerv3.Listener
		for _, l := range r.Listeners {
			if strings.HasPrefix(l.GetName(), "capture|") {
				capture = l
			}
		}
		raft := capture.GetFilterChainMatcher().GetMatcherTree().GetExactMatchMap().GetMap()["7000"].GetMatcher()
		inMatcher := raft.GetMatcherTree().GetExactMatchMap().GetMap()["10.244.2.9"] != nil
		cfg, err := r.Extensions[0].GetTypedConfig().UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		var expr string
		if values := cfg.(*sfslistenerv3.Config).GetOnAccept(); len(values) > 0 {
			expr = values[0].GetFormatString().GetTextFormatSource().GetInlineString()
		}
		inMap := strings.Contains(expr, "'10.244.2.9:7000'")
		if inMatcher != many || inMap == many || many && expr != "" {
			t.Errorf("many=%v: 10.244.2.9:7000 in the matcher %v, in the ECDS map %v (%.80s...)", many, inMatcher, inMap, expr)
		}
		// A headless HTTP endpoint's entry, in the matcher or the map, names the headless chain.
		httpEntry := capture.GetFilterChainMatcher().GetMatcherTree().GetExactMatchMap().GetMap()["8081"].GetMatcher().
			GetMatcherTree().GetExactMatchMap().GetMap()["10.244.2.9"].GetAction().GetName()
		if many && httpEntry != captureHeadlessChain || !many && !strings.Contains(expr, "'10.244.2.9:8081': '"+captureHeadlessChain+"'") {
			t.Errorf("many=%v: 10.244.2.9:8081 takes chain %q in the matcher (%.200s...), want %s", many, httpEntry, expr, captureHeadlessChain)
		}
	}
}

// TestBuilderRevalidatesRejected: a resource that failed ValidateAll is validated again in the
// next build that reuses it, so a bad model fails every time, and a good one passes after it.
func TestBuilderRevalidatesRejected(t *testing.T) {
	bad := goldenVariant(func(s []*model.Service, e map[model.ServiceKey][]model.Endpoint, p []*model.LocalPod) ([]*model.Service, []*model.LocalPod) {
		p[0].Ports = []model.PodPort{{Port: 70000, Protocol: model.ProtocolTCP}} // not a port: its inbound cluster is invalid
		return s, p
	}, model.Node{})
	bl := NewBuilder(Options{})
	for i := 0; i < 2; i++ {
		r, err := bl.Build(bad, fakeSVIDs(bad), fakeBundles(bad))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.ValidateAll(); err == nil || !strings.Contains(err.Error(), "70000") {
			t.Fatalf("build %d of the bad model: ValidateAll = %v, want an error naming port 70000", i+1, err)
		}
	}
	good := goldenMesh()
	r, err := bl.Build(good, fakeSVIDs(good), fakeBundles(good))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.ValidateAll(); err != nil {
		t.Fatalf("good model after the bad one: %v", err)
	}
}

// TestConsistentAgreesWithLibrary: the snapshot's own consistency check accepts and rejects the
// same snapshots as go-control-plane's Snapshot.Consistent.
func TestConsistentAgreesWithLibrary(t *testing.T) {
	m := goldenMesh()
	r, err := Build(m, fakeSVIDs(m), fakeBundles(m), Options{})
	if err != nil {
		t.Fatal(err)
	}
	without := func(t resource.Type, name string) map[resource.Type][]types.Resource {
		out := r.typed()
		out[t] = slices.DeleteFunc(slices.Clone(out[t]), func(x types.Resource) bool { return cache.GetResourceName(x) == name })
		return out
	}
	cases := []struct {
		name string
		res  map[resource.Type][]types.Resource
		ok   bool
	}{
		{"built", r.typed(), true},
		{"empty model", mustTyped(t, model.New(1, "c1", "", "", model.Node{}, nil, nil, nil)), true},
		// A node whose pods are captured before any mesh service exists: no capture HTTP chain
		// names the capture route, so it must not be served (else the snapshot is refused and the
		// pods' CNI ADD waits for an ACK that never comes).
		{"pods without services", mustTyped(t, model.New(1, m.Cluster, m.MeshDomain, m.TrustDomain, m.Node, nil, nil, m.Pods)), true},
		{"EDS resource missing", without(resource.EndpointType, "web.shop.mesh:80"), false},
		{"EDS cluster missing", without(resource.ClusterType, "web.shop.mesh:80"), false},
		{"route missing", without(resource.RouteType, CaptureRouteName), false},
		{"listeners missing", map[resource.Type][]types.Resource{
			resource.ClusterType: r.typed()[resource.ClusterType], resource.EndpointType: r.typed()[resource.EndpointType],
			resource.RouteType: r.typed()[resource.RouteType], resource.ListenerType: {}, resource.SecretType: {}}, false},
		{"EDS service_name", map[resource.Type][]types.Resource{
			resource.ClusterType: {&clusterv3.Cluster{Name: "a", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
				EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{ServiceName: "web.shop.mesh:80"}}},
			resource.EndpointType: {claNamed(r, "web.shop.mesh:80")}, resource.ListenerType: {}, resource.RouteType: {}, resource.SecretType: {}}, true},
	}
	for _, c := range cases {
		lib, err := cache.NewSnapshot("1", c.res)
		if err != nil {
			t.Fatal(err)
		}
		libErr := lib.Consistent()
		_, ownErr := newSnapshot("1", c.res, nil)
		if (libErr == nil) != c.ok || (ownErr == nil) != c.ok {
			t.Errorf("%s: library Consistent = %v, own check = %v, want ok=%v", c.name, libErr, ownErr, c.ok)
		}
	}
}

func claNamed(r *Resources, name string) types.Resource {
	for _, e := range r.Endpoints {
		if e.GetClusterName() == name {
			return e
		}
	}
	return nil
}

func mustTyped(t *testing.T, m *model.Mesh) map[resource.Type][]types.Resource {
	t.Helper()
	r, err := Build(m, fakeSVIDs(m), fakeBundles(m), Options{})
	if err != nil {
		t.Fatal(err)
	}
	return r.typed()
}

// TestVersionMapStable: delta versions depend on content only (two Builders, two fresh models:
// the same versions; equal to go-control-plane's hash for resources without a shared matcher,
// with the cluster's appended for EDS),
// and a change moves the versions of exactly the resources it changed.
func TestVersionMapStable(t *testing.T) {
	steps := builderSteps()
	versions := func(bl *Builder, m *model.Mesh, memo *hashMemo) map[string]map[string]string {
		t.Helper()
		_, s := buildSnapshot(t, bl, m, memo)
		for _, typ := range snapshotTypes {
			for name, x := range s.GetResources(typ) {
				b, _ := cache.MarshalResource(x)
				lib := cache.HashResource(b)
				// An EDS resource's version carries its cluster's (snapshot.ConstructVersionMap).
				if c, ok := s.GetResources(resource.ClusterType)[name]; ok && typ == resource.EndpointType {
					cb, _ := cache.MarshalResource(c)
					lib += "/" + cache.HashResource(cb)
				}
				if got := s.GetVersionMap(typ)[name]; (got == lib) == (typ == resource.ListenerType && strings.HasPrefix(name, "capture|")) {
					t.Errorf("%s %s: version %s, library hash %s: want equal unless it is a capture listener", typ, name, got, lib)
				}
			}
		}
		out := map[string]map[string]string{}
		for _, typ := range snapshotTypes {
			out[typ] = s.GetVersionMap(typ)
		}
		return out
	}
	bl, memo := NewBuilder(Options{}), &hashMemo{}
	v0 := versions(bl, steps[0].mesh, memo)
	if other := versions(NewBuilder(Options{}), steps[1].mesh, nil); !mapsEqual(v0, other) {
		t.Error("two builders of equal models give different versions")
	}
	changed := func(a, b map[string]map[string]string) []string {
		var out []string
		for typ, vm := range b {
			for name, v := range vm {
				if a[typ][name] != v {
					out = append(out, name)
				}
			}
		}
		slices.Sort(out)
		return out
	}
	v1 := versions(bl, steps[2].mesh, memo) // an endpoint of web.shop:80 turns healthy
	if got := changed(v0, v1); !slices.Equal(got, []string{"web.shop.mesh:80"}) {
		t.Errorf("one endpoint changed: versions moved for %v, want only web.shop.mesh:80", got)
	}
	v2 := versions(bl, steps[4].mesh, memo) // db.shop gains a VIP: every capture listener's matcher changes
	var captures []string
	for name := range v2[resource.ListenerType] {
		if strings.HasPrefix(name, "capture|") {
			captures = append(captures, name)
		}
	}
	for _, name := range captures {
		if v2[resource.ListenerType][name] == v1[resource.ListenerType][name] {
			t.Errorf("%s kept its version although its filter-chain matcher changed", name)
		}
	}

	// The shared parts stay in the memo while listeners hold them, even when every listener was
	// reused (its hash taken from the memo): a new pod's capture listener then encodes neither.
	versions(bl, steps[4].mesh, memo)
	r, _ := bl.Build(steps[4].mesh, fakeSVIDs(steps[4].mesh), fakeBundles(steps[4].mesh))
	var capture *listenerv3.Listener
	for _, l := range r.Listeners {
		if strings.HasPrefix(l.GetName(), "capture|") {
			capture = l
		}
	}
	for _, p := range sharedParts(capture) {
		if _, ok := memo.m[p.key]; !ok {
			t.Errorf("shared part %T of %s not kept in the memo", p.msg, capture.GetName())
		}
	}
	// A change in the shared filter chains moves the listener's version.
	before, _ := resourceVersion(capture, memo.m)
	chains := slices.Clone(capture.FilterChains)
	chains[len(chains)-1] = &listenerv3.FilterChain{Name: "other"}
	changedL := &listenerv3.Listener{Name: capture.Name, Address: capture.Address, ListenerFilters: capture.ListenerFilters,
		FilterChainMatcher: capture.FilterChainMatcher, FilterChains: chains, DefaultFilterChain: capture.DefaultFilterChain}
	shared := map[any]string{}
	for _, p := range sharedParts(changedL) {
		shared[p.key], _ = hashMessage(p.msg, "")
	}
	if after, _ := resourceVersion(changedL, shared); after == before {
		t.Error("a capture listener kept its version although a filter chain changed")
	}
}

func mapsEqual(a, b map[string]map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, x := range a {
		y := b[k]
		if len(x) != len(y) {
			return false
		}
		for n, v := range x {
			if y[n] != v {
				return false
			}
		}
	}
	return true
}

// TestBuilderAfterFailedBuild: a build that fails (a new pod without a netns path) leaves the
// Builder consistent: the next build of the earlier model still equals a fresh Build.
func TestBuilderAfterFailedBuild(t *testing.T) {
	first := goldenMesh()
	// web-1 (which backs web.shop) leaves and a pod without a netns path arrives: the build
	// fails after the Builder looked up the local pods' endpoints for the new set of pods.
	withPod := goldenVariant(func(s []*model.Service, e map[model.ServiceKey][]model.Endpoint, p []*model.LocalPod) ([]*model.Service, []*model.LocalPod) {
		p = slices.DeleteFunc(p, func(x *model.LocalPod) bool { return x.Name == "web-1" })
		return s, append(p, &model.LocalPod{UID: "uid-new", Namespace: "shop", Name: "new", ServiceAccount: "new",
			IPs: []netip.Addr{netip.MustParseAddr("10.244.1.30")}, Ready: true})
	}, model.Node{})
	bl := NewBuilder(Options{})
	if _, err := bl.Build(first, fakeSVIDs(first), fakeBundles(first)); err != nil {
		t.Fatal(err)
	}
	if _, err := bl.Build(withPod, fakeSVIDs(withPod), fakeBundles(first)); err == nil || !strings.Contains(err.Error(), "empty netns path") {
		t.Fatalf("build with a pod lacking its netns path = %v, want an error saying so", err)
	}
	got, err := bl.Build(first, fakeSVIDs(first), fakeBundles(first))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := Build(first, fakeSVIDs(first), fakeBundles(first), Options{})
	for _, kind := range differingKinds(t, got, want) {
		t.Errorf("%s differ from a fresh Build after a failed build", kind)
	}
}

// TestBuildLeavesOutPodWithoutSVID: a local pod whose SVID the identity provider does not have
// yet (SPIRE before its entry reached the node) is left out, named in Resources.Unserved, while
// every other pod is served; once its SVID is there it is served like the rest, by the same
// Builder, as a fresh Build serves it.
func TestBuildLeavesOutPodWithoutSVID(t *testing.T) {
	m := goldenVariant(func(s []*model.Service, e map[model.ServiceKey][]model.Endpoint, p []*model.LocalPod) ([]*model.Service, []*model.LocalPod) {
		return s, append(p, &model.LocalPod{UID: "uid-new", Namespace: "shop", Name: "new", ServiceAccount: "new", NetnsPath: "/var/run/netns/cni-new",
			IPs: []netip.Addr{netip.MustParseAddr("10.244.1.30")}, Ready: true})
	}, model.Node{})
	newPod := m.Pod("uid-new")
	newID := newPod.SPIFFEID(m.TrustDomain)
	svids := fakeSVIDs(m)
	delete(svids, newID)
	bl := NewBuilder(Options{})
	r, err := bl.Build(m, svids, fakeBundles(m))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Unserved) != 1 || r.Unserved[0].UID != "uid-new" || !strings.Contains(r.Unserved[0].Reason, newID) {
		t.Fatalf("Unserved = %+v, want uid-new, naming %s", r.Unserved, newID)
	}
	names := map[string]bool{}
	for _, l := range r.Listeners {
		names[l.GetName()] = true
	}
	full, err := Build(m, fakeSVIDs(m), fakeBundles(m), Options{})
	if err != nil {
		t.Fatal(err)
	}
	newNames := PodListenerNames(newPod)
	if !slices.ContainsFunc(full.Listeners, func(l *listenerv3.Listener) bool { return l.GetName() == newNames[0] }) {
		t.Fatalf("a Build with every SVID has no listener %s", newNames[0])
	}
	for _, l := range full.Listeners {
		switch n := l.GetName(); {
		case slices.Contains(newNames, n) && names[n]:
			t.Errorf("listener %s of the pod without an SVID is served", n)
		case !slices.Contains(newNames, n) && !names[n]:
			t.Errorf("listener %s (not the pod's without an SVID) is missing", n)
		}
	}
	for _, sec := range r.Secrets {
		if strings.Contains(sec.GetName(), newID) {
			t.Errorf("secret %s served for the pod without an SVID", sec.GetName())
		}
	}
	// With no SVID at all (SPIRE before any entry reached the node) every pod is left out, and
	// the snapshot is still consistent: no route, extension or mirror without its listener.
	none, err := bl.Build(m, map[string]*identity.SVID{}, fakeBundles(m))
	if err != nil {
		t.Fatal(err)
	}
	if len(none.Unserved) != len(m.Pods) || len(none.Routes) != 0 {
		t.Fatalf("without SVIDs: %d unserved of %d pods, %d routes; want every pod, no route", len(none.Unserved), len(m.Pods), len(none.Routes))
	}
	if _, err := newSnapshot("v1", none.typed(), &hashMemo{}); err != nil {
		t.Fatalf("snapshot without any pod's SVID: %v", err)
	}
	got, err := bl.Build(m, fakeSVIDs(m), fakeBundles(m))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Unserved) != 0 {
		t.Fatalf("Unserved = %+v once every SVID is there", got.Unserved)
	}
	want, _ := Build(m, fakeSVIDs(m), fakeBundles(m), Options{})
	for _, kind := range differingKinds(t, got, want) {
		t.Errorf("%s differ from a fresh Build once the SVID came", kind)
	}
}

// TestServedPods: the one decision of which local pods a build serves. A pod is left out, named
// once in model order with its reason, when the identity provider lacks an SVID of its own (even
// though its SPIFFE ID has one, from another pod) or when its SPIFFE ID has no SVID; a pod with
// both is named once, as lacking its own. With every pod served the model is returned as is.
func TestServedPods(t *testing.T) {
	m := goldenMesh() // pods in model order: uid-client, uid-db-0, uid-web-1
	id := func(uid string) string { return m.Pod(uid).SPIFFEID(m.TrustDomain) }
	without := func(uids ...string) map[string]*identity.SVID {
		svids := fakeSVIDs(m)
		for _, uid := range uids {
			delete(svids, id(uid))
		}
		return svids
	}
	lacking := func(uids ...string) func(string) bool {
		return func(uid string) bool { return slices.Contains(uids, uid) }
	}
	own := func(uid string) string { return uid + ": no SVID of its own for " + id(uid) }
	none := func(uid string) string { return uid + ": no SVID for " + id(uid) }
	for _, c := range []struct {
		name     string
		svids    map[string]*identity.SVID
		lacks    func(string) bool
		served   []string
		unserved []string
	}{
		{"every pod has its SVID", fakeSVIDs(m), nil, []string{"uid-client", "uid-db-0", "uid-web-1"}, nil},
		{"no lacks, nothing lacking", fakeSVIDs(m), lacking(), []string{"uid-client", "uid-db-0", "uid-web-1"}, nil},
		{"an ID without an SVID", without("uid-web-1"), nil, []string{"uid-client", "uid-db-0"}, []string{none("uid-web-1")}},
		{"a pod without its own, its ID served", fakeSVIDs(m), lacking("uid-db-0"), []string{"uid-client", "uid-web-1"}, []string{own("uid-db-0")}},
		{"both at once, named once", without("uid-db-0"), lacking("uid-db-0"), []string{"uid-client", "uid-web-1"}, []string{own("uid-db-0")}},
		{"one of each, in model order", without("uid-web-1"), lacking("uid-client"), []string{"uid-db-0"}, []string{own("uid-client"), none("uid-web-1")}},
		{"no SVID at all", map[string]*identity.SVID{}, nil, nil, []string{none("uid-client"), none("uid-db-0"), none("uid-web-1")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := slices.Clone(m.Pods)
			got, unserved := servedPods(m, c.svids, c.lacks)
			var served, left []string
			for _, p := range got.Pods {
				served = append(served, p.UID)
			}
			for _, u := range unserved {
				if p := m.Pod(u.UID); p == nil || p.Namespace != u.Namespace || p.Name != u.Name {
					t.Errorf("unserved %+v does not name a pod of the model", u)
				}
				left = append(left, u.UID+": "+u.Reason)
			}
			if !slices.Equal(served, c.served) {
				t.Errorf("served %q, want %q", served, c.served)
			}
			if len(left) != len(c.unserved) {
				t.Fatalf("unserved %q, want %q", left, c.unserved)
			}
			for i := range left {
				if !strings.HasPrefix(left[i], c.unserved[i]) {
					t.Errorf("unserved[%d] = %q, want it to start with %q", i, left[i], c.unserved[i])
				}
			}
			if (len(unserved) == 0) != (got == m) {
				t.Errorf("model returned as is: %v, want it exactly when every pod is served", got == m)
			}
			if !slices.Equal(m.Pods, before) {
				t.Error("the input model's pods changed")
			}
			if got.Version != m.Version || len(got.Services) != len(m.Services) {
				t.Error("the served model differs from the input beyond its pods")
			}
		})
	}
}

// TestBuildTrustBundles: the trust bundle secret is Envoy's SPIFFE certificate validator with
// one trust domain per bundle of the admitted trust domains (the mesh's own and
// Options.PeerTrustDomains), sorted; a bundle of a trust domain not admitted is left out; each
// admitted trust domain has a secret of its own bundle alone (a placeholder CA certificate that
// signs nothing while it has none), which outbound clusters pinned to it use; a missing bundle of the mesh's
// trust domain and a bundle that is not PEM are refused, naming it, and so is a bad
// PeerTrustDomains name.
func TestBuildTrustBundles(t *testing.T) {
	m := goldenMesh()
	beta := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("BETA")})
	partner := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("PARTNER")})
	opts := Options{PeerTrustDomains: []string{"beta.example", "gamma.example"}}
	r, err := Build(m, fakeSVIDs(m), map[string][]byte{m.TrustDomain: testBundlePEM, "beta.example": beta, "partner.example": partner}, opts)
	if err != nil {
		t.Fatal(err)
	}
	domains := func(name string) []string { return validatorDomains(t, r.Secrets, name) }
	own := m.TrustDomain + "=" + string(testBundlePEM)
	for name, want := range map[string][]string{
		TrustBundleSecret:                       {"beta.example=" + string(beta), own},
		TrustDomainBundleSecret(m.TrustDomain):  {own},
		TrustDomainBundleSecret("beta.example"): {"beta.example=" + string(beta)},
		// No bundle of gamma yet: a placeholder that signs nothing.
		TrustDomainBundleSecret("gamma.example"): {"gamma.example=" + string(placeholderBundle)},
	} {
		slices.Sort(want)
		if got := domains(name); !slices.Equal(got, want) {
			t.Errorf("secret %s: trust domains %q, want %q", name, got, want)
		}
	}
	for _, s := range r.Secrets {
		if strings.Contains(s.GetName(), "partner") {
			t.Errorf("secret %s of a trust domain not admitted", s.GetName())
		}
	}
	// Outbound clusters pinned to the mesh's IDs validate against its bundle alone.
	for _, c := range r.Clusters {
		if ts := c.GetTransportSocket(); ts != nil {
			var u tlsv3.UpstreamTlsContext
			if err := ts.GetTypedConfig().UnmarshalTo(&u); err != nil {
				t.Fatal(err)
			}
			if got := u.GetCommonTlsContext().GetCombinedValidationContext().GetValidationContextSdsSecretConfig().GetName(); got != TrustDomainBundleSecret(m.TrustDomain) {
				t.Errorf("cluster %s validates against %q, want %q", c.GetName(), got, TrustDomainBundleSecret(m.TrustDomain))
			}
		}
	}
	for _, c := range []struct {
		name    string
		bundles map[string][]byte
		opts    Options
		want    string
	}{
		{"mesh's missing", map[string][]byte{"beta.example": beta}, opts, `trust domain "` + m.TrustDomain + `"`},
		{"mesh's empty", map[string][]byte{m.TrustDomain: nil}, opts, `trust domain "` + m.TrustDomain + `"`},
		{"not PEM", map[string][]byte{m.TrustDomain: testBundlePEM, "beta.example": []byte("junk")}, opts, `"beta.example": no PEM`},
		{"bad peer name", map[string][]byte{m.TrustDomain: testBundlePEM}, Options{PeerTrustDomains: []string{"Beta Example"}}, `PeerTrustDomains "Beta Example"`},
	} {
		if _, err := Build(m, fakeSVIDs(m), c.bundles, c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one containing %s", c.name, err, c.want)
		}
	}
	// A partner's bad bundle is not used, and not checked.
	if _, err := Build(m, fakeSVIDs(m), map[string][]byte{m.TrustDomain: testBundlePEM, "partner.example": []byte("junk")}, opts); err != nil {
		t.Errorf("a bad bundle of a trust domain not admitted: %v", err)
	}
}

// differingKinds returns the resource kinds ("listeners", "clusters", ...) whose resources
// differ between a and b (compared as stable JSON).
func differingKinds(t *testing.T, a, b *Resources) []string {
	t.Helper()
	var out []string
	for _, kind := range []struct {
		name string
		a, b []proto.Message
	}{
		{"listeners", asMessages(a.Listeners), asMessages(b.Listeners)},
		{"clusters", asMessages(a.Clusters), asMessages(b.Clusters)},
		{"endpoints", asMessages(a.Endpoints), asMessages(b.Endpoints)},
		{"routes", asMessages(a.Routes), asMessages(b.Routes)},
		{"secrets", asMessages(a.Secrets), asMessages(b.Secrets)},
		{"extensions", asMessages(a.Extensions), asMessages(b.Extensions)},
	} {
		if !bytes.Equal(stableJSON(t, kind.a), stableJSON(t, kind.b)) {
			out = append(out, kind.name)
		}
	}
	return out
}

// TestHeadlessExprLimit: the ECDS filter's expression stays under the CEL parser's length limit:
// fewer than maxHeadlessMap entries whose chain names are long (63-character Service and
// namespace names) go to the matcher instead, and the length bound holds for what headlessExpr
// writes, quotes escaped.
func TestHeadlessExprLimit(t *testing.T) {
	long := strings.Repeat("s", 63) + "." + strings.Repeat("n", 63) + ".mesh"
	chain := "tcp|direct|" + long + ":9042|9042"
	var e svcEntry
	for i := 0; i < 600; i++ {
		dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), 9042)
		e.direct = append(e.direct, directEntry{dst: dst, chain: chain})
	}
	rt := &routing{}
	rt.assembleDirect([]*svcEntry{&e})
	if !rt.directInMatcher {
		t.Errorf("600 entries of %d-byte chain names (about %d bytes of expression): not in the matcher", len(chain), headlessExprLen(map[netip.AddrPort]string{e.direct[0].dst: chain})*600)
	}
	cfg, err := rt.headlessFilter.GetTypedConfig().UnmarshalNew()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(cfg.(*sfslistenerv3.Config).GetOnAccept()); n != 0 {
		t.Errorf("filter over the length limit has %d values, want none", n)
	}
	rt = &routing{}
	rt.assembleDirect([]*svcEntry{{direct: e.direct[:100]}})
	if rt.directInMatcher {
		t.Error("100 entries: in the matcher, want the filter's map")
	}
	direct := addrPorts(map[string]string{"10.0.0.1:80": `a'b\c`, "10.0.0.2:80": chain})
	expr := headlessExpr(direct)
	if !strings.Contains(expr, `'10.0.0.1:80': 'a\'b\\c'`) {
		t.Errorf("quote and backslash not escaped: %s", expr)
	}
	if body := expr[strings.Index(expr, "{"):]; len(body) > headlessExprLen(direct) {
		t.Errorf("map literal %d bytes, over headlessExprLen's bound %d", len(body), headlessExprLen(direct))
	}
}

// addrPorts is m ("<ip>:<port>" -> chain) keyed by the parsed addresses, as headlessExpr takes it.
func addrPorts(m map[string]string) map[netip.AddrPort]string {
	out := make(map[netip.AddrPort]string, len(m))
	for dst, chain := range m {
		out[netip.MustParseAddrPort(dst)] = chain
	}
	return out
}

// buildSnapshot builds m with bl (fake SVIDs) and makes the snapshot the server would serve
// (version "1", delta versions from memo); it fails t when either fails, a snapshot that is not
// Consistent() included.
func buildSnapshot(t *testing.T, bl *Builder, m *model.Mesh, memo *hashMemo) (*Resources, *snapshot) {
	t.Helper()
	r, err := bl.Build(m, fakeSVIDs(m), fakeBundles(m))
	if err != nil {
		t.Fatal(err)
	}
	s, err := newSnapshot("1", r.typed(), memo)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ConstructVersionMap(); err != nil {
		t.Fatal(err)
	}
	return r, s
}

// TestBuildPinSetBundles: a cluster whose endpoints' IDs span two trust domains (the mesh's and
// beta's) validates against a secret holding those two bundles alone, not every admitted one
// (gamma's CA could otherwise sign a certificate naming a gamma ID first, which picks gamma's
// bundle, and a pinned ID second); an endpoint ID of a trust domain not admitted puts a
// placeholder under its name in its set.
func TestBuildPinSetBundles(t *testing.T) {
	m := goldenMesh()
	beta := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("BETA")})
	gamma := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("GAMMA")})
	var k model.ServiceKey
	for _, s := range m.Services {
		if eps := m.Endpoints[s.Key]; len(eps) > 0 && hasClusters(s) && !s.Headless && len(s.Ports) == 1 {
			k = s.Key
			break
		}
	}
	if k.Name == "" {
		t.Fatal("goldenMesh has no service with endpoints and one port")
	}
	eps := slices.Clone(m.Endpoints[k])
	betaEP := eps[0]
	betaEP.PodName, betaEP.PodUID, betaEP.Cluster = "beta-0", "uid-beta-0", "beta"
	betaEP.IPs = []netip.Addr{netip.MustParseAddr("10.245.9.9")}
	betaEP.SPIFFEID = "spiffe://beta.example/ns/" + k.Namespace + "/sa/b"
	m.Endpoints[k] = append(eps, betaEP)
	r, err := Build(m, fakeSVIDs(m), map[string][]byte{m.TrustDomain: testBundlePEM, "beta.example": beta, "gamma.example": gamma},
		Options{PeerTrustDomains: []string{"beta.example", "gamma.example"}})
	if err != nil {
		t.Fatal(err)
	}
	set := []string{"beta.example", m.TrustDomain}
	slices.Sort(set)
	want := TrustDomainBundleSecret(set...)
	cluster := ClusterName(m, k, m.Service(k).Ports[0].Port)
	found := false
	for _, c := range r.Clusters {
		if c.GetName() != cluster {
			continue
		}
		found = true
		var u tlsv3.UpstreamTlsContext
		if err := c.GetTransportSocket().GetTypedConfig().UnmarshalTo(&u); err != nil {
			t.Fatal(err)
		}
		if got := u.GetCommonTlsContext().GetCombinedValidationContext().GetValidationContextSdsSecretConfig().GetName(); got != want {
			t.Errorf("cluster %s validates against %q, want %q", cluster, got, want)
		}
	}
	if !found {
		t.Fatalf("no cluster %s", cluster)
	}
	got := validatorDomains(t, r.Secrets, want)
	wantTDs := []string{"beta.example=" + string(beta), m.TrustDomain + "=" + string(testBundlePEM)}
	slices.Sort(wantTDs)
	if !slices.Equal(got, wantTDs) {
		t.Errorf("secret %s: trust domains %q, want %q (gamma's left out)", want, got, wantTDs)
	}

	// An endpoint of a trust domain not admitted: its set's secret has a placeholder for it.
	sets := map[string][]string{}
	pinSets(sets, []string{"spiffe://partner.example/ns/x/sa/y", "spiffe://beta.example/ns/x/sa/y"})
	pinSets(sets, []string{"spiffe://partner.example/ns/x/sa/z"})
	pinSets(sets, []string{"spiffe://beta.example/ns/x/sa/z"}) // admitted: made once
	ts, err := trustSecrets([]string{"beta.example", m.TrustDomain}, map[string][]byte{m.TrustDomain: testBundlePEM, "beta.example": beta,
		"partner.example": gamma}, sortedSets(sets))
	if err != nil {
		t.Fatal(err)
	}
	name := TrustDomainBundleSecret("beta.example", "partner.example")
	if got, want := validatorDomains(t, ts, name), []string{"beta.example=" + string(beta), "partner.example=" + string(placeholderBundle)}; !slices.Equal(got, want) {
		t.Errorf("secret %s: trust domains %q, want %q (partner.example not admitted: the placeholder)", name, got, want)
	}
	// A cluster pinned to the partner alone refers to a validation context that exists and
	// admits nothing, rather than one Envoy would wait for.
	if got, want := validatorDomains(t, ts, TrustDomainBundleSecret("partner.example")), []string{"partner.example=" + string(placeholderBundle)}; !slices.Equal(got, want) {
		t.Errorf("secret %s: trust domains %q, want %q", TrustDomainBundleSecret("partner.example"), got, want)
	}
	names := map[string]int{}
	for _, s := range ts {
		names[s.GetName()]++
	}
	for n, c := range names {
		if c > 1 {
			t.Errorf("secret %s made %d times", n, c)
		}
	}
}

// validatorDomains returns the trust domains of the SDS validation context name among secrets,
// each "<td>=<bundle PEM>", sorted; it fails t unless the secret is there and holds Envoy's SPIFFE
// validator alone.
func validatorDomains(t *testing.T, secrets []*tlsv3.Secret, name string) []string {
	t.Helper()
	for _, s := range secrets {
		if s.GetName() != name {
			continue
		}
		vc := s.GetValidationContext()
		if vc.GetCustomValidatorConfig().GetName() != SPIFFEValidatorName || vc.GetTrustedCa() != nil {
			t.Fatalf("secret %s = %v, want the SPIFFE validator alone", name, vc)
		}
		var cfg tlsv3.SPIFFECertValidatorConfig
		if err := vc.GetCustomValidatorConfig().GetTypedConfig().UnmarshalTo(&cfg); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, td := range cfg.GetTrustDomains() {
			got = append(got, td.GetName()+"="+string(td.GetTrustBundle().GetInlineBytes()))
		}
		slices.Sort(got)
		return got
	}
	t.Fatalf("no secret %s among %d", name, len(secrets))
	return nil
}
