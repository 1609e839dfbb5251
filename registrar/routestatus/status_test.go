package routestatus

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	k8stesting "k8s.io/client-go/testing"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/aethermesh/aether/model"
)

func ptr[T any](v T) *T { return &v }

var (
	t0 = metav1.NewTime(time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC))
	t1 = metav1.NewTime(time.Date(2026, 1, 1, 11, 0, 0, 0, time.UTC))
)

// Parent refs as the API server stores them (defaults applied: group and kind set).
var (
	svcRef = gwv1.ParentReference{Group: ptr(gwv1.Group("")), Kind: ptr(gwv1.Kind("Service")), Name: "cart", Port: ptr(gwv1.PortNumber(80))}
	impRef = gwv1.ParentReference{Group: ptr(gwv1.Group("multicluster.x-k8s.io")), Kind: ptr(gwv1.Kind("ServiceImport")), Name: "cart"}
	gwRef  = gwv1.ParentReference{Group: ptr(gwv1.Group(gwv1.GroupName)), Kind: ptr(gwv1.Kind("Gateway")), Name: "edge"}
)

func accepted(msg string) model.Condition {
	return model.Condition{Status: true, Reason: "Accepted", Message: msg}
}

var resolved = model.Condition{Status: true, Reason: "ResolvedRefs"}

func cond(typ string, status metav1.ConditionStatus, reason, msg string, gen int64, at metav1.Time) metav1.Condition {
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen, LastTransitionTime: at}
}

func ours(ref gwv1.ParentReference, conds ...metav1.Condition) gwv1.RouteParentStatus {
	return gwv1.RouteParentStatus{ParentRef: ref, ControllerName: model.GatewayControllerName, Conditions: conds}
}

// foreign is another controller's entry for the Gateway parentRef.
var foreign = gwv1.RouteParentStatus{ParentRef: gwRef, ControllerName: "example.net/gateway-controller",
	Conditions: []metav1.Condition{cond("Accepted", metav1.ConditionTrue, "Accepted", "theirs", 1, t0)}}

