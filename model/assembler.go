package model

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"
)

// KubeFiller fills the Kubernetes half of Sources (the agent's informer-backed KubeSource
// implements it).
type KubeFiller interface {
	Fill(*Sources) error
}

// RegistryView is the registry's clusterset-wide state as the agent currently holds it.
type RegistryView interface {
	// Records returns the current endpoints and export marks of every cluster, origin-stamped
	// from their registry keys. The slices are not changed afterwards by the view.
	Records() ([]Endpoint, []ExportMark)
}

// AttachmentView returns the node's persisted CNI attachments by pod UID.
type AttachmentView interface {
	Attachments() map[string]cniv1.PodAttachment
}

// UncapturedView, when an AttachmentView implements it, also returns the attachments of the
// node's pods the CNI server left alone (not meshed), by pod UID: an edge Gateway's pod opts out
// of capture, and the agent serves it in its netns (Sources.Uncaptured).
type UncapturedView interface {
	Uncaptured() map[string]cniv1.PodAttachment
}

// AssemblerConfig configures an Assembler.
type AssemblerConfig struct {
	Cluster     string
	MeshDomain  string
	TrustDomain string
	// Region and Zone, when set, replace the Node's topology labels (LabelRegion, LabelZone) in
	// every Mesh. The agent sets Region to its registry origin's region, which its endpoints
	// carry, so that the priority tiers compare this cluster's endpoints with the node alike; and
	// Zone from --zone.
	Region, Zone string
	// Quiet and MaxDelay bound rebuilds under bursts (see Coalescer); defaults 50 ms and 500 ms.
	Quiet, MaxDelay time.Duration
	Logger          *slog.Logger
	// Observe, when set, is called after each build with the time it took to read the sources
	// and assemble the Mesh (not the subscribers' time).
	Observe func(took time.Duration)
}

// Assembler keeps the agent's current Mesh: on every Trigger (an informer event, a registry
// event, an attachment change) it coalesces the burst, assembles a new Mesh from its sources and
// hands it to every subscriber in order. The previous Mesh stays current when a source fails, so
// the node keeps serving the last model.
type Assembler struct {
	cfg   AssemblerConfig
	kube  KubeFiller
	reg   RegistryView
	att   AttachmentView
	co    *Coalescer
	cur   atomic.Pointer[Mesh]
	ver   atomic.Uint64
	built atomic.Uint64

	// build serialises Rebuild (Run's coalescer and direct calls), so versions, Current and the
	// subscribers never go backwards.
	build sync.Mutex
	// authzCache keeps AuthorizationPolicy conversions between builds (under build).
	authzCache AuthzCache
	mu         sync.Mutex
	subs       []func(*Mesh)
	// next is closed and replaced when a new Mesh is published (Wait).
	next chan struct{}
}

// NewAssembler returns an Assembler over the given sources; any source may be nil (it then
// contributes nothing).
func NewAssembler(cfg AssemblerConfig, kube KubeFiller, reg RegistryView, att AttachmentView) *Assembler {
	if cfg.Quiet == 0 {
		cfg.Quiet = 50 * time.Millisecond
	}
	if cfg.MaxDelay == 0 {
		cfg.MaxDelay = 500 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	a := &Assembler{cfg: cfg, kube: kube, reg: reg, att: att, next: make(chan struct{})}
	a.co = NewCoalescer(cfg.Quiet, cfg.MaxDelay, func() { a.Rebuild() })
	return a
}

// Subscribe adds fn, called with every new Mesh (from the Assembler's goroutine; fn should hand
// the value off quickly). A subscriber added after the first build is called at the next one.
func (a *Assembler) Subscribe(fn func(*Mesh)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.subs = append(a.subs, fn)
}

// Trigger records that a source changed; it never blocks.
func (a *Assembler) Trigger() { a.co.Trigger() }

// Run serves triggers until ctx ends.
func (a *Assembler) Run(ctx context.Context) { a.co.Run(ctx) }

// Current returns the last assembled Mesh, or nil before the first build.
func (a *Assembler) Current() *Mesh { return a.cur.Load() }

// Wait returns the first Mesh, the current one or a later one, for which ok returns true, or
// ctx's cause when ctx ends first. It wakes on every new Mesh; it never polls.
func (a *Assembler) Wait(ctx context.Context, ok func(*Mesh) bool) (*Mesh, error) {
	for {
		a.mu.Lock()
		next := a.next
		a.mu.Unlock()
		if m := a.cur.Load(); m != nil && ok(m) {
			return m, nil
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-next:
		}
	}
}

// Rebuilds returns how many Mesh values have been built.
func (a *Assembler) Rebuilds() uint64 { return a.built.Load() }

// Rebuild assembles a Mesh now and publishes it. When the Kubernetes source cannot be read the
// current Mesh is kept and the error returned.
func (a *Assembler) Rebuild() error {
	a.build.Lock()
	defer a.build.Unlock()
	start := time.Now()
	s := Sources{Cluster: a.cfg.Cluster, MeshDomain: a.cfg.MeshDomain, TrustDomain: a.cfg.TrustDomain, AuthzCache: &a.authzCache}
	if a.kube != nil {
		if err := a.kube.Fill(&s); err != nil {
			a.cfg.Logger.Error("assemble mesh model: keeping the last model", "err", err)
			return err
		}
	}
	if a.cfg.Region != "" {
		s.Node.Region = a.cfg.Region
	}
	if a.cfg.Zone != "" {
		s.Node.Zone = a.cfg.Zone
	}
	if a.reg != nil {
		s.Endpoints, s.Exports = a.reg.Records()
	}
	if a.att != nil {
		s.Attachments = a.att.Attachments()
		if u, ok := a.att.(UncapturedView); ok {
			s.Uncaptured = u.Uncaptured()
		}
	}
	m := Assemble(a.ver.Add(1), s)
	if a.cfg.Observe != nil {
		a.cfg.Observe(time.Since(start))
	}
	a.cfg.Logger.Debug("mesh model built", "version", m.Version, "services", len(m.Services), "pods", len(m.Pods), "endpoints", len(s.Endpoints))
	a.cur.Store(m)
	a.built.Add(1)
	a.mu.Lock()
	subs := append([]func(*Mesh){}, a.subs...)
	close(a.next)
	a.next = make(chan struct{})
	a.mu.Unlock()
	for _, fn := range subs {
		fn(m)
	}
	return nil
}
