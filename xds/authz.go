package xds

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	celfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/filters/cel/v3"
	streamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	httprbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netrbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/aethermesh/aether/internal/xdsproto"
	"github.com/aethermesh/aether/model"
)

// Authorization (issue #32) is enforced on the destination's node Envoy, on the inbound filter
// chains at pod_ip:15008 of the pods that policies select (model/authz.go holds the semantics;
// docs/authorization.md, "Enforcement", what operators see).
//
// Layout: each inbound chain of such a pod runs two RBAC filters, the DENY one first, then the
// ALLOW one (Envoy's RBAC has one action per filter: two filters keep DENY's precedence by their
// order and every policy under its own name in the RBAC policy keys, which a single filter could
// only do by negating the DENY rules inside every ALLOW policy). On a TCP port they are network
// RBAC filters (envoy.filters.network.rbac) before tcp_proxy, on an HTTP port HTTP RBAC filters
// (envoy.filters.http.rbac) before the router. Both are ECDS references (Filter.config_discovery,
// HttpFilter.config_discovery) to one extension config each, AuthzFilterName: a policy change
// changes those only, never the listener, so Envoy does not drain the pod's connections (a change
// of a filter chain drains every connection of that chain). The chains of a pod with no entry in
// Mesh.Authz have no RBAC filter at all: its listener is as it was before authorization existed.
//
// Dry-run policies are RBAC shadow_rules, computed as if they were enforced beside the enforced
// policies: the shadow rules of each filter hold the enforced and the dry-run policies of its
// action. Envoy counts shadow denials (shadow_denied) and writes the shadow verdict and policy in
// the dynamic metadata, which the access log reads. Pods with no dry-run policy get no
// shadow_rules.

// Kinds of the two RBAC filters of an inbound chain.
const (
	authzDeny  = "deny"
	authzAllow = "allow"
)

// AuthzFilterName returns the ECDS resource of the RBAC filter of kind ("deny" or "allow") on the
// inbound chain of pod p's port: "authz|<ns>/<name>:<port>|<http or tcp>|<kind>". The protocol is
// in the name because the resource's type is (HTTP or network RBAC): a port that changes protocol
// gets new names, so a chain still draining never receives a config of the other type (which
// Envoy would reject).
func AuthzFilterName(p *model.LocalPod, port uint32, http bool, kind string) string {
	proto := "tcp"
	if http {
		proto = "http"
	}
	return "authz|" + p.Namespace + "/" + p.Name + ":" + strconv.FormatUint(uint64(port), 10) + "|" + proto + "|" + kind
}

// authzStatLabel is the stat name part of one RBAC filter: "authz.<ns>.<pod>.<port>.<kind>", the
// pod name's dots replaced by "_" (a dot separates stat name elements).
func authzStatLabel(p *model.LocalPod, port uint32, kind string) string {
	return "authz." + p.Namespace + "." + strings.ReplaceAll(p.Name, ".", "_") + "." + strconv.FormatUint(uint64(port), 10) + "." + kind
}

// authzShadowTCP is the network RBAC filter's shadow_rules_stat_prefix, which also prefixes its
// dynamic metadata keys (envoy.filters.network.rbac namespace): distinct per kind, since both
// filters of a chain write into the same connection's metadata.
func authzShadowTCP(kind string) string { return kind + "_dry_run." }

// authzRBAC is the RBAC of one kind on one port: the enforced rules and the shadow rules, each nil
// when absent (Envoy: "If absent, no ... policy will be applied").
type authzRBAC struct {
	rules, shadow *rbacv3.RBAC
}

