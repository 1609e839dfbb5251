package xds

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/aethermesh/aether/model"
)

// randEp is one endpoint of randSvc: pod index (IP and UID), and whether it serves the HTTP port.
type randEp struct {
	pod           int
	http, healthy bool
	remote        bool
	moved         int
	altPort       bool
}

type randSvc struct {
	present, headless, vip, httpIsTCP, many bool
	named, clusterset                       bool
	eps                                     []randEp
}

type randState struct {
	svcs [4]randSvc
	pods [4]bool
	zone string
	// l4 picks the L4 routes (randL4Routes): 0 none.
	l4 int
}

// randL4Routes are the L4 routes of state l4 over randState's services: 1 a TCPRoute on every
// TCP port of s0 (and its clusterset frontend) splitting over s1 and s2; 2 TLSRoutes sharing
// s0:7000 by SNI (a name, and every other name); 3 a TCPRoute on s1:7000 and a wildcard TLSRoute
// on s0:7000 to s3.
func randL4Routes(l4 int) []model.Route {
	key := func(i int) model.ServiceKey { return model.ServiceKey{Namespace: "ns", Name: fmt.Sprintf("s%d", i)} }
	parent := func(i int, port uint32) model.ParentRef {
		return model.ParentRef{Kind: model.ParentService, Service: key(i), Port: port}
	}
	to := func(i int, weight int32) model.BackendRef {
		return model.BackendRef{Kind: model.BackendService, Service: key(i), Port: 7000, Weight: weight}
	}
	route := func(kind model.RouteKind, name string, parents []model.ParentRef, hosts []string, bs ...model.BackendRef) model.Route {
		return model.Route{RouteRef: model.RouteRef{Kind: kind, Namespace: "ns", Name: name}, Parents: parents, Hostnames: hosts,
			Rules: []model.RouteRule{{Backends: bs}}}
	}
	switch l4 {
	case 1:
		return []model.Route{route(model.KindTCPRoute, "tcp", []model.ParentRef{parent(0, 0), {Kind: model.ParentServiceImport, Service: key(0)}}, nil, to(1, 2), to(2, 1))}
	case 2:
		return []model.Route{
			route(model.KindTLSRoute, "tls", []model.ParentRef{parent(0, 7000)}, []string{"a.example"}, to(1, 1)),
			route(model.KindTLSRoute, "tls-any", []model.ParentRef{parent(0, 7000)}, nil, to(2, 1)),
		}
	case 3:
		return []model.Route{
			route(model.KindTCPRoute, "tcp", []model.ParentRef{parent(1, 7000)}, nil, to(0, 1)),
			route(model.KindTLSRoute, "tls", []model.ParentRef{parent(0, 7000)}, []string{"*.w.example"}, to(3, 1)),
		}
	}
	return nil
}

