package model

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The checks here are the one rule set of route values: HTTPRouteModel and GRPCRouteModel list
// what fails them in a rule's Unsupported (the rule is not served), RouteFromProto refuses a
// record holding it. They refuse what the Gateway API v1.6.3 CRDs refuse (a route may come from
// newer CRDs, or a registry record from anywhere) and what Envoy 1.40 would refuse, which would
// make it reject the node's whole route table (docs/routing.md, "What aether refuses in a
// route").

// fieldProblem is what a check found wrong: the field (relative to the value checked, "" for the
// value itself), its value as written and why.
type fieldProblem struct {
	field, value, reason string
}

// under returns p with its field under prefix; nil stays nil.
func (p *fieldProblem) under(prefix string) *fieldProblem {
	if p == nil {
		return nil
	}
	f := prefix
	if p.field != "" {
		if f != "" && !strings.HasPrefix(p.field, "[") {
			f += "."
		}
		f += p.field
	}
	return &fieldProblem{field: f, value: p.value, reason: p.reason}
}

// unsupported is p as an entry of RouteRule.Unsupported: "<field>: invalid value <value>:
// <reason>", the value quoted and cut to 128 bytes.
func (p *fieldProblem) unsupported() string {
	return fmt.Sprintf("%s: invalid value %s: %s", p.field, quoteValue(p.value), p.reason)
}

// err is p as RouteFromProto's error.
func (p *fieldProblem) err() *RouteFieldError { return routeFieldErr(p.field, p.value, p.reason) }

// pathChars are the characters of an Exact or PathPrefix HTTPPathMatch value (the CRD's rule).
var pathChars = regexp.MustCompile(`^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$`)

// checkPathMatch checks an HTTPPathMatch (fields "type" and "value"): Exact or PathPrefix with an
// absolute path as the CRD allows it (no "?" or "#", which Envoy's path_separated_prefix
// refuses), or RegularExpression (regexProblem), at most 1024 bytes.
func checkPathMatch(t MatchType, v string) *fieldProblem {
	switch t {
	case MatchExact, MatchPathPrefix:
	case MatchRegex:
		if len(v) > maxPathLen {
			return &fieldProblem{"value", v, "want at most 1024 bytes"}
		}
		if why := regexProblem(v); why != "" {
			return &fieldProblem{"value", v, why}
		}
		return nil
	default:
		return &fieldProblem{"type", string(t), "want Exact, PathPrefix or RegularExpression"}
	}
	var why string
	switch {
	case len(v) > maxPathLen:
		why = "want at most 1024 bytes"
	case !strings.HasPrefix(v, "/"):
		why = "want an absolute path starting with /"
	case !pathChars.MatchString(v):
		why = "want only the characters -A-Za-z0-9/._~!$&'()*+,;=:@ and %XX escapes"
	case strings.Contains(v, "//") || strings.Contains(v, "/./") || strings.Contains(v, "/../") ||
		strings.Contains(strings.ToLower(v), "%2f") || strings.HasSuffix(v, "/.") || strings.HasSuffix(v, "/.."):
		why = "must not contain //, /./, /../ or %2f, nor end with /. or /.."
	}
	if why != "" {
		return &fieldProblem{"value", v, why}
	}
	return nil
}

// checkStringMatch checks a header or query parameter match (fields "type" and "value"; the
// name is the caller's): Exact with a value of at most maxLen bytes without NUL, CR or LF, or
// RegularExpression (regexProblem).
func checkStringMatch(t MatchType, v string, maxLen int) *fieldProblem {
	switch t {
	case MatchExact, MatchRegex:
	default:
		return &fieldProblem{"type", string(t), "want Exact or RegularExpression"}
	}
	if len(v) > maxLen {
		return &fieldProblem{"value", v, fmt.Sprintf("want at most %d bytes", maxLen)}
	}
	if t == MatchRegex {
		if why := regexProblem(v); why != "" {
			return &fieldProblem{"value", v, why}
		}
		return nil
	}
	if strings.ContainsAny(v, "\x00\r\n") {
		return &fieldProblem{"value", v, "want no NUL, CR or LF"}
	}
	return nil
}

