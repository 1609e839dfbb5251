package routestatus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/retry"
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
	// ownGw is a parentRef to one of aether's Gateways, as written (group and kind unset).
	ownGw = gwv1.ParentReference{Name: "front", SectionName: ptr(gwv1.SectionName("http"))}
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
		name  string
		have  []gwv1.RouteParentStatus
		refs  []gwv1.ParentReference
		st    model.RouteStatus
		gst   model.GatewayRouteStatus
		extra []ParentCondition
		want  []gwv1.RouteParentStatus
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
			name: "a parent whose parentRef is a Gateway gets no entry, and aether's old entry for it is removed",
			have: []gwv1.RouteParentStatus{
				ours(gwRef, cond("Accepted", "True", "Accepted", "bound", 1, t0)),
				foreign,
			},
			refs: refs,
			st: model.RouteStatus{Generation: 2, Parents: []model.ParentStatus{
				{Index: 0, Accepted: accepted("bound"), ResolvedRefs: resolved},
				{Index: 1, Accepted: accepted("bound"), ResolvedRefs: resolved},
			}},
			want: []gwv1.RouteParentStatus{
				foreign,
				ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 2, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 2, t1)),
			},
		},
		{
			name: "unset group and kind are the API's defaults: a Gateway",
			refs: []gwv1.ParentReference{{Name: "cart"}, {Kind: ptr(gwv1.Kind("Service")), Name: "cart"}, {Group: ptr(gwv1.Group("")), Name: "cart"}},
			st: model.RouteStatus{Generation: 1, Parents: []model.ParentStatus{
				{Index: 0, Accepted: accepted("bound"), ResolvedRefs: resolved},
				{Index: 1, Accepted: accepted("bound"), ResolvedRefs: resolved},
				{Index: 2, Accepted: accepted("bound"), ResolvedRefs: resolved},
			}},
			want: []gwv1.RouteParentStatus{},
		},
		{
			name: "the same parentRef at two indexes: one entry",
			refs: []gwv1.ParentReference{svcRef, svcRef},
			st: model.RouteStatus{Generation: 1, Parents: []model.ParentStatus{
				{Index: 0, Accepted: accepted("first"), ResolvedRefs: resolved},
				{Index: 1, Accepted: accepted("second"), ResolvedRefs: resolved},
			}},
			want: []gwv1.RouteParentStatus{
				ours(svcRef, cond("Accepted", "True", "Accepted", "first", 1, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t1)),
			},
		},
		{
			name: "a Gateway parent of aether's: its entry from the Gateway status, in spec.parentRefs order",
			have: []gwv1.RouteParentStatus{foreign},
			refs: []gwv1.ParentReference{svcRef, ownGw, impRef},
			st: model.RouteStatus{Generation: 2, Parents: []model.ParentStatus{
				{Index: 0, Accepted: accepted("bound"), ResolvedRefs: resolved},
				{Index: 2, Accepted: accepted("bound"), ResolvedRefs: resolved},
			}},
			gst: model.GatewayRouteStatus{Generation: 2, Parents: []model.GatewayParentStatus{
				{Index: 1, Accepted: accepted("attached to listener http"), ResolvedRefs: model.Condition{Reason: "RefNotPermitted", Message: "no ReferenceGrant"}},
			}},
			want: []gwv1.RouteParentStatus{
				foreign,
				ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 2, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 2, t1)),
				ours(ownGw, cond("Accepted", "True", "Accepted", "attached to listener http", 2, t1), cond("ResolvedRefs", "False", "RefNotPermitted", "no ReferenceGrant", 2, t1)),
				ours(impRef, cond("Accepted", "True", "Accepted", "bound", 2, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 2, t1)),
			},
		},
		{
			name: "a Gateway entry kept where it is, its transition time kept, PartiallyInvalid dropped",
			have: []gwv1.RouteParentStatus{
				ours(ownGw, cond("Accepted", "True", "Accepted", "old", 1, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t0),
					cond("PartiallyInvalid", "True", "UnsupportedValue", "x", 1, t0)),
				foreign,
			},
			refs: []gwv1.ParentReference{gwRef, ownGw},
			gst: model.GatewayRouteStatus{Generation: 2, Parents: []model.GatewayParentStatus{
				{Index: 1, Accepted: accepted("new"), ResolvedRefs: resolved},
			}},
			want: []gwv1.RouteParentStatus{
				ours(ownGw, cond("Accepted", "True", "Accepted", "new", 2, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 2, t0)),
				foreign,
			},
		},
		{
			name: "a Gateway status for a parentRef that is not a Gateway, or a mesh status for a Gateway: no entry",
			refs: []gwv1.ParentReference{svcRef, ownGw},
			st: model.RouteStatus{Generation: 1, Parents: []model.ParentStatus{
				{Index: 1, Accepted: accepted("bound"), ResolvedRefs: resolved},
			}},
			gst: model.GatewayRouteStatus{Generation: 1, Parents: []model.GatewayParentStatus{
				{Index: 0, Accepted: accepted("attached"), ResolvedRefs: resolved},
			}},
			want: []gwv1.RouteParentStatus{},
		},
		{
			name: "the Gateway no longer aether's: its entry removed, the mesh entry kept",
			have: []gwv1.RouteParentStatus{
				ours(ownGw, cond("Accepted", "True", "Accepted", "attached", 1, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t0)),
				ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 1, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t0)),
			},
			refs: []gwv1.ParentReference{ownGw, svcRef},
			st: model.RouteStatus{Generation: 1, Parents: []model.ParentStatus{
				{Index: 1, Accepted: accepted("bound"), ResolvedRefs: resolved},
			}},
			want: []gwv1.RouteParentStatus{
				ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 1, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t0)),
			},
		},
		{
			name: "a hook's condition set on its mesh entry only, after aether's own",
			refs: []gwv1.ParentReference{svcRef, ownGw, impRef},
			st: model.RouteStatus{Generation: 2, Parents: []model.ParentStatus{
				{Index: 0, Accepted: accepted("bound"), ResolvedRefs: resolved},
				{Index: 2, Accepted: accepted("bound"), ResolvedRefs: resolved},
			}},
			gst: model.GatewayRouteStatus{Generation: 2, Parents: []model.GatewayParentStatus{
				{Index: 1, Accepted: accepted("attached"), ResolvedRefs: resolved},
			}},
			extra: []ParentCondition{
				{Index: 0, Type: "aether.io/BackendsExported", Condition: model.Condition{Reason: "BackendNotExported", Message: "shop/db"}},
				{Index: 1, Type: "aether.io/BackendsExported", Condition: model.Condition{Status: true, Reason: "Exported"}},
				{Index: 0, Type: "Accepted", Condition: model.Condition{Reason: "Hijacked"}},
			},
			want: []gwv1.RouteParentStatus{
				ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 2, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 2, t1),
					cond("aether.io/BackendsExported", "False", "BackendNotExported", "shop/db", 2, t1)),
				ours(ownGw, cond("Accepted", "True", "Accepted", "attached", 2, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 2, t1)),
				ours(impRef, cond("Accepted", "True", "Accepted", "bound", 2, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 2, t1)),
			},
		},
		{
			name: "a hook's condition keeps its transition time while its status holds, and goes when the hook gives none",
			have: []gwv1.RouteParentStatus{
				ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 1, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t0),
					cond("aether.io/BackendsExported", "False", "BackendNotExported", "shop/db", 1, t0)),
				ours(impRef, cond("Accepted", "True", "Accepted", "bound", 1, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t0),
					cond("aether.io/BackendsExported", "True", "Exported", "", 1, t0)),
			},
			refs: []gwv1.ParentReference{svcRef, impRef},
			st: model.RouteStatus{Generation: 2, Parents: []model.ParentStatus{
				{Index: 0, Accepted: accepted("bound"), ResolvedRefs: resolved},
				{Index: 1, Accepted: accepted("bound"), ResolvedRefs: resolved},
			}},
			extra: []ParentCondition{{Index: 0, Type: "aether.io/BackendsExported", Condition: model.Condition{Reason: "BackendNotExported", Message: "shop/db, shop/cache"}}},
			want: []gwv1.RouteParentStatus{
				ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 2, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 2, t0),
					cond("aether.io/BackendsExported", "False", "BackendNotExported", "shop/db, shop/cache", 2, t0)),
				ours(impRef, cond("Accepted", "True", "Accepted", "bound", 2, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 2, t0)),
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
			got, omitted := ParentStatuses(c.have, c.refs, c.st, c.gst, c.extra, t1)
			if omitted != 0 {
				t.Errorf("%d entries omitted", omitted)
			}
			if !equality.Semantic.DeepEqual(got, c.want) {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
			if !equality.Semantic.DeepEqual(c.have, before) {
				t.Errorf("have changed: %+v", c.have)
			}
			later := metav1.NewTime(t1.Add(time.Hour))
			if again, _ := ParentStatuses(got, c.refs, c.st, c.gst, c.extra, later); !equality.Semantic.DeepEqual(again, got) {
				t.Errorf("second run changed it:\n%+v\nwas %+v", again, got)
			}
		})
	}
}

