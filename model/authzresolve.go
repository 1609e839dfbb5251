package model

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	secv1alpha1 "github.com/aethermesh/aether/api/aether/security/v1alpha1"
)

// This file turns AuthorizationPolicy objects (api/aether/security/v1alpha1) into the
// authorization model (authz.go): the conversion with its refusals, the resolution of each
// policy's targets, and the selection of the local pods each policy applies to.

// AuthzFieldError is one refusal of the conversion: the field's path in the object, its value as
// written and why it is refused.
type AuthzFieldError struct {
	// Field is the field's path, e.g. "spec.rules[0].sources[1].spiffe".
	Field string
	// Value is the field's value as written ("" when unset).
	Value string
	// Reason says what is wanted.
	Reason string
}

// Error is `<field> "<value>": <reason>`.
func (e AuthzFieldError) Error() string { return fmt.Sprintf("%s %q: %s", e.Field, e.Value, e.Reason) }

// AuthzTarget is one entry of a policy's spec.targetRefs as ResolveAuthz found it.
type AuthzTarget struct {
	// Index is the entry's index in spec.targetRefs.
	Index int
	// Kind is "Service" or "Pod".
	Kind string
	// Name is the Service's name (kind Service).
	Name string
	// Selector selects the namespace's pods by label (kind Pod; labels.Everything() for {}).
	Selector labels.Selector
	// Found: a Service target's Service exists in the policy's namespace; always true for a Pod
	// target (its pods are each node's to find).
	Found bool
}

// AuthzResolved is what ResolveAuthz made of one AuthorizationPolicy: the policy the data plane
// applies (nil when nothing of it applies) and the inputs of its status.
type AuthzResolved struct {
	Namespace, Name string
	// Generation is the object's metadata.generation the result is for.
	Generation int64
	// Policy is what the data plane applies to the pods Targets select: nil for a policy whose
	// targets are all missing or invalid; for an invalid policy with valid targets, a DENY with
	// FailClosed set or an ALLOW without rules (ResolveAuthz).
	Policy *AuthzPolicy
	// Errors are the invalid fields, in the object's order; none for a valid policy.
	Errors []AuthzFieldError
	// Targets are the valid targetRefs, in spec order, with whether each was found. A Service
	// target that was not found selects no pod.
	Targets []AuthzTarget
}

// Valid reports whether the policy converted without a refusal.
func (r *AuthzResolved) Valid() bool { return len(r.Errors) == 0 }

// Missing returns the names of the targeted Services that were not found.
func (r *AuthzResolved) Missing() []string {
	var out []string
	for _, t := range r.Targets {
		if !t.Found {
			out = append(out, t.Name)
		}
	}
	return out
}

// ResolveAuthz converts each AuthorizationPolicy (ConvertAuthz) and resolves its targets in the
// policy's own namespace: a Service target is found when serviceExists says the Service
// exists. The result has one entry per policy, sorted by namespace, then name. It is pure.
//
// Nothing of an invalid policy's rules applies, and it fails closed on its valid targets (at
// least one needed): an invalid DENY policy (spec.action DENY) gets FailClosed set and no rules,
// so it refuses every caller of its targets (issue #32: a DENY policy that cannot be applied
// fails closed, never open); any other invalid policy becomes an ALLOW policy without rules, so
// its targets accept only what their other ALLOW policies allow (a broken ALLOW policy never
// opens a pod it closed). A policy's dryRun still holds then: a dry-run policy that fails closed
// refuses nothing and counts every caller it would refuse.
func ResolveAuthz(policies []*secv1alpha1.AuthorizationPolicy, serviceExists func(ServiceKey) bool) []AuthzResolved {
	return resolveAuthz(policies, serviceExists, nil)
}

// AuthzCache keeps the conversions (ConvertAuthz) of the AuthorizationPolicies one assembly saw,
// for the next: an informer's store hands the same object until it changes, so a model rebuilt
// for any other reason converts none of them again. The objects must not be changed once handed
// in (an informer store's are not). Not safe for concurrent use: one per Assembler.
type AuthzCache struct {
	m map[*secv1alpha1.AuthorizationPolicy]authzConverted
}

