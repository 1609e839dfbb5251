package configexport

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

var (
	cart  = model.ServiceKey{Namespace: "shop", Name: "cart"}
	db    = model.ServiceKey{Namespace: "shop", Name: "db"}
	cache = model.ServiceKey{Namespace: "shop", Name: "cache"}
	east  = registry.Origin{Region: "r1", Cluster: "east"}
	t0    = time.Date(2026, 7, 1, 10, 0, 0, 0, time.UTC)
	mt0   = metav1.NewTime(t0)
	mt1   = metav1.NewTime(t0.Add(time.Hour))
)

// route is an HTTPRoute in ns with the given parents (index = position) and one rule whose
// backends are the given services (kind Service, port 80).
func route(ns, name string, parents []model.ParentRef, backends ...model.BackendRef) model.Route {
	for i := range parents {
		parents[i].Index = i
	}
	return model.Route{
		RouteRef: model.RouteRef{Kind: model.KindHTTPRoute, Namespace: ns, Name: name}, Generation: 1, Created: t0,
		Parents: parents,
		Rules:   []model.RouteRule{{Matches: []model.RouteMatch{{Path: model.PathMatch{Type: model.MatchPathPrefix, Value: "/"}}}, Backends: backends}},
	}
}

func svcParent(k model.ServiceKey) model.ParentRef {
	return model.ParentRef{Kind: model.ParentService, Service: k, Port: 80}
}

func impParent(k model.ServiceKey) model.ParentRef {
	return model.ParentRef{Kind: model.ParentServiceImport, Service: k, Port: 80}
}

func svcBackend(k model.ServiceKey) model.BackendRef {
	return model.BackendRef{Kind: model.BackendService, Service: k, Port: 80, Weight: 1}
}

// TestProject: a projection carries exactly model.ProjectService's routes (the projector the
// agents' routing binds with), converted with model.RouteToProto, and the ServiceExport's
// creation time; the same routes in another order give the same projection.
func TestProject(t *testing.T) {
	producer := route("shop", "canary", []model.ParentRef{svcParent(cart), svcParent(db)}, svcBackend(cart))
	producer.GatewayParents = []model.GatewayParentRef{{Index: 2}}
	producer.Hostnames = []string{"cart.example"}
	other := route("shop", "db-only", []model.ParentRef{svcParent(db)}, svcBackend(db))
	consumer := route("web", "mine", []model.ParentRef{svcParent(cart)}, svcBackend(cart))
	onImport := route("shop", "on-import", []model.ParentRef{impParent(cart)}, svcBackend(cart))
	imported := route("shop", "imported", []model.ParentRef{svcParent(cart)}, svcBackend(cart))
	imported.Origin = "west"
	all := []model.Route{other, consumer, producer, onImport, imported}

	p := Project(east, cart, all, t0)
	if p.GetService().GetNamespace() != "shop" || p.GetService().GetName() != "cart" || p.GetOriginCluster() != "east" || p.GetOriginRegion() != "r1" {
		t.Errorf("identity %v", p)
	}
	if p.GetExportCreateTime() != "2026-07-01T10:00:00Z" {
		t.Errorf("export_create_time %q", p.GetExportCreateTime())
	}
	want := model.ProjectService(cart, all)
	if len(want) != 1 || len(p.GetRoutes()) != 1 {
		t.Fatalf("routes %v, ProjectService %v", p.GetRoutes(), want)
	}
	if !proto.Equal(p.GetRoutes()[0], model.RouteToProto(want[0])) {
		t.Errorf("route %v, want %v", p.GetRoutes()[0], model.RouteToProto(want[0]))
	}
	if back, err := model.RouteFromProto(p.GetRoutes()[0]); err != nil || len(back.Parents) != 1 || back.Parents[0].Service != cart || back.Hostnames != nil {
		t.Errorf("round trip %+v, %v: want only the cart parentRef", back, err)
	}
	// Indexing by parent (what a pass does) changes nothing.
	if q := Project(east, cart, byParent([]model.Route{producer, imported, other, onImport, consumer})[cart], t0); !proto.Equal(p, q) {
		t.Errorf("indexed projection %v, want %v", q, p)
	}
	if q := Project(east, cache, all, t0); len(q.GetRoutes()) != 0 || check(withWrite(q)) != nil {
		t.Errorf("a service without routes: %v, %v", q, check(withWrite(q)))
	}
}