// TestParentStatuses merges a route's resolved status into stored status.parents: each case is
// run a second time on its own output, later, which must change nothing (idempotent, so the
// controller writes nothing when nothing changed).
func TestParentStatuses(t *testing.T) {
	refs := []gwv1.ParentReference{gwRef, svcRef, impRef}
	for _, c := range []struct {
		name string
		have []gwv1.RouteParentStatus
		refs []gwv1.ParentReference
		st   model.RouteStatus
		want []gwv1.RouteParentStatus
	}{
		{
			name: "new entries after the foreign one, parentRefs copied",
			have: []gwv1.RouteParentStatus{foreign},
			refs: refs,
			st: model.RouteStatus{Generation: 3, Parents: []model.ParentStatus{
				{Index: 1, Accepted: accepted("bound to Service shop/cart:80"), ResolvedRefs: resolved},
				{Index: 2, Accepted: model.Condition{Reason: "NoMatchingParent", Message: "no import"}, ResolvedRefs: model.Condition{Reason: "BackendNotFound", Message: "gone"}},
			}},
			want: []gwv1.RouteParentStatus{
				foreign,
				ours(svcRef, cond("Accepted", "True", "Accepted", "bound to Service shop/cart:80", 3, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 3, t1)),
				ours(impRef, cond("Accepted", "False", "NoMatchingParent", "no import", 3, t1), cond("ResolvedRefs", "False", "BackendNotFound", "gone", 3, t1)),
			},
		},
		{
			name: "unchanged statuses keep their transition time, generation and message follow",
			have: []gwv1.RouteParentStatus{
				ours(svcRef, cond("Accepted", "True", "Accepted", "old message", 2, t0), cond("ResolvedRefs", "False", "BackendNotFound", "gone", 2, t0)),
				foreign,
			},
			refs: refs,
			st: model.RouteStatus{Generation: 3, Parents: []model.ParentStatus{
				{Index: 1, Accepted: accepted("new message"), ResolvedRefs: resolved},
			}},
			want: []gwv1.RouteParentStatus{
				ours(svcRef, cond("Accepted", "True", "Accepted", "new message", 3, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 3, t1)),
				foreign,
			},
		},
		{
			name: "reason changes without a status change keep the transition time",
			have: []gwv1.RouteParentStatus{
				ours(svcRef, cond("Accepted", "False", "NoMatchingParent", "no port", 1, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t0)),
			},
			refs: refs,
			st: model.RouteStatus{Generation: 1, Parents: []model.ParentStatus{
				{Index: 1, Accepted: model.Condition{Reason: model.ReasonConflicted, Message: "a GRPCRoute wins"}, ResolvedRefs: resolved},
			}},
			want: []gwv1.RouteParentStatus{
				ours(svcRef, cond("Accepted", "False", "Conflicted", "a GRPCRoute wins", 1, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t0)),
			},
		},
		{
			name: "PartiallyInvalid added",
			refs: refs,
			st: model.RouteStatus{Generation: 1, Parents: []model.ParentStatus{
				{Index: 1, Accepted: accepted("bound"), ResolvedRefs: resolved, PartiallyInvalid: &model.Condition{Status: true, Reason: "UnsupportedValue", Message: "Dropped Rule(s): rule 1"}},
			}},
			want: []gwv1.RouteParentStatus{
				ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 1, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t1),
					cond("PartiallyInvalid", "True", "UnsupportedValue", "Dropped Rule(s): rule 1", 1, t1)),
			},
		},
		{
			name: "PartiallyInvalid and a condition type aether does not write removed",
			have: []gwv1.RouteParentStatus{
				ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 1, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t0),
					cond("PartiallyInvalid", "True", "UnsupportedValue", "Dropped Rule(s): rule 1", 1, t0), cond("Programmed", "True", "Programmed", "", 1, t0)),
			},
			refs: refs,
			st: model.RouteStatus{Generation: 2, Parents: []model.ParentStatus{
				{Index: 1, Accepted: accepted("bound"), ResolvedRefs: resolved},
			}},
			want: []gwv1.RouteParentStatus{
				ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 2, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 2, t0)),
			},
		},
		{
			name: "a removed parentRef's entry removed, the foreign one kept, a new one appended",
			have: []gwv1.RouteParentStatus{
				ours(impRef, cond("Accepted", "True", "Accepted", "bound", 1, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t0)),
				foreign,
			},
			refs: []gwv1.ParentReference{gwRef, svcRef},
			st: model.RouteStatus{Generation: 2, Parents: []model.ParentStatus{
				{Index: 1, Accepted: accepted("bound"), ResolvedRefs: resolved},
			}},
			want: []gwv1.RouteParentStatus{
				foreign,
				ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 2, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 2, t1)),
			},
		},
		{
			name: "no mesh parent left: every entry of ours removed",
			have: []gwv1.RouteParentStatus{
				ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 1, t0)),
				ours(svcRef, cond("Accepted", "True", "Accepted", "a second entry", 1, t0)),
				foreign,
			},
			refs: []gwv1.ParentReference{gwRef},
			st:   model.RouteStatus{Generation: 2},
			want: []gwv1.RouteParentStatus{foreign},
		},
		{
			name: "a port changed in place is another parentRef",
			have: []gwv1.RouteParentStatus{
				ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 1, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t0)),
			},
			refs: []gwv1.ParentReference{func() gwv1.ParentReference { r := *svcRef.DeepCopy(); r.Port = ptr(gwv1.PortNumber(81)); return r }()},
			st: model.RouteStatus{Generation: 2, Parents: []model.ParentStatus{
				{Index: 0, Accepted: model.Condition{Reason: "NoMatchingParent", Message: "no port 81"}, ResolvedRefs: resolved},
			}},
			want: []gwv1.RouteParentStatus{
				ours(func() gwv1.ParentReference { r := *svcRef.DeepCopy(); r.Port = ptr(gwv1.PortNumber(81)); return r }(),
					cond("Accepted", "False", "NoMatchingParent", "no port 81", 2, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 2, t1)),
			},
		},
		{
			name: "an index outside spec.parentRefs is skipped",
			refs: []gwv1.ParentReference{svcRef},
			st: model.RouteStatus{Generation: 1, Parents: []model.ParentStatus{
				{Index: 4, Accepted: accepted("bound"), ResolvedRefs: resolved},
			}},
			want: []gwv1.RouteParentStatus{},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := make([]gwv1.RouteParentStatus, len(c.have))
			for i := range c.have {
				c.have[i].DeepCopyInto(&before[i])
			}
			got := ParentStatuses(c.have, c.refs, c.st, t1)
			if !equality.Semantic.DeepEqual(got, c.want) {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
			if !equality.Semantic.DeepEqual(c.have, before) {
				t.Errorf("have changed: %+v", c.have)
			}
			later := metav1.NewTime(t1.Add(time.Hour))
			if again := ParentStatuses(got, c.refs, c.st, later); !equality.Semantic.DeepEqual(again, got) {
				t.Errorf("second run changed it:\n%+v\nwas %+v", again, got)
			}
		})
	}
}

// TestConditionMessageCut: a message over the API's 32768 bytes is cut on a rune boundary.
func TestConditionMessageCut(t *testing.T) {
	msg := strings.Repeat("é", maxMessage) // 2 bytes each
	c := condition(gwv1.RouteConditionResolvedRefs, model.Condition{Reason: "BackendNotFound", Message: msg}, 1, t0)
	if len(c.Message) != maxMessage || !strings.HasPrefix(msg, c.Message) {
		t.Errorf("message of %d bytes cut to %d, want %d", len(msg), len(c.Message), maxMessage)
	}
	odd := "x" + msg
	if c := condition(gwv1.RouteConditionResolvedRefs, model.Condition{Reason: "BackendNotFound", Message: odd}, 1, t0); len(c.Message) != maxMessage-1 {
		t.Errorf("message cut inside a rune: %d bytes", len(c.Message))
	}
}