// headerNameReason says why n is not a Gateway API HeaderName (an HTTP token of at most 256
// bytes), "" when it is one.
func headerNameReason(n string) string {
	if !validHeaderName(n) {
		return "want an HTTP header name (an RFC 9110 token of at most 256 bytes)"
	}
	return ""
}

// methodReason says why m is not a Gateway API HTTPMethod, "" when it is one ("" is any).
func methodReason(m string) string {
	if m != "" && !slices.Contains(httpMethods, m) {
		return "want GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE or PATCH"
	}
	return ""
}

// GRPCMethodRegex returns the path regex Envoy matches a gRPC method match g with (the route's
// safe_regex, matched against the whole path "/<service>/<method>"): the service and method in
// "/(<service>)/(<method>)", quoted when g is Exact, "[^/]+" for one left empty. ok is false when
// the match needs no regex: an Exact match of both (the path) or of the service only (a
// prefix). xds builds the same (its tests compare them).
func GRPCMethodRegex(g GRPCMethodMatch) (re string, ok bool) {
	if g.Type == MatchExact && g.Service != "" {
		return "", false
	}
	svc, method := g.Service, g.Method
	if g.Type == MatchExact {
		svc, method = regexp.QuoteMeta(svc), regexp.QuoteMeta(method)
	}
	if svc == "" {
		svc = "[^/]+"
	}
	if method == "" {
		method = "[^/]+"
	}
	return "/(" + svc + ")/(" + method + ")", true
}

// checkGRPCMethod checks a GRPCMethodMatch (fields "type", "service", "method", or "" for the
// pair): Exact or RegularExpression; service and/or method set (GRPCMethodMatch: "At least one
// of Service and Method MUST be a non-empty string"); an Exact service or method as the CRD
// allows it; a regex service or method RE2 as regexProblem says, and the path regex Envoy
// matches (GRPCMethodRegex) one too.
func checkGRPCMethod(g GRPCMethodMatch) *fieldProblem {
	switch g.Type {
	case MatchExact, MatchRegex:
	default:
		return &fieldProblem{"type", string(g.Type), "want Exact or RegularExpression"}
	}
	if g.Service == "" && g.Method == "" {
		return &fieldProblem{"", "", "want service and/or method (a match without method matches every method)"}
	}
	for _, c := range []struct {
		field, v string
		exact    *regexp.Regexp
	}{{"service", g.Service, grpcService}, {"method", g.Method, grpcMethod}} {
		switch {
		case c.v == "":
		case len(c.v) > maxPathLen:
			return &fieldProblem{c.field, c.v, "want at most 1024 bytes"}
		case g.Type == MatchRegex:
			if why := regexProblem(c.v); why != "" {
				return &fieldProblem{c.field, c.v, why}
			}
		case !c.exact.MatchString(c.v):
			return &fieldProblem{c.field, c.v, "want " + c.exact.String() + " (GRPCMethodMatch)"}
		}
	}
	if re, ok := GRPCMethodRegex(g); ok {
		if why := regexProblem(re); why != "" {
			return &fieldProblem{"", g.Service + "/" + g.Method, fmt.Sprintf("Envoy matches it as the path regex %s: %s", quoteValue(re), why)}
		}
	}
	return nil
}

