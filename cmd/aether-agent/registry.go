package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registrar/registry"
)

// registryView folds the registry's endpoint and export watches into what the model assembler
// reads (model.RegistryView). It keeps its last view while the registry is unreachable: the
// watches resume, or re-list after a compaction, and deliver exactly the difference.
type registryView struct {
	log      *slog.Logger
	onChange func()

	mu sync.Mutex
	// eps holds each valid endpoint record converted once, when its event arrives: a change
	// costs the conversion of what changed, not of every endpoint in the clusterset.
	eps     map[string]model.Endpoint
	exps    map[string]registry.Record[*registryv1.ExportMark]
	cacheOK bool
	epsOut  []model.Endpoint
	expOut  []model.ExportMark
	synced  chan struct{} // closed once both watches delivered their snapshot
	epsSeen bool
	expSeen bool
}

func newRegistryView(log *slog.Logger, onChange func()) *registryView {
	return &registryView{log: log, onChange: onChange, synced: make(chan struct{}),
		eps:  map[string]model.Endpoint{},
		exps: map[string]registry.Record[*registryv1.ExportMark]{}}
}

// run consumes both watches until ctx ends.
func (v *registryView) run(ctx context.Context, r *registry.Registry) {
	epc, exc := r.WatchEndpoints(ctx), r.WatchExports(ctx)
	for epc != nil || exc != nil {
		select {
		case b, ok := <-epc:
			if !ok {
				epc = nil
				continue
			}
			v.mu.Lock()
			v.applyEndpoints(b)
			v.cacheOK = false
			v.epsSeen = true
			v.markSynced()
			v.mu.Unlock()
			v.onChange()
		case b, ok := <-exc:
			if !ok {
				exc = nil
				continue
			}
			v.mu.Lock()
			b.Apply(v.exps)
			v.cacheOK = false
			v.expSeen = true
			v.markSynced()
			v.mu.Unlock()
			v.onChange()
		}
	}
}

func (v *registryView) markSynced() {
	if v.epsSeen && v.expSeen {
		select {
		case <-v.synced:
		default:
			close(v.synced)
		}
	}
}

// applyEndpoints folds an endpoint batch into v.eps, converting each added or updated record; a
// record that does not convert is logged and left out (an earlier value under its key is
// dropped, as the store no longer holds a valid one). Called with v.mu held.
func (v *registryView) applyEndpoints(b registry.Batch[*registryv1.ServiceEndpoint]) {
	for _, e := range b.Events {
		if e.Type == registry.Deleted {
			delete(v.eps, e.Key)
			continue
		}
		m, err := registry.ToModelEndpoint(e.Record)
		if err != nil {
			v.log.Warn("skip registry endpoint", "key", e.Key, "err", err)
			delete(v.eps, e.Key)
			continue
		}
		v.eps[e.Key] = m
	}
}

// Records implements model.RegistryView. The slices are cached until the next batch.
func (v *registryView) Records() ([]model.Endpoint, []model.ExportMark) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cacheOK {
		return v.epsOut, v.expOut
	}
	eps := make([]model.Endpoint, 0, len(v.eps))
	for _, e := range v.eps {
		eps = append(eps, e)
	}
	exps := make([]model.ExportMark, 0, len(v.exps))
	for _, rec := range v.exps {
		exps = append(exps, toModelExport(rec))
	}
	v.epsOut, v.expOut, v.cacheOK = eps, exps, true
	return eps, exps
}

// toModelExport converts an export mark record; cluster and region come from the key's origin.
func toModelExport(rec registry.Record[*registryv1.ExportMark]) model.ExportMark {
	m := rec.Value
	x := model.ExportMark{
		Service: model.ServiceKey{Namespace: m.GetService().GetNamespace(), Name: m.GetService().GetName()},
		Cluster: rec.Origin.Cluster, Region: rec.Origin.Region,
	}
	if t, err := time.Parse(time.RFC3339Nano, m.GetCreateTime()); err == nil {
		x.Created = t
	}
	for _, p := range m.GetPorts() {
		x.Ports = append(x.Ports, model.ServicePort{Name: p.GetName(), Port: p.GetPort(), TargetPort: p.GetTargetPort()})
	}
	return x
}

