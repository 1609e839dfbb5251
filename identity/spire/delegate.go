// Package spire gets the X.509 SVIDs of a node's pods, and the trust bundles, from the node's
// SPIRE agent through its Delegated Identity API (spire-api-sdk
// spire/api/agent/delegatedidentity/v1, served on the agent's admin socket, admin_socket_path, to
// the workloads whose SPIFFE IDs its authorized_delegates lists).
//
// The node agent asks for a pod by the pod's selectors, never by a process: at CNI ADD the pod has
// no application process yet. The SPIRE Controller Manager registers each pod a ClusterSPIFFEID
// selects with the selector k8s:pod-uid:<uid> under the SPIFFE ID of its node's SPIRE agent, so a
// SPIRE agent only ever holds the entries of its own node's pods; among those, the node agent's
// own record of the pods it attached (the caller of SetPods) is the only guard against asking for
// another pod's identity.
package spire

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	delegatedidentityv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/agent/delegatedidentity/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/aethermesh/aether/identity"
)

// PodSelectors are the workload selectors the Delegate asks SPIRE with for pod w, as SPIRE's k8s
// workload attestor reports them for a process of that pod: k8s:pod-uid:<uid>, which the SPIRE
// Controller Manager's entries carry (spire-controller-manager pkg/spireentry), and, when w's
// SPIFFE ID is the mesh's spiffe://<td>/ns/<namespace>/sa/<service account> (the agent derives
// it from the pod's spec in the API server), k8s:ns:<namespace> and k8s:sa:<service account>,
// which an entry may require besides (workloadSelectorTemplates: the chart's aether-edge requires
// the edge Gateway's ServiceAccount). SPIRE answers with the entries whose selectors are all
// among these.
func PodSelectors(w identity.Workload) []*types.Selector {
	out := []*types.Selector{{Type: "k8s", Value: "pod-uid:" + w.UID}}
	if id, err := spiffeid.FromString(w.SPIFFEID); err == nil {
		if seg := strings.Split(strings.TrimPrefix(id.Path(), "/"), "/"); len(seg) == 4 && seg[0] == "ns" && seg[2] == "sa" && seg[1] != "" && seg[3] != "" {
			out = append(out, &types.Selector{Type: "k8s", Value: "ns:" + seg[1]}, &types.Selector{Type: "k8s", Value: "sa:" + seg[3]})
		}
	}
	return out
}

// Config configures a Delegate.
type Config struct {
	// AdminSocket is the path of the SPIRE agent's admin socket (its admin_socket_path).
	AdminSocket string
	// Logger receives subscription errors and recoveries (default: discarded).
	Logger *slog.Logger
	// RetryMin and RetryMax bound the backoff before a broken subscription is opened again
	// (defaults 200 ms and 10 s; each wait doubles, with jitter).
	RetryMin, RetryMax time.Duration
}

// PodState is what a Delegate holds for one pod.
type PodState struct {
	// SVIDs are the pod's current X.509 SVIDs, as the SPIRE agent last sent them (one per
	// registration entry that matches the pod; the Controller Manager writes one per
	// ClusterSPIFFEID selecting the pod), less those expired. They stay while the subscription
	// is broken, and when the agent sends none (Withdrawn), until they expire: neither a SPIRE
	// agent restart nor a pod leaving its ClusterSPIFFEID cuts the pod's connections before
	// its SVID's end; it is no longer renewed.
	SVIDs []*identity.SVID
	// Withdrawn is set when the SPIRE agent's last update held no SVID for the pod (no entry
	// matches it any more, or not yet): SVIDs are the last ones it sent, not renewed.
	Withdrawn bool
	// Updated is when the SPIRE agent last sent them (zero: never).
	Updated time.Time
	// Err is why the subscription is broken (nil while it is up), with the SPIRE agent's status:
	// PermissionDenied when the caller is not one of its authorized_delegates.
	Err error
}

