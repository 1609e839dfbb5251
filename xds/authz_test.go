package xds

import (
	"bytes"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/internal/testenv"
	"github.com/aethermesh/aether/model"
)

// call is one connection or request an evaluation of translateAuthz's output judges: the caller's
// URI SAN, and on an HTTP port the method and the path.
type call struct {
	san, method, path string
}

// evalRBAC is Envoy's verdict for RBAC r on c as far as translateAuthz uses RBAC (any,
// authenticated principal names, :method headers, url_path, and/or rules): allowed, and the
// matched policy. A nil r allows (no engine).
func evalRBAC(t *testing.T, r *rbacv3.RBAC, c call) (bool, string) {
	t.Helper()
	if r == nil {
		return true, ""
	}
	for _, name := range slices.Sorted(maps.Keys(r.Policies)) {
		p := r.Policies[name]
		perm := slices.ContainsFunc(p.Permissions, func(x *rbacv3.Permission) bool { return evalPermission(t, x, c) })
		prin := slices.ContainsFunc(p.Principals, func(x *rbacv3.Principal) bool { return evalPrincipal(t, x, c) })
		if perm && prin {
			return r.Action == rbacv3.RBAC_ALLOW, name
		}
	}
	return r.Action == rbacv3.RBAC_DENY, ""
}

func evalString(t *testing.T, m *matcherv3.StringMatcher, s string) bool {
	t.Helper()
	fold := func(x string) string {
		if m.IgnoreCase {
			return strings.ToLower(x)
		}
		return x
	}
	switch p := m.MatchPattern.(type) {
	case *matcherv3.StringMatcher_Exact:
		return fold(s) == fold(p.Exact)
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(fold(s), fold(p.Prefix))
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(fold(s), fold(p.Contains))
	case *matcherv3.StringMatcher_SafeRegex:
		return regexp.MustCompile("^(?:" + p.SafeRegex.Regex + ")$").MatchString(s)
	}
	t.Fatalf("string matcher %v", m)
	return false
}

func evalPermission(t *testing.T, p *rbacv3.Permission, c call) bool {
	t.Helper()
	switch r := p.Rule.(type) {
	case *rbacv3.Permission_Any:
		return true
	case *rbacv3.Permission_AndRules:
		for _, x := range r.AndRules.Rules {
			if !evalPermission(t, x, c) {
				return false
			}
		}
		return true
	case *rbacv3.Permission_OrRules:
		return slices.ContainsFunc(r.OrRules.Rules, func(x *rbacv3.Permission) bool { return evalPermission(t, x, c) })
	case *rbacv3.Permission_NotRule:
		return !evalPermission(t, r.NotRule, c)
	case *rbacv3.Permission_Header:
		if r.Header.Name != ":method" {
			t.Fatalf("header permission on %s", r.Header.Name)
		}
		return evalString(t, r.Header.GetStringMatch(), c.method)
	case *rbacv3.Permission_UrlPath:
		return evalString(t, r.UrlPath.GetPath(), c.path)
	}
	t.Fatalf("permission %v", p)
	return false
}

func evalPrincipal(t *testing.T, p *rbacv3.Principal, c call) bool {
	t.Helper()
	switch id := p.Identifier.(type) {
	case *rbacv3.Principal_Any:
		return true
	case *rbacv3.Principal_Authenticated_:
		if id.Authenticated.PrincipalName == nil {
			return true
		}
		return evalString(t, id.Authenticated.PrincipalName, c.san)
	}
	t.Fatalf("principal %v (only the certificate may identify a caller)", p)
	return false
}

// verdict is the chain's verdict on c: the DENY filter, then the ALLOW filter, enforced or (shadow)
// as the dry runs would have it.
func verdict(t *testing.T, deny, allow authzRBAC, shadow bool, c call) bool {
	t.Helper()
	d, a := deny.rules, allow.rules
	if shadow {
		d, a = deny.shadow, allow.shadow
	}
	ok, _ := evalRBAC(t, d, c)
	if !ok {
		return false
	}
	ok, _ = evalRBAC(t, a, c)
	return ok
}

