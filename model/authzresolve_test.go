package model

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	cniv1 "github.com/aethermesh/aether/api/aether/cni/v1"
	sec "github.com/aethermesh/aether/api/aether/security/v1alpha1"
)

// authzPolicy is a valid ALLOW policy shop/name on Service web with one rule: every caller.
func authzPolicy(name string, edit ...func(*sec.AuthorizationPolicy)) *sec.AuthorizationPolicy {
	p := &sec.AuthorizationPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Generation: 3},
		Spec: sec.AuthorizationPolicySpec{
			Action:     sec.ActionAllow,
			TargetRefs: []sec.PolicyTargetReferenceWithLabelSelectors{{Kind: "Service", Name: "web"}},
			Rules:      []sec.AuthorizationRule{{}},
		},
	}
	for _, e := range edit {
		e(p)
	}
	return p
}

func TestConvertAuthz(t *testing.T) {
	p := authzPolicy("full", func(p *sec.AuthorizationPolicy) {
		p.Spec.Action = sec.ActionDeny
		p.Spec.DryRun = true
		p.Spec.TargetRefs = []sec.PolicyTargetReferenceWithLabelSelectors{
			{Group: "", Kind: "Service", Name: "web"},
			{Group: "core", Kind: "Pod", Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
			{Kind: "Pod", Selector: &metav1.LabelSelector{}},
		}
		p.Spec.Rules = []sec.AuthorizationRule{
			{
				Sources: []sec.AuthorizationSource{
					{Type: sec.SourceServiceAccount, ServiceAccount: &sec.AuthorizationSourceServiceAccount{Name: "frontend"}},
					{Type: sec.SourceServiceAccount, ServiceAccount: &sec.AuthorizationSourceServiceAccount{Namespace: "ops", Name: "*"}},
					{Type: sec.SourceSPIFFE, SPIFFE: "spiffe://other.example/ns/a/sa/b"},
					{Type: sec.SourceSPIFFE, SPIFFE: "spiffe://partner.example/*"},
					{Type: sec.SourceNamespace, Namespace: "monitoring"},
				},
				NetworkAttributes: &sec.AuthorizationNetworkAttributes{Ports: []int32{8080, 9090, 8080}},
				HTTP: &sec.AuthorizationHTTPAttributes{
					Methods: []sec.HTTPMethod{"GET", "POST", "GET"},
					Paths:   []sec.HTTPPathMatch{{Type: sec.PathMatchExact, Value: "/healthz"}, {Value: "/api"}},
				},
			},
			{Sources: []sec.AuthorizationSource{}},
			{},
		}
	})
	pol, targets, errs := ConvertAuthz(p)
	if len(errs) != 0 {
		t.Fatalf("errors: %v", errs)
	}
	want := &AuthzPolicy{Namespace: "shop", Name: "full", Action: AuthzDeny, DryRun: true, Rules: []AuthzRule{
		{
			Sources: []AuthzSource{
				{ServiceAccount: &AuthzServiceAccount{Namespace: "shop", Name: "frontend"}},
				{ServiceAccount: &AuthzServiceAccount{Namespace: "ops", Name: "*"}},
				{SPIFFE: "spiffe://other.example/ns/a/sa/b"},
				{SPIFFE: "spiffe://partner.example/*"},
				{Namespace: "monitoring"},
			},
			Ports:   []uint32{8080, 9090},
			Methods: []string{"GET", "POST"},
			Paths:   []PathMatch{{Type: MatchExact, Value: "/healthz"}, {Type: MatchPathPrefix, Value: "/api"}},
		},
		{Sources: []AuthzSource{}},
		{AnySource: true},
	}}
	if d := cmp.Diff(want, pol); d != "" {
		t.Errorf("policy (-want +got):\n%s", d)
	}
	if pol.Rules[1].Sources == nil || pol.Rules[1].AnySource {
		t.Error("sources: [] must match no caller (non-nil, empty, AnySource false)")
	}
	if len(targets) != 3 || targets[0].Kind != "Service" || targets[0].Name != "web" ||
		targets[1].Selector.String() != "app=db" || !targets[2].Selector.Empty() {
		t.Errorf("targets = %+v", targets)
	}
}

// TestConvertAuthzRefusals has one case per refusal: each names the field and the value.
func TestConvertAuthzRefusals(t *testing.T) {
	src := func(s sec.AuthorizationSource) func(*sec.AuthorizationPolicy) {
		return func(p *sec.AuthorizationPolicy) {
			p.Spec.Rules = []sec.AuthorizationRule{{Sources: []sec.AuthorizationSource{s}}}
		}
	}
	target := func(r sec.PolicyTargetReferenceWithLabelSelectors) func(*sec.AuthorizationPolicy) {
		return func(p *sec.AuthorizationPolicy) { p.Spec.TargetRefs = []sec.PolicyTargetReferenceWithLabelSelectors{r} }
	}
	spiffe := func(id string) func(*sec.AuthorizationPolicy) {
		return src(sec.AuthorizationSource{Type: sec.SourceSPIFFE, SPIFFE: id})
	}
	http := func(h sec.AuthorizationHTTPAttributes) func(*sec.AuthorizationPolicy) {
		return func(p *sec.AuthorizationPolicy) { p.Spec.Rules = []sec.AuthorizationRule{{HTTP: &h}} }
	}
	sa := func(ns, name string) func(*sec.AuthorizationPolicy) {
		return src(sec.AuthorizationSource{Type: sec.SourceServiceAccount, ServiceAccount: &sec.AuthorizationSourceServiceAccount{Namespace: ns, Name: name}})
	}
	for _, tc := range []struct {
		name string
		edit func(*sec.AuthorizationPolicy)
		want string
	}{
		{"action", func(p *sec.AuthorizationPolicy) { p.Spec.Action = "AUDIT" }, `spec.action "AUDIT": want ALLOW or DENY`},
		{"no targets", func(p *sec.AuthorizationPolicy) { p.Spec.TargetRefs = nil }, `spec.targetRefs "": want at least one target`},
		{"too many targets", func(p *sec.AuthorizationPolicy) {
			for range sec.MaxTargetRefs {
				p.Spec.TargetRefs = append(p.Spec.TargetRefs, p.Spec.TargetRefs[0])
			}
		}, `spec.targetRefs "17": want at most 16 targets`},
		{"target group", target(sec.PolicyTargetReferenceWithLabelSelectors{Group: "apps", Kind: "Service", Name: "web"}), `spec.targetRefs[0].group "apps": want ""`},
		{"target kind", target(sec.PolicyTargetReferenceWithLabelSelectors{Kind: "Deployment", Name: "web"}), `spec.targetRefs[0].kind "Deployment": want Service or Pod`},
		{"service without name", target(sec.PolicyTargetReferenceWithLabelSelectors{Kind: "Service"}), `spec.targetRefs[0].name "": want the name of a Service`},
		{"service bad name", target(sec.PolicyTargetReferenceWithLabelSelectors{Kind: "Service", Name: "Web.x"}), `spec.targetRefs[0].name "Web.x": want the name of a Service`},
		{"service with selector", target(sec.PolicyTargetReferenceWithLabelSelectors{Kind: "Service", Name: "web",
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}}), `spec.targetRefs[0].selector "a=b": a Service target takes no selector`},
		{"pod with name", target(sec.PolicyTargetReferenceWithLabelSelectors{Kind: "Pod", Name: "web-1", Selector: &metav1.LabelSelector{}}),
			`spec.targetRefs[0].name "web-1": a Pod target takes no name`},
		{"pod without selector", target(sec.PolicyTargetReferenceWithLabelSelectors{Kind: "Pod"}), `spec.targetRefs[0].selector "": want a label selector`},
		{"pod bad selector", target(sec.PolicyTargetReferenceWithLabelSelectors{Kind: "Pod", Selector: &metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Near"}}}}), `spec.targetRefs[0].selector "{\"matchExpressions\":[{\"key\":\"app\",\"operator\":\"Near\"}]}": "Near" is not a valid label selector operator`},
		{"too many rules", func(p *sec.AuthorizationPolicy) { p.Spec.Rules = make([]sec.AuthorizationRule, sec.MaxRules+1) }, `spec.rules "65": want at most 64 rules`},
		{"too many sources", func(p *sec.AuthorizationPolicy) {
			s := make([]sec.AuthorizationSource, sec.MaxSources+1)
			for i := range s {
				s[i] = sec.AuthorizationSource{Type: sec.SourceNamespace, Namespace: "a"}
			}
			p.Spec.Rules = []sec.AuthorizationRule{{Sources: s}}
		}, `spec.rules[0].sources "65": want at most 64 sources`},
		{"source type", src(sec.AuthorizationSource{Type: "IP", Namespace: "a"}), `spec.rules[0].sources[0].type "IP": want ServiceAccount, SPIFFE or Namespace`},
		{"source field missing", src(sec.AuthorizationSource{Type: sec.SourceSPIFFE}), `spec.rules[0].sources[0].spiffe "": want it set: type is SPIFFE`},
		{"source second field", src(sec.AuthorizationSource{Type: sec.SourceSPIFFE, SPIFFE: "spiffe://td/x", Namespace: "shop"}),
			`spec.rules[0].sources[0].namespace "shop": type SPIFFE takes only spiffe`},
		{"source service account beside namespace", src(sec.AuthorizationSource{Type: sec.SourceNamespace, Namespace: "shop",
			ServiceAccount: &sec.AuthorizationSourceServiceAccount{Name: "x"}}), `spec.rules[0].sources[0].serviceAccount "/x": type Namespace takes only namespace`},
		{"spiffe scheme", spiffe("spiffe:/x"), `spec.rules[0].sources[0].spiffe "spiffe:/x": want spiffe://<trust domain>/<path>`},
		{"spiffe no trust domain", spiffe("spiffe:///ns/a"), `spec.rules[0].sources[0].spiffe "spiffe:///ns/a": want a trust domain after spiffe://`},
		{"spiffe trust domain chars", spiffe("spiffe://Example.com/a"), `spiffe "spiffe://Example.com/a": trust domain "Example.com": character 'E'`},
		{"spiffe trust domain port", spiffe("spiffe://td:8443/a"), `trust domain "td:8443": character ':'`},
		{"spiffe no path", spiffe("spiffe://td"), `spiffe "spiffe://td": want a path after the trust domain (spiffe://td/* for every workload of it)`},
		{"spiffe trailing slash", spiffe("spiffe://td/ns/"), `spiffe "spiffe://td/ns/": empty path segment`},
		{"spiffe empty segment", spiffe("spiffe://td/ns//sa"), `spiffe "spiffe://td/ns//sa": empty path segment`},
		{"spiffe dot segment", spiffe("spiffe://td/ns/../sa"), `path segment "..": want no relative segments`},
		{"spiffe wildcard inside", spiffe("spiffe://td/ns/*"), `"*" only as the whole path`},
		{"spiffe segment chars", spiffe("spiffe://td/ns/a b"), `path segment "a b": character ' '`},
		{"spiffe too long", spiffe("spiffe://td/" + strings.Repeat("a", sec.MaxSPIFFEID)), `want at most 2048 bytes`},
		{"service account namespace", sa("Shop", "x"), `spec.rules[0].sources[0].serviceAccount.namespace "Shop": want a namespace name`},
		{"service account name", sa("", "a_b"), `spec.rules[0].sources[0].serviceAccount.name "a_b": want a service account name, or "*"`},
		{"namespace source", src(sec.AuthorizationSource{Type: sec.SourceNamespace, Namespace: "a.b"}), `spec.rules[0].sources[0].namespace "a.b": want a namespace name`},
		{"port range", func(p *sec.AuthorizationPolicy) {
			p.Spec.Rules = []sec.AuthorizationRule{{NetworkAttributes: &sec.AuthorizationNetworkAttributes{Ports: []int32{80, 0}}}}
		}, `spec.rules[0].networkAttributes.ports[1] "0": want a port 1-65535`},
		{"port above range", func(p *sec.AuthorizationPolicy) {
			p.Spec.Rules = []sec.AuthorizationRule{{NetworkAttributes: &sec.AuthorizationNetworkAttributes{Ports: []int32{65536}}}}
		}, `spec.rules[0].networkAttributes.ports[0] "65536": want a port 1-65535`},
		{"too many ports", func(p *sec.AuthorizationPolicy) {
			ports := make([]int32, sec.MaxPorts+1)
			for i := range ports {
				ports[i] = int32(i + 1)
			}
			p.Spec.Rules = []sec.AuthorizationRule{{NetworkAttributes: &sec.AuthorizationNetworkAttributes{Ports: ports}}}
		}, `spec.rules[0].networkAttributes.ports "33": want at most 32 ports`},
		{"method", http(sec.AuthorizationHTTPAttributes{Methods: []sec.HTTPMethod{"get"}}), `spec.rules[0].http.methods[0] "get": want one of GET, HEAD`},
		{"path type", http(sec.AuthorizationHTTPAttributes{Paths: []sec.HTTPPathMatch{{Type: "RegularExpression", Value: "/a.*"}}}),
			`spec.rules[0].http.paths[0].type "RegularExpression": want Exact or PathPrefix`},
		{"path relative", http(sec.AuthorizationHTTPAttributes{Paths: []sec.HTTPPathMatch{{Value: "api"}}}), `spec.rules[0].http.paths[0].value "api": want an absolute path`},
		{"path dot segment", http(sec.AuthorizationHTTPAttributes{Paths: []sec.HTTPPathMatch{{Type: sec.PathMatchExact, Value: "/a/../admin"}}}),
			`spec.rules[0].http.paths[0].value "/a/../admin": must not contain //, /./, /../ or %2f`},
		{"path query", http(sec.AuthorizationHTTPAttributes{Paths: []sec.HTTPPathMatch{{Value: "/a?b"}}}), `spec.rules[0].http.paths[0].value "/a?b": want only the characters`},
		{"too many paths", http(sec.AuthorizationHTTPAttributes{Paths: make([]sec.HTTPPathMatch, sec.MaxPaths+1)}), `spec.rules[0].http.paths "33": want at most 32 paths`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, errs := ConvertAuthz(authzPolicy("p", tc.edit))
			var msgs []string
			for _, e := range errs {
				msgs = append(msgs, e.Error())
			}
			if !strings.Contains(strings.Join(msgs, "\n"), tc.want) {
				t.Errorf("errors:\n%s\nwant one containing %s", strings.Join(msgs, "\n"), tc.want)
			}
		})
	}
}

func TestResolveAuthz(t *testing.T) {
	invalidRule := func(p *sec.AuthorizationPolicy) {
		p.Spec.Rules = []sec.AuthorizationRule{{Sources: []sec.AuthorizationSource{{Type: sec.SourceSPIFFE, SPIFFE: "spiffe:/x"}}}}
	}
	deny := func(p *sec.AuthorizationPolicy) { p.Spec.Action = sec.ActionDeny }
	dry := func(p *sec.AuthorizationPolicy) { p.Spec.DryRun = true }
	targets := func(refs ...sec.PolicyTargetReferenceWithLabelSelectors) func(*sec.AuthorizationPolicy) {
		return func(p *sec.AuthorizationPolicy) { p.Spec.TargetRefs = refs }
	}
	svcRef := func(n string) sec.PolicyTargetReferenceWithLabelSelectors {
		return sec.PolicyTargetReferenceWithLabelSelectors{Kind: "Service", Name: n}
	}
	exists := func(k ServiceKey) bool { return k == ServiceKey{"shop", "web"} || k == ServiceKey{"other", "api"} }
	for _, tc := range []struct {
		name string
		p    *sec.AuthorizationPolicy
		// applies: "" (nothing), "rules" (the converted policy), "failclosed".
		applies string
		dryRun  bool
		errs    int
		targets []AuthzTarget // Index, Kind, Name, Found (Selector not compared)
		missing []string
	}{
		{"valid", authzPolicy("a"), "rules", false, 0, []AuthzTarget{{Index: 0, Kind: "Service", Name: "web", Found: true}}, nil},
		{"invalid allow allows nothing", authzPolicy("a", invalidRule), "allownothing", false, 1, []AuthzTarget{{Kind: "Service", Name: "web", Found: true}}, nil},
		{"invalid deny fails closed", authzPolicy("a", invalidRule, deny), "failclosed", false, 1, []AuthzTarget{{Kind: "Service", Name: "web", Found: true}}, nil},
		{"invalid dry-run deny fails closed in dry run", authzPolicy("a", invalidRule, deny, dry), "failclosed", true, 1,
			[]AuthzTarget{{Kind: "Service", Name: "web", Found: true}}, nil},
		{"invalid deny without a valid target applies nothing", authzPolicy("a", deny, targets(sec.PolicyTargetReferenceWithLabelSelectors{Kind: "Pod"})), "", false, 1, nil, nil},
		{"invalid deny keeps its valid targets", authzPolicy("a", deny, targets(svcRef("web"), svcRef("Bad"))), "failclosed", false, 1,
			[]AuthzTarget{{Kind: "Service", Name: "web", Found: true}}, nil},
		{"invalid deny whose service is missing applies nothing", authzPolicy("a", invalidRule, deny, targets(svcRef("gone"))), "", false, 1,
			[]AuthzTarget{{Kind: "Service", Name: "gone"}}, []string{"gone"}},
		{"target not found", authzPolicy("a", targets(svcRef("gone"))), "", false, 0, []AuthzTarget{{Kind: "Service", Name: "gone"}}, []string{"gone"}},
		{"service of another namespace is not found", authzPolicy("a", targets(svcRef("api"))), "", false, 0, []AuthzTarget{{Kind: "Service", Name: "api"}}, []string{"api"}},
		{"some targets found", authzPolicy("a", targets(svcRef("gone"), svcRef("web"))), "rules", false, 0,
			[]AuthzTarget{{Kind: "Service", Name: "gone"}, {Index: 1, Kind: "Service", Name: "web", Found: true}}, []string{"gone"}},
		{"pod target always found", authzPolicy("a", targets(sec.PolicyTargetReferenceWithLabelSelectors{Kind: "Pod", Selector: &metav1.LabelSelector{}})), "rules", false, 0,
			[]AuthzTarget{{Kind: "Pod", Found: true}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := ResolveAuthz([]*sec.AuthorizationPolicy{tc.p}, exists)
			if len(rs) != 1 {
				t.Fatalf("%d results", len(rs))
			}
			r := rs[0]
			if r.Namespace != "shop" || r.Name != "a" || r.Generation != 3 {
				t.Errorf("identity = %s/%s@%d", r.Namespace, r.Name, r.Generation)
			}
			if len(r.Errors) != tc.errs || r.Valid() != (tc.errs == 0) {
				t.Errorf("errors = %v, want %d", r.Errors, tc.errs)
			}
			if d := cmp.Diff(tc.targets, r.Targets, cmpopts.IgnoreFields(AuthzTarget{}, "Selector"), cmpopts.EquateEmpty()); d != "" {
				t.Errorf("targets (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.missing, r.Missing(), cmpopts.EquateEmpty()); d != "" {
				t.Errorf("missing (-want +got):\n%s", d)
			}
			switch tc.applies {
			case "":
				if r.Policy != nil {
					t.Errorf("policy = %+v, want none applied", r.Policy)
				}
			case "rules":
				if r.Policy == nil || r.Policy.FailClosed || len(r.Policy.Rules) != len(tc.p.Spec.Rules) {
					t.Errorf("policy = %+v, want the converted one", r.Policy)
				}
			case "allownothing":
				want := &AuthzPolicy{Namespace: "shop", Name: "a", Action: AuthzAllow, DryRun: tc.dryRun}
				if d := cmp.Diff(want, r.Policy); d != "" {
					t.Errorf("policy (-want +got):\n%s", d)
				}
			case "failclosed":
				want := &AuthzPolicy{Namespace: "shop", Name: "a", Action: AuthzDeny, DryRun: tc.dryRun, FailClosed: true}
				if d := cmp.Diff(want, r.Policy); d != "" {
					t.Errorf("policy (-want +got):\n%s", d)
				}
			}
		})
	}
}

func TestResolveAuthzSorted(t *testing.T) {
	mk := func(ns, name string) *sec.AuthorizationPolicy {
		p := authzPolicy(name)
		p.Namespace = ns
		return p
	}
	rs := ResolveAuthz([]*sec.AuthorizationPolicy{mk("b", "a"), mk("a", "z"), mk("a", "b")}, func(ServiceKey) bool { return true })
	var got []string
	for _, r := range rs {
		got = append(got, r.Namespace+"/"+r.Name)
	}
	if d := cmp.Diff([]string{"a/b", "a/z", "b/a"}, got); d != "" {
		t.Errorf("order (-want +got):\n%s", d)
	}
}

func TestSelectAuthz(t *testing.T) {
	web := ServiceKey{"shop", "web"}
	pods := []*LocalPod{
		{UID: "w1", Namespace: "shop", Name: "web-1", Services: []ServiceKey{web}},
		{UID: "d1", Namespace: "shop", Name: "db-1"},
		{UID: "o1", Namespace: "other", Name: "web-1", Services: []ServiceKey{{"other", "web"}}},
	}
	podLabels := map[string]map[string]string{"w1": {"app": "web"}, "d1": {"app": "db"}, "o1": {"app": "db"}}
	sel := func(s string) labels.Selector {
		l, err := labels.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	pol := func(ns, name string) *AuthzPolicy { return &AuthzPolicy{Namespace: ns, Name: name, Action: AuthzAllow} }
	onWeb := pol("shop", "a-web")
	onDB := pol("shop", "b-db")
	everyPod := pol("shop", "c-all")
	both := pol("shop", "d-both")
	resolved := []AuthzResolved{
		{Namespace: "shop", Name: "a-web", Policy: onWeb, Targets: []AuthzTarget{{Kind: "Service", Name: "web", Found: true}}},
		{Namespace: "shop", Name: "b-db", Policy: onDB, Targets: []AuthzTarget{{Kind: "Pod", Selector: sel("app=db"), Found: true}}},
		{Namespace: "shop", Name: "c-all", Policy: everyPod, Targets: []AuthzTarget{{Kind: "Pod", Selector: labels.Everything(), Found: true}}},
		// Two targets selecting one pod: the policy once.
		{Namespace: "shop", Name: "d-both", Policy: both, Targets: []AuthzTarget{
			{Kind: "Service", Name: "web", Found: true}, {Kind: "Pod", Selector: sel("app=web"), Found: true}}},
		// No policy to apply (Policy nil): selects nothing.
		{Namespace: "shop", Name: "e-invalid", Targets: []AuthzTarget{{Kind: "Pod", Selector: labels.Everything(), Found: true}}},
		// A missing Service selects nothing.
		{Namespace: "shop", Name: "f-missing", Policy: pol("shop", "f-missing"), Targets: []AuthzTarget{{Kind: "Service", Name: "gone"}}},
		// another namespace's policy on a Service of the same name in its namespace.
		{Namespace: "other", Name: "g", Policy: pol("other", "g"), Targets: []AuthzTarget{{Kind: "Service", Name: "web", Found: true}}},
	}
	got := SelectAuthz(resolved, pods, podLabels)
	want := map[string][]*AuthzPolicy{
		"w1": {onWeb, everyPod, both},
		"d1": {onDB, everyPod},
		"o1": {resolved[6].Policy},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("selection (-want +got):\n%s", d)
	}
	if got := SelectAuthz(resolved[4:6], pods, podLabels); got != nil {
		t.Errorf("selection of unapplied policies = %v, want nil", got)
	}
}

// TestAssembleAuthz: Assemble resolves the sources' policies against the model's local services
// and selects this node's pods by their labels and Services.
func TestAssembleAuthz(t *testing.T) {
	web := svc("shop", "web", "10.96.0.10", t0)
	web.Spec.Selector = map[string]string{"app": "web"}
	pod := func(uid, app string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: app + "-" + uid, UID: types.UID(uid), Labels: map[string]string{"app": app}}}
	}
	att := func(uid string) cniv1.PodAttachment {
		return cniv1.PodAttachment{PodUID: uid, NetnsPath: "/var/run/netns/" + uid, IPs: []netip.Addr{netip.MustParseAddr("10.244.0.5")}}
	}
	unmeshed := authzPolicy("on-unmeshed", func(p *sec.AuthorizationPolicy) { p.Namespace = "plain" })
	in := Sources{
		Cluster: "a", MeshNamespaces: map[string]bool{"shop": true},
		Services:    []*corev1.Service{web},
		Pods:        []*corev1.Pod{pod("u1", "web"), pod("u2", "db")},
		Attachments: map[string]cniv1.PodAttachment{"u1": att("u1"), "u2": att("u2")},
		AuthorizationPolicies: []*sec.AuthorizationPolicy{
			authzPolicy("web-only"),
			authzPolicy("db", func(p *sec.AuthorizationPolicy) {
				p.Spec.Action = sec.ActionDeny
				p.Spec.TargetRefs = []sec.PolicyTargetReferenceWithLabelSelectors{{Kind: "Pod", Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}}
			}),
			unmeshed,
		},
	}
	m := Assemble(1, in)
	got := map[string][]string{}
	for uid, ps := range m.Authz {
		for _, p := range ps {
			got[uid] = append(got[uid], fmt.Sprintf("%s %s", p.Name, p.Action))
		}
	}
	if d := cmp.Diff(map[string][]string{"u1": {"web-only ALLOW"}, "u2": {"db DENY"}}, got); d != "" {
		t.Errorf("Mesh.Authz (-want +got):\n%s", d)
	}
	var names []string
	for _, r := range m.AuthzResolved() {
		names = append(names, fmt.Sprintf("%s/%s missing=%v", r.Namespace, r.Name, r.Missing()))
	}
	// plain/on-unmeshed targets a Service named web in namespace plain, which the model does not
	// hold: not found there.
	if d := cmp.Diff([]string{"plain/on-unmeshed missing=[web]", "shop/db missing=[]", "shop/web-only missing=[]"}, names); d != "" {
		t.Errorf("AuthzResolved (-want +got):\n%s", d)
	}
	if New(1, "a", "", "", Node{}, nil, nil, nil).AuthzResolved() != nil {
		t.Error("a Mesh made with New has resolved policies")
	}
}

// TestAuthzCache shows that an assembly with a cache converts an AuthorizationPolicy once per
// version: the same object gives the same conversion (and the same result as without a cache),
// a new resource version is converted again, and a policy gone is forgotten.
func TestAuthzCache(t *testing.T) {
	exists := func(ServiceKey) bool { return true }
	a := authzPolicy("a")
	a.ResourceVersion = "1"
	b := authzPolicy("b", func(p *sec.AuthorizationPolicy) { p.Spec.Action = "Sometimes" }) // invalid
	c := &AuthzCache{}
	first := resolveAuthz([]*sec.AuthorizationPolicy{a, b}, exists, c)
	if !reflect.DeepEqual(first, ResolveAuthz([]*sec.AuthorizationPolicy{a, b}, exists)) {
		t.Fatalf("with a cache: %+v, want what ResolveAuthz gives", first)
	}
	second := resolveAuthz([]*sec.AuthorizationPolicy{a, b}, exists, c)
	if second[0].Policy != first[0].Policy || len(second[1].Errors) == 0 {
		t.Fatalf("the same objects again: converted anew (%p, %p) or errors lost %v", first[0].Policy, second[0].Policy, second[1].Errors)
	}
	// Found is per assembly: a Service gone is seen with the cached conversion.
	gone := resolveAuthz([]*sec.AuthorizationPolicy{a}, func(ServiceKey) bool { return false }, c)
	if gone[0].Policy != nil || gone[0].Targets[0].Found || !second[0].Targets[0].Found {
		t.Fatalf("target of a cached conversion: %+v (before %+v), want not found now, found before", gone[0].Targets, second[0].Targets)
	}
	if _, ok := c.m[b]; ok || len(c.m) != 1 {
		t.Fatalf("cache holds %d entries after b went, want only a", len(c.m))
	}
	// A new version of the object is converted again (the store hands a new object, but even
	// the same one changed in place is).
	a.ResourceVersion, a.Spec.Action = "2", sec.ActionDeny
	third := resolveAuthz([]*sec.AuthorizationPolicy{a}, exists, c)
	if third[0].Policy == first[0].Policy || third[0].Policy.Action != AuthzDeny {
		t.Fatalf("after a new resource version: %+v, want converted again as DENY", third[0].Policy)
	}
}
