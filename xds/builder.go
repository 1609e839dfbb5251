package xds

import (
	"cmp"
	"fmt"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"sync"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	runtimev3 "github.com/envoyproxy/go-control-plane/envoy/service/runtime/v3"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/tunnel"
)

// Builder is Build with a memory, for a caller that rebuilds on every model change (the agent's
// Server). It keeps, per service, the resources it built (outbound clusters, EDS resources, floor
// chains, matcher and route entries) with the model values they were built from, per local pod
// its listeners and inbound clusters, and the shared capture matcher and route tables. The next
// Build compares each service and its endpoints, and each pod and its local endpoints, with what
// it kept (by value: models are rebuilt from scratch) and rebuilds only what differs, services in
// parallel across GOMAXPROCS; the shared parts are reassembled only when a service's routing
// (VIPs, ports, names) changed or a service came or went. A change of a mesh-wide input (cluster
// name, domains, node locality, or with CertMatcher the set of local identities) rebuilds
// everything.
//
// Reused resources are the same values as in the previous build, so they hash the same for delta
// xDS, and ValidateAll skips those that already passed it. The output of Build is the same as
// that of the package function Build for the same model. A Builder is not safe for concurrent
// use, and the resources it returns are shared with later builds: they must not be modified.
type Builder struct {
	opts Options
	// shared holds the typed configs every build shares (newSharedConfigs).
	shared *sharedConfigs

	globals *meshGlobals
	svcs    map[model.ServiceKey]*svcEntry
	pods    map[string]*podEntry
	routing *routing
	// mirrors are the mirror clusters of the last build, by name (mirrorResources).
	mirrors map[string]*mirrorEntry
	// localUIDs are the local pods' UIDs of the last build (svcEntry.locals depends on them).
	localUIDs map[string]bool
}

// NewBuilder returns a Builder with nothing kept yet.
func NewBuilder(opts Options) *Builder { return &Builder{opts: opts} }

// meshGlobals are the mesh-wide inputs that per-service and per-pod resources depend on.
type meshGlobals struct {
	cluster, meshDomain, trustDomain, region, zone string
	// peerTrustDomains are the trust domains whose callers the inbound listeners admit: the
	// mesh's own and Options.PeerTrustDomains, sorted.
	peerTrustDomains []string
	// ids are the local identities, sorted, when every cluster depends on them (CertMatcher).
	ids []string
}

func globalsOf(m *model.Mesh, opts Options) *meshGlobals {
	g := &meshGlobals{cluster: m.Cluster, meshDomain: m.MeshDomain, trustDomain: m.TrustDomain, region: m.Node.Region, zone: m.Node.Zone,
		peerTrustDomains: peerTrustDomains(m.TrustDomain, opts.PeerTrustDomains)}
	if opts.CertSelection == CertMatcher {
		g.ids = localIDs(m)
	}
	return g
}

func (g *meshGlobals) equal(o *meshGlobals) bool {
	return o != nil && g.cluster == o.cluster && g.meshDomain == o.meshDomain && g.trustDomain == o.trustDomain &&
		g.region == o.region && g.zone == o.zone && slices.Equal(g.ids, o.ids) && slices.Equal(g.peerTrustDomains, o.peerTrustDomains)
}

// svcEntry is what one service contributes to a build (serviceEntry), with the model values it
// was built from: the service, its endpoints and the short name it owned.
type svcEntry struct {
	svc   *model.Service
	eps   []model.Endpoint
	short string
	// peers are the SPIFFE IDs of the endpoints, which the clusters pin.
	peers []string
	// otherPorts are, per service port, the endpoints' target ports other than its TargetPort
	// (otherTargetPorts), direct and through a waypoint, which get transport sockets of their
	// own in the clusters.
	otherPorts []otherPorts
	// locals are the endpoints in this cluster of local pods (Builder.localUIDs), in order, once
	// localsKnown.
	locals      []model.Endpoint
	localsKnown bool

	clusters []*clusterv3.Cluster
	clas     []*endpointv3.ClusterLoadAssignment
	floors   []floorChain
	chains   []vipChain
	direct   []directEntry
	// routes are the service's VIP routes (CaptureRouteName), directRoutes its headless routes
	// (CaptureHeadlessRouteName).
	routes, directRoutes []vipRoute
	lane                 []*routev3.VirtualHost
	// valid is set once a build that used this entry passed ValidateAll; clustersValid when its
	// clusters were carried over from an entry that had.
	valid, clustersValid bool
}