// TestTranslateAuthz checks the policy-to-RBAC translation by its verdicts: precedence (DENY over
// ALLOW, no policy means allow, ALLOW on another port of the pod still closes this one), port
// scoping, sources (service account, namespace, SPIFFE ID and trust-domain wildcard, any, none),
// methods and paths (Gateway API prefix semantics), L7 rules on TCP ports, FailClosed and dry
// runs.
func TestTranslateAuthz(t *testing.T) {
	const td = "td"
	id := func(ns, sa string) string { return model.SPIFFEID(td, ns, sa) }
	sa := func(ns, name string) model.AuthzSource {
		return model.AuthzSource{ServiceAccount: &model.AuthzServiceAccount{Namespace: ns, Name: name}}
	}
	pol := func(name string, action model.AuthzAction, rules ...model.AuthzRule) *model.AuthzPolicy {
		return &model.AuthzPolicy{Namespace: "web", Name: name, Action: action, Rules: rules}
	}
	dry := func(p *model.AuthzPolicy) *model.AuthzPolicy { p.DryRun = true; return p }
	prefix := func(v string) []model.PathMatch { return []model.PathMatch{{Type: model.MatchPathPrefix, Value: v}} }
	a, b := id("shop", "a"), id("shop", "b")
	type check struct {
		c      call
		port   uint32
		http   bool
		want   bool
		shadow *bool // the dry-run verdict, when it differs from want
	}
	yes, no := true, false
	cases := []struct {
		name     string
		policies []*model.AuthzPolicy
		checks   []check
	}{
		{"no policy allows", nil, []check{{call{san: a}, 80, true, true, nil}, {call{san: a}, 3306, false, true, nil}}},
		{"ALLOW by service account", []*model.AuthzPolicy{pol("p", model.AuthzAllow, model.AuthzRule{Sources: []model.AuthzSource{sa("shop", "a")}})}, []check{
			{call{san: a, method: "GET", path: "/"}, 80, true, true, nil},
			{call{san: b, method: "GET", path: "/"}, 80, true, false, nil},
			{call{san: a}, 3306, false, true, nil},
			{call{san: b}, 3306, false, false, nil},
			{call{san: id("shop", "a2")}, 3306, false, false, nil}, // exact, not a prefix
		}},
		{"DENY over ALLOW", []*model.AuthzPolicy{
			pol("allow", model.AuthzAllow, model.AuthzRule{AnySource: true}),
			pol("deny", model.AuthzDeny, model.AuthzRule{Sources: []model.AuthzSource{sa("shop", "a")}, Paths: prefix("/admin")}),
		}, []check{
			{call{san: a, method: "GET", path: "/admin/x"}, 80, true, false, nil},
			{call{san: a, method: "GET", path: "/x"}, 80, true, true, nil},
			{call{san: b, method: "GET", path: "/admin"}, 80, true, true, nil},
			// On a TCP port the DENY rule matches without its path: a is refused.
			{call{san: a}, 3306, false, false, nil},
			{call{san: b}, 3306, false, true, nil},
		}},
		{"ALLOW on another port closes this one", []*model.AuthzPolicy{pol("p", model.AuthzAllow, model.AuthzRule{AnySource: true, Ports: []uint32{8080}})}, []check{
			{call{san: a, method: "GET", path: "/"}, 8080, true, true, nil},
			{call{san: a, method: "GET", path: "/"}, 9090, true, false, nil},
			{call{san: a}, 3306, false, false, nil},
		}},
		{"DENY scoped to a port", []*model.AuthzPolicy{pol("p", model.AuthzDeny, model.AuthzRule{AnySource: true, Ports: []uint32{8080}})}, []check{
			{call{san: a, method: "GET", path: "/"}, 8080, true, false, nil},
			{call{san: a, method: "GET", path: "/"}, 9090, true, true, nil},
		}},
		{"L7 ALLOW rule on a TCP port matches nothing", []*model.AuthzPolicy{pol("p", model.AuthzAllow,
			model.AuthzRule{Sources: []model.AuthzSource{sa("shop", "a")}, Methods: []string{"GET"}})}, []check{
			{call{san: a}, 3306, false, false, nil},
			{call{san: a, method: "GET", path: "/"}, 80, true, true, nil},
			{call{san: a, method: "POST", path: "/"}, 80, true, false, nil},
		}},
		{"namespace, SPIFFE ID and trust-domain wildcard", []*model.AuthzPolicy{pol("p", model.AuthzAllow, model.AuthzRule{Sources: []model.AuthzSource{
			{Namespace: "front"}, {SPIFFE: "spiffe://other/ns/x/sa/y"}, {SPIFFE: "spiffe://partner/*"}, sa("ops", "*"),
		}})}, []check{
			{call{san: id("front", "any")}, 1, false, true, nil},
			{call{san: id("frontend", "any")}, 1, false, false, nil},
			{call{san: "spiffe://other/ns/x/sa/y"}, 1, false, true, nil},
			{call{san: "spiffe://other/ns/x/sa/z"}, 1, false, false, nil},
			{call{san: "spiffe://partner/ns/q/sa/r"}, 1, false, true, nil},
			{call{san: "spiffe://partnerx/ns/q/sa/r"}, 1, false, false, nil},
			{call{san: id("ops", "bot")}, 1, false, true, nil},
			{call{san: id("shop", "ops")}, 1, false, false, nil},
		}},
		{"empty sources match no caller", []*model.AuthzPolicy{pol("p", model.AuthzAllow, model.AuthzRule{Sources: []model.AuthzSource{}})}, []check{
			{call{san: a}, 1, false, false, nil},
		}},
		{"an ALLOW policy without rules closes the pod", []*model.AuthzPolicy{pol("p", model.AuthzAllow)}, []check{
			{call{san: a, method: "GET", path: "/"}, 80, true, false, nil},
		}},
		{"methods and paths", []*model.AuthzPolicy{pol("p", model.AuthzAllow,
			model.AuthzRule{AnySource: true, Methods: []string{"GET", "HEAD"}, Paths: append(prefix("/a/"), model.PathMatch{Type: model.MatchExact, Value: "/e"})},
			model.AuthzRule{AnySource: true, Paths: []model.PathMatch{{Type: model.MatchRegex, Value: "/nev(er)?"}}},
		)}, []check{
			{call{san: a, method: "GET", path: "/a"}, 80, true, true, nil},
			{call{san: a, method: "HEAD", path: "/a/b/c"}, 80, true, true, nil},
			{call{san: a, method: "GET", path: "/ab"}, 80, true, false, nil},
			{call{san: a, method: "GET", path: "/e"}, 80, true, true, nil},
			{call{san: a, method: "GET", path: "/e/f"}, 80, true, false, nil},
			{call{san: a, method: "POST", path: "/a"}, 80, true, false, nil},
			{call{san: a, method: "POST", path: "/never"}, 80, true, true, nil},
		}},
		{"a DENY rule refuses every spelling of what it names", []*model.AuthzPolicy{
			pol("allow", model.AuthzAllow, model.AuthzRule{AnySource: true}),
			pol("deny", model.AuthzDeny, model.AuthzRule{Sources: []model.AuthzSource{sa("shop", "a")}, Methods: []string{"DELETE"}, Paths: prefix("/admin")}),
		}, []check{
			{call{san: a, method: "DELETE", path: "/admin/users"}, 80, true, false, nil},
			{call{san: a, method: "delete", path: "/admin/users"}, 80, true, false, nil},
			{call{san: a, method: "DELETE", path: "/admin%2Fusers"}, 80, true, false, nil},
			{call{san: a, method: "DELETE", path: "/x/..%5cadmin"}, 80, true, false, nil},
			{call{san: a, method: "GET", path: "/admin%2fusers"}, 80, true, true, nil},
			{call{san: a, method: "DELETE", path: "/other"}, 80, true, true, nil},
			{call{san: b, method: "delete", path: "/admin%2Fusers"}, 80, true, true, nil},
			{call{san: a, method: "DELETE", path: "/ADMIN/users"}, 80, true, false, nil},
			{call{san: a, method: "DELETE", path: "/admin;jsessionid=1/users"}, 80, true, false, nil},
			{call{san: a, method: "DELETE", path: "/x;y/admin/users"}, 80, true, false, nil}, // a parameter in any segment
			{call{san: a, method: "DELETE", path: "/administrator"}, 80, true, true, nil},
		}},
		{"a DENY of GET refuses HEAD; exact and regex paths of a DENY ignore case", []*model.AuthzPolicy{
			pol("deny", model.AuthzDeny, model.AuthzRule{AnySource: true, Methods: []string{"GET"}, Paths: []model.PathMatch{
				{Type: model.MatchExact, Value: "/secret"}, {Type: model.MatchRegex, Value: "/v[0-9]+/keys"},
			}}),
		}, []check{
			{call{san: a, method: "HEAD", path: "/secret"}, 80, true, false, nil},
			{call{san: a, method: "GET", path: "/Secret"}, 80, true, false, nil},
			{call{san: a, method: "GET", path: "/secret;x"}, 80, true, false, nil},
			{call{san: a, method: "GET", path: "/secret/"}, 80, true, false, nil},
			{call{san: a, method: "GET", path: "/V2/KEYS"}, 80, true, false, nil},
			{call{san: a, method: "GET", path: "/secrets"}, 80, true, true, nil},
			{call{san: a, method: "POST", path: "/secret"}, 80, true, true, nil},
		}},
		{"an ALLOW rule allows only the exact spelling", []*model.AuthzPolicy{
			pol("allow", model.AuthzAllow, model.AuthzRule{AnySource: true, Methods: []string{"GET"}, Paths: prefix("/public")}),
		}, []check{
			{call{san: a, method: "GET", path: "/public/x"}, 80, true, true, nil},
			{call{san: a, method: "get", path: "/public/x"}, 80, true, false, nil},
			{call{san: a, method: "GET", path: "/public%2F..%2Fadmin"}, 80, true, false, nil},
			{call{san: a, method: "GET", path: "/public/..%2Fadmin"}, 80, true, false, nil},
			{call{san: a, method: "GET", path: "/public/..;/admin"}, 80, true, false, nil},
			{call{san: a, method: "GET", path: "/public/a%5cb"}, 80, true, false, nil},
		}},
		{"prefix / is every path", []*model.AuthzPolicy{pol("p", model.AuthzDeny, model.AuthzRule{AnySource: true, Paths: prefix("/")})}, []check{
			{call{san: a, method: "GET", path: "/anything"}, 80, true, false, nil},
		}},
		{"FailClosed refuses everyone everywhere", []*model.AuthzPolicy{
			pol("allow", model.AuthzAllow, model.AuthzRule{AnySource: true}),
			{Namespace: "web", Name: "broken", Action: model.AuthzDeny, FailClosed: true, Rules: []model.AuthzRule{{Sources: []model.AuthzSource{sa("shop", "b")}, Ports: []uint32{1}}}},
		}, []check{
			{call{san: a, method: "GET", path: "/"}, 80, true, false, nil},
			{call{san: a}, 3306, false, false, nil},
		}},
		{"dry-run DENY counts without refusing", []*model.AuthzPolicy{dry(pol("audit", model.AuthzDeny, model.AuthzRule{Sources: []model.AuthzSource{sa("shop", "a")}}))}, []check{
			{call{san: a}, 3306, false, true, &no},
			{call{san: b}, 3306, false, true, &yes},
		}},
		{"dry-run ALLOW as if enforced beside the enforced policies", []*model.AuthzPolicy{
			pol("deny-b", model.AuthzDeny, model.AuthzRule{Sources: []model.AuthzSource{sa("shop", "b")}}),
			dry(pol("only-a", model.AuthzAllow, model.AuthzRule{Sources: []model.AuthzSource{sa("shop", "a")}})),
		}, []check{
			{call{san: a}, 3306, false, true, &yes},
			{call{san: b}, 3306, false, false, &no},
			{call{san: id("shop", "c")}, 3306, false, true, &no},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dryRun := slices.ContainsFunc(c.policies, func(p *model.AuthzPolicy) bool { return p.DryRun })
			for _, ck := range c.checks {
				deny, allow := translateAuthz([]string{td}, c.policies, ck.port, ck.http)
				if got := verdict(t, deny, allow, false, ck.c); got != ck.want {
					t.Errorf("%+v on port %d: allowed %t, want %t", ck.c, ck.port, got, ck.want)
				}
				if !dryRun {
					if deny.shadow != nil || allow.shadow != nil {
						t.Errorf("shadow rules without a dry-run policy")
					}
					continue
				}
				want := ck.want
				if ck.shadow != nil {
					want = *ck.shadow
				}
				if got := verdict(t, deny, allow, true, ck.c); got != want {
					t.Errorf("%+v on port %d: dry-run verdict allowed %t, want %t", ck.c, ck.port, got, want)
				}
			}
		})
	}
}