// checkHeaderEdits checks a RequestHeaderModifier or ResponseHeaderModifier (fields "set[i]",
// "add[i]", "remove[i]"): at most 16 entries a list, names HTTP tokens in lower case, values of
// at most 4096 bytes without NUL, CR or LF (Envoy refuses them), no name in more than one list
// (HTTPHeaderFilter: "Filters specifying multiple actions of the same or different type for
// any one header name are invalid"), and neither host nor a pseudo-header (":path"), which
// Envoy refuses to modify or remove. repeats allows a name twice in one list (a Kubernetes
// object, whose later entries are ignored); a model's lists hold each name once.
func checkHeaderEdits(h *HeaderModifier, repeats bool) *fieldProblem {
	lists := []struct {
		name  string
		names []string
		vals  []string
	}{{name: "set"}, {name: "add"}, {name: "remove", names: h.Remove}}
	for _, e := range h.Set {
		lists[0].names, lists[0].vals = append(lists[0].names, e.Name), append(lists[0].vals, e.Value)
	}
	for _, e := range h.Add {
		lists[1].names, lists[1].vals = append(lists[1].names, e.Name), append(lists[1].vals, e.Value)
	}
	owner := map[string]string{}
	for _, l := range lists {
		if n := len(l.names); n > maxHeaderEdits {
			return &fieldProblem{l.name, strconv.Itoa(n) + " items", fmt.Sprintf("want at most %d (Gateway API)", maxHeaderEdits)}
		}
		for i, n := range l.names {
			f := fmt.Sprintf("%s[%d]", l.name, i)
			if l.vals != nil {
				f += ".name"
			}
			switch o := owner[n]; {
			case n == "host":
				return &fieldProblem{f, n, "Envoy refuses to modify or remove Host (and with it the node's route table); set the host with a URLRewrite filter's hostname"}
			case strings.HasPrefix(n, ":"):
				return &fieldProblem{f, n, "a pseudo-header, which Envoy refuses to modify or remove"}
			case n == "x-aether-original-dst" || strings.HasPrefix(n, "x-aether-mirror-"):
				return &fieldProblem{f, n, "the node proxy's own header (x-aether-original-dst, x-aether-mirror-<i>)"}
			case headerNameReason(n) != "" || strings.ToLower(n) != n:
				return &fieldProblem{f, n, "want an HTTP header name in lower case (an RFC 9110 token of at most 256 bytes)"}
			case o != "" && o != l.name:
				return &fieldProblem{f, n, fmt.Sprintf("also in %s: one action per header name (HTTPHeaderFilter)", o)}
			case o != "" && !repeats:
				return &fieldProblem{f, n, "given twice: each name once (the first of equivalent names counts)"}
			}
			owner[n] = l.name
			if l.vals != nil {
				if v := l.vals[i]; len(v) > maxHeaderValueLen || strings.ContainsAny(v, "\x00\r\n") {
					return &fieldProblem{fmt.Sprintf("%s[%d].value", l.name, i), v, "want at most 4096 bytes without NUL, CR or LF"}
				}
			}
		}
	}
	return nil
}

// pathModifierReason says why value v of a path modifier cannot be used, "" when it can: at most
// 1024 bytes, no spaces or control characters (the CRD bounds only the length; Envoy refuses
// CR, LF and NUL in a redirect path).
func pathModifierReason(v string) string {
	if len(v) > maxPathLen || strings.ContainsFunc(v, func(c rune) bool { return c <= ' ' || c == 0x7f }) {
		return "want at most 1024 bytes without spaces or control characters"
	}
	return ""
}

// hostnameReason says why h is not a Gateway API PreciseHostname (a DNS name), "" when it is
// one or empty.
func hostnameReason(h string) string {
	if h != "" && len(validation.IsDNS1123Subdomain(h)) > 0 {
		return "want a DNS name (RFC 1123 subdomain), or empty"
	}
	return ""
}

// schemeReason says why s is not a redirect scheme aether takes: http, https or "" (the
// request's); HTTPRequestRedirectFilter.scheme: "Unknown values here must result in the
// implementation setting the Accepted Condition for the Route to status: False".
func schemeReason(s string) string {
	if s != "" && s != "http" && s != "https" {
		return "want http or https"
	}
	return ""
}

// CORSOriginRegex returns the RE2 regex (matched whole by Envoy) of the Origin header values an
// allowOrigins entry "<scheme>://<host>[:<port>]" (a valid one) allows, as
// HTTPCORSFilter.allowOrigins defines them: scheme and host compared without case; a host "*"
// matches every host and a leading "*." one or more DNS labels (so "https://*.bar.com" allows
// https://www.bar.com and https://a.www.bar.com, not https://bar.com); without a port, the
// scheme's default port (80 for http, 443 for https) is assumed, so the Origin may carry it or
// leave it out. xds builds the same (its tests compare them).
func CORSOriginRegex(origin string) string {
	scheme, hostport, _ := strings.Cut(origin, "://")
	host, port := hostport, ""
	if i := strings.LastIndexByte(hostport, ':'); i >= 0 {
		host, port = hostport[:i], hostport[i+1:]
	}
	var h string
	switch {
	case host == "*":
		h = `[a-z0-9.-]+`
	case strings.HasPrefix(host, "*."):
		h = `([a-z0-9-]+\.)+` + regexp.QuoteMeta(host[2:])
	default:
		h = regexp.QuoteMeta(host)
	}
	p := ":" + port
	if port == "" {
		p = "(:80)?"
		if strings.EqualFold(scheme, "https") {
			p = "(:443)?"
		}
	}
	return "(?i)" + regexp.QuoteMeta(scheme) + "://" + h + p
}