func (st *randState) mesh() *model.Mesh {
	td := model.DefaultTrustDomain
	var services []*model.Service
	eps := map[model.ServiceKey][]model.Endpoint{}
	for i, s := range st.svcs {
		if !s.present {
			continue
		}
		k := model.ServiceKey{Namespace: "ns", Name: fmt.Sprintf("s%d", i)}
		proto := model.ProtocolHTTP
		if s.httpIsTCP {
			proto = model.ProtocolTCP
		}
		svc := &model.Service{Key: k, Local: true, Headless: s.headless, Ports: []model.ServicePort{
			{Name: "http", Port: 80, TargetPort: 8080, Protocol: proto},
			{Name: "raft", Port: 7000, TargetPort: 7000, Protocol: model.ProtocolTCP},
		}}
		if s.vip && !s.headless {
			svc.VIPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(10 + i)})}
		}
		if s.clusterset {
			svc.Imported = true
			svc.ClustersetVIPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 97, 0, byte(10 + i)})}
		}
		if s.named {
			svc.Ports[0].TargetPortName = "web"
		}
		services = append(services, svc)
		seen := map[int]bool{}
		var list []model.Endpoint
		add := func(ep model.Endpoint) {
			list = append(list, ep)
		}
		for _, e := range s.eps {
			if seen[e.pod] {
				continue
			}
			seen[e.pod] = true
			cluster := "c1"
			if e.remote {
				cluster = "c2"
			}
			ports := []model.EndpointPort{{Port: 7000, Protocol: model.ProtocolTCP}}
			if e.http {
				tp := uint32(8080)
				if e.altPort {
					tp = 8081
				}
				ports = append(ports, model.EndpointPort{Name: "web", Port: tp, Protocol: proto})
			}
			add(model.Endpoint{Service: k, Cluster: cluster, Region: "r1", Zone: "z1", PodName: fmt.Sprintf("p%d", e.pod), PodUID: fmt.Sprintf("uid-p%d", e.pod),
				IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, byte(1 + e.moved), byte(10 + e.pod)})}, Ports: ports,
				SPIFFEID: model.SPIFFEID(td, "ns", fmt.Sprintf("sa%d", e.pod)), Healthy: e.healthy})
		}
		if s.many {
			for j := 0; j <= maxHeadlessMap/2+1; j++ {
				add(model.Endpoint{Service: k, Cluster: "c1", Region: "r1", Zone: "z1", PodName: fmt.Sprintf("many-%d", j), PodUID: fmt.Sprintf("uid-many-%d-%d", i, j),
					IPs:   []netip.Addr{netip.AddrFrom4([4]byte{10, byte(200 + i), byte(j >> 8), byte(j)})},
					Ports: []model.EndpointPort{{Name: "http", Port: 8080, Protocol: proto}, {Port: 7000, Protocol: model.ProtocolTCP}}, SPIFFEID: model.SPIFFEID(td, "ns", "many"), Healthy: true})
			}
		}
		eps[k] = list
	}
	var pods []*model.LocalPod
	for p, on := range st.pods {
		if on {
			pods = append(pods, &model.LocalPod{UID: fmt.Sprintf("uid-p%d", p), Namespace: "ns", Name: fmt.Sprintf("p%d", p), ServiceAccount: fmt.Sprintf("sa%d", p),
				NetnsPath: fmt.Sprintf("/var/run/netns/cni-p%d", p), IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + p)})}, Ready: true,
				Ports: []model.PodPort{{Port: 8080, Protocol: model.ProtocolHTTP}}})
		}
	}
	zone := st.zone
	if zone == "" {
		zone = "z1"
	}
	m := model.New(1, "c1", "mesh", td, model.Node{Name: "n1", Region: "r1", Zone: zone}, services, eps, pods)
	m.L4Routing, _ = model.ResolveL4Routes(servicesOf(m), randL4Routes(st.l4))
	return m
}

func (st *randState) mutate(r *rand.Rand, keepPod bool) string {
	i := r.IntN(len(st.svcs))
	s := &st.svcs[i]
	// The changes that flip one flag of the service, or of one of its endpoints, by draw.
	svcFlags := map[int]struct {
		name string
		f    *bool
	}{0: {"present", &s.present}, 1: {"headless", &s.headless}, 2: {"vip", &s.vip}, 3: {"httpIsTCP", &s.httpIsTCP},
		14: {"named", &s.named}, 15: {"clusterset", &s.clusterset}}
	epFlags := map[int]struct {
		name string
		f    func(*randEp) *bool
	}{8: {"http", func(e *randEp) *bool { return &e.http }}, 9: {"healthy", func(e *randEp) *bool { return &e.healthy }},
		16: {"altPort", func(e *randEp) *bool { return &e.altPort }}}
	c := r.IntN(20)
	if fl, ok := svcFlags[c]; ok {
		*fl.f = !*fl.f
		return fmt.Sprintf("s%d %s=%v", i, fl.name, *fl.f)
	}
	if fl, ok := epFlags[c]; ok {
		if len(s.eps) == 0 {
			return "nothing"
		}
		j := r.IntN(len(s.eps))
		f := fl.f(&s.eps[j])
		*f = !*f
		return fmt.Sprintf("s%d endpoint %d %s=%v", i, j, fl.name, *f)
	}
	switch c {
	case 4:
		if r.IntN(6) == 0 {
			s.many = !s.many
			return fmt.Sprintf("s%d many=%v", i, s.many)
		}
	case 5, 6:
		s.eps = append(s.eps, randEp{pod: r.IntN(5), http: r.IntN(3) > 0, healthy: r.IntN(2) == 0, remote: r.IntN(5) == 0})
		return fmt.Sprintf("s%d endpoint added", i)
	case 7:
		if len(s.eps) > 0 {
			j := r.IntN(len(s.eps))
			s.eps = append(s.eps[:j:j], s.eps[j+1:]...)
			return fmt.Sprintf("s%d endpoint %d removed", i, j)
		}
	case 10:
		if len(s.eps) > 0 {
			j := r.IntN(len(s.eps))
			s.eps[j].moved = (s.eps[j].moved + 1) % 3
			return fmt.Sprintf("s%d endpoint %d moved %d", i, j, s.eps[j].moved)
		}
	case 11:
		p := r.IntN(len(st.pods))
		if keepPod && p == 0 {
			p = 1
		}
		st.pods[p] = !st.pods[p]
		return fmt.Sprintf("pod %d present=%v", p, st.pods[p])
	case 12:
		if r.IntN(4) == 0 {
			if st.zone == "z2" {
				st.zone = "z1"
			} else {
				st.zone = "z2"
			}
			return "zone " + st.zone
		}
	case 13:
		s.eps = nil
		return fmt.Sprintf("s%d endpoints cleared", i)
	case 17, 18, 19:
		st.l4 = (st.l4 + 1) % 4
		return fmt.Sprintf("L4 routes %d", st.l4)
	}
	return "nothing"
}