// TestTranslateAuthzPolicyNames checks that each Envoy policy names its AuthorizationPolicy and
// rule, so that a denial says which one refused.
func TestTranslateAuthzPolicyNames(t *testing.T) {
	deny, allow := translateAuthz([]string{"td"}, []*model.AuthzPolicy{
		{Namespace: "web", Name: "deny", Action: model.AuthzDeny, Rules: []model.AuthzRule{{AnySource: true, Ports: []uint32{1}}, {AnySource: true}}},
		{Namespace: "web", Name: "broken", Action: model.AuthzDeny, FailClosed: true},
	}, 80, true)
	_, matched := evalRBAC(t, deny.rules, call{san: "x", method: "GET", path: "/"})
	if matched != "web/broken#fail-closed" {
		t.Errorf("matched %q", matched)
	}
	if got := slices.Sorted(maps.Keys(deny.rules.Policies)); !slices.Equal(got, []string{"web/broken#fail-closed", "web/deny#1"}) {
		t.Errorf("DENY policies %v", got)
	}
	if allow.rules != nil || allow.shadow != nil {
		t.Errorf("an ALLOW RBAC without ALLOW policies: %v", allow)
	}
}

// authzGoldenMesh is goldenMesh with policies on web-1 (HTTP 8080, gRPC 9090, TCP 7000) and
// db-0 (TCP 3306), one of them a dry run.
func authzGoldenMesh() *model.Mesh {
	m := goldenMesh()
	client := model.AuthzSource{ServiceAccount: &model.AuthzServiceAccount{Namespace: "shop", Name: "client"}}
	m.Authz = map[string][]*model.AuthzPolicy{
		"uid-web-1": {
			{Namespace: "shop", Name: "web-allow", Action: model.AuthzAllow, Rules: []model.AuthzRule{
				{Sources: []model.AuthzSource{client, {Namespace: "edge"}}, Ports: []uint32{8080}, Methods: []string{"GET"}, Paths: []model.PathMatch{{Type: model.MatchPathPrefix, Value: "/api/"}}},
				{AnySource: true, Ports: []uint32{9090, 7000}},
			}},
			{Namespace: "shop", Name: "web-deny", Action: model.AuthzDeny, Rules: []model.AuthzRule{
				{Sources: []model.AuthzSource{{SPIFFE: "spiffe://other/*"}}, Paths: []model.PathMatch{{Type: model.MatchExact, Value: "/admin"}}},
			}},
		},
		"uid-db-0": {
			{Namespace: "shop", Name: "db-audit", Action: model.AuthzAllow, DryRun: true, Rules: []model.AuthzRule{{Sources: []model.AuthzSource{client}}}},
		},
	}
	return m
}