type authzConverted struct {
	resourceVersion string
	generation      int64
	policy          *AuthzPolicy
	targets         []AuthzTarget
	errs            []AuthzFieldError
}

// convert returns ConvertAuthz(p), from the cache when it holds p at the same resource version
// and generation; next collects what the next call keeps.
func (c *AuthzCache) convert(p *secv1alpha1.AuthorizationPolicy, next map[*secv1alpha1.AuthorizationPolicy]authzConverted) (*AuthzPolicy, []AuthzTarget, []AuthzFieldError) {
	if c == nil {
		return ConvertAuthz(p)
	}
	v, ok := c.m[p]
	if !ok || v.resourceVersion != p.ResourceVersion || v.generation != p.Generation {
		v.resourceVersion, v.generation = p.ResourceVersion, p.Generation
		v.policy, v.targets, v.errs = ConvertAuthz(p)
	}
	next[p] = v
	return v.policy, slices.Clone(v.targets), v.errs
}

// resolveAuthz is ResolveAuthz with the conversions cached in cache (nil: none). The converted
// policies are shared between the models of successive assemblies: nothing changes them.
func resolveAuthz(policies []*secv1alpha1.AuthorizationPolicy, serviceExists func(ServiceKey) bool, cache *AuthzCache) []AuthzResolved {
	out := make([]AuthzResolved, 0, len(policies))
	next := map[*secv1alpha1.AuthorizationPolicy]authzConverted{}
	for _, p := range policies {
		pol, targets, errs := cache.convert(p, next)
		r := AuthzResolved{Namespace: p.Namespace, Name: p.Name, Generation: p.Generation, Errors: errs, Targets: targets}
		for i := range r.Targets {
			t := &r.Targets[i]
			t.Found = t.Kind == "Pod" || serviceExists(ServiceKey{Namespace: p.Namespace, Name: t.Name})
		}
		switch {
		case !slices.ContainsFunc(r.Targets, func(t AuthzTarget) bool { return t.Found }):
		case len(errs) == 0:
			r.Policy = pol
		case p.Spec.Action == secv1alpha1.ActionDeny:
			r.Policy = &AuthzPolicy{Namespace: p.Namespace, Name: p.Name, Action: AuthzDeny, DryRun: p.Spec.DryRun, FailClosed: true}
		default:
			// Invalid and not DENY: an ALLOW policy that allows nothing. Its targets stay
			// closed to everything no other ALLOW policy allows (were it dropped, a typo in a
			// pod's only ALLOW policy would open the pod to every meshed caller).
			r.Policy = &AuthzPolicy{Namespace: p.Namespace, Name: p.Name, Action: AuthzAllow, DryRun: p.Spec.DryRun}
		}
		out = append(out, r)
	}
	if cache != nil {
		cache.m = next
	}
	slices.SortFunc(out, func(a, b AuthzResolved) int {
		return ServiceKey{Namespace: a.Namespace, Name: a.Name}.Compare(ServiceKey{Namespace: b.Namespace, Name: b.Name})
	})
	return out
}

// ConvertAuthz converts AuthorizationPolicy p into the model's AuthzPolicy and its valid targets
// (Found not set), checking every field again whatever the CRD's validation let through (an
// object written before a CRD upgrade, or with validation off). It returns every refusal, in the
// object's order, each naming the field's path and value; with any, the policy must not be
// applied as converted (ResolveAuthz says what applies instead).
func ConvertAuthz(p *secv1alpha1.AuthorizationPolicy) (*AuthzPolicy, []AuthzTarget, []AuthzFieldError) {
	c := authzConv{ns: p.Namespace}
	out := &AuthzPolicy{Namespace: p.Namespace, Name: p.Name, DryRun: p.Spec.DryRun}
	switch p.Spec.Action {
	case secv1alpha1.ActionAllow:
		out.Action = AuthzAllow
	case secv1alpha1.ActionDeny:
		out.Action = AuthzDeny
	default:
		c.fail("spec.action", string(p.Spec.Action), "want ALLOW or DENY")
	}
	targets := c.targets(p.Spec.TargetRefs)
	if n := len(p.Spec.Rules); n > secv1alpha1.MaxRules {
		c.fail("spec.rules", strconv.Itoa(n), fmt.Sprintf("want at most %d rules", secv1alpha1.MaxRules))
	}
	for i := range p.Spec.Rules {
		out.Rules = append(out.Rules, c.rule(fmt.Sprintf("spec.rules[%d]", i), &p.Spec.Rules[i]))
	}
	return out, targets, c.errs
}