// TestRouteCRDInstalled checks the discovery lookup at its boundary (a fake discovery client):
// group version missing, one kind, both kinds, and a discovery error.
func TestRouteCRDInstalled(t *testing.T) {
	list := func(names ...string) []*metav1.APIResourceList {
		l := &metav1.APIResourceList{GroupVersion: gwv1.GroupVersion.String()}
		for _, n := range names {
			l.APIResources = append(l.APIResources, metav1.APIResource{Name: n})
		}
		return []*metav1.APIResourceList{l}
	}
	for _, c := range []struct {
		name       string
		resources  []*metav1.APIResourceList
		fail       error
		http, grpc bool
		wantErr    bool
	}{
		{name: "group not served", resources: []*metav1.APIResourceList{{GroupVersion: "gateway.networking.k8s.io/v1beta1"}}},
		{name: "httproutes only", resources: list("httproutes", "httproutes/status", "gateways"), http: true},
		{name: "both", resources: list("grpcroutes", "httproutes"), http: true, grpc: true},
		{name: "discovery fails", fail: errors.New("connection refused"), wantErr: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := &fakediscovery.FakeDiscovery{Fake: &k8stesting.Fake{Resources: c.resources}}
			if c.fail != nil {
				d.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, c.fail })
			}
			for _, k := range []struct {
				res  string
				want bool
			}{{"httproutes", c.http}, {"grpcroutes", c.grpc}} {
				got, err := RouteCRDInstalled(d, k.res)
				if (err != nil) != c.wantErr || got != k.want {
					t.Errorf("%s: installed %v, err %v; want %v, error %v", k.res, got, err, k.want, c.wantErr)
				}
			}
		})
	}
}

// TestWrite checks write's effects at the client boundary (get and update recorded): nothing
// written when the status is already right, a conflict answered by reading the route again and
// merging into its fresh status, and a route whose generation moved on left to the next pass.
func TestWrite(t *testing.T) {
	st := model.RouteStatus{Route: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: "shop", Name: "web"}, Generation: 1,
		Parents: []model.ParentStatus{{Index: 0, Accepted: accepted("bound"), ResolvedRefs: resolved}}}
	route := func(gen int64, parents ...gwv1.RouteParentStatus) *gwv1.HTTPRoute {
		r := &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", Generation: gen, ResourceVersion: "1"}}
		r.Spec.ParentRefs = []gwv1.ParentReference{svcRef}
		r.Status.Parents = parents
		return r
	}
	done := ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 1, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t0))
	for _, c := range []struct {
		name      string
		cached    *gwv1.HTTPRoute
		conflicts int
		fresh     *gwv1.HTTPRoute
		// want is the last status written, nil for no write.
		want    []gwv1.RouteParentStatus
		updates int
	}{
		{name: "already right", cached: route(1, done)},
		{name: "written", cached: route(1), updates: 1, want: []gwv1.RouteParentStatus{
			ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 1, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t1))}},
		{name: "conflict: merged into the fresh status", cached: route(1), conflicts: 1, fresh: route(1, foreign), updates: 2,
			want: []gwv1.RouteParentStatus{foreign,
				ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 1, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t1))}},
		{name: "conflict: the fresh status is right", cached: route(1), conflicts: 1, fresh: route(1, done), updates: 1},
		{name: "conflict: the spec moved on", cached: route(1), conflicts: 1, fresh: route(2), updates: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var updates int
			var last []gwv1.RouteParentStatus
			k := httpKind(nil)
			k.get = func(context.Context, string, string) (*gwv1.HTTPRoute, error) { return c.fresh.DeepCopy(), nil }
			k.update = func(_ context.Context, r *gwv1.HTTPRoute) error {
				updates++
				if updates <= c.conflicts {
					return apierrors.NewConflict(schema.GroupResource{Group: gwv1.GroupName, Resource: "httproutes"}, r.Name, errors.New("stale"))
				}
				last = r.Status.Parents
				return nil
			}
			cached := c.cached.DeepCopy()
			if err := write(context.Background(), slog.New(slog.DiscardHandler), nil, k, cached, st, t1); err != nil {
				t.Fatal(err)
			}
			if updates != c.updates || !equality.Semantic.DeepEqual(last, c.want) {
				t.Errorf("%d updates, last %+v; want %d, %+v", updates, last, c.updates, c.want)
			}
			if !equality.Semantic.DeepEqual(cached, c.cached) {
				t.Error("the cached route was changed")
			}
		})
	}
}
