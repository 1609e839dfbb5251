package agent

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/aethermesh/aether/capture"
	"github.com/aethermesh/aether/model"
)

// udpCapture orders the routed UDP frontends (model.Mesh.UDPFrontends) between the node Envoy's
// UDP listeners on the node's address and the pods' capture redirects (docs/capture.md): a redirect is
// installed only once Envoy has ACKed the listeners it points at, and a listener goes only once
// its redirect is gone from every pod. The xDS builder serves listeners for the model's
// frontends and for those Held returns (xds.Options.UDPHeld), the frontends whose redirects may
// still be installed.
type udpCapture struct {
	log *slog.Logger
	// acked returns once Envoy has ACKed a snapshot of m or a later model.
	acked func(ctx context.Context, m *model.Mesh) error
	// set replaces the pods' UDP redirects and returns once every captured pod has them
	// (cni.Server.SetUDPRedirects).
	set func(ctx context.Context, rs []capture.UDPRedirect) error
	// rebuild asks for a new model (model.Assembler.Trigger), so listeners no longer held go.
	rebuild func()
	// current is the version of the last model published (model.Assembler.Current); nil: 0.
	current func() uint64
	// retry is the wait before a failed change is tried again.
	retry time.Duration
	// frontends are the routed UDP frontends of a model the node serves
	// (xds.Options.UDPFrontends: those of a family the node has a host address of).
	frontends func(m *model.Mesh) []model.UDPFrontend

	mu   sync.Mutex
	held []model.UDPFrontend
	// synced is set once a set of redirects has been applied: until then the pods may hold
	// the redirects a previous agent persisted (cni.Server), so the first model is applied
	// even when it routes nothing.
	synced bool
	// stale is the last model version published when held last changed: the snapshots of
	// models up to it may have been built with the held set before, so an ACK of one says
	// nothing of the listeners now held, and run skips them for the rebuild that follows.
	stale uint64
}

// changedHeld records that held just changed (stale); mu is held.
func (u *udpCapture) changedHeld() {
	if u.current != nil {
		u.stale = u.current()
	}
}

// hold starts with rs held: redirects a previous agent persisted (cni.LoadUDPRedirects), as
// frontends without a route. Their listeners are not served (nothing says where to), but a model
// frontend on one of their local ports waits until the first pass has replaced them (xds
// udpServed), so no pod's old redirect leads to another frontend's route.
func (u *udpCapture) hold(rs []capture.UDPRedirect) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, r := range rs {
		u.held = append(u.held, model.UDPFrontend{VIP: r.VIP, Port: r.Port, LocalPort: r.LocalPort})
	}
}

// Held returns the frontends whose redirects may be installed in pods (xds.Options.UDPHeld).
func (u *udpCapture) Held() []model.UDPFrontend {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.held)
}

// run follows the models on latest until ctx ends: for a model whose frontends differ from the
// installed ones it waits for Envoy's ACK of that model (its listeners, and the held ones),
// sets the pods' redirects to the model's frontends, holds only those, and asks for a rebuild
// that drops the listeners of the others. A failed step is tried again after retry unless a
// newer model came meanwhile.
func (u *udpCapture) run(ctx context.Context, latest chan *model.Mesh) {
	for {
		var m *model.Mesh
		select {
		case <-ctx.Done():
			return
		case m = <-latest:
		}
		want := u.frontends(m)
		u.mu.Lock()
		synced, stale := u.synced, u.stale
		u.mu.Unlock()
		if m.Version <= stale || (synced && sameUDP(want, u.Held())) {
			continue
		}
		if err := u.apply(ctx, m, want); err != nil {
			if ctx.Err() != nil {
				return
			}
			u.log.Error("routed UDP frontends not updated; trying again", "frontends", len(want), "err", err)
			// A new model, built with what is held now (the failed pass may have changed it).
			go func() {
				select {
				case <-ctx.Done():
				case <-time.After(u.retry):
					u.rebuild()
				}
			}()
		}
	}
}

func (u *udpCapture) apply(ctx context.Context, m *model.Mesh, want []model.UDPFrontend) error {
	// A frontend whose local port a held frontend of another VIP or port still has waits: the
	// node's listener on that port serves the held one (xds udpServed) until no pod redirects to
	// it, which this pass sees to; the rebuild after it brings the frontend in.
	held := u.Held()
	want = slices.DeleteFunc(slices.Clone(want), func(f model.UDPFrontend) bool {
		return slices.ContainsFunc(held, func(h model.UDPFrontend) bool {
			return h.LocalPort == f.LocalPort && (h.VIP != f.VIP || h.Port != f.Port)
		})
	})
	if err := u.acked(ctx, m); err != nil {
		return err
	}
	rs := make([]capture.UDPRedirect, len(want))
	for i, f := range want {
		rs[i] = capture.UDPRedirect{VIP: f.VIP, Port: f.Port, LocalPort: f.LocalPort}
	}
	if err := u.set(ctx, rs); err != nil {
		// Some pods may have the new redirects: hold both sets until a pass succeeds.
		u.mu.Lock()
		for _, f := range want {
			if !slices.ContainsFunc(u.held, func(h model.UDPFrontend) bool {
				return h.LocalPort == f.LocalPort && h.VIP == f.VIP && h.Port == f.Port
			}) {
				u.held = append(u.held, f)
			}
		}
		u.changedHeld()
		u.mu.Unlock()
		return err
	}
	u.mu.Lock()
	u.held = want
	u.synced = true
	u.changedHeld()
	u.mu.Unlock()
	u.log.Info("routed UDP frontends in the pods' capture", "frontends", len(want))
	u.rebuild()
	return nil
}

// sameUDP reports whether a and b redirect the same VIPs and ports to the same local ports to
// the same routes.
func sameUDP(a, b []model.UDPFrontend) bool {
	return slices.EqualFunc(a, b, func(x, y model.UDPFrontend) bool {
		return x.VIP == y.VIP && x.Port == y.Port && x.LocalPort == y.LocalPort && x.Route.Route == y.Route.Route
	})
}