// TestConditionMessageCut: a message over MaxMessage bytes is cut on a rune boundary, ends
// with a note of how much was cut, and is at most MaxMessage bytes; a message that fits is kept.
func TestConditionMessageCut(t *testing.T) {
	for _, c := range []struct {
		name, msg string
	}{
		{"ASCII", strings.Repeat("x", 5*MaxMessage)},
		{"two-byte runes", strings.Repeat("é", MaxMessage)},
		{"two-byte runes, odd start", "x" + strings.Repeat("é", MaxMessage)},
		{"four-byte runes", strings.Repeat("𝄞", MaxMessage)},
		{"one byte over", strings.Repeat("x", MaxMessage+1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := condition(string(gwv1.RouteConditionResolvedRefs), model.Condition{Reason: "BackendNotFound", Message: c.msg}, 1, t0).Message
			kept, note, ok := strings.Cut(got, " [... ")
			switch {
			case len(got) > MaxMessage || len(got) < MaxMessage-8:
				t.Errorf("cut to %d bytes, want at most %d and no more than a rune and a digit short", len(got), MaxMessage)
			case !ok || !strings.HasPrefix(c.msg, kept) || !utf8.ValidString(got):
				t.Errorf("cut message %q... is not a valid prefix with a note", got[:40])
			case note != strconv.Itoa(len(c.msg)-len(kept))+" bytes cut]":
				t.Errorf("note %q, want %d bytes cut", note, len(c.msg)-len(kept))
			}
		})
	}
	fits := strings.Repeat("é", MaxMessage/2)
	if got := condition(string(gwv1.RouteConditionAccepted), model.Condition{Message: fits}, 1, t0).Message; got != fits {
		t.Errorf("a message of %d bytes changed", len(fits))
	}
}

