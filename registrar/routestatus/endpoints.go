package routestatus

import (
	"cmp"
	"context"
	"slices"
	"sync"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

// EndpointSource is the registry's endpoint records as the route status controller reads them;
// *registry.Registry implements it. WatchEndpoints delivers every cluster's endpoints as one
// Snapshot batch once the first list succeeded, then their changes; after a watch that fell
// behind a compaction it re-lists and delivers the difference (registry.Batch). The channel is
// closed when ctx ends or the registry is closed.
type EndpointSource interface {
	WatchEndpoints(ctx context.Context) <-chan registry.Batch[*registryv1.ServiceEndpoint]
}

// ExportSource is the clusterset-wide export view (every cluster's export marks); the registrar's
// *mcs.ExportView implements it, fed by its own registry watch.
type ExportSource interface {
	// Synced reports whether the view holds the registry's first snapshot.
	Synced() bool
	// WaitSynced blocks until Synced or ctx ends (ctx's error).
	WaitSynced(ctx context.Context) error
	// Marks returns the export marks of one service from every cluster (shared: not changed).
	Marks(k model.ServiceKey) []registry.Record[*registryv1.ExportMark]
	// Subscribe registers fn, called after every change of the view with the services it touched.
	Subscribe(fn func([]model.ServiceKey))
}

// endpointView holds the registry's endpoint records (every cluster's) as far as route status
// depends on them: for each service, each endpoint's cluster, pod UID and ports (name, number,
// protocol), by registry key, and how many endpoints of each cluster declare each protocol for
// each port name. model.Assemble takes a Service port's protocol from them when the port has no
// appProtocol (the one most endpoints declare), exactly as the agents do from the same records.
// It is safe for concurrent use.
type endpointView struct {
	mu     sync.Mutex
	synced bool
	rev    int64
	n      int
	bySvc  map[model.ServiceKey]*serviceEndpoints
}

// serviceEndpoints are one service's endpoints in an endpointView.
type serviceEndpoints struct {
	eps    map[string]model.Endpoint // registry key -> endpoint (Service, Cluster, PodUID, Ports)
	counts map[tallyKey]int          // endpoints declaring a protocol for a port name, per cluster
	// sorted is eps in model's endpoint order (cluster, pod UID), built when a pass asks for the
	// service and dropped when eps changes: a pass copies it once, and model.New, finding it
	// sorted, does not sort it again. Only the services routes name have one.
	sorted []model.Endpoint
}

// tallyKey is one port name, cluster and declared protocol.
type tallyKey struct {
	port, cluster string
	proto         model.Protocol
}

// tallyEntry is one element of a service's protocol signature.
type tallyEntry struct {
	tallyKey
	n int
}

func newEndpointView() *endpointView {
	return &endpointView{bySvc: map[model.ServiceKey]*serviceEndpoints{}}
}

// apply folds one watch batch into the view. It returns the services whose protocol signature
// changed (signature: only those changes can change a port protocol model.Assemble derives, for
// any set of clusters whose endpoints count) and whether this was the first batch. A record that
// does not convert (registry.ToModelEndpoint; the watch delivers validated records only) is left
// out, as the agents leave it out.
func (v *endpointView) apply(b registry.Batch[*registryv1.ServiceEndpoint]) (changed []model.ServiceKey, first bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	before := map[model.ServiceKey][]tallyEntry{}
	for _, e := range b.Events {
		k := model.ServiceKey{Namespace: e.Record.Value.GetService().GetNamespace(), Name: e.Record.Value.GetService().GetName()}
		se := v.bySvc[k]
		if _, ok := before[k]; !ok {
			before[k] = se.signature()
		}
		if se == nil {
			se = &serviceEndpoints{eps: map[string]model.Endpoint{}, counts: map[tallyKey]int{}}
			v.bySvc[k] = se
		}
		se.sorted = nil
		if old, ok := se.eps[e.Key]; ok {
			se.count(old, -1)
			delete(se.eps, e.Key)
			v.n--
		}
		if e.Type != registry.Deleted {
			if ep, err := registry.ToModelEndpoint(e.Record); err == nil {
				ep = model.Endpoint{Service: ep.Service, Cluster: ep.Cluster, PodUID: ep.PodUID, Ports: ep.Ports}
				se.eps[e.Key] = ep
				se.count(ep, 1)
				v.n++
			}
		}
		if len(se.eps) == 0 {
			delete(v.bySvc, k)
		}
	}
	for k, sig := range before {
		if !slices.Equal(sig, v.bySvc[k].signature()) {
			changed = append(changed, k)
		}
	}
	slices.SortFunc(changed, model.ServiceKey.Compare)
	first, v.synced = !v.synced, true
	v.rev = max(v.rev, b.Revision)
	return changed, first
}

// count adds d to the tallies of ep's ports: the first port of each name, the one model.Assemble
// reads (the registry refuses two ports of one name, but not two unnamed ones).
func (se *serviceEndpoints) count(ep model.Endpoint, d int) {
	for i, p := range ep.Ports {
		if slices.ContainsFunc(ep.Ports[:i], func(q model.EndpointPort) bool { return q.Name == p.Name }) {
			continue
		}
		k := tallyKey{port: p.Name, cluster: ep.Cluster, proto: p.Protocol}
		if se.counts[k] += d; se.counts[k] == 0 {
			delete(se.counts, k)
		}
	}
}

// signature is what a port protocol model.Assemble derives from se's endpoints can depend on,
// sorted: for each port name whose endpoints (in every cluster) all declare one protocol, which
// clusters have endpoints declaring it (the protocol of the port is that one for any set of
// clusters holding one of them, and the default for any other set: the number of endpoints does
// not matter); for a port name with several protocols declared, every cluster's count of each
// (the one most endpoints declare may change with any count). So pods that come and go with the
// same annotation change nothing, and a pass is run only for what may change a status. nil for
// no endpoints.
func (se *serviceEndpoints) signature() []tallyEntry {
	if se == nil {
		return nil
	}
	protos := map[string]model.Protocol{}
	mixed := map[string]bool{}
	for k := range se.counts {
		if p, ok := protos[k.port]; ok && p != k.proto {
			mixed[k.port] = true
		}
		protos[k.port] = k.proto
	}
	out := make([]tallyEntry, 0, len(se.counts))
	for k, n := range se.counts {
		if !mixed[k.port] {
			n = 1
		}
		out = append(out, tallyEntry{k, n})
	}
	slices.SortFunc(out, func(a, b tallyEntry) int {
		return cmp.Or(cmp.Compare(a.port, b.port), cmp.Compare(a.cluster, b.cluster), cmp.Compare(a.proto, b.proto))
	})
	return out
}

// state reports whether the view holds the first snapshot, and the revision it is at.
func (v *endpointView) state() (synced bool, rev int64, n int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.synced, v.rev, v.n
}

// endpoints returns the endpoints of the services keys names, each service's in model's
// endpoint order (by cluster, then pod UID), in one slice of its final size.
func (v *endpointView) endpoints(keys map[model.ServiceKey]bool) []model.Endpoint {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := 0
	for k := range keys {
		if se := v.bySvc[k]; se != nil {
			n += len(se.eps)
		}
	}
	out := make([]model.Endpoint, 0, n)
	for k := range keys {
		se := v.bySvc[k]
		if se == nil {
			continue
		}
		if se.sorted == nil {
			se.sorted = make([]model.Endpoint, 0, len(se.eps))
			for _, ep := range se.eps {
				se.sorted = append(se.sorted, ep)
			}
			slices.SortFunc(se.sorted, func(a, b model.Endpoint) int {
				return cmp.Or(cmp.Compare(a.Cluster, b.Cluster), cmp.Compare(a.PodUID, b.PodUID))
			})
		}
		out = append(out, se.sorted...)
	}
	return out
}