// authzConv collects the refusals of one conversion.
type authzConv struct {
	ns   string
	errs []AuthzFieldError
}

func (c *authzConv) fail(field, value, reason string) {
	c.errs = append(c.errs, AuthzFieldError{Field: field, Value: value, Reason: reason})
}

// targets converts spec.targetRefs; it returns the valid ones.
func (c *authzConv) targets(refs []secv1alpha1.PolicyTargetReferenceWithLabelSelectors) []AuthzTarget {
	switch n := len(refs); {
	case n == 0:
		c.fail("spec.targetRefs", "", "want at least one target (a Service, or Pods by selector)")
	case n > secv1alpha1.MaxTargetRefs:
		c.fail("spec.targetRefs", strconv.Itoa(n), fmt.Sprintf("want at most %d targets", secv1alpha1.MaxTargetRefs))
	}
	var out []AuthzTarget
	for i, r := range refs {
		f := fmt.Sprintf("spec.targetRefs[%d]", i)
		before := len(c.errs)
		if r.Group != "" && r.Group != "core" {
			c.fail(f+".group", r.Group, `want "" (the core group: Service or Pod)`)
		}
		t := AuthzTarget{Index: i, Kind: r.Kind}
		switch r.Kind {
		case "Service":
			if errs := validation.IsDNS1035Label(r.Name); len(errs) > 0 {
				c.fail(f+".name", r.Name, "want the name of a Service in the policy's namespace: "+strings.Join(errs, "; "))
			}
			if r.Selector != nil {
				c.fail(f+".selector", metav1.FormatLabelSelector(r.Selector), "a Service target takes no selector (its Service selects the pods)")
			}
			t.Name = r.Name
		case "Pod":
			if r.Name != "" {
				c.fail(f+".name", r.Name, "a Pod target takes no name: select pods with selector ({} for every pod of the namespace)")
			}
			if r.Selector == nil {
				c.fail(f+".selector", "", "want a label selector ({} for every pod of the namespace)")
				break
			}
			sel, err := metav1.LabelSelectorAsSelector(r.Selector)
			if err != nil {
				js, _ := json.Marshal(r.Selector) // FormatLabelSelector says only "<error>"
				c.fail(f+".selector", string(js), err.Error())
				break
			}
			t.Selector = sel
		default:
			c.fail(f+".kind", r.Kind, "want Service or Pod")
		}
		if len(c.errs) == before {
			out = append(out, t)
		}
	}
	return out
}

// rule converts one rule at field path f.
func (c *authzConv) rule(f string, r *secv1alpha1.AuthorizationRule) AuthzRule {
	var out AuthzRule
	if r.Sources == nil {
		out.AnySource = true // omitted: every caller; [] (not nil): none (GEP-3779)
	} else {
		out.Sources = []AuthzSource{}
	}
	if n := len(r.Sources); n > secv1alpha1.MaxSources {
		c.fail(f+".sources", strconv.Itoa(n), fmt.Sprintf("want at most %d sources", secv1alpha1.MaxSources))
	}
	for j := range r.Sources {
		if s, ok := c.source(fmt.Sprintf("%s.sources[%d]", f, j), &r.Sources[j]); ok {
			out.Sources = append(out.Sources, s)
		}
	}
	if na := r.NetworkAttributes; na != nil {
		if n := len(na.Ports); n > secv1alpha1.MaxPorts {
			c.fail(f+".networkAttributes.ports", strconv.Itoa(n), fmt.Sprintf("want at most %d ports", secv1alpha1.MaxPorts))
		}
		for j, p := range na.Ports {
			if p < 1 || p > 65535 {
				c.fail(fmt.Sprintf("%s.networkAttributes.ports[%d]", f, j), strconv.Itoa(int(p)), "want a port 1-65535")
				continue
			}
			if !slices.Contains(out.Ports, uint32(p)) {
				out.Ports = append(out.Ports, uint32(p))
			}
		}
	}
	if h := r.HTTP; h != nil {
		for j, m := range h.Methods {
			if !slices.Contains(httpMethods, string(m)) {
				c.fail(fmt.Sprintf("%s.http.methods[%d]", f, j), string(m), "want one of "+strings.Join(httpMethods, ", "))
				continue
			}
			if !slices.Contains(out.Methods, string(m)) {
				out.Methods = append(out.Methods, string(m))
			}
		}
		if n := len(h.Paths); n > secv1alpha1.MaxPaths {
			c.fail(f+".http.paths", strconv.Itoa(n), fmt.Sprintf("want at most %d paths", secv1alpha1.MaxPaths))
		}
		for j, p := range h.Paths {
			pf := fmt.Sprintf("%s.http.paths[%d]", f, j)
			pm := PathMatch{Type: MatchPathPrefix, Value: p.Value}
			switch p.Type {
			case "", secv1alpha1.PathMatchPathPrefix:
			case secv1alpha1.PathMatchExact:
				pm.Type = MatchExact
			default:
				c.fail(pf+".type", string(p.Type), "want Exact or PathPrefix")
				continue
			}
			if bad := checkPathMatch(pm.Type, p.Value); bad != nil { // HTTPRoute's path checks
				c.fail(pf+"."+bad.field, bad.value, bad.reason)
				continue
			}
			out.Paths = append(out.Paths, pm)
		}
	}
	return out
}