// TestBuilderRandomSequences: random sequences of small model changes; at every step the
// Builder's output equals a fresh Build, the snapshot is consistent, and every resource (and
// shared capture part) the Builder marks known valid was part of an earlier build that passed
// ValidateAll. Seeds 1 to 4 by default (about 20 s under -race, as make test runs it);
// AETHER_BUILDER_SEEDS=N runs seeds 1 to N (the review ran 200).
func TestBuilderRandomSequences(t *testing.T) {
	for _, o := range []Options{{}, {CertSelection: CertMatcher}, {EastWestWaypoint: true}} {
		t.Run(fmt.Sprintf("pods come and go %+v", o), func(t *testing.T) { builderRandom(t, false, o) })
		t.Run(fmt.Sprintf("a pod always %+v", o), func(t *testing.T) { builderRandom(t, true, o) })
	}
}

func builderRandom(t *testing.T, keepPod bool, opts Options) {
	seeds := uint64(4)
	if v := os.Getenv("AETHER_BUILDER_SEEDS"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			t.Fatalf("AETHER_BUILDER_SEEDS=%q: want a number of seeds, 1 or more", v)
		}
		seeds = n
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		st := &randState{}
		st.pods[0] = keepPod
		bl := NewBuilder(opts)
		validated := map[any]bool{}
		var log []string
		for step := 0; step < 40; step++ {
			n := 1 + r.IntN(3)
			for k := 0; k < n; k++ {
				log = append(log, fmt.Sprintf("step %d: %s", step, st.mutate(r, keepPod)))
			}
			m := st.mesh()
			if len(m.Pods) > 0 && r.IntN(8) == 0 {
				// A build that leaves a pod out (no SVID yet) must leave the Builder able to
				// build the next model as a fresh Build does.
				svids := fakeSVIDs(m)
				left := m.Pods[r.IntN(len(m.Pods))]
				delete(svids, left.SPIFFEID(m.TrustDomain))
				res, err := bl.Build(m, svids, fakeBundles(m))
				if err != nil || !slices.ContainsFunc(res.Unserved, func(u UnservedPod) bool { return u.UID == left.UID }) {
					t.Fatalf("seed %d step %d: build without %s's SVID: %v, unserved %+v; want it left out", seed, step, left.Name, err, res)
				}
				log = append(log, fmt.Sprintf("step %d: build without %s's SVID, then %s", step, left.Name, st.mutate(r, keepPod)))
				m = st.mesh()
			}
			got, err := bl.Build(m, fakeSVIDs(m), fakeBundles(m))
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("seed %d step %d: %s\n%s", seed, step, fmt.Sprintf(format, args...), joinLines(log))
			}
			want, err := Build(m, fakeSVIDs(m), fakeBundles(m), opts)
			if err != nil {
				t.Fatal(err)
			}
			if d := differingKinds(t, got, want); len(d) > 0 {
				fail("%v differ from a fresh Build", d)
			}
			if _, err := newSnapshot("1", got.typed(), nil); err != nil {
				fail("snapshot: %v", err)
			}
			var parts []any
			for _, x := range got.Listeners {
				parts = append(parts, x)
				if x.FilterChainMatcher != nil {
					parts = append(parts, x.FilterChainMatcher)
				}
				if k := chainsKey(x.FilterChains); k != nil {
					parts = append(parts, k)
				}
			}
			for _, x := range got.Routes {
				parts = append(parts, x)
			}
			for _, x := range got.Extensions {
				parts = append(parts, x)
			}
			for _, x := range got.Clusters {
				parts = append(parts, x)
			}
			for _, x := range got.Endpoints {
				parts = append(parts, x)
			}
			for _, x := range parts {
				if got.isKnown(x) && !validated[x] {
					fail("%T %v known valid but never served in a build that passed ValidateAll", x, name(x))
				}
			}
			if r.IntN(5) == 0 {
				continue // not validated: nothing of it may be known valid later on its account
			}
			if err := got.ValidateAll(); err != nil {
				fail("ValidateAll: %v", err)
			}
			for _, x := range parts {
				validated[x] = true
			}
		}
	}
}