// translateAuthz turns the policies that select a pod (model.Mesh.Authz, sorted) into the DENY
// and the ALLOW RBAC of its inbound chain for port, an HTTP port when http (method and path
// permissions) or a TCP port (connection only).
//
//   - DENY: the enforced rules are the enforced DENY policies' rules that cover port (nil when
//     there are none: the filter then does nothing); a FailClosed policy matches every caller
//     whatever its rules say, and is kept with the DENY ones whatever its action (a broken
//     policy never opens a port).
//   - ALLOW: as soon as one enforced ALLOW policy selects the pod (for any port), the enforced
//     rules are present and hold the ALLOW rules that cover port, possibly none: a port no rule
//     covers is closed.
//   - On a TCP port a rule with methods or paths is an ALLOW rule that matches nothing, or a DENY
//     rule that matches without them (model.AuthzRule).
//   - Shadow rules exist only when some policy of the pod is a dry run: the same construction over
//     the enforced and the dry-run policies together.
//
// Each Envoy policy is one rule, keyed "<ns>/<name>#<index of the rule>" ("#fail-closed" for a
// FailClosed policy), so that a denial names it (Envoy's rbac_access_denied_matched_policy[...]
// and the effective_policy_id metadata). td is the mesh trust domain of the sources'
// SPIFFEPattern.
func translateAuthz(tds []string, policies []*model.AuthzPolicy, port uint32, http bool) (deny, allow authzRBAC) {
	dryRun := slices.ContainsFunc(policies, func(p *model.AuthzPolicy) bool { return p.DryRun })
	build := func(withDryRun bool) (deny, allow *rbacv3.RBAC) {
		denies, allows := map[string]*rbacv3.Policy{}, map[string]*rbacv3.Policy{}
		anyAllow := false
		for _, p := range policies {
			if p.DryRun && !withDryRun {
				continue
			}
			if p.FailClosed {
				denies[p.Namespace+"/"+p.Name+"#fail-closed"] = &rbacv3.Policy{
					Permissions: []*rbacv3.Permission{anyPermission()},
					Principals:  []*rbacv3.Principal{{Identifier: &rbacv3.Principal_Any{Any: true}}},
				}
				continue
			}
			into := denies
			if p.Action == model.AuthzAllow {
				into, anyAllow = allows, true
			}
			for i := range p.Rules {
				r := &p.Rules[i]
				if !r.AppliesToPort(port) || (!http && r.HasL7() && p.Action == model.AuthzAllow) {
					continue
				}
				principals := authzPrincipals(tds, r)
				if len(principals) == 0 {
					continue // no source: the rule matches no caller
				}
				perm := anyPermission()
				if http {
					perm = authzPermission(r, p.Action != model.AuthzAllow)
				}
				into[p.Namespace+"/"+p.Name+"#"+strconv.Itoa(i)] = &rbacv3.Policy{Permissions: []*rbacv3.Permission{perm}, Principals: principals}
			}
		}
		if len(denies) > 0 {
			deny = &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: denies}
		}
		if anyAllow {
			allow = &rbacv3.RBAC{Action: rbacv3.RBAC_ALLOW, Policies: allows}
		}
		return deny, allow
	}
	deny.rules, allow.rules = build(false)
	if dryRun {
		deny.shadow, allow.shadow = build(true)
	}
	return deny, allow
}

// anyPermission is the RBAC permission that matches every connection or request.
func anyPermission() *rbacv3.Permission {
	return &rbacv3.Permission{Rule: &rbacv3.Permission_Any{Any: true}}
}

// authzPrincipals are the principals of rule r: the caller's client certificate
// (authenticated.principal_name, matched against the certificate's URI SANs; the inbound TLS
// context already requires a certificate of one of the trust domains tds, the mesh's own and the
// clusterset's others (Options.PeerTrustDomains), and the chain's trust domain guard refuses a
// certificate naming two), exact or prefix per AuthzSource.SPIFFEPattern in each of tds (a
// namespace or service account source matches it in every trust domain of the clusterset, as
// MCS namespace sameness has it); "any authenticated caller" for AnySource; none for an empty
// Sources. Headers are never read: XFCC and the like cannot speak for a caller.
func authzPrincipals(tds []string, r *model.AuthzRule) []*rbacv3.Principal {
	if r.AnySource {
		return []*rbacv3.Principal{{Identifier: &rbacv3.Principal_Authenticated_{Authenticated: &rbacv3.Principal_Authenticated{}}}}
	}
	out := make([]*rbacv3.Principal, 0, len(r.Sources)*len(tds))
	seen := map[[2]string]bool{}
	for _, s := range r.Sources {
		for _, td := range tds {
			exact, prefix := s.SPIFFEPattern(td)
			if seen[[2]string{exact, prefix}] {
				continue // a SPIFFE ID source names its trust domain itself
			}
			seen[[2]string{exact, prefix}] = true
			sm := &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: exact}}
			if exact == "" {
				sm = &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: prefix}}
			}
			out = append(out, &rbacv3.Principal{Identifier: &rbacv3.Principal_Authenticated_{Authenticated: &rbacv3.Principal_Authenticated{PrincipalName: sm}}})
		}
	}
	return out
}