// source converts one source at field path f; ok is false when it is refused.
func (c *authzConv) source(f string, s *secv1alpha1.AuthorizationSource) (AuthzSource, bool) {
	before := len(c.errs)
	set := map[secv1alpha1.AuthorizationSourceType]bool{
		secv1alpha1.SourceServiceAccount: s.ServiceAccount != nil,
		secv1alpha1.SourceSPIFFE:         s.SPIFFE != "",
		secv1alpha1.SourceNamespace:      s.Namespace != "",
	}
	field := map[secv1alpha1.AuthorizationSourceType]string{
		secv1alpha1.SourceServiceAccount: "serviceAccount", secv1alpha1.SourceSPIFFE: "spiffe", secv1alpha1.SourceNamespace: "namespace",
	}
	if _, known := set[s.Type]; !known {
		c.fail(f+".type", string(s.Type), "want ServiceAccount, SPIFFE or Namespace")
		return AuthzSource{}, false
	}
	for _, t := range []secv1alpha1.AuthorizationSourceType{secv1alpha1.SourceServiceAccount, secv1alpha1.SourceSPIFFE, secv1alpha1.SourceNamespace} {
		switch {
		case t == s.Type && !set[t]:
			c.fail(f+"."+field[t], "", "want it set: type is "+string(s.Type))
		case t != s.Type && set[t]:
			c.fail(f+"."+field[t], sourceValue(s, t), "type "+string(s.Type)+" takes only "+field[s.Type])
		}
	}
	if len(c.errs) > before {
		return AuthzSource{}, false
	}
	switch s.Type {
	case secv1alpha1.SourceSPIFFE:
		if reason := badSPIFFE(s.SPIFFE); reason != "" {
			c.fail(f+".spiffe", s.SPIFFE, reason)
			return AuthzSource{}, false
		}
		return AuthzSource{SPIFFE: s.SPIFFE}, true
	case secv1alpha1.SourceNamespace:
		if errs := validation.IsDNS1123Label(s.Namespace); len(errs) > 0 {
			c.fail(f+".namespace", s.Namespace, "want a namespace name: "+strings.Join(errs, "; "))
			return AuthzSource{}, false
		}
		return AuthzSource{Namespace: s.Namespace}, true
	}
	sa := AuthzServiceAccount{Namespace: s.ServiceAccount.Namespace, Name: s.ServiceAccount.Name}
	if sa.Namespace == "" {
		sa.Namespace = c.ns
	} else if errs := validation.IsDNS1123Label(sa.Namespace); len(errs) > 0 {
		c.fail(f+".serviceAccount.namespace", sa.Namespace, "want a namespace name: "+strings.Join(errs, "; "))
	}
	if sa.Name != "*" {
		if errs := validation.IsDNS1123Subdomain(sa.Name); len(errs) > 0 {
			c.fail(f+".serviceAccount.name", sa.Name, `want a service account name, or "*" for every one of the namespace: `+strings.Join(errs, "; "))
		}
	}
	if len(c.errs) > before {
		return AuthzSource{}, false
	}
	return AuthzSource{ServiceAccount: &sa}, true
}

