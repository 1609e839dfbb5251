package spire

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	delegatedidentityv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/agent/delegatedidentity/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/aethermesh/aether/identity"
	"github.com/aethermesh/aether/internal/testenv"
)

// devCA returns a development CA of trust domain td, to mint the SVIDs a fake agent sends.
func devCA(t *testing.T, td string) *identity.DevCA {
	t.Helper()
	ca, err := testenv.NewCA("spire test CA")
	if err != nil {
		t.Fatal(err)
	}
	dev, err := identity.NewDevCA(ca.CertPEM, ca.KeyPEM, td, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return dev
}

// toProto turns an SVID into what the Delegated Identity API sends.
func toProto(t *testing.T, s *identity.SVID) *delegatedidentityv1.X509SVIDWithKey {
	t.Helper()
	var chain [][]byte
	for rest := s.CertChainPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		chain = append(chain, b.Bytes)
	}
	kb, _ := pem.Decode(s.KeyPEM)
	td, path, _ := strings.Cut(strings.TrimPrefix(s.SPIFFEID, "spiffe://"), "/")
	return &delegatedidentityv1.X509SVIDWithKey{
		X509Svid:    &types.X509SVID{CertChain: chain, Id: &types.SPIFFEID{TrustDomain: td, Path: "/" + path}, ExpiresAt: s.NotAfter.Unix()},
		X509SvidKey: kb.Bytes,
	}
}