// Delegate keeps one Delegated Identity subscription per pod of the node (SetPods) and one to
// the trust bundles, opened again after any break. It is safe for concurrent use.
type Delegate struct {
	cfg    Config
	conn   *grpc.ClientConn
	client delegatedidentityv1.DelegatedIdentityClient
	ctx    context.Context

	mu      sync.Mutex
	pods    map[string]*podSub
	owners  map[string]map[string]identity.Workload // SetPods' owner -> its pods by UID
	bundles map[string][]byte                       // trust domain name -> CA certificates, PEM
	bundErr error
	changed chan struct{}
	// watchers are the Providers' own change channels (watch), each signalled like changed;
	// wmu guards them (taken after mu, never before).
	wmu      sync.Mutex
	watchers map[chan struct{}]bool
}

type podSub struct {
	cancel context.CancelFunc
	w      identity.Workload // the pod as SetPods named it (its selectors: PodSelectors)
	state  PodState
}

// New returns a Delegate for the SPIRE agent whose admin socket is cfg.AdminSocket. It does not
// connect: Start does, and keeps connecting until its context ends. It returns an error naming
// the field when cfg.AdminSocket is empty.
func New(cfg Config) (*Delegate, error) {
	if cfg.AdminSocket == "" {
		return nil, errors.New("spire: Config.AdminSocket: empty; want the SPIRE agent's admin_socket_path")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = 200 * time.Millisecond
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = max(10*time.Second, cfg.RetryMin)
	}
	conn, err := grpc.NewClient("unix://"+cfg.AdminSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("spire: admin socket %s: %w", cfg.AdminSocket, err)
	}
	return &Delegate{
		cfg: cfg, conn: conn, client: delegatedidentityv1.NewDelegatedIdentityClient(conn),
		pods: map[string]*podSub{}, owners: map[string]map[string]identity.Workload{}, changed: make(chan struct{}, 1),
		watchers: map[chan struct{}]bool{},
	}, nil
}

// Start subscribes to the trust bundles and serves SetPods' subscriptions until ctx ends, then
// closes the connection. It does not block.
func (d *Delegate) Start(ctx context.Context) {
	d.mu.Lock()
	d.ctx = ctx
	d.mu.Unlock()
	go d.keep(ctx, "trust bundles", d.bundleStream)
	context.AfterFunc(ctx, func() { _ = d.conn.Close() })
}

// Changed is signalled (without blocking, coalesced) whenever a pod's SVIDs, a subscription's
// error or the trust bundles change.
func (d *Delegate) Changed() <-chan struct{} { return d.changed }

// watch returns a channel of its own signalled (coalesced) as Changed is, until unwatch: each
// user of the Delegate waits on its own, so none takes another's wake-up.
func (d *Delegate) watch() chan struct{} {
	ch := make(chan struct{}, 1)
	d.wmu.Lock()
	d.watchers[ch] = true
	d.wmu.Unlock()
	return ch
}

func (d *Delegate) unwatch(ch chan struct{}) {
	d.wmu.Lock()
	delete(d.watchers, ch)
	d.wmu.Unlock()
}