// TestAuthzGolden builds the golden mesh with authorization policies: the inbound listeners of the
// pods with policies and their RBAC filters' ECDS resources match their golden files, every
// resource passes ValidateAll and the snapshot is Consistent; every listener and cluster is the
// one the mesh without policies builds (the representative golden files), byte for byte, the
// policied pods' inbound listeners included: policies change ECDS resources only, so a pod's
// first policy never changes a listener (connections opened before it would otherwise go on
// without RBAC until they drain).
func TestAuthzGolden(t *testing.T) {
	m := authzGoldenMesh()
	r := buildValid(t, m, Options{})
	var inbound []*listenerv3.Listener
	for _, l := range r.Listeners {
		if l.GetName() == "inbound|shop/web-1" || l.GetName() == "inbound|shop/db-0" {
			inbound = append(inbound, l)
		}
	}
	if len(inbound) != 2 {
		t.Fatalf("inbound listeners of the pods with policies: %d", len(inbound))
	}
	testenv.Golden(t, "authz.inbound.json", stableJSON(t, asMessages(inbound)))
	var exts []*core.TypedExtensionConfig
	for _, x := range r.Extensions {
		if strings.Contains(x.GetName(), "shop/web-1:") || strings.Contains(x.GetName(), "shop/db-0:") {
			exts = append(exts, x)
		}
	}
	// web-1: 7000, 8080, 9090; db-0: 3306; DENY and ALLOW each.
	if len(exts) != 8 {
		t.Errorf("%d RBAC extension configs, want 8", len(exts))
	}
	testenv.Golden(t, "authz.extensions.json", stableJSON(t, asMessages(exts)))

	plain := buildValid(t, goldenMesh(), Options{})
	for i, l := range plain.Listeners {
		if !proto.Equal(l, r.Listeners[i]) {
			t.Errorf("%s changed with policies", l.GetName())
		}
		if !bytes.Equal(stableJSON(t, []proto.Message{l}), stableJSON(t, []proto.Message{r.Listeners[i]})) {
			t.Errorf("%s changed with policies on other pods", l.GetName())
		}
	}
	if !bytes.Equal(stableJSON(t, asMessages(plain.Clusters)), stableJSON(t, asMessages(r.Clusters))) {
		t.Errorf("clusters changed with policies")
	}
}