func TestSVIDFromProto(t *testing.T) {
	ca := devCA(t, "td.example")
	good, err := ca.Issue(context.Background(), "spiffe://td.example/ns/shop/sa/web")
	if err != nil {
		t.Fatal(err)
	}
	other, err := ca.Issue(context.Background(), "spiffe://td.example/ns/shop/sa/db")
	if err != nil {
		t.Fatal(err)
	}
	p := toProto(t, good)
	got, err := SVIDFromProto(p)
	if err != nil {
		t.Fatal(err)
	}
	if got.SPIFFEID != good.SPIFFEID || string(got.CertChainPEM) != string(good.CertChainPEM) || string(got.KeyPEM) != string(good.KeyPEM) ||
		!got.NotAfter.Equal(good.NotAfter.Truncate(time.Second)) {
		t.Fatalf("converted %s (not after %s), want %s (not after %s), same chain and key", got.SPIFFEID, got.NotAfter, good.SPIFFEID, good.NotAfter)
	}
	for _, tc := range []struct {
		name string
		mut  func(*delegatedidentityv1.X509SVIDWithKey)
		want string
	}{
		{"another's key", func(p *delegatedidentityv1.X509SVIDWithKey) { p.X509SvidKey = toProto(t, other).X509SvidKey }, "not the leaf certificate's"},
		{"an ID the leaf does not carry", func(p *delegatedidentityv1.X509SVIDWithKey) { p.X509Svid.Id.Path = "/ns/shop/sa/admin" }, "want only spiffe://td.example/ns/shop/sa/admin"},
		{"no certificate", func(p *delegatedidentityv1.X509SVIDWithKey) { p.X509Svid.CertChain = nil }, "without an ID or a certificate"},
		{"garbage certificate", func(p *delegatedidentityv1.X509SVIDWithKey) { p.X509Svid.CertChain = [][]byte{{1, 2, 3}} }, "certificate 0"},
		{"garbage key", func(p *delegatedidentityv1.X509SVIDWithKey) { p.X509SvidKey = []byte{1} }, "key:"},
	} {
		p := toProto(t, good)
		tc.mut(p)
		if _, err := SVIDFromProto(p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

// fakeAgent is a Delegated Identity server at the test's boundary: it answers a subscription whose
// selectors hold one k8s:pod-uid:<uid> (and only k8s selectors) with svids[uid], sends again on
// push, refuses everyone when deny is set, and
// counts the open pod streams.
type fakeAgent struct {
	delegatedidentityv1.UnimplementedDelegatedIdentityServer
	mu     sync.Mutex
	svids  map[string][]*delegatedidentityv1.X509SVIDWithKey
	deny   bool
	open   map[string]int
	push   chan struct{}
	bundle map[string][]byte
	// delay holds each subscription's first answer back (a SPIRE agent slow to answer).
	delay time.Duration
}

func (f *fakeAgent) SubscribeToX509SVIDs(req *delegatedidentityv1.SubscribeToX509SVIDsRequest, s grpc.ServerStreamingServer[delegatedidentityv1.SubscribeToX509SVIDsResponse]) error {
	f.mu.Lock()
	deny := f.deny
	f.mu.Unlock()
	if deny {
		return status.Error(codes.PermissionDenied, "caller not authorized")
	}
	uid := ""
	for _, sel := range req.Selectors {
		if sel.Type != "k8s" {
			return status.Errorf(codes.InvalidArgument, "selectors %v", req.Selectors)
		}
		if v, ok := strings.CutPrefix(sel.Value, "pod-uid:"); ok {
			if uid != "" {
				return status.Errorf(codes.InvalidArgument, "selectors %v: two pod UIDs", req.Selectors)
			}
			uid = v
		}
	}
	if uid == "" {
		return status.Errorf(codes.InvalidArgument, "selectors %v: no pod UID", req.Selectors)
	}
	f.mu.Lock()
	f.open[uid]++
	f.mu.Unlock()
	defer func() { f.mu.Lock(); f.open[uid]--; f.mu.Unlock() }()
	f.mu.Lock()
	delay := f.delay
	f.mu.Unlock()
	time.Sleep(delay)
	for {
		f.mu.Lock()
		resp := &delegatedidentityv1.SubscribeToX509SVIDsResponse{X509Svids: f.svids[uid]}
		push := f.push
		f.mu.Unlock()
		if err := s.Send(resp); err != nil {
			return err
		}
		select {
		case <-s.Context().Done():
			return nil
		case <-push:
		}
	}
}

func (f *fakeAgent) SubscribeToX509Bundles(_ *delegatedidentityv1.SubscribeToX509BundlesRequest, s grpc.ServerStreamingServer[delegatedidentityv1.SubscribeToX509BundlesResponse]) error {
	f.mu.Lock()
	b := f.bundle
	f.mu.Unlock()
	if err := s.Send(&delegatedidentityv1.SubscribeToX509BundlesResponse{CaCertificates: b}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// serve starts f on the unix socket at path; stop ends it and its streams.
func serve(t *testing.T, f *fakeAgent, path string) (stop func()) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	delegatedidentityv1.RegisterDelegatedIdentityServer(s, f)
	go func() { _ = s.Serve(l) }()
	return s.Stop
}

// fakeWorld is a development CA minting SVIDs and a fake agent serving them with the CA's bundle.
type fakeWorld struct {
	ca *identity.DevCA
	f  *fakeAgent
}

// newFakeWorld returns a fakeWorld of trust domain td.example whose agent holds, for each pod
// UID of ids, an SVID of the SPIFFE ID ids gives it.
func newFakeWorld(t *testing.T, ids map[string]string) *fakeWorld {
	t.Helper()
	w := &fakeWorld{ca: devCA(t, "td.example")}
	bundleBlock, _ := pem.Decode(w.ca.BundlePEM())
	w.f = &fakeAgent{svids: map[string][]*delegatedidentityv1.X509SVIDWithKey{}, open: map[string]int{}, push: make(chan struct{}),
		bundle: map[string][]byte{"spiffe://td.example": bundleBlock.Bytes}}
	for uid, id := range ids {
		w.f.svids[uid] = []*delegatedidentityv1.X509SVIDWithKey{w.issue(t, id)}
	}
	return w
}

// issue mints an SVID of id as the agent sends it.
func (w *fakeWorld) issue(t *testing.T, id string) *delegatedidentityv1.X509SVIDWithKey {
	t.Helper()
	s, err := w.ca.Issue(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return toProto(t, s)
}

// TestDelegateFollowsPods drives a Delegate against a fake SPIRE agent (the gRPC boundary; the
// real agent is in TestPrivilegedSPIRE): SVIDs of the pods set arrive and follow rotations; a
// pod taken out of the set loses its SVIDs and its stream; an agent restart keeps the SVIDs
// (with the error) until the subscription is back; an update without SVIDs keeps the last one,
// withdrawn; a caller the agent refuses is told why.
func TestDelegateFollowsPods(t *testing.T) {
	w := newFakeWorld(t, map[string]string{"uid-web": "spiffe://td.example/ns/shop/sa/web", "uid-db": "spiffe://td.example/ns/shop/sa/db"})
	ca, f := w.ca, w.f
	issue := func(id string) *delegatedidentityv1.X509SVIDWithKey { return w.issue(t, id) }
	sock := filepath.Join(t.TempDir(), "admin.sock")
	stop := serve(t, f, sock)
	d, err := New(Config{AdminSocket: sock, RetryMin: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d.Start(ctx)
	d.SetPods("test", []identity.Workload{{UID: "uid-web"}, {UID: "uid-db"}})

	svidOf := func(uid string) (string, time.Time, error) {
		st, ok := d.Pod(uid)
		switch {
		case !ok:
			return "", time.Time{}, nil
		case len(st.SVIDs) == 0:
			return "", st.Updated, st.Err
		}
		return st.SVIDs[0].SPIFFEID, st.Updated, st.Err
	}
	testenv.Eventually(t, 10*time.Second, "both pods' SVIDs and the bundle", func() error {
		for uid, want := range map[string]string{"uid-web": "spiffe://td.example/ns/shop/sa/web", "uid-db": "spiffe://td.example/ns/shop/sa/db"} {
			if got, _, err := svidOf(uid); got != want || err != nil {
				return fmt.Errorf("%s: %q, %v; want %s", uid, got, err, want)
			}
		}
		if b, err := d.Bundles(); string(b["td.example"]) != string(ca.BundlePEM()) || err != nil {
			return fmt.Errorf("bundles %v, %v", b, err)
		}
		return nil
	})
	select {
	case <-d.Changed():
	default:
		t.Fatal("Changed not signalled")
	}

	// A rotation: the agent sends a new SVID on the same stream.
	_, before, _ := svidOf("uid-web")
	rotated := issue("spiffe://td.example/ns/shop/sa/web")
	f.mu.Lock()
	f.svids["uid-web"] = []*delegatedidentityv1.X509SVIDWithKey{rotated}
	close(f.push)
	f.push = make(chan struct{})
	f.mu.Unlock()
	testenv.Eventually(t, 10*time.Second, "the rotated SVID", func() error {
		st, _ := d.Pod("uid-web")
		if len(st.SVIDs) != 1 || st.SVIDs[0].NotBefore.Equal(time.Time{}) || !st.Updated.After(before) {
			return fmt.Errorf("%+v", st)
		}
		if got := toProto(t, st.SVIDs[0]); string(got.X509SvidKey) != string(rotated.X509SvidKey) {
			return fmt.Errorf("still the old SVID")
		}
		return nil
	})

	// The agent sends db nothing (its entry went): the last SVID stays, marked withdrawn.
	f.mu.Lock()
	f.svids["uid-db"] = nil
	close(f.push)
	f.push = make(chan struct{})
	f.mu.Unlock()
	testenv.Eventually(t, 10*time.Second, "db's SVID withdrawn, kept", func() error {
		st, _ := d.Pod("uid-db")
		if !st.Withdrawn || len(st.SVIDs) != 1 || st.SVIDs[0].SPIFFEID != "spiffe://td.example/ns/shop/sa/db" {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})

	// db leaves the node: its SVIDs are forgotten at once and its stream closes.
	d.SetPods("test", []identity.Workload{{UID: "uid-web"}})
	if _, ok := d.Pod("uid-db"); ok {
		t.Fatal("uid-db still held after SetPods left it out")
	}
	testenv.Eventually(t, 10*time.Second, "db's stream closed", func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.open["uid-db"] != 0 {
			return fmt.Errorf("%d streams open", f.open["uid-db"])
		}
		return nil
	})

	// The agent goes away: web keeps its SVID, with the error; back, the error clears.
	stop()
	testenv.Eventually(t, 10*time.Second, "the break recorded", func() error {
		if id, _, err := svidOf("uid-web"); id == "" || err == nil {
			return fmt.Errorf("%q, %v; want the SVID kept and an error", id, err)
		}
		return nil
	})
	stop = serve(t, f, sock)
	defer stop()
	testenv.Eventually(t, 10*time.Second, "the subscription back", func() error {
		if id, _, err := svidOf("uid-web"); id == "" || err != nil {
			return fmt.Errorf("%q, %v", id, err)
		}
		return nil
	})

	// A caller the agent refuses is told to look at authorized_delegates.
	f.mu.Lock()
	f.deny = true
	f.mu.Unlock()
	d.SetPods("test", []identity.Workload{{UID: "uid-web"}, {UID: "uid-new"}})
	testenv.Eventually(t, 10*time.Second, "the refusal explained", func() error {
		st, _ := d.Pod("uid-new")
		if st.Err == nil || !strings.Contains(st.Err.Error(), "authorized_delegates") || status.Code(st.Err) != codes.PermissionDenied {
			return fmt.Errorf("%v", st.Err)
		}
		return nil
	})
}

func TestNewRefusesNoSocket(t *testing.T) {
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "AdminSocket") {
		t.Fatalf("New without a socket = %v, want an error naming AdminSocket", err)
	}
}

// TestProviderServesOnlyThePodsID: the Provider subscribes to exactly the pods asked for, serves
// for each SPIFFE ID an SVID one of its pods got under that ID (never one of another ID, as a
// ClusterSPIFFEID with another template would give), leaves out pods without one, gives the
// mesh trust domain's bundle and the earliest expiry, and passes the Delegate's changes on.
func TestProviderServesOnlyThePodsID(t *testing.T) {
	w := newFakeWorld(t, map[string]string{
		"uid-web":   "spiffe://td.example/ns/shop/sa/web",
		"uid-rogue": "spiffe://td.example/ns/shop/sa/admin", // not its mesh ID
	})
	ca, f := w.ca, w.f
	// uid-web2 is another pod of web's service account that has no entry (out of the
	// ClusterSPIFFEID's selector).
	sock := filepath.Join(t.TempDir(), "admin.sock")
	defer serve(t, f, sock)()
	d, err := New(Config{AdminSocket: sock, RetryMin: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d.Start(ctx)
	p := NewProvider(d, "td.example", "test")
	var _ identity.Provider = p
	pods := []identity.Workload{
		{UID: "uid-web", SPIFFEID: "spiffe://td.example/ns/shop/sa/web"},
		{UID: "uid-rogue", SPIFFEID: "spiffe://td.example/ns/shop/sa/rogue"},
		{UID: "uid-new", SPIFFEID: "spiffe://td.example/ns/shop/sa/new"}, // no entry yet
		{UID: "uid-web2", SPIFFEID: "spiffe://td.example/ns/shop/sa/web"},
	}
	testenv.Eventually(t, 10*time.Second, "web's SVID and the bundle", func() error {
		svids, _, err := p.SVIDs(ctx, pods)
		if err != nil || len(svids) != 1 || svids["spiffe://td.example/ns/shop/sa/web"] == nil {
			return fmt.Errorf("%v, %v; want web's only", svids, err)
		}
		if b := p.Bundles(); len(b) != 1 || string(b["td.example"]) != string(ca.BundlePEM()) {
			return fmt.Errorf("bundles %q; want td.example's only", b)
		}
		return nil
	})
	// Each pod lacking an SVID of its own is named, web2 too although web's ID is served.
	for _, w := range pods {
		if want := w.UID != "uid-web"; p.Lacks(w.UID) != want {
			t.Errorf("Lacks(%s) = %v, want %v", w.UID, !want, want)
		}
	}
	if nr := p.NextRenewal(); nr.IsZero() || nr.After(time.Now().Add(time.Hour+time.Minute)) {
		t.Fatalf("NextRenewal = %s, want web's expiry within the hour", nr)
	}
	select {
	case <-p.Changed():
	default:
		t.Fatal("the Delegate's changes are not passed on")
	}
	// Another owner (an edge pod's server) asking for web keeps web's subscription when p
	// leaves it; each Provider gets every change on its own channel.
	edge := NewProvider(d, "td.example", "edge")
	if _, _, err := edge.SVIDs(ctx, pods[:1]); err != nil {
		t.Fatal(err)
	}
	d.notify()
	for name, ch := range map[string]<-chan struct{}{"node": p.Changed(), "edge": edge.Changed()} {
		select {
		case <-ch:
		case <-time.After(time.Second):
			t.Errorf("the %s Provider missed a change (another took its wake-up)", name)
		}
	}
	svids, _, _ := p.SVIDs(ctx, pods[1:])
	if len(svids) != 0 {
		t.Fatalf("after web left: %v", svids)
	}
	if _, ok := d.Pod("uid-web"); !ok {
		t.Fatal("web's subscription closed while another owner still asks for it")
	}
	// Left by every owner: its subscription closes and nothing is served for it.
	edge.Close()
	if _, ok := d.Pod("uid-web"); ok {
		t.Fatal("web still subscribed after it left the pods asked for")
	}
}

// TestProviderSettleFirst: a restarted node agent's first SVIDs call, made while the SPIRE agent
// serves the bundle, waits for its pods' subscriptions to answer (SettleFirst), so the first
// snapshot holds the pods it had; a Provider without it answers at once, without them; later
// calls never wait.
func TestProviderSettleFirst(t *testing.T) {
	for _, settle := range []bool{true, false} {
		w := newFakeWorld(t, map[string]string{"uid-web": "spiffe://td.example/ns/shop/sa/web"})
		w.f.delay = 300 * time.Millisecond
		sock := filepath.Join(t.TempDir(), "admin.sock")
		stop := serve(t, w.f, sock)
		d, err := New(Config{AdminSocket: sock, RetryMin: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		d.Start(ctx)
		testenv.Eventually(t, 10*time.Second, "the bundle", func() error {
			if b, _ := d.Bundles(); len(b["td.example"]) == 0 {
				return errors.New("no bundle yet")
			}
			return nil
		})
		p := NewProvider(d, "td.example", "node")
		if settle {
			p.SettleFirst(5 * time.Second)
		}
		pods := []identity.Workload{{UID: "uid-web", SPIFFEID: "spiffe://td.example/ns/shop/sa/web"}}
		svids, _, err := p.SVIDs(ctx, pods)
		if err != nil {
			t.Fatal(err)
		}
		if got := svids["spiffe://td.example/ns/shop/sa/web"] != nil; got != settle {
			t.Errorf("settle %v: the first call served web's SVID: %v", settle, got)
		}
		// A new pod later: no wait (its subscription answers 300 ms later).
		start := time.Now()
		if _, _, err := p.SVIDs(ctx, append(pods, identity.Workload{UID: "uid-new", SPIFFEID: "spiffe://td.example/ns/shop/sa/new"})); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 200*time.Millisecond {
			t.Errorf("settle %v: a later call waited %s", settle, took)
		}
		cancel()
		stop()
	}
}

// TestPodSelectors: a pod with the mesh's SPIFFE ID is asked for by its UID, namespace and
// service account, as SPIRE's k8s workload attestor reports them; one without (or with another
// shape of ID) by its UID alone.
func TestPodSelectors(t *testing.T) {
	str := func(sels []*types.Selector) []string {
		var out []string
		for _, s := range sels {
			out = append(out, s.Type+":"+s.Value)
		}
		return out
	}
	for _, c := range []struct {
		w    identity.Workload
		want []string
	}{
		{identity.Workload{UID: "u1", SPIFFEID: "spiffe://td.example/ns/shop/sa/web"}, []string{"k8s:pod-uid:u1", "k8s:ns:shop", "k8s:sa:web"}},
		{identity.Workload{UID: "u2"}, []string{"k8s:pod-uid:u2"}},
		{identity.Workload{UID: "u3", SPIFFEID: "spiffe://td.example/workload/web"}, []string{"k8s:pod-uid:u3"}},
		{identity.Workload{UID: "u4", SPIFFEID: "spiffe://td.example/ns/shop/sa/web/extra"}, []string{"k8s:pod-uid:u4"}},
	} {
		if got := str(PodSelectors(c.w)); !slices.Equal(got, c.want) {
			t.Errorf("PodSelectors(%+v) = %q, want %q", c.w, got, c.want)
		}
	}
}