// authzPermission is the permission of rule r on an HTTP port: any of its methods (the :method
// header) and any of its paths (url_path: the path without query string, after the inbound
// HCM's RFC 3986 normalization and slash merging), "any" for an attribute r leaves empty.
//
// A DENY rule (deny) matches wider where applications read requests more loosely than Envoy
// compares them, so that no other spelling of a refused request gets through: its methods
// ignore case (Express and others route "delete" as DELETE) and GET brings HEAD (which most
// frameworks serve with the GET handler); its paths ignore case and a trailing slash, and a
// rule with paths also matches every path holding an escaped slash or backslash (%2F, %5C, any
// case), which normalization keeps but many applications decode ("/admin%2Fusers" is
// "/admin/users" to them), or a path parameter (";", which servlet containers strip from every
// segment). An ALLOW rule matches exactly, and its paths never match a path holding any of
// those: a request spelled otherwise is not allowed by it, which fails closed.
func authzPermission(r *model.AuthzRule, deny bool) *rbacv3.Permission {
	var and []*rbacv3.Permission
	if len(r.Methods) > 0 {
		methods := slices.Clone(r.Methods)
		if deny && slices.Contains(methods, "GET") && !slices.Contains(methods, "HEAD") {
			methods = append(methods, "HEAD")
		}
		var ms []*rbacv3.Permission
		for _, m := range methods {
			ms = append(ms, &rbacv3.Permission{Rule: &rbacv3.Permission_Header{Header: &routev3.HeaderMatcher{
				Name: ":method", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
					MatchPattern: &matcherv3.StringMatcher_Exact{Exact: m}, IgnoreCase: deny,
				}},
			}}})
		}
		and = append(and, orPermissions(ms))
	}
	if len(r.Paths) > 0 {
		var ps []*rbacv3.Permission
		for _, p := range r.Paths {
			ps = append(ps, pathPermissions(p, deny)...)
		}
		// Paths applications read otherwise than Envoy compares them: escaped slashes and
		// backslashes, which normalization keeps and many applications decode
		// ("/public/..%2Fadmin"), and path parameters, which servlet containers strip from every
		// segment ("/public/..;/admin" is "/admin" to Tomcat). A DENY rule refuses them all to
		// its callers; an ALLOW rule allows none of them.
		var odd []*rbacv3.Permission
		for _, c := range []string{"%2f", "%5c", ";"} {
			odd = append(odd, urlPathPermission(&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Contains{Contains: c}, IgnoreCase: true}))
		}
		if deny {
			and = append(and, orPermissions(append(ps, odd...)))
		} else {
			and = append(and, orPermissions(ps), &rbacv3.Permission{Rule: &rbacv3.Permission_NotRule{NotRule: orPermissions(odd)}})
		}
	}
	switch len(and) {
	case 0:
		return anyPermission()
	case 1:
		return and[0]
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_AndRules{AndRules: &rbacv3.Permission_Set{Rules: and}}}
}

// urlPathPermission is the url_path permission of sm.
func urlPathPermission(sm *matcherv3.StringMatcher) *rbacv3.Permission {
	return &rbacv3.Permission{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{Rule: &matcherv3.PathMatcher_Path{Path: sm}}}}
}

// pathPermissions are the url_path permissions of a Gateway API path match: Exact is the path
// itself; PathPrefix matches by whole segments ("/a" and "/a/" match "/a", "/a/", "/a/b", never
// "/ab"), so it is the path without its trailing slash, exactly or followed by "/", and "/" is
// every path; RegularExpression is an RE2 full match. For a DENY rule (wide, authzPermission)
// the matches ignore case and an Exact path also matches with a trailing slash; a regular
// expression gets RE2's (?i).
func pathPermissions(p model.PathMatch, wide bool) []*rbacv3.Permission {
	exact := func(v string) *rbacv3.Permission {
		return urlPathPermission(&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: v}, IgnoreCase: wide})
	}
	prefix := func(v string) *rbacv3.Permission {
		return urlPathPermission(&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: v}, IgnoreCase: wide})
	}
	switch p.Type {
	case model.MatchPathPrefix:
		v := strings.TrimRight(p.Value, "/")
		if v == "" {
			return []*rbacv3.Permission{anyPermission()}
		}
		return []*rbacv3.Permission{exact(v), prefix(v + "/")}
	case model.MatchRegex:
		re := p.Value
		if wide {
			re = "(?i)" + re
		}
		return []*rbacv3.Permission{urlPathPermission(&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: re}}})}
	default:
		out := []*rbacv3.Permission{exact(p.Value)}
		if wide && !strings.HasSuffix(p.Value, "/") {
			out = append(out, exact(p.Value+"/"))
		}
		return out
	}
}

