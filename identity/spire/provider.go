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

	mu   sync.Mutex
	uids []string // the pods of the last SVIDs call
}

// NewProvider returns the Provider over d (started) for the mesh's trust domain name; owner
// names its set of pods among the Delegate's users (Delegate.SetPods).
func NewProvider(d *Delegate, trustDomain, owner string) *Provider {
	return &Provider{d: d, trustDomain: trustDomain, owner: owner}
}

// Close releases the Provider's pods: their subscriptions end unless another owner lists them.
func (p *Provider) Close() {
	p.mu.Lock()
	p.uids = nil
	p.mu.Unlock()
	p.d.SetPods(p.owner, nil)
}

// SVIDs implements identity.Provider: of each pod's SVIDs with the pod's SPIFFE ID, the one
// that expires last, by ID (the latest of the pods sharing an ID). A pod without one yet (its
// entry has not reached the node) is left out; changed is always true when any is given (the
// xDS builder compares what it serves).
func (p *Provider) SVIDs(_ context.Context, pods []identity.Workload) (map[string]*identity.SVID, bool, error) {
	uids := make([]string, len(pods))
	for i, w := range pods {
		uids[i] = w.UID
	}
	p.mu.Lock()
	p.uids = uids
	p.mu.Unlock()
	p.d.SetPods(p.owner, uids)
	out := make(map[string]*identity.SVID, len(pods))
	for _, w := range pods {
		st, _ := p.d.Pod(w.UID)
		for _, s := range st.SVIDs {
			if s.SPIFFEID != w.SPIFFEID {
				continue
			}
			if cur := out[w.SPIFFEID]; cur == nil || s.NotAfter.After(cur.NotAfter) {
				out[w.SPIFFEID] = s
			}
		}
	}
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

// Changed implements identity.Provider: the Delegate's changes (SVIDs, bundles, errors).
func (p *Provider) Changed() <-chan struct{} { return p.d.Changed() }