// endpointRegistrar keeps this node's endpoints in the registry equal to what the model says:
// one ServiceEndpoint per (local pod, local service selecting it), healthy while the pod is Ready,
// with each Service port mapped to its container port.
type endpointRegistrar struct {
	reg  *registry.Registry
	log  *slog.Logger
	mu   sync.Mutex
	have map[string]*registryv1.ServiceEndpoint // ns/svc/podUID -> registered value
}

func newEndpointRegistrar(reg *registry.Registry, log *slog.Logger) *endpointRegistrar {
	return &endpointRegistrar{reg: reg, log: log, have: map[string]*registryv1.ServiceEndpoint{}}
}

// desiredEndpoints builds the node's endpoints from a model (pure).
func desiredEndpoints(m *model.Mesh) map[string]*registryv1.ServiceEndpoint {
	out := map[string]*registryv1.ServiceEndpoint{}
	for _, p := range m.Pods {
		for _, k := range p.Services {
			s := m.Service(k)
			if s == nil || !s.Local {
				continue
			}
			ep := &registryv1.ServiceEndpoint{
				Service:  &registryv1.ServiceRef{Namespace: k.Namespace, Name: k.Name},
				Zone:     m.Node.Zone,
				SpiffeId: p.SPIFFEID(m.TrustDomain),
				Health:   registryv1.Health_HEALTH_UNHEALTHY,
				Kubernetes: &registryv1.KubernetesMetadata{
					NodeName: m.Node.Name, PodName: p.Name, PodUid: p.UID, ServiceAccount: p.ServiceAccount,
				},
			}
			if p.Ready {
				ep.Health = registryv1.Health_HEALTH_HEALTHY
			}
			if m.Node.IP.IsValid() {
				ep.Kubernetes.NodeIp = m.Node.IP.String()
			}
			for _, ip := range p.IPs {
				ep.Addresses = append(ep.Addresses, ip.String())
			}
			for _, sp := range s.Ports {
				target, proto := sp.TargetPort, p.Protocol
				if sp.TargetPortName != "" {
					target = 0
					for _, pp := range p.Ports {
						if pp.Name == sp.TargetPortName {
							target = pp.Port
						}
					}
				}
				if target == 0 {
					continue // a named port this pod does not have: Kubernetes leaves it out too
				}
				if sp.AppProtocol {
					proto = sp.Protocol
				}
				rp, err := registry.ProtocolFromModel(proto)
				if err != nil {
					continue
				}
				ep.Ports = append(ep.Ports, &registryv1.EndpointPort{Name: sp.Name, Port: target, Protocol: rp})
			}
			if len(ep.Addresses) == 0 || len(ep.Ports) == 0 {
				continue
			}
			out[k.Namespace+"/"+k.Name+"/"+p.UID] = ep
		}
	}
	return out
}

// sync registers new and changed endpoints and deregisters gone ones. It returns the first error
// and leaves what it could not write for the next sync.
func (e *endpointRegistrar) sync(ctx context.Context, m *model.Mesh) error {
	want := desiredEndpoints(m)
	e.mu.Lock()
	defer e.mu.Unlock()
	var first error
	for key, ep := range want {
		if old, ok := e.have[key]; ok && proto.Equal(old, ep) {
			continue
		}
		if err := e.reg.RegisterEndpoint(ctx, ep); err != nil {
			e.log.Warn("register endpoint", "key", key, "err", err)
			if first == nil {
				first = err
			}
			continue
		}
		e.have[key] = ep
	}
	for key, old := range e.have {
		if _, ok := want[key]; ok {
			continue
		}
		err := e.reg.DeregisterEndpoint(ctx, old.Service.Namespace, old.Service.Name, old.Kubernetes.PodUid)
		if err != nil {
			e.log.Warn("deregister endpoint", "key", key, "err", err)
			if first == nil {
				first = err
			}
			continue
		}
		delete(e.have, key)
	}
	if first != nil {
		return fmt.Errorf("sync endpoints: %w", first)
	}
	return nil
}