// orPermissions is ps itself when it holds one permission, else their or_rules.
func orPermissions(ps []*rbacv3.Permission) *rbacv3.Permission {
	if len(ps) == 1 {
		return ps[0]
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_OrRules{OrRules: &rbacv3.Permission_Set{Rules: ps}}}
}

// authzExtensions are the two ECDS resources (AuthzFilterName, DENY then ALLOW) of pod p's
// inbound chain for port ipt: network RBAC configs on a TCP port, HTTP RBAC configs on an HTTP
// port (translateAuthz). Stats (docs/authorization.md, "Enforcement"): on a TCP port
// "authz.<ns>.<pod>.<port>.<kind>.rbac.{allowed,denied}" and
// "...rbac.<kind>_dry_run.{shadow_allowed,shadow_denied}"; on an HTTP port
// "http.inbound_http.rbac.authz.<ns>.<pod>.<port>.<kind>.{allowed,denied}" and
// "...<kind>.dry_run.{shadow_allowed,shadow_denied}". Its only errors are ToAny's.
func authzExtensions(tds []string, p *model.LocalPod, policies []*model.AuthzPolicy, ipt inboundPort) ([]*core.TypedExtensionConfig, error) {
	http := ipt.protocol.IsHTTP()
	deny, allow := translateAuthz(tds, policies, ipt.port, http)
	out := make([]*core.TypedExtensionConfig, 0, 2)
	for _, k := range []struct {
		kind string
		r    authzRBAC
	}{{authzDeny, deny}, {authzAllow, allow}} {
		label := authzStatLabel(p, ipt.port, k.kind)
		var cfg proto.Message
		if http {
			cfg = &httprbacv3.RBAC{Rules: k.r.rules, RulesStatPrefix: label + ".", ShadowRules: k.r.shadow, ShadowRulesStatPrefix: label + ".dry_run."}
		} else {
			cfg = &netrbacv3.RBAC{
				Rules: k.r.rules, ShadowRules: k.r.shadow, StatPrefix: label, ShadowRulesStatPrefix: authzShadowTCP(k.kind),
				// The caller is its certificate, the same on every byte: one check, on the
				// first byte, is the verdict of the connection.
				EnforcementType: netrbacv3.RBAC_ONE_TIME_ON_FIRST_BYTE,
			}
		}
		a, err := xdsproto.ToAny(cfg)
		if err != nil {
			return nil, err
		}
		out = append(out, &core.TypedExtensionConfig{Name: AuthzFilterName(p, ipt.port, http, k.kind), TypedConfig: a})
	}
	return out, nil
}

// Type URLs of the RBAC filters' ECDS resources.
const (
	netRBACTypeURL  = "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC"
	httpRBACTypeURL = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
)

// authzNetworkFilters are the network filters (ECDS references over ADS, DENY then ALLOW) that
// precede tcp_proxy on pod p's TCP chain for port.
func authzNetworkFilters(p *model.LocalPod, port uint32) []*listenerv3.Filter {
	out := make([]*listenerv3.Filter, 0, 2)
	for _, kind := range []string{authzDeny, authzAllow} {
		out = append(out, &listenerv3.Filter{Name: AuthzFilterName(p, port, false, kind), ConfigType: &listenerv3.Filter_ConfigDiscovery{
			ConfigDiscovery: &core.ExtensionConfigSource{ConfigSource: xdsproto.ADS(), TypeUrls: []string{netRBACTypeURL}},
		}})
	}
	return out
}

// authzHTTPFilters are the HTTP filters (ECDS references over ADS, DENY then ALLOW) that precede
// the router on pod p's HTTP chain for port.
func authzHTTPFilters(p *model.LocalPod, port uint32) []*hcmv3.HttpFilter {
	out := make([]*hcmv3.HttpFilter, 0, 2)
	for _, kind := range []string{authzDeny, authzAllow} {
		out = append(out, &hcmv3.HttpFilter{Name: AuthzFilterName(p, port, true, kind), ConfigType: &hcmv3.HttpFilter_ConfigDiscovery{
			ConfigDiscovery: &core.ExtensionConfigSource{ConfigSource: xdsproto.ADS(), TypeUrls: []string{httpRBACTypeURL}},
		}})
	}
	return out
}