// sourceValue is the value of s's field of type t, as written.
func sourceValue(s *secv1alpha1.AuthorizationSource, t secv1alpha1.AuthorizationSourceType) string {
	switch t {
	case secv1alpha1.SourceSPIFFE:
		return s.SPIFFE
	case secv1alpha1.SourceNamespace:
		return s.Namespace
	}
	return s.ServiceAccount.Namespace + "/" + s.ServiceAccount.Name
}

// badSPIFFE returns why id is not a SPIFFE ID a source may name, or "": "spiffe://<trust
// domain>/<path>" (SPIFFE-ID spec section 2: a trust domain of lowercase letters, digits, ".",
// "-" and "_"; path segments of letters, digits, ".", "-" and "_", none empty, "." or ".."; at
// most 2048 bytes), or "spiffe://<trust domain>/*", every workload of the trust domain.
func badSPIFFE(id string) string {
	const scheme = "spiffe://"
	if len(id) > secv1alpha1.MaxSPIFFEID {
		return fmt.Sprintf("want at most %d bytes", secv1alpha1.MaxSPIFFEID)
	}
	rest, ok := strings.CutPrefix(id, scheme)
	if !ok {
		return `want spiffe://<trust domain>/<path>, or spiffe://<trust domain>/* for every workload of a trust domain`
	}
	td, path, _ := strings.Cut(rest, "/")
	if td == "" {
		return "want a trust domain after spiffe://"
	}
	if i := strings.IndexFunc(td, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_')
	}); i >= 0 {
		return fmt.Sprintf("trust domain %q: character %q: want lowercase letters, digits, '.', '-' and '_'", td, td[i])
	}
	if path == "" {
		return "want a path after the trust domain (spiffe://" + td + "/* for every workload of it)"
	}
	if path == "*" {
		return ""
	}
	for seg := range strings.SplitSeq(path, "/") {
		switch {
		case seg == "":
			return "empty path segment (// or a trailing /)"
		case seg == "." || seg == "..":
			return fmt.Sprintf("path segment %q: want no relative segments", seg)
		case seg == "*":
			return `"*" only as the whole path (spiffe://<trust domain>/*)`
		}
		if i := strings.IndexFunc(seg, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_')
		}); i >= 0 {
			return fmt.Sprintf("path segment %q: character %q: want letters, digits, '.', '-' and '_'", seg, seg[i])
		}
	}
	return ""
}

// SelectAuthz returns the enforced policies of resolved (those with a Policy) that select each
// pod, by pod UID, each list sorted by namespace, then name (resolved's order), a policy once
// however many of its targets select the pod. podLabels gives each pod's labels by UID. A Service
// target selects the pods whose Services hold that Service of the policy's namespace, a Pod target
// the policy namespace's pods its selector matches; a policy never selects another namespace's
// pods. A pod no policy selects has no entry; the result is nil when none is selected.
func SelectAuthz(resolved []AuthzResolved, pods []*LocalPod, podLabels map[string]map[string]string) map[string][]*AuthzPolicy {
	var out map[string][]*AuthzPolicy
	for i := range resolved {
		r := &resolved[i]
		if r.Policy == nil {
			continue
		}
		for _, p := range pods {
			if p.Namespace != r.Namespace || !slices.ContainsFunc(r.Targets, func(t AuthzTarget) bool { return t.selects(p, podLabels[p.UID]) }) {
				continue
			}
			if out == nil {
				out = map[string][]*AuthzPolicy{}
			}
			out[p.UID] = append(out[p.UID], r.Policy)
		}
	}
	return out
}

// selects reports whether target t (of a policy in p's namespace) selects pod p with labels l.
func (t AuthzTarget) selects(p *LocalPod, l map[string]string) bool {
	switch {
	case !t.Found:
		return false
	case t.Kind == "Service":
		return slices.Contains(p.Services, ServiceKey{Namespace: p.Namespace, Name: t.Name})
	default:
		return t.Selector != nil && t.Selector.Matches(labels.Set(l))
	}
}