// notify signals Changed and every watcher, without blocking. Called with or without d.mu held.
func (d *Delegate) notify() {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	for _, ch := range append([]chan struct{}{d.changed}, slices.Collect(maps.Keys(d.watchers))...) {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// SetPods sets owner's pods to pods (none: owner is forgotten) and makes the Delegate subscribe
// to the SVIDs of exactly the pods some owner lists, by their selectors (PodSelectors): it opens
// a subscription for each new one (or one whose SPIFFE ID changed) and closes those of the pods
// no owner lists any more, whose SVIDs it forgets at once. Owners are the Delegate's users (the
// node proxy, each edge pod's server); call it with the pods this node attached, and only those,
// each with the SPIFFE ID its spec in the API server gives. It panics when called before Start.
func (d *Delegate) SetPods(owner string, pods []identity.Workload) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil {
		panic("spire: SetPods before Start")
	}
	if len(pods) == 0 {
		delete(d.owners, owner)
	} else {
		set := make(map[string]identity.Workload, len(pods))
		for _, w := range pods {
			set[w.UID] = w
		}
		d.owners[owner] = set
	}
	want := map[string]identity.Workload{}
	for _, set := range d.owners {
		maps.Copy(want, set)
	}
	gone := false
	for uid, s := range d.pods {
		if w, ok := want[uid]; !ok || w != s.w {
			s.cancel()
			delete(d.pods, uid)
			gone = true
		}
	}
	for uid, w := range want {
		if d.pods[uid] != nil {
			continue
		}
		ctx, cancel := context.WithCancel(d.ctx)
		sub := &podSub{cancel: cancel, w: w}
		d.pods[uid] = sub
		go d.keep(ctx, "pod "+uid, func(ctx context.Context) (bool, error) { return d.podStream(ctx, uid, sub) })
	}
	if gone {
		d.notify()
	}
}

// Pod returns what the Delegate holds for the pod with uid; ok is false for a pod SetPods did not
// list.
func (d *Delegate) Pod(uid string) (PodState, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.pods[uid]
	if s == nil {
		return PodState{}, false
	}
	st := s.state
	now := time.Now()
	st.SVIDs = slices.DeleteFunc(slices.Clone(st.SVIDs), func(sv *identity.SVID) bool { return !now.Before(sv.NotAfter) })
	return st, true
}

// waitAnswered waits until every pod of uids has had an answer on its subscription (SVIDs, none,
// or an error), timeout passes or ctx ends.
func (d *Delegate) waitAnswered(ctx context.Context, uids []string, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for {
		pending := false
		d.mu.Lock()
		for _, uid := range uids {
			if s := d.pods[uid]; s != nil && s.state.Updated.IsZero() && s.state.Err == nil {
				pending = true
				break
			}
		}
		d.mu.Unlock()
		if !pending || ctx.Err() != nil || !time.Now().Before(deadline) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Bundles returns the trust bundles the SPIRE agent last sent, PEM by trust domain name (its own
// and the federated ones), and the subscription's error (nil while it is up).
func (d *Delegate) Bundles() (map[string][]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.bundles), d.bundErr
}

// keep runs stream until ctx ends, again after each break (logged) with a growing wait, reset
// once a stream delivered something.
func (d *Delegate) keep(ctx context.Context, what string, stream func(context.Context) (delivered bool, err error)) {
	wait := d.cfg.RetryMin
	for {
		delivered, err := stream(ctx)
		if ctx.Err() != nil {
			return
		}
		if delivered {
			wait = d.cfg.RetryMin
		}
		d.cfg.Logger.Warn("SPIRE delegated identity subscription broken; opening it again", "subscription", what, "retry", wait, "err", err)
		t := time.NewTimer(wait + rand.N(wait/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, d.cfg.RetryMax)
	}
}

// podStream runs one subscription to the SVIDs of the pod with uid until it breaks.
func (d *Delegate) podStream(ctx context.Context, uid string, sub *podSub) (delivered bool, err error) {
	defer func() {
		if err != nil && ctx.Err() == nil {
			d.setPod(uid, sub, func(st *PodState) { st.Err = err })
		}
	}()
	stream, err := d.client.SubscribeToX509SVIDs(ctx, &delegatedidentityv1.SubscribeToX509SVIDsRequest{Selectors: PodSelectors(sub.w)})
	if err != nil {
		return false, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return delivered, explain(err)
		}
		svids := make([]*identity.SVID, 0, len(resp.X509Svids))
		var bad []error
		for _, p := range resp.X509Svids {
			s, err := SVIDFromProto(p)
			if err != nil {
				bad = append(bad, err)
				continue
			}
			svids = append(svids, s)
		}
		if len(bad) > 0 {
			d.cfg.Logger.Error("SPIRE agent sent SVIDs that cannot be used; left out", "pod_uid", uid, "err", errors.Join(bad...))
		}
		delivered = true
		d.setPod(uid, sub, func(st *PodState) {
			st.Updated, st.Err, st.Withdrawn = time.Now(), nil, len(svids) == 0
			if len(svids) > 0 {
				st.SVIDs = svids
			}
		})
	}
}

// setPod changes the state of the pod with uid, when sub is still its subscription, and
// notifies.
func (d *Delegate) setPod(uid string, sub *podSub, f func(*PodState)) {
	d.mu.Lock()
	cur := d.pods[uid] == sub // not a subscription SetPods closed (the pod may be back with another)
	if cur {
		f(&sub.state)
	}
	d.mu.Unlock()
	if cur {
		d.notify()
	}
}

// bundleStream runs one subscription to the trust bundles until it breaks.
func (d *Delegate) bundleStream(ctx context.Context) (delivered bool, err error) {
	defer func() {
		if err != nil && ctx.Err() == nil {
			d.mu.Lock()
			d.bundErr = err
			d.mu.Unlock()
			d.notify()
		}
	}()
	stream, err := d.client.SubscribeToX509Bundles(ctx, &delegatedidentityv1.SubscribeToX509BundlesRequest{})
	if err != nil {
		return false, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return delivered, explain(err)
		}
		bundles := make(map[string][]byte, len(resp.CaCertificates))
		for key, der := range resp.CaCertificates {
			// The agent keys them by trust domain ID ("spiffe://td"); aether by name.
			tdid, err := spiffeid.TrustDomainFromString(key)
			if err != nil {
				d.cfg.Logger.Error("SPIRE agent sent a trust bundle of an invalid trust domain; left out", "trust_domain", key, "err", err)
				continue
			}
			td := tdid.Name()
			certs, err := x509.ParseCertificates(der)
			if err != nil || len(certs) == 0 {
				d.cfg.Logger.Error("SPIRE agent sent a trust bundle that does not parse; left out", "trust_domain", td, "err", err)
				continue
			}
			var pemb []byte
			for _, c := range certs {
				pemb = append(pemb, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
			}
			bundles[td] = pemb
		}
		delivered = true
		if len(bundles) == 0 && len(resp.CaCertificates) > 0 {
			continue // none usable: keep the last good ones (logged above)
		}
		d.mu.Lock()
		d.bundles, d.bundErr = bundles, nil
		d.mu.Unlock()
		d.notify()
	}
}

// explain adds what a Delegated Identity status means for aether to err.
func explain(err error) error {
	switch status.Code(err) {
	case codes.PermissionDenied:
		return fmt.Errorf("the SPIRE agent refuses this caller (is its SPIFFE ID in the agent's authorized_delegates?): %w", err)
	case codes.Unavailable:
		return fmt.Errorf("the SPIRE agent's admin socket does not answer: %w", err)
	}
	return err
}

// SVIDFromProto converts an SVID the Delegated Identity API sent into aether's SVID: the chain
// (leaf first) and the key in PEM. It returns an error when the chain or the key does not parse,
// when the leaf's only URI SAN is not the SVID's SPIFFE ID, or when the key is not the leaf's.
func SVIDFromProto(p *delegatedidentityv1.X509SVIDWithKey) (*identity.SVID, error) {
	sv := p.GetX509Svid()
	if sv == nil || sv.Id == nil || len(sv.CertChain) == 0 {
		return nil, errors.New("SVID without an ID or a certificate")
	}
	id := (&url.URL{Scheme: "spiffe", Host: sv.Id.TrustDomain, Path: sv.Id.Path}).String()
	var chain []byte
	var leaf *x509.Certificate
	for i, der := range sv.CertChain {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("SVID %s: certificate %d: %w", id, i, err)
		}
		if i == 0 {
			leaf = c
		}
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id {
		return nil, fmt.Errorf("SVID %s: the leaf's URI SANs are %v, want only %s", id, leaf.URIs, id)
	}
	key, err := x509.ParsePKCS8PrivateKey(p.X509SvidKey)
	if err != nil {
		return nil, fmt.Errorf("SVID %s: key: %w", id, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("SVID %s: key of type %T cannot sign", id, key)
	}
	if pub, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(leaf.PublicKey) {
		return nil, fmt.Errorf("SVID %s: the key is not the leaf certificate's", id)
	}
	return &identity.SVID{
		SPIFFEID:     id,
		CertChainPEM: chain,
		KeyPEM:       pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p.X509SvidKey}),
		NotBefore:    leaf.NotBefore,
		NotAfter:     leaf.NotAfter,
		IssuedAt:     leaf.NotBefore,
	}, nil
}