// TestParentStatusesMaxParents: status.parents holds at most MaxParents entries. Other
// controllers' entries are kept, aether's fill the room left in the order of spec.parentRefs
// (an entry of aether's beyond it is removed), and omitted says how many were left out. Each
// case is run twice, the second time on its own output, which must change nothing.
func TestParentStatusesMaxParents(t *testing.T) {
	svc := func(i int) gwv1.ParentReference {
		r := *svcRef.DeepCopy()
		r.Name = gwv1.ObjectName(fmt.Sprintf("svc-%02d", i))
		return r
	}
	theirs := func(n int) []gwv1.RouteParentStatus {
		var out []gwv1.RouteParentStatus
		for i := range n {
			f := *foreign.DeepCopy()
			f.ParentRef.Name = gwv1.ObjectName(fmt.Sprintf("edge-%02d", i))
			out = append(out, f)
		}
		return out
	}
	entry := func(i int, at metav1.Time) gwv1.RouteParentStatus {
		return ours(svc(i), cond("Accepted", "True", "Accepted", "bound", 1, at), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, at))
	}
	status := func(n int) model.RouteStatus {
		st := model.RouteStatus{Generation: 1}
		for i := range n {
			st.Parents = append(st.Parents, model.ParentStatus{Index: i, Accepted: accepted("bound"), ResolvedRefs: resolved})
		}
		return st
	}
	refs := func(n int) []gwv1.ParentReference {
		var out []gwv1.ParentReference
		for i := range n {
			out = append(out, svc(i))
		}
		return out
	}
	for _, c := range []struct {
		name    string
		have    []gwv1.RouteParentStatus
		n       int // mesh parentRefs (and parents resolved)
		want    []gwv1.RouteParentStatus
		omitted int
	}{
		{name: "32 of ours fit", n: 32, want: func() []gwv1.RouteParentStatus {
			var w []gwv1.RouteParentStatus
			for i := range 32 {
				w = append(w, entry(i, t1))
			}
			return w
		}()},
		{name: "30 of theirs and 4 of ours: the first 2 of ours", have: theirs(30), n: 4, omitted: 2,
			want: append(theirs(30), entry(0, t1), entry(1, t1))},
		{name: "one of ours beyond the room is removed, one kept in place", have: append([]gwv1.RouteParentStatus{entry(3, t0), entry(1, t0)}, theirs(30)...), n: 4, omitted: 2,
			want: append([]gwv1.RouteParentStatus{entry(1, t0)}, append(theirs(30), entry(0, t1))...)},
		{name: "32 of theirs: none of ours", have: append(theirs(31), entry(0, t0), theirs(32)[31]), n: 2, omitted: 2, want: theirs(32)},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, omitted := ParentStatuses(c.have, refs(c.n), status(c.n), model.GatewayRouteStatus{}, nil, t1)
			if omitted != c.omitted || !equality.Semantic.DeepEqual(got, c.want) {
				t.Errorf("omitted %d, got %d entries %+v\nwant omitted %d, %d entries %+v", omitted, len(got), got, c.omitted, len(c.want), c.want)
			}
			if len(got) > MaxParents {
				t.Errorf("%d entries", len(got))
			}
			again, omitted2 := ParentStatuses(got, refs(c.n), status(c.n), model.GatewayRouteStatus{}, nil, metav1.NewTime(t1.Add(time.Hour)))
			if omitted2 != c.omitted || !equality.Semantic.DeepEqual(again, got) {
				t.Errorf("second run changed it (omitted %d):\n%+v", omitted2, again)
			}
		})
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
// merging into its fresh status, a route whose generation moved on left to the next pass, a
// route deleted meanwhile no error, a write refused as invalid or too large reported as refused
// (not retried, and not sent again while the route and its status are those refused), and
// another failure returned for the pass to retry.
func TestWrite(t *testing.T) {
	gr := schema.GroupResource{Group: gwv1.GroupName, Resource: "httproutes"}
	st := model.RouteStatus{Route: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: "shop", Name: "web"}, Generation: 1,
		Parents: []model.ParentStatus{{Index: 0, Accepted: accepted("bound"), ResolvedRefs: resolved}}}
	route := func(gen int64, parents ...gwv1.RouteParentStatus) *gwv1.HTTPRoute {
		r := &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", Generation: gen, ResourceVersion: "1"}}
		r.Spec.ParentRefs = []gwv1.ParentReference{svcRef}
		r.Status.Parents = parents
		return r
	}
	done := ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 1, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t0))
	other := model.RouteStatus{Route: st.Route, Generation: 1,
		Parents: []model.ParentStatus{{Index: 0, Accepted: accepted("bound to something else"), ResolvedRefs: resolved}}}
	for _, c := range []struct {
		name      string
		cached    *gwv1.HTTPRoute
		conflicts int
		fresh     *gwv1.HTTPRoute
		// fail is the error of every update after the conflicts.
		fail error
		// want is the last status written, nil for no write.
		want    []gwv1.RouteParentStatus
		updates int
		// prev is the route's last refused write.
		prev *refusal
		// refused and retry: the outcome's refused and err are set.
		refused, retry bool
	}{
		{name: "already right", cached: route(1, done)},
		{name: "written", cached: route(1), updates: 1, want: []gwv1.RouteParentStatus{
			ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 1, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t1))}},
		{name: "conflict: merged into the fresh status", cached: route(1), conflicts: 1, fresh: route(1, foreign), updates: 2,
			want: []gwv1.RouteParentStatus{foreign,
				ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 1, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t1))}},
		{name: "conflict: the fresh status is right", cached: route(1), conflicts: 1, fresh: route(1, done), updates: 1},
		{name: "conflict: the spec moved on", cached: route(1), conflicts: 1, fresh: route(2), updates: 1},
		{name: "conflict: the route is gone", cached: route(1), conflicts: 1, updates: 1},
		{name: "gone", cached: route(1), fail: apierrors.NewNotFound(gr, "web"), updates: 1},
		{name: "invalid: refused", cached: route(1), fail: apierrors.NewInvalid(schema.GroupKind{Group: gwv1.GroupName, Kind: "HTTPRoute"}, "web", nil), updates: 1, refused: true},
		{name: "too large: refused", cached: route(1), fail: apierrors.NewRequestEntityTooLargeError("limit is 3145728"), updates: 1, refused: true},
		{name: "other failure: retried with the pass", cached: route(1), fail: apierrors.NewInternalError(errors.New("etcd is away")), updates: 1, retry: true},
		{name: "conflicts only: retried with the pass", cached: route(1), conflicts: 10, fresh: route(1), updates: retry.DefaultBackoff.Steps, retry: true},
		{name: "refused before, the same route and status: not sent again", cached: route(1), prev: &refusal{resourceVersion: "1", status: routeWant{mesh: st}, err: errors.New("refused")}, refused: true},
		{name: "refused before, the route changed since: sent", cached: route(1), prev: &refusal{resourceVersion: "0", status: routeWant{mesh: st}, err: errors.New("refused")}, updates: 1, want: []gwv1.RouteParentStatus{
			ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 1, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t1))}},
		{name: "refused before, another status to write: sent", cached: route(1), prev: &refusal{resourceVersion: "1", status: routeWant{mesh: other}, err: errors.New("refused")}, updates: 1, want: []gwv1.RouteParentStatus{
			ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 1, t1), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t1))}},
		{name: "refused before, now right: nothing sent, not refused", cached: route(1, done), prev: &refusal{resourceVersion: "1", status: routeWant{mesh: st}, err: errors.New("refused")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var updates int
			var last []gwv1.RouteParentStatus
			k := httpKind(nil)
			k.get = func(context.Context, string, string) (*gwv1.HTTPRoute, error) {
				if c.fresh == nil {
					return nil, apierrors.NewNotFound(gr, "web")
				}
				return c.fresh.DeepCopy(), nil
			}
			k.update = func(_ context.Context, r *gwv1.HTTPRoute) error {
				updates++
				if updates <= c.conflicts {
					return apierrors.NewConflict(gr, r.Name, errors.New("stale"))
				}
				if c.fail != nil {
					return c.fail
				}
				last = r.Status.Parents
				return nil
			}
			cached := c.cached.DeepCopy()
			res := write(context.Background(), slog.New(slog.DiscardHandler), nil, k, cached, routeWant{mesh: st}, t1, c.prev)
			if (res.refused != nil) != c.refused || (res.err != nil) != c.retry || res.omitted != 0 {
				t.Errorf("outcome %+v; want refused %v, retried %v", res, c.refused, c.retry)
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

// TestComparedFields fails when a type that sameRef or equalParents compares field by field
// gains or loses a field (a Gateway API or apimachinery upgrade): they must compare it too.
func TestComparedFields(t *testing.T) {
	for _, c := range []struct {
		v    any
		want []string
	}{
		{gwv1.ParentReference{}, []string{"Group", "Kind", "Namespace", "Name", "SectionName", "Port"}},
		{gwv1.RouteParentStatus{}, []string{"ParentRef", "ControllerName", "Conditions"}},
		{metav1.Condition{}, []string{"Type", "Status", "ObservedGeneration", "LastTransitionTime", "Reason", "Message"}},
	} {
		typ := reflect.TypeOf(c.v)
		var got []string
		for i := range typ.NumField() {
			got = append(got, typ.Field(i).Name)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s has fields %v; sameRef and equalParents compare %v", typ, got, c.want)
		}
	}
}

// TestEqualParents checks equalParents against equality.Semantic.DeepEqual on the cases of a
// changed field, nil and empty lists, and a time parsed back from the API's RFC 3339 form.
func TestEqualParents(t *testing.T) {
	base := []gwv1.RouteParentStatus{foreign,
		ours(svcRef, cond("Accepted", "True", "Accepted", "bound", 1, t0), cond("ResolvedRefs", "True", "ResolvedRefs", "", 1, t0))}
	change := func(f func(p []gwv1.RouteParentStatus)) []gwv1.RouteParentStatus {
		c := make([]gwv1.RouteParentStatus, len(base))
		for i := range base {
			base[i].DeepCopyInto(&c[i])
		}
		f(c)
		return c
	}
	roundTrip := metav1.NewTime(t0.Add(500 * time.Millisecond))
	b, err := roundTrip.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var parsed metav1.Time
	if err := parsed.UnmarshalJSON(b); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		a, b []gwv1.RouteParentStatus
	}{
		{"same", base, change(func([]gwv1.RouteParentStatus) {})},
		{"nil and empty", nil, []gwv1.RouteParentStatus{}},
		{"controller", base, change(func(p []gwv1.RouteParentStatus) { p[0].ControllerName = "x/y" })},
		{"port unset", base, change(func(p []gwv1.RouteParentStatus) { p[1].ParentRef.Port = nil })},
		{"port", base, change(func(p []gwv1.RouteParentStatus) { p[1].ParentRef.Port = ptr(gwv1.PortNumber(81)) })},
		{"namespace set", base, change(func(p []gwv1.RouteParentStatus) { p[1].ParentRef.Namespace = ptr(gwv1.Namespace("shop")) })},
		{"section", base, change(func(p []gwv1.RouteParentStatus) { p[1].ParentRef.SectionName = ptr(gwv1.SectionName("http")) })},
		{"group", base, change(func(p []gwv1.RouteParentStatus) { p[1].ParentRef.Group = ptr(gwv1.Group("x")) })},
		{"kind", base, change(func(p []gwv1.RouteParentStatus) { p[1].ParentRef.Kind = ptr(gwv1.Kind("X")) })},
		{"name", base, change(func(p []gwv1.RouteParentStatus) { p[1].ParentRef.Name = "x" })},
		{"a condition less", base, change(func(p []gwv1.RouteParentStatus) { p[1].Conditions = p[1].Conditions[:1] })},
		{"status", base, change(func(p []gwv1.RouteParentStatus) { p[1].Conditions[0].Status = "False" })},
		{"reason", base, change(func(p []gwv1.RouteParentStatus) { p[1].Conditions[0].Reason = "X" })},
		{"message", base, change(func(p []gwv1.RouteParentStatus) { p[1].Conditions[0].Message = "x" })},
		{"generation", base, change(func(p []gwv1.RouteParentStatus) { p[1].Conditions[0].ObservedGeneration = 2 })},
		{"type", base, change(func(p []gwv1.RouteParentStatus) { p[1].Conditions[0].Type = "X" })},
		{"time", base, change(func(p []gwv1.RouteParentStatus) { p[1].Conditions[0].LastTransitionTime = t1 })},
		{"time in another zone", base, change(func(p []gwv1.RouteParentStatus) {
			p[1].Conditions[0].LastTransitionTime = metav1.NewTime(t0.In(time.FixedZone("x", 3600)))
		})},
		{"time stored to the second", change(func(p []gwv1.RouteParentStatus) { p[1].Conditions[0].LastTransitionTime = roundTrip }),
			change(func(p []gwv1.RouteParentStatus) { p[1].Conditions[0].LastTransitionTime = parsed })},
		{"order", base, []gwv1.RouteParentStatus{base[1], base[0]}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got, want := equalParents(c.a, c.b), equality.Semantic.DeepEqual(c.a, c.b); got != want {
				t.Errorf("equalParents %v, equality.Semantic %v", got, want)
			}
		})
	}
}