func withWrite(p *registryv1.ServiceConfigProjection) *registryv1.ServiceConfigProjection {
	p.Version, p.ExportTime = 1, t0.Format(exportTimeLayout)
	return p
}

// TestNextVersion: a projection in the registry goes on from its version; a new one starts above
// the one deleted in this leadership and above the revision read at its start, so no version is
// reused.
func TestNextVersion(t *testing.T) {
	for _, c := range []struct {
		name           string
		have           *held
		deleted, floor uint64
		want           uint64
	}{
		{"held", &held{version: 7}, 0, 100, 8},
		{"held below the floor goes on from its own", &held{version: 7}, 50, 100, 8},
		{"new: above the revision", nil, 0, 100, 101},
		{"re-created in this leadership", nil, 140, 100, 141},
		{"re-created after a leader change", nil, 0, 160, 161},
		{"empty registry", nil, 0, 0, 1},
	} {
		if got := nextVersion(c.have, c.deleted, c.floor); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

// TestCheck: too many routes and too many bytes are TooLarge (naming the count or size and the
// limit); another refusal is the registry's validation error.
func TestCheck(t *testing.T) {
	small := model.RouteToProto(route("shop", "r", []model.ParentRef{svcParent(cart)}, svcBackend(cart)))
	many := withWrite(Project(east, cart, nil, t0))
	for i := range registry.MaxConfigRoutes + 1 {
		r := proto.Clone(small).(*registryv1.Route)
		r.Name = fmt.Sprintf("r%d", i)
		many.Routes = append(many.Routes, r)
	}
	var tl *TooLargeError
	if err := check(many); !errors.As(err, &tl) || !strings.Contains(err.Error(), "1001 routes, over the limit of 1000") {
		t.Errorf("1001 routes: %v", err)
	}
	big := withWrite(Project(east, cart, nil, t0))
	r := proto.Clone(small).(*registryv1.Route)
	r.Name = strings.Repeat("x", registry.MaxConfigBytes)
	big.Routes = []*registryv1.Route{r}
	if err := check(big); !errors.As(err, &tl) || !strings.Contains(err.Error(), "bytes encoded, over the limit of 1048576") {
		t.Errorf("too many bytes: %v", err)
	}
	reason, msg := refusedCondition(check(big), &held{version: 4, exportTime: t0})
	if reason != ReasonTooLarge || !strings.Contains(msg, "the registry keeps version 4, written 2026-07-01T10:00:00Z") {
		t.Errorf("TooLarge condition %s: %s", reason, msg)
	}
	bad := withWrite(Project(east, cart, nil, t0))
	bad.Routes = []*registryv1.Route{{Name: "no-kind", Namespace: "shop"}}
	var ve *registry.ValidationError
	if err := check(bad); !errors.As(err, &ve) || errors.As(err, &tl) {
		t.Errorf("invalid route: %v", err)
	}
	if reason, msg := refusedCondition(check(bad), nil); reason != ReasonInvalid || !strings.Contains(msg, "nothing of this service is in the registry") {
		t.Errorf("Invalid condition %s: %s", reason, msg)
	}
}

// TestBackendConditions: only a projected parentRef (kind Service, in the route's namespace,
// naming an exported Service) gets the condition; Service backends and mirror backends not
// exported from this cluster make it False, naming them once each, sorted.
func TestBackendConditions(t *testing.T) {
	mirror := func(k model.ServiceKey) []model.RouteFilter {
		return []model.RouteFilter{{Type: model.FilterRequestMirror, Mirror: &model.Mirror{Backend: svcBackend(k)}}}
	}
	all := route("shop", "all", []model.ParentRef{svcParent(cart)}, svcBackend(cart))
	missing := route("shop", "missing", []model.ParentRef{svcParent(cart), impParent(cart), svcParent(db)}, svcBackend(db), svcBackend(cache), svcBackend(db))
	mirrored := route("shop", "mirrored", []model.ParentRef{svcParent(cart)}, svcBackend(cart))
	mirrored.Rules[0].Filters = mirror(cache)
	backendMirror := route("shop", "backend-mirror", []model.ParentRef{svcParent(cart)}, svcBackend(cart))
	backendMirror.Rules[0].Backends[0].Filters = mirror(db)
	viaImport := route("shop", "via-import", []model.ParentRef{svcParent(cart)}, model.BackendRef{Kind: model.BackendServiceImport, Service: db, Port: 80})
	consumer := route("web", "consumer", []model.ParentRef{svcParent(cart)}, svcBackend(db))
	imported := route("shop", "imported", []model.ParentRef{svcParent(cart)}, svcBackend(db))
	imported.Origin = "west"
	exported := map[model.ServiceKey]bool{cart: true}

	got := BackendConditions([]model.Route{all, missing, mirrored, backendMirror, viaImport, consumer, imported}, exported, "east")
	want := map[string]string{
		"all":            "0 True Exported",
		"missing":        "0 False BackendNotExported backends shop/cache, shop/db",
		"mirrored":       "0 False BackendNotExported backend shop/cache is",
		"backend-mirror": "0 False BackendNotExported backend shop/db is",
		"via-import":     "0 True Exported",
	}
	if len(got) != len(want) {
		t.Errorf("conditions for %d routes, want %d: %v", len(got), len(want), got)
	}
	for name, w := range want {
		cs := got[model.RouteRef{Kind: model.KindHTTPRoute, Namespace: "shop", Name: name}]
		if len(cs) != 1 {
			t.Errorf("%s: %d conditions, want 1 (only the projected parentRef): %v", name, len(cs), cs)
			continue
		}
		c := cs[0]
		if c.Type != ConditionBackendsExported || !strings.HasPrefix(fmt.Sprintf("%d %v %s %s", c.Index, c.Status, c.Reason, c.Message), strings.ReplaceAll(strings.ReplaceAll(w, " True", " true"), " False", " false")) {
			t.Errorf("%s: %+v, want %s", name, c, w)
		}
		if !c.Status && !strings.Contains(c.Message, "not exported from cluster east") {
			t.Errorf("%s: message %q", name, c.Message)
		}
	}
	if got := BackendConditions([]model.Route{missing}, map[model.ServiceKey]bool{cart: true, db: true}, "east")[missing.RouteRef]; len(got) != 2 || got[1].Index != 2 {
		t.Errorf("two exported parents: %v", got)
	}
}

// TestImportConditions covers each reason of ConfigImported and ConfigDrift.
func TestImportConditions(t *testing.T) {
	now := t0.Add(1500 * time.Millisecond)
	projected := route("shop", "canary", []model.ParentRef{svcParent(cart)}, svcBackend(cart))
	fromEast := &model.Projection{Service: cart, Origin: "east", Region: "r1", Version: 12, ExportTime: t0, ExportCreated: t0, Routes: []model.Route{projected}}
	rogue := &model.Projection{Service: db, Origin: "rogue", Version: 3, ExportTime: t0}
	consumer := route("web", "cart-local", []model.ParentRef{impParent(cart)}, svcBackend(cart))
	override := route("shop", "cart-override", []model.ParentRef{impParent(cart)}, svcBackend(cart))
	for _, c := range []struct {
		name                   string
		ci                     *model.ConfigImports
		routes                 []model.Route
		control                string
		svc                    model.ServiceKey
		imported, drift        string // "<status> <reason>"
		importedHas, driftHas  string
		importedBaseHasNoAgeOf bool
	}{
		{name: "applied", ci: &model.ConfigImports{Selection: model.ProjectionSelection{Applied: map[model.ServiceKey]*model.Projection{cart: fromEast}}},
			svc: cart, imported: "True Applied", importedHas: "from cluster east: version 12, exported 2026-07-01T10:00:00Z (1.5s old when", drift: "False NoDrift"},
		{name: "partially invalid", ci: &model.ConfigImports{Selection: model.ProjectionSelection{Applied: map[model.ServiceKey]*model.Projection{cart: fromEast}},
			Problems: map[model.ServiceKey][]string{cart: {"HTTPRoute shop/canary from cluster east: BackendNotFound: no ServiceImport shop/db"}}},
			svc: cart, imported: "True PartiallyInvalid", importedHas: "not served here: HTTPRoute shop/canary from cluster east: BackendNotFound", drift: "False NoDrift"},
		{name: "overridden", ci: &model.ConfigImports{Selection: model.ProjectionSelection{Applied: map[model.ServiceKey]*model.Projection{cart: fromEast}}, Overridden: []model.ServiceKey{cart}},
			routes: []model.Route{override}, svc: cart, imported: "False Overridden", importedHas: "local producer routes HTTPRoute shop/cart-override on ServiceImport shop/cart replace the routes projected from cluster east (version 12)",
			drift: "True Drift", driftHas: "local producer routes HTTPRoute shop/cart-override"},
		{name: "consumer route drifts", ci: &model.ConfigImports{Selection: model.ProjectionSelection{Applied: map[model.ServiceKey]*model.Projection{cart: fromEast}}},
			routes: []model.Route{consumer}, svc: cart, imported: "True Applied", drift: "True Drift", driftHas: "callers in namespace web use consumer routes HTTPRoute web/cart-local"},
		{name: "not the control cluster", ci: &model.ConfigImports{Selection: model.ProjectionSelection{Ignored: []model.IgnoredProjection{{Projection: rogue, NotControl: true}}}},
			control: "hub", svc: db, imported: "False NotControlCluster", importedHas: "cluster(s) rogue are ignored: only the control cluster hub's apply", drift: "False NoDrift"},
		{name: "projection of an origin that does not export the service", ci: &model.ConfigImports{Selection: model.ProjectionSelection{Ignored: []model.IgnoredProjection{{Projection: rogue, NotExported: true}}}},
			svc: db, imported: "False NoProjection", importedHas: "the projections from cluster(s) rogue are ignored: they do not export this service", drift: "False NoDrift"},
		{name: "no projection", ci: &model.ConfigImports{}, svc: cache, imported: "False NoProjection", importedHas: "no cluster projects", drift: "False NoDrift"},
		{name: "no projection from the control cluster", ci: nil, control: "hub", svc: cache, imported: "False NoProjection", importedHas: "the control cluster hub projects no config", drift: "False NoDrift"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := ImportConditions([]model.ServiceKey{c.svc}, c.ci, c.routes, c.control, now)[c.svc]
			if got := string(w.imported.Status) + " " + w.imported.Reason; got != c.imported || w.imported.Type != ConditionConfigImported {
				t.Errorf("ConfigImported %s (%s), want %s", got, w.imported.Message, c.imported)
			}
			if !strings.Contains(w.imported.Message, c.importedHas) || !strings.HasPrefix(w.imported.Message, w.importedBase) {
				t.Errorf("ConfigImported message %q (base %q), want it to say %q", w.imported.Message, w.importedBase, c.importedHas)
			}
			if got := string(w.drift.Status) + " " + w.drift.Reason; got != c.drift || w.drift.Type != ConditionConfigDrift {
				t.Errorf("ConfigDrift %s (%s), want %s", got, w.drift.Message, c.drift)
			}
			if !strings.Contains(w.drift.Message, c.driftHas) {
				t.Errorf("ConfigDrift message %q, want it to say %q", w.drift.Message, c.driftHas)
			}
		})
	}
	// The age moves on, the base does not: the written condition stands.
	ci := &model.ConfigImports{Selection: model.ProjectionSelection{Applied: map[model.ServiceKey]*model.Projection{cart: fromEast}}}
	a := ImportConditions([]model.ServiceKey{cart}, ci, nil, "", now)[cart]
	b := ImportConditions([]model.ServiceKey{cart}, ci, nil, "", now.Add(time.Hour))[cart]
	written, changed := MergeCondition(nil, a.imported, a.importedBase, 3, mt0)
	if !changed {
		t.Fatal("a new condition is a change")
	}
	if _, changed := MergeCondition([]metav1.Condition{written}, b.imported, b.importedBase, 3, mt1); changed {
		t.Errorf("only the age changed (%q -> %q): no write wanted", a.imported.Message, b.imported.Message)
	}
}

// TestMerged: lastTransitionTime stays while the status does; reason, message and generation
// changes are changes.
func TestMergeCondition(t *testing.T) {
	old := metav1.Condition{Type: ConditionConfigExported, Status: metav1.ConditionTrue, Reason: ReasonExported, Message: "version 1", ObservedGeneration: 2, LastTransitionTime: mt0}
	other := metav1.Condition{Type: "Valid", Status: metav1.ConditionTrue, Reason: "Valid", LastTransitionTime: mt0}
	have := []metav1.Condition{other, old}
	for _, c := range []struct {
		name    string
		want    metav1.Condition
		gen     int64
		changed bool
		ltt     metav1.Time
	}{
		{"same", metav1.Condition{Type: ConditionConfigExported, Status: metav1.ConditionTrue, Reason: ReasonExported, Message: "version 1"}, 2, false, mt0},
		{"message", metav1.Condition{Type: ConditionConfigExported, Status: metav1.ConditionTrue, Reason: ReasonExported, Message: "version 2"}, 2, true, mt0},
		{"generation", metav1.Condition{Type: ConditionConfigExported, Status: metav1.ConditionTrue, Reason: ReasonExported, Message: "version 1"}, 3, true, mt0},
		{"status", metav1.Condition{Type: ConditionConfigExported, Status: metav1.ConditionFalse, Reason: ReasonTooLarge, Message: "big"}, 2, true, mt1},
		{"a prefix of the old message is not the same without a base", metav1.Condition{Type: ConditionConfigExported, Status: metav1.ConditionTrue, Reason: ReasonExported, Message: "version"}, 2, true, mt0},
	} {
		got, changed := MergeCondition(have, c.want, "", c.gen, mt1)
		if changed != c.changed || !got.LastTransitionTime.Equal(&c.ltt) || (changed && (got.Message != c.want.Message || got.ObservedGeneration != c.gen)) {
			t.Errorf("%s: %+v changed=%v, want changed=%v at %v", c.name, got, changed, c.changed, c.ltt)
		}
	}
}

// TestApplyEvents: the exporter follows its own projections in the registry: one deleted by
// someone else is forgotten (and written again, above its version); a higher version written by
// an earlier leader is taken over; older events change nothing.
func TestApplyEvents(t *testing.T) {
	e := &Exporter{held: map[model.ServiceKey]*held{cart: {version: 5}, db: {version: 9}}, deleted: map[model.ServiceKey]uint64{}}
	rec := func(typ registry.EventType, k model.ServiceKey, v uint64) registry.Event[*registryv1.ServiceConfigProjection] {
		return registry.Event[*registryv1.ServiceConfigProjection]{Type: typ, Record: registry.Record[*registryv1.ServiceConfigProjection]{
			Origin: east, Value: &registryv1.ServiceConfigProjection{Service: &registryv1.ServiceRef{Namespace: k.Namespace, Name: k.Name}, Version: v,
				ExportTime: t0.Format(exportTimeLayout), ExportCreateTime: "2026-07-01T10:00:00Z"}}}
	}
	e.applyEvents(ConfigEvents{
		rec(registry.Updated, cart, 4),   // older: ignored
		rec(registry.Deleted, cart, 4),   // an older version's deletion: ignored
		rec(registry.Deleted, db, 9),     // ours, deleted by someone else
		rec(registry.Added, cache, 20),   // an earlier leader's, not known
		rec(registry.Updated, cache, 19), // older than what is held now
	})
	if h := e.held[cart]; h == nil || h.version != 5 {
		t.Errorf("cart %+v, want version 5 kept", h)
	}
	if _, ok := e.held[db]; ok || e.deleted[db] != 9 || nextVersion(e.held[db], e.deleted[db], 3) != 10 {
		t.Errorf("db held %v, deleted %d: want it forgotten, written again at 10", e.held[db], e.deleted[db])
	}
	if h := e.held[cache]; h == nil || h.version != 20 || nextVersion(h, 0, 100) != 21 {
		t.Errorf("cache %+v, want version 20 taken over", h)
	}
}