func name(x any) string {
	if n, ok := x.(interface{ GetName() string }); ok {
		return n.GetName()
	}
	if n, ok := x.(interface{ GetClusterName() string }); ok {
		return n.GetClusterName()
	}
	return "(shared part)"
}

func joinLines(ls []string) string {
	out := ""
	for _, l := range ls {
		out += l + "\n"
	}
	return out
}

// TestBuilderKnownOnlyWhenServed: a shared part the Builder marks known valid was served in a
// build that passed ValidateAll. The route tables, the headless filter and the capture matcher
// and chains are served only with pods (the route tables and matcher also only with a capture
// matcher), yet ValidateAll of a build without them marked the routing valid.
func TestBuilderKnownOnlyWhenServed(t *testing.T) {
	cases := []struct {
		name         string
		first, after func(st *randState)
	}{
		// New with the headless route table: the capture route is kept when no VIP route changed,
		// also from a routing without a capture matcher (the table not served).
		{"TCP service gains the first VIP", func(st *randState) {
			st.pods[0] = true
			st.svcs[0] = randSvc{present: true, httpIsTCP: true}
		}, func(st *randState) { st.svcs[0].vip = true }},
		// Older: the routing does not change when the first pod arrives.
		{"first pod arrives", func(st *randState) {
			st.svcs[0] = randSvc{present: true, vip: true}
			st.svcs[1] = randSvc{present: true, headless: true, eps: []randEp{{pod: 1, http: true, healthy: true}}}
		}, func(st *randState) { st.pods[0] = true }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := &randState{}
			c.first(st)
			bl := NewBuilder(Options{})
			m := st.mesh()
			r1, err := bl.Build(m, fakeSVIDs(m), fakeBundles(m))
			if err != nil {
				t.Fatal(err)
			}
			if err := r1.ValidateAll(); err != nil {
				t.Fatal(err)
			}
			served := map[any]bool{}
			for _, x := range r1.Routes {
				served[x] = true
			}
			for _, x := range r1.Extensions {
				served[x] = true
			}
			for _, l := range r1.Listeners {
				served[l.FilterChainMatcher] = true
			}
			c.after(st)
			m = st.mesh()
			r2, err := bl.Build(m, fakeSVIDs(m), fakeBundles(m))
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range r2.Routes {
				if r2.isKnown(x) && !served[x] {
					t.Errorf("route table %s known valid, never validated", x.GetName())
				}
			}
			for _, x := range r2.Extensions {
				if r2.isKnown(x) && !served[x] {
					t.Errorf("extension config %s known valid, never validated", x.GetName())
				}
			}
			for _, l := range r2.Listeners {
				if fcm := l.FilterChainMatcher; fcm != nil && r2.isKnown(fcm) && !served[fcm] {
					t.Errorf("%s: capture matcher known valid, never validated", l.GetName())
				}
			}
		})
	}
}