// TestBuilderAuthzChange rebuilds with a Builder as policies come, change and go: a change of
// policies, the first one and the removal of the last included, changes only the RBAC extension
// configs (the listeners stay equal), and every build equals the package Build of the same model.
func TestBuilderAuthzChange(t *testing.T) {
	bl := NewBuilder(Options{})
	build := func(m *model.Mesh) *Resources {
		t.Helper()
		r, err := bl.Build(m, fakeSVIDs(m), fakeBundles(m))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.ValidateAll(); err != nil {
			t.Fatal(err)
		}
		fresh := buildValid(t, m, Options{})
		for _, kind := range []struct{ a, b []proto.Message }{
			{asMessages(r.Listeners), asMessages(fresh.Listeners)},
			{asMessages(r.Extensions), asMessages(fresh.Extensions)},
		} {
			if !bytes.Equal(stableJSON(t, kind.a), stableJSON(t, kind.b)) {
				t.Fatalf("the Builder's output differs from Build's")
			}
		}
		return r
	}
	listeners := func(r *Resources) []byte { return stableJSON(t, asMessages(r.Listeners)) }
	none := build(goldenMesh())
	with := build(authzGoldenMesh())
	if !bytes.Equal(listeners(none), listeners(with)) {
		t.Fatal("the first policies changed a listener (connections opened before would stay on its old chains, without RBAC, until they drained)")
	}
	if bytes.Equal(stableJSON(t, asMessages(none.Extensions)), stableJSON(t, asMessages(with.Extensions))) {
		t.Fatal("the first policies changed no extension config")
	}
	changed := authzGoldenMesh()
	changed.Authz["uid-web-1"][1].Rules[0].Paths[0].Value = "/root"
	changed.Authz["uid-db-0"][0].DryRun = false
	after := build(changed)
	if !bytes.Equal(listeners(with), listeners(after)) {
		t.Error("a change of policies changed a listener (Envoy would drain its connections)")
	}
	if bytes.Equal(stableJSON(t, asMessages(with.Extensions)), stableJSON(t, asMessages(after.Extensions))) {
		t.Error("a change of policies changed no extension config")
	}
	gone := build(goldenMesh())
	if !bytes.Equal(listeners(none), listeners(gone)) || !bytes.Equal(stableJSON(t, asMessages(none.Extensions)), stableJSON(t, asMessages(gone.Extensions))) {
		t.Error("without policies the listeners and extension configs are not the original ones")
	}
}