// corsOriginReason says why o cannot be an allowOrigins entry, "" when it can: "*" or
// <scheme>://<host>[:<port>] (a CORSOrigin, at most 253 bytes) whose regex (CORSOriginRegex)
// Envoy takes.
func corsOriginReason(o string) string {
	if len(o) > 253 || !corsOrigin.MatchString(o) {
		return `want "*" or <scheme>://<host>[:<port>] with scheme http or https and a host that may start with "*." or be "*"`
	}
	if o == "*" {
		return ""
	}
	if why := regexProblem(CORSOriginRegex(o)); why != "" {
		return "Envoy matches it with the regex " + quoteValue(CORSOriginRegex(o)) + ": " + why
	}
	return ""
}

// gatewayDuration is the format of a Gateway API Duration (GEP-2257).
var gatewayDuration = regexp.MustCompile(`^([0-9]{1,5}(h|m|s|ms)){1,4}$`)

// parseDuration parses a Gateway API Duration as GEP-2257 says: it must match
// ^([0-9]{1,5}(h|m|s|ms)){1,4}$, then reads as Go's time.ParseDuration. why says what is wrong
// ("" when nothing).
func parseDuration(s string) (d time.Duration, why string) {
	if !gatewayDuration.MatchString(s) {
		return 0, "want a Gateway API duration (GEP-2257): one to four <1-5 digits><h|m|s|ms>, such as 500ms or 1h30m"
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, "want a Gateway API duration (GEP-2257): " + err.Error()
	}
	return d, ""
}

// timeoutsReason says why timeouts request and backendRequest (nil when unset) cannot go
// together, "" when they can: backendRequest may not exceed request unless request is 0
// (HTTPRouteTimeouts, a CEL rule of the CRD).
func timeoutsReason(request, backendRequest *time.Duration) string {
	if request != nil && backendRequest != nil && *request != 0 && *backendRequest > *request {
		return fmt.Sprintf("backendRequest %s exceeds request %s: want at most the request timeout, unless that is 0 (HTTPRouteTimeouts)", backendRequest, request)
	}
	return ""
}

// minRetryBackoff is the retry back-off the model uses for a backoff of 0: Envoy refuses a
// base_interval of 0 (RetryBackOff: "value must be greater than 0s"), and any wait honours a
// minimum of 0.
const minRetryBackoff = time.Millisecond

// retryBackoff is the back-off the model keeps for a retry's backoff d: d, or minRetryBackoff
// for 0; nil stays nil.
func retryBackoff(d *time.Duration) *time.Duration {
	if d != nil && *d < minRetryBackoff {
		m := minRetryBackoff
		return &m
	}
	return d
}

// checkRetry checks HTTPRouteRetry's attempts and codes (fields "attempts", "codes[i]"): 1 to
// 2147483647 attempts (the CRD's minimum 1; Envoy's num_retries is 32 bits), codes 400-599
// (HTTPRouteRetryStatusCode).
func checkRetry(attempts *int64, codes []int) *fieldProblem {
	if a := attempts; a != nil && (*a < 1 || *a > math.MaxInt32) {
		return &fieldProblem{"attempts", strconv.FormatInt(*a, 10), "want 1-2147483647 (HTTPRouteRetry.attempts)"}
	}
	if n := len(codes); n > maxRetryCodes {
		return &fieldProblem{"codes", strconv.Itoa(n) + " items", fmt.Sprintf("want at most %d (Gateway API)", maxRetryCodes)}
	}
	for i, c := range codes {
		if c < 400 || c > 599 {
			return &fieldProblem{fmt.Sprintf("codes[%d]", i), strconv.Itoa(c), "want 400-599 (HTTPRouteRetryStatusCode)"}
		}
	}
	return nil
}