// authzAccessLog is the access log of pod p's inbound chain for port (on its tcp_proxy or its
// HTTP connection manager): one JSON line on Envoy's stdout (envoy.access_loggers.stdout; the
// supervisor sends it to envoy.out, the Envoy container's log in the DaemonSet) per denied
// connection or request and per one a dry run would have denied, never for one that passes:
//
//	{"authz":"denied","pod":"<ns>/<name>","port":<port>,"caller":"<URI SAN>",
//	 "enforced":"rbac_access_denied_matched_policy[<policy>]", "dry_run_deny":"denied",
//	 "dry_run_deny_policy":"<policy>","dry_run_allow":"allowed","dry_run_allow_policy":...,
//	 "method":...,"path":...}
//
// "enforced" is Envoy's connection termination details (TCP) or response code details (HTTP):
// "rbac_access_denied_matched_policy[none]" is a refusal by the ALLOW filter (no ALLOW rule
// matched), any other policy name the DENY rule that matched; for a call only a dry run refuses
// it holds what else ended it (null, "via_upstream"). The dry_run_* fields are the shadow verdict
// and the shadow policy of each filter (null without dry-run policies). The filter is a CEL
// expression (envoy.access_loggers.extension_filters.cel) over the same attributes.
func authzAccessLog(p *model.LocalPod, port uint32, http bool) (*accesslogv3.AccessLog, error) {
	ns, enforced, details := "envoy.filters.network.rbac", "%CONNECTION_TERMINATION_DETAILS%", "connection.termination_details"
	if http {
		ns, enforced, details = "envoy.filters.http.rbac", "%RESPONSE_CODE_DETAILS%", "response.code_details"
	}
	key := func(kind, field string) string {
		if http {
			return authzStatLabel(p, port, kind) + ".dry_run." + field
		}
		return authzShadowTCP(kind) + field
	}
	fields := map[string]any{
		"authz":    "denied",
		"pod":      p.Namespace + "/" + p.Name,
		"port":     float64(port),
		"caller":   "%DOWNSTREAM_PEER_URI_SAN%",
		"enforced": enforced,
	}
	expr := details + ".startsWith('rbac_access_denied')"
	for _, kind := range []string{authzDeny, authzAllow} {
		fields["dry_run_"+kind] = "%DYNAMIC_METADATA(" + ns + ":" + key(kind, "shadow_engine_result") + ")%"
		fields["dry_run_"+kind+"_policy"] = "%DYNAMIC_METADATA(" + ns + ":" + key(kind, "shadow_effective_policy_id") + ")%"
		expr += fmt.Sprintf(" || metadata.filter_metadata[%q][%q] == 'denied'", ns, key(kind, "shadow_engine_result"))
	}
	if http {
		fields["method"] = "%REQ(:METHOD)%"
		fields["path"] = "%PATH(WQ)%"
	}
	js, err := structpb.NewStruct(fields)
	if err != nil {
		return nil, fmt.Errorf("authz access log: %w", err)
	}
	out, err := xdsproto.ToAny(&streamv3.StdoutAccessLog{AccessLogFormat: &streamv3.StdoutAccessLog_LogFormat{LogFormat: &core.SubstitutionFormatString{
		Format: &core.SubstitutionFormatString_JsonFormat{JsonFormat: js},
	}}})
	if err != nil {
		return nil, err
	}
	cel, err := xdsproto.ToAny(&celfilterv3.ExpressionFilter{Expression: expr})
	if err != nil {
		return nil, err
	}
	return &accesslogv3.AccessLog{
		Name: "envoy.access_loggers.stdout",
		Filter: &accesslogv3.AccessLogFilter{FilterSpecifier: &accesslogv3.AccessLogFilter_ExtensionFilter{ExtensionFilter: &accesslogv3.ExtensionFilter{
			Name: "envoy.access_loggers.extension_filters.cel", ConfigType: &accesslogv3.ExtensionFilter_TypedConfig{TypedConfig: cel},
		}}},
		ConfigType: &accesslogv3.AccessLog_TypedConfig{TypedConfig: out},
	}, nil
}

// authzTCPProxy is the tcp_proxy of an inbound TCP chain with authorization: as
// xdsproto.TCPProxy, with the access log al.
func authzTCPProxy(stat, cluster string, al *accesslogv3.AccessLog) (*listenerv3.Filter, error) {
	return xdsproto.NetworkFilter("envoy.filters.network.tcp_proxy", &tcpv3.TcpProxy{
		StatPrefix: stat, ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: cluster}, AccessLog: []*accesslogv3.AccessLog{al},
	})
}
