package spire

import (
	"context"
	"sync"
	"time"

	"github.com/aethermesh/aether/identity"
)

// Provider is the identity.Provider of a node whose SVIDs come from its SPIRE agent: the pods
// asked for are the Delegate's whole set (SetPods: a pod no longer asked for loses its
// subscription and SVIDs), and each pod's SVID is the one SPIRE issued it under the SPIFFE ID
// the mesh gives it (spiffe://<trustDomain>/ns/<ns>/sa/<sa>): an SVID of another ID (a
// ClusterSPIFFEID whose template gives another name) is never served for it, since every
// authorization policy and SAN pin names that ID.
type Provider struct {
	d           *Delegate
	trustDomain string
	owner       string
	changed     chan struct{}
	// settle, when set, is how long the first SVIDs call made while the SPIRE agent serves the
	// bundle waits for its pods' subscriptions to answer (SettleFirst).
	settle time.Duration

	mu      sync.Mutex
	uids    []string        // the pods of the last SVIDs call
	lacking map[string]bool // of those, the pods without an SVID of their own
	settled bool
	closed  bool
}

// NewProvider returns the Provider over d (started) for the mesh's trust domain name; owner
// names its set of pods among the Delegate's users (Delegate.SetPods). Close releases it.
func NewProvider(d *Delegate, trustDomain, owner string) *Provider {
	return &Provider{d: d, trustDomain: trustDomain, owner: owner, changed: d.watch()}
}

// SettleFirst makes the first SVIDs call made while the SPIRE agent serves the mesh's bundle
// wait, up to timeout, until every pod's subscription has answered (SVIDs, or none, or an
// error): a restarted node agent then serves the pods it already had with their SVIDs at
// once, instead of a first snapshot without them (which would take the pods' listeners out of
// the Envoy that outlived the agent).
func (p *Provider) SettleFirst(timeout time.Duration) { p.settle = timeout }

// Close releases the Provider's pods (their subscriptions end unless another owner lists them)
// and its change channel; SVIDs asks for nothing afterwards.
func (p *Provider) Close() {
	p.mu.Lock()
	p.uids, p.closed = nil, true
	p.mu.Unlock()
	p.d.SetPods(p.owner, nil)
	p.d.unwatch(p.changed)
}

// Lacks implements identity.Provider: whether the pod with uid had no SVID of its own with its
// SPIFFE ID at the last SVIDs call, even if another pod of the same ID has one.
func (p *Provider) Lacks(uid string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lacking[uid]
}

// SVIDs implements identity.Provider: of each pod's SVIDs with the pod's SPIFFE ID, the one
// that expires last, by ID (the latest of the pods sharing an ID). A pod without one yet (its
// entry has not reached the node) is left out; changed is always true when any is given (the
// xDS builder compares what it serves).
func (p *Provider) SVIDs(ctx context.Context, pods []identity.Workload) (map[string]*identity.SVID, bool, error) {
	uids := make([]string, len(pods))
	for i, w := range pods {
		uids[i] = w.UID
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false, nil
	}
	p.uids = uids
	settle := p.settle > 0 && !p.settled
	p.mu.Unlock()
	p.d.SetPods(p.owner, pods)
	if settle {
		if b, _ := p.d.Bundles(); len(b[p.trustDomain]) > 0 {
			p.d.waitAnswered(ctx, uids, p.settle)
			p.mu.Lock()
			p.settled = true
			p.mu.Unlock()
		}
	}
	out := make(map[string]*identity.SVID, len(pods))
	lacking := map[string]bool{}
	for _, w := range pods {
		st, _ := p.d.Pod(w.UID)
		own := false
		for _, s := range st.SVIDs {
			if s.SPIFFEID != w.SPIFFEID {
				continue
			}
			own = true
			if cur := out[w.SPIFFEID]; cur == nil || s.NotAfter.After(cur.NotAfter) {
				out[w.SPIFFEID] = s
			}
		}
		if !own {
			lacking[w.UID] = true
		}
	}
	p.mu.Lock()
	p.lacking = lacking
	p.mu.Unlock()
	return out, len(out) > 0, nil
}

// Bundles implements identity.Provider: the bundles the SPIRE agent last sent, by trust domain
// (the mesh's own, once it sent it, and those of the trust domains its server federates with).
func (p *Provider) Bundles() map[string][]byte {
	b, _ := p.d.Bundles()
	return b
}

// NextRenewal implements identity.Provider: the earliest expiry of the SVIDs of the Provider's
// pods, when a withdrawn SVID leaves its pod (SPIRE renews the others and says so through
// Changed).
func (p *Provider) NextRenewal() time.Time {
	p.mu.Lock()
	uids := p.uids
	p.mu.Unlock()
	var t time.Time
	for _, uid := range uids {
		st, _ := p.d.Pod(uid)
		for _, s := range st.SVIDs {
			if t.IsZero() || s.NotAfter.Before(t) {
				t = s.NotAfter
			}
		}
	}
	return t
}

// Changed implements identity.Provider: the Delegate's changes (SVIDs, bundles, errors), on a
// channel of the Provider's own.
func (p *Provider) Changed() <-chan struct{} { return p.changed }