// podEntry is one local pod's listeners and inbound clusters, with the pod and the local
// endpoints (its registrations in this cluster) they were built from.
type podEntry struct {
	pod       *model.LocalPod
	local     []model.Endpoint
	listeners []*listenerv3.Listener
	clusters  []*clusterv3.Cluster
	// authz are the pod's authorization policies (Mesh.Authz), exts the ECDS resources of its
	// inbound chains' RBAC filters built from them.
	authz []*model.AuthzPolicy
	exts  []*core.TypedExtensionConfig
	valid bool
}

// Build is the package function Build, rebuilding only what changed since the Builder's last
// successful Build (see Builder). Its errors are Build's.
func (bl *Builder) Build(m *model.Mesh, svids map[string]*identity.SVID, bundles map[string][]byte) (*Resources, error) {
	return bl.build(m, svids, nil, bundles)
}

// build is Build leaving out, besides the pods whose SPIFFE ID has no SVID, those lacks names
// (servedPods; the Server passes its identity provider's Lacks, nil for none).
func (bl *Builder) build(m *model.Mesh, svids map[string]*identity.SVID, lacks func(uid string) bool, bundles map[string][]byte) (*Resources, error) {
	if err := bl.opts.check(); err != nil {
		return nil, fmt.Errorf("build: %w", err)
	}
	if err := checkBundles(m.TrustDomain, peerTrustDomains(m.TrustDomain, bl.opts.PeerTrustDomains), bundles); err != nil {
		return nil, fmt.Errorf("build: %w", err)
	}
	// A local pod without an SVID is left out of everything built: no listener (its traffic is
	// refused), no route or mirror for it; its CNI ADD waits for it (Server.WaitPodServed).
	m, unserved := servedPods(m, svids, lacks)
	if bl.shared == nil {
		sh, err := newSharedConfigs()
		if err != nil {
			return nil, err
		}
		bl.shared = sh
	}
	g := globalsOf(m, bl.opts)
	guard, gerr := newTrustDomainGuard(g.peerTrustDomains)
	if gerr != nil {
		return nil, gerr
	}
	b := &builder{m: m, opts: bl.opts, sharedConfigs: bl.shared, peerTrustDomains: g.peerTrustDomains, tdGuard: guard}
	oldSvcs, oldPods, rt := bl.svcs, bl.pods, bl.routing
	if !g.equal(bl.globals) {
		oldSvcs, oldPods, rt = nil, nil, nil
	}

	// Services: keep the entries whose service and endpoints are unchanged, rebuild the others.
	entries := make([]*svcEntry, len(m.Services))
	var todo, headless []int
	routingChanged := rt == nil
	kept := 0
	for i, s := range m.Services {
		e := oldSvcs[s.Key]
		if e == nil {
			routingChanged = true
			todo = append(todo, i)
			continue
		}
		kept++
		sameSvc := e.short == m.ShortName(s.Key) && serviceEqual(e.svc, s)
		if sameSvc && endpointsEqual(e.eps, m.Endpoints[s.Key]) {
			entries[i] = e
			continue
		}
		switch {
		case !sameSvc:
			routingChanged = true
		case s.Headless:
			// A headless service's endpoints are in the headless filter and the headless route
			// table, and their target ports in the matcher (directEntries): compared once
			// rebuilt. A change of health alone keeps them.
			headless = append(headless, i)
		}
		todo = append(todo, i)
	}
	// Which shared route tables the change touches: a new or removed service's routes, or a
	// rebuilt service's that differ.
	vipRoutesChanged, directChanged := rt == nil, rt == nil
	if kept != len(oldSvcs) {
		routingChanged = true // a service went away
		present := make(map[model.ServiceKey]bool, len(m.Services))
		for _, s := range m.Services {
			present[s.Key] = true
		}
		for k, e := range oldSvcs {
			if !present[k] {
				vipRoutesChanged = vipRoutesChanged || len(e.routes) > 0
				directChanged = directChanged || len(e.direct)+len(e.directRoutes) > 0
			}
		}
	}
	err := parallel(len(todo), func(j int) error {
		s := m.Services[todo[j]]
		e, err := b.serviceEntry(s, oldSvcs[s.Key])
		if err != nil {
			return fmt.Errorf("build service %s: %w", s.Key, err)
		}
		entries[todo[j]] = e
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, i := range todo {
		old, e := oldSvcs[m.Services[i].Key], entries[i]
		if old == nil {
			vipRoutesChanged = vipRoutesChanged || len(e.routes) > 0
			directChanged = directChanged || len(e.direct)+len(e.directRoutes) > 0
			continue
		}
		vipRoutesChanged = vipRoutesChanged || !routesEqual(old.routes, e.routes)
		directChanged = directChanged || !directEqual(old, e)
	}
	for _, i := range headless {
		if !sharedRoutingEqual(oldSvcs[m.Services[i].Key], entries[i]) {
			routingChanged = true
		}
	}
	// TCPRoutes and TLSRoutes change the capture matcher and chains (and, for the ports with
	// TLSRoutes, the capture listeners' tls_inspector): the routing is assembled again.
	if !routingChanged && !l4Same(rt, m) {
		routingChanged = true
	}
	if !routingChanged && directChanged {
		if n := rt.withDirect(entries); n != nil {
			rt = n
		} else {
			routingChanged = true
		}
	}
	// GAMMA routes change the capture route tables only, and the capture chains of the pods in a
	// namespace whose consumer routes come or go.
	gammaSame, keepLists := gammaDiff(rt, m)
	switch {
	case routingChanged:
		rt, err = assembleRouting(b, entries, reuse{old: rt, sameVIPRoutes: !vipRoutesChanged && gammaSame, sameDirect: !directChanged})
	case !gammaSame:
		rt = rt.withGamma(b, entries, keepLists)
	}
	if err != nil {
		return nil, err
	}
	b.captureMatcher, b.captureChains, b.captureTLS = rt.captureMatcher, rt.captureChains, rt.captureTLS
	var mirrors map[string]*mirrorEntry
	var omitted int
	if len(rt.mirrors) > 0 && len(m.Pods) > 0 {
		if mirrors, omitted, err = mirrorResources(localIDsByNamespace(m), rt.mirrors, entries, bl.mirrors); err != nil {
			return nil, err
		}
	}

	r := &Resources{Warnings: slices.Clone(rt.warnings), Unserved: unserved}
	if omitted > 0 {
		r.Warnings = append(r.Warnings, fmt.Sprintf("GAMMA mirrors: %d mirror clusters over the node's bound of %d are not built; their mirrored copies are not sent", omitted, maxMirrorClusters))
	}
	known := func(valid bool, xs ...any) {
		if valid {
			for _, x := range xs {
				r.known[x] = struct{}{}
			}
		}
	}
	nc, ne := 1, 0
	for _, e := range entries {
		nc += len(e.clusters)
		ne += len(e.clas)
	}
	r.known = make(map[any]struct{}, nc+ne+4*len(m.Pods)+4)
	r.Clusters = make([]*clusterv3.Cluster, 0, nc+3*len(m.Pods))
	r.Endpoints = make([]*endpointv3.ClusterLoadAssignment, 0, ne)
	for _, e := range entries {
		r.Clusters = append(r.Clusters, e.clusters...)
		r.Endpoints = append(r.Endpoints, e.clas...)
		if e.valid || e.clustersValid {
			for _, c := range e.clusters {
				r.known[c] = struct{}{}
			}
		}
		if e.valid {
			for _, c := range e.clas {
				r.known[c] = struct{}{}
			}
		}
	}
	for _, me := range mirrors {
		r.Clusters, r.Endpoints = append(r.Clusters, me.c), append(r.Endpoints, me.cla)
		known(me.valid, me.c)
		known(me.claValid, me.cla)
	}
	if bl.opts.passthroughFromNode {
		r.Clusters = append(r.Clusters, sharedPassthroughCluster(bl.opts))
	}
	// The shared routes are referenced only by pod listeners: a node without meshed pods serves
	// none, the capture route only while the capture listeners carry their HTTP chain (some
	// service has a VIP), and the headless route only while they carry the headless HTTP chain.
	// A snapshot serving a route no listener names is not Consistent().
	if len(m.Pods) > 0 {
		r.Routes = append(r.Routes, rt.laneRoute)
		known(rt.valid || rt.sharedValid, rt.laneRoute)
		if rt.captureMatcher != nil {
			r.Routes = append(r.Routes, rt.captureRoute)
			known(rt.valid || rt.vipRouteValid, rt.captureRoute)
			if rt.headlessRoute != nil {
				r.Routes = append(r.Routes, rt.headlessRoute)
				known(rt.valid || rt.directValid, rt.headlessRoute)
			}
		}
	}
	if rt.captureMatcher != nil {
		known(rt.valid || rt.sharedValid, rt.captureMatcher, chainsKey(rt.captureChains))
	}
	if len(m.Pods) > 0 {
		r.Extensions = append(r.Extensions, rt.headlessFilter)
		known(rt.valid || rt.directValid, rt.headlessFilter)
	}

	// Pods: this cluster's endpoints of the local pods, for their inbound listeners.
	// Each entry keeps its endpoints that are local pods' (for the same set of local pods); only
	// new entries, or all when the set changed, look them up.
	uids := make(map[string]bool, len(m.Pods))
	for _, p := range m.Pods {
		uids[p.UID] = true
	}
	sameUIDs := maps.Equal(uids, bl.localUIDs)
	b.localEndpoints = make(map[string][]model.Endpoint, len(m.Pods))
	for _, e := range entries {
		if !sameUIDs || !e.localsKnown {
			e.locals, e.localsKnown = nil, true
			for _, ep := range e.eps {
				if ep.Cluster == m.Cluster && uids[ep.PodUID] {
					e.locals = append(e.locals, ep)
				}
			}
		}
		for _, ep := range e.locals {
			b.localEndpoints[ep.PodUID] = append(b.localEndpoints[ep.PodUID], ep)
		}
	}
	bl.localUIDs = uids // what every kept entry's locals now hold, whether this build succeeds or not
	pods := make(map[string]*podEntry, len(m.Pods))
	ids := map[string]bool{}
	for _, p := range m.Pods {
		id := p.SPIFFEID(m.TrustDomain)
		if svids[id] == nil {
			return nil, fmt.Errorf("build pod %s/%s: no SVID for %s", p.Namespace, p.Name, id)
		}
		if p.NetnsPath == "" {
			return nil, fmt.Errorf("build pod %s/%s: empty netns path", p.Namespace, p.Name)
		}
		ids[id] = true
		local := b.localEndpoints[p.UID]
		pe := oldPods[p.UID]
		authz := m.Authz[p.UID]
		if routingChanged || pe == nil || !podEqual(pe.pod, p) || !endpointsEqual(pe.local, local) || !authzEqual(pe.authz, authz) {
			ls, cs, xs, err := b.podListeners(p)
			if err != nil {
				return nil, fmt.Errorf("build pod %s/%s: %w", p.Namespace, p.Name, err)
			}
			pe = &podEntry{pod: p, local: local, listeners: ls, clusters: cs, authz: authz, exts: xs}
		}
		pods[p.UID] = pe
		r.Listeners = append(r.Listeners, pe.listeners...)
		r.Clusters = append(r.Clusters, pe.clusters...)
		r.Extensions = append(r.Extensions, pe.exts...)
		for _, l := range pe.listeners {
			known(pe.valid, l)
		}
		for _, c := range pe.clusters {
			known(pe.valid, c)
		}
		for _, x := range pe.exts {
			known(pe.valid, x)
		}
	}
	// Routed UDP frontends: the node's listeners, one per frontend, and one cluster per route.
	if udp := udpServed(m, bl.opts); len(udp) > 0 {
		ls, err := udpNodeListeners(m, udp, bl.opts)
		if err != nil {
			return nil, fmt.Errorf("build routed UDP frontends: %w", err)
		}
		r.Listeners = append(r.Listeners, ls...)
		r.Clusters = append(r.Clusters, udpClusters(m, udp, bl.opts)...)
	}
	if bl.opts.PodMaxConnections > 0 {
		r.Runtimes = []*runtimev3.Runtime{listenerLimits(r.Listeners, bl.opts.PodMaxConnections)}
	}
	if bl.opts.EastWestWaypoint {
		// The node's tunnel listener (package tunnel); nil while the node IP is unknown.
		w, err := tunnel.Build(m, tunnel.Options{ConnectTimeout: bl.opts.ConnectTimeout, Netns: bl.opts.UpstreamNetns, HandshakeTimeout: bl.opts.HandshakeTimeout})
		if err != nil {
			return nil, fmt.Errorf("build waypoint: %w", err)
		}
		if w != nil {
			r.Listeners = append(r.Listeners, w.Listener)
			r.Clusters = append(r.Clusters, w.Clusters...)
			r.Endpoints = append(r.Endpoints, w.Endpoints...)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(ids)) {
		r.Secrets = append(r.Secrets, svidSecret(id, svids[id]), svidSecret(InboundSecretName(id), svids[id]))
	}
	sets := map[string][]string{}
	for _, e := range entries {
		if hasClusters(e.svc) {
			pinSets(sets, e.peers)
		}
	}
	ts, err := trustSecrets(g.peerTrustDomains, bundles, sortedSets(sets))
	if err != nil {
		return nil, err
	}
	r.Secrets = append(r.Secrets, ts...)
	sortByName(r.Listeners, (*listenerv3.Listener).GetName)
	sortByName(r.Clusters, (*clusterv3.Cluster).GetName)
	sortByName(r.Endpoints, (*endpointv3.ClusterLoadAssignment).GetClusterName)
	sortByName(r.Routes, (*routev3.RouteConfiguration).GetName)
	sortByName(r.Secrets, (*tlsv3.Secret).GetName)
	sortByName(r.Extensions, (*core.TypedExtensionConfig).GetName)

	svcs := oldSvcs
	if routingChanged || svcs == nil {
		// The set of services may differ: a new index.
		svcs = make(map[model.ServiceKey]*svcEntry, len(entries))
		for _, e := range entries {
			svcs[e.svc.Key] = e
		}
	} else {
		for _, i := range todo {
			svcs[entries[i].svc.Key] = entries[i]
		}
	}
	bl.globals, bl.svcs, bl.pods, bl.routing, bl.mirrors = g, svcs, pods, rt, mirrors
	r.validated = func() {
		for _, e := range entries {
			e.valid = true
		}
		for _, pe := range pods {
			pe.valid = true
		}
		for _, me := range mirrors {
			me.valid, me.claValid = true, true
		}
		// Only when every shared part was served (and so validated): the route tables, the
		// matcher and the chains are left out without pods or without a capture matcher, and a
		// later build may serve them as they are.
		if len(m.Pods) > 0 && rt.captureMatcher != nil {
			rt.valid = true
		}
	}
	return r, nil
}

// peerTrustDomains is own and peers, sorted and unique.
func peerTrustDomains(own string, peers []string) []string {
	return slices.Compact(slices.Sorted(slices.Values(append([]string{own}, peers...))))
}

// servedPods decides which local pods of m a build serves, and why it leaves out the others: a
// pod lacks names (the identity provider has no SVID of the pod's own, although another pod of
// its SPIFFE ID may have one: SPIRE, a pod out of its ClusterSPIFFEID's selector;
// identity.Provider.Lacks), and a pod whose SPIFFE ID has no SVID in svids (SPIRE before the
// pod's entry reached the node's agent, or after a withdrawn SVID expired). It returns m and no
// unserved pods when it serves every pod; else a shallow copy of m holding only the served pods,
// and the others in the model's order, each once with its reason. A nil lacks names no pod.
func servedPods(m *model.Mesh, svids map[string]*identity.SVID, lacks func(uid string) bool) (*model.Mesh, []UnservedPod) {
	var unserved []UnservedPod
	left := make([]bool, len(m.Pods))
	for i, p := range m.Pods {
		id := p.SPIFFEID(m.TrustDomain)
		var reason string
		switch {
		case lacks != nil && lacks(p.UID):
			reason = "no SVID of its own for " + id + " from the identity provider"
		case svids[id] == nil:
			reason = "no SVID for " + id + " from the identity provider yet"
		default:
			continue
		}
		left[i] = true
		unserved = append(unserved, UnservedPod{UID: p.UID, Namespace: p.Namespace, Name: p.Name, Reason: reason})
	}
	if len(unserved) == 0 {
		return m, nil
	}
	out := *m
	out.Pods = make([]*model.LocalPod, 0, len(m.Pods)-len(unserved))
	for i, p := range m.Pods {
		if !left[i] {
			out.Pods = append(out.Pods, p)
		}
	}
	return &out, unserved
}

// parallel runs fn(0..n-1) in up to GOMAXPROCS goroutines and returns the error of the lowest
// index that failed.
func parallel(n int, fn func(i int) error) error {
	w := min(runtime.GOMAXPROCS(0), n)
	if w <= 1 {
		for i := 0; i < n; i++ {
			if err := fn(i); err != nil {
				return err
			}
		}
		return nil
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for k := 0; k < w; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := k; i < n; i += w {
				errs[i] = fn(i)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// sortByName sorts resources by the name name gives (deterministic output).
func sortByName[T any](s []T, name func(T) string) {
	slices.SortFunc(s, func(a, b T) int { return cmp.Compare(name(a), name(b)) })
}

// serviceEqual reports whether two services are the same in every field.
func serviceEqual(a, b *model.Service) bool {
	if a == b {
		return true
	}
	return a.Key == b.Key && a.Local == b.Local && a.Headless == b.Headless && a.Imported == b.Imported && a.Exported == b.Exported &&
		a.Created.Equal(b.Created) && slices.Equal(a.VIPs, b.VIPs) && slices.Equal(a.ClustersetVIPs, b.ClustersetVIPs) &&
		slices.Equal(a.Ports, b.Ports)
}

// sharedRoutingEqual reports whether two entries of a service contribute the same to the
// routing every pod's capture listener holds (assembleRouting): the same floor chains, capture
// matcher entries, VIP routes, lane virtual hosts, and headless chains per target port. A
// headless service's endpoints change none of these unless a target port comes or goes: a
// joining or leaving endpoint changes only its direct entries and headless routes (directEqual),
// and a readiness change nothing.
func sharedRoutingEqual(a, b *svcEntry) bool {
	return slices.EqualFunc(a.floors, b.floors, func(x, y floorChain) bool { return x.name == y.name && proto.Equal(x.tcp, y.tcp) }) &&
		slices.EqualFunc(a.chains, b.chains, func(x, y vipChain) bool {
			return x.vip == y.vip && x.port == y.port && proto.Equal(x.action, y.action)
		}) &&
		routesEqual(a.routes, b.routes) &&
		slices.EqualFunc(a.lane, b.lane, func(x, y *routev3.VirtualHost) bool { return proto.Equal(x, y) }) &&
		maps.Equal(directChainSet(a.direct), directChainSet(b.direct))
}

// directChainSet is the set of target port and chain pairs of direct entries.
func directChainSet(ds []directEntry) map[portChain]bool {
	out := make(map[portChain]bool, len(ds))
	for _, d := range ds {
		out[portChain{d.dst.Port(), d.chain}] = true
	}
	return out
}

// portChain is a headless target port and the capture chain its endpoints take.
type portChain struct {
	port  uint16
	chain string
}

// directEqual reports whether two entries of a service have the same direct entries and headless
// routes, in the same order.
func directEqual(a, b *svcEntry) bool {
	return slices.Equal(a.direct, b.direct) && routesEqual(a.directRoutes, b.directRoutes)
}

// routesEqual reports whether two lists of capture routes are the same, in the same order.
func routesEqual(a, b []vipRoute) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 || &a[0] == &b[0] {
		return true // the same list, carried over (serviceEntry)
	}
	return slices.EqualFunc(a, b, func(x, y vipRoute) bool { return x.dst == y.dst && proto.Equal(x.action, y.action) })
}

// endpointsEqual reports whether two endpoint lists are the same, in the same order.
func endpointsEqual(a, b []model.Endpoint) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 || &a[0] == &b[0] {
		return true
	}
	for i := range a {
		x, y := &a[i], &b[i]
		if x.Service != y.Service || x.Cluster != y.Cluster || x.Region != y.Region || x.Zone != y.Zone ||
			x.PodName != y.PodName || x.PodUID != y.PodUID || x.NodeName != y.NodeName || x.NodeIP != y.NodeIP ||
			x.SPIFFEID != y.SPIFFEID || x.Healthy != y.Healthy || !slices.Equal(x.IPs, y.IPs) || !slices.Equal(x.Ports, y.Ports) {
			return false
		}
	}
	return true
}

// podEqual reports whether two local pods are the same in every field.
func podEqual(a, b *model.LocalPod) bool {
	if a == b {
		return true
	}
	return a.UID == b.UID && a.Namespace == b.Namespace && a.Name == b.Name && a.ServiceAccount == b.ServiceAccount &&
		a.ContainerID == b.ContainerID && a.NetnsPath == b.NetnsPath && a.Ready == b.Ready && a.Protocol == b.Protocol &&
		slices.Equal(a.IPs, b.IPs) && slices.Equal(a.Ports, b.Ports) && slices.Equal(a.Services, b.Services)
}

// authzEqual reports whether two lists of a pod's authorization policies are equal by value (the
// model is rebuilt from scratch: equal policies are distinct pointers).
func authzEqual(a, b []*model.AuthzPolicy) bool {
	return slices.EqualFunc(a, b, func(x, y *model.AuthzPolicy) bool { return x == y || reflect.DeepEqual(x, y) })
}

// listenerLimits is the RTDS layer RuntimeLayerName capping each of the pods' listeners (ls, before
// the waypoint's is added: its cap is the bootstrap's static layer) at limit connections:
// envoy.resource_limits.listener.<name>.connection_limit for every listener name.
func listenerLimits(ls []*listenerv3.Listener, limit uint64) *runtimev3.Runtime {
	fields := make(map[string]*structpb.Value, len(ls))
	for _, l := range ls {
		fields["envoy.resource_limits.listener."+l.GetName()+".connection_limit"] = structpb.NewNumberValue(float64(limit))
	}
	return &runtimev3.Runtime{Name: RuntimeLayerName, Layer: &structpb.Struct{Fields: fields}}
}
