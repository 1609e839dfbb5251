package registry

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
)

// ValidationError is an invalid record field: Field is its path in the record
// (e.g. "ports[1].port"), Value the offending value and Reason what was wanted.
type ValidationError struct {
	Field  string
	Value  string
	Reason string
}

// Error returns "<field>: invalid value <value>: <reason>".
func (e *ValidationError) Error() string {
	return fmt.Sprintf("%s: invalid value %q: %s", e.Field, e.Value, e.Reason)
}

func fieldErr(field, value, reason string) *ValidationError {
	return &ValidationError{Field: field, Value: value, Reason: reason}
}

// validName checks a region, cluster, namespace or service name: an RFC 1123 DNS label
// (lowercase letters, digits and '-', 1 to 63 characters, alphanumeric at both ends), the rule
// Kubernetes applies to namespace and Service names. Such a name never holds '/', so it is always
// exactly one key segment.
func validName(s string) error {
	ok := len(s) > 0 && len(s) <= 63 && s[0] != '-' && s[len(s)-1] != '-'
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-'
	}
	if !ok {
		return errNotDNSLabel
	}
	return nil
}

var errNotDNSLabel = errors.New("want an RFC 1123 DNS label (a-z, 0-9, '-', at most 63 characters)")

// validPodUID checks an endpoint id: 1 to 128 characters of A-Z a-z 0-9 . _ - (a Kubernetes
// UID is a lowercase RFC 4122 UUID).
func validPodUID(s string) error { return validToken("pod_uid", s) }

// ValidateClusterID checks a cluster ID (Config.ClusterID, PartitionClaim.cluster_id): a
// Kubernetes UID, or any token of 1-128 characters of A-Z a-z 0-9 . _ - (as a pod UID). It
// returns a *ValidationError naming field and the value.
func ValidateClusterID(field, id string) error { return validToken(field, id) }

// validToken checks a UID-like token: 1-128 characters of A-Z a-z 0-9 . _ -.
func validToken(field, s string) error {
	ok := len(s) > 0 && len(s) <= 128
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
	}
	if !ok {
		return fieldErr(field, s, "want 1-128 characters of A-Z a-z 0-9 . _ -")
	}
	return nil
}

func validServiceRef(namespace, name, field string) error {
	if err := validName(namespace); err != nil {
		return fieldErr(field+".namespace", namespace, err.Error())
	}
	if err := validName(name); err != nil {
		return fieldErr(field+".name", name, err.Error())
	}
	return nil
}

func validRef(r *registryv1.ServiceRef, field string) error {
	if r == nil {
		return fieldErr(field, "", "required")
	}
	return validServiceRef(r.GetNamespace(), r.GetName(), field)
}

func validPort(p uint32, field string, zeroOK bool) error {
	if (p == 0 && !zeroOK) || p > 65535 {
		return fieldErr(field, strconv.FormatUint(uint64(p), 10), "want 1-65535")
	}
	return nil
}

func knownProtocol(p registryv1.Protocol) bool {
	return p > registryv1.Protocol_PROTOCOL_UNSPECIFIED && p <= registryv1.Protocol_PROTOCOL_UDP
}

func validProtocol(p registryv1.Protocol, field string) error {
	if !knownProtocol(p) {
		return fieldErr(field, p.String(), "want one of HTTP, HTTP2, GRPC, TCP, UDP")
	}
	return nil
}

func validTime(s, field string) error {
	if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
		return fieldErr(field, s, "want an RFC 3339 time, e.g. 2026-01-02T15:04:05.123456789Z")
	}
	return nil
}

// Limits on the lists of one record, taken from the Kubernetes API objects the records mirror, so
// that no record Kubernetes can describe is refused and no writer can make every reader decode,
// validate and hold an unbounded list (etcd's own cap is 1.5 MiB per value, room for about
// 100k ports).
const (
	// MaxEndpointAddresses caps ServiceEndpoint.addresses: an EndpointSlice endpoint holds "at
	// least one address but no more than 100" (discovery.k8s.io/v1 Endpoint.addresses). A pod
	// has at most two (Pod status.podIPs: one per IP family).
	MaxEndpointAddresses = 100
	// MaxEndpointPorts caps ServiceEndpoint.ports: "Each slice may include a maximum of 100
	// ports" (discovery.k8s.io/v1 EndpointSlice.ports); the endpoint controller puts every
	// port of a Service into each of its slices.
	MaxEndpointPorts = 100
	// MaxExportPorts caps ExportMark.ports, the ports of an exported Service. The Service API
	// itself sets no count, but the importing cluster carries them in EndpointSlices (at most
	// 100 ports each, as MaxEndpointPorts), so a Service with more cannot be imported whole.
	MaxExportPorts = 100
	// MaxExportedMetadataBytes caps ExportMark.exported_labels and .exported_annotations, keys
	// and values together: the API server's limit on one object's annotations (256 KiB).
	MaxExportedMetadataBytes = 256 << 10
	// MaxSessionAffinitySeconds is the longest ClientIP session affinity timeout a Service takes
	// (spec.sessionAffinityConfig.clientIP.timeoutSeconds: 0 < t <= 86400).
	MaxSessionAffinitySeconds = 86400
	// MaxConfigBytes caps one ServiceConfigProjection, encoded: the config-export controller
	// refuses to write a bigger one (and says so), every reader refuses to hold one. A 10-rule
	// route takes about 1.5 KB, so this is room for hundreds of routes per service.
	MaxConfigBytes = 1 << 20
	// MaxConfigRoutes caps ServiceConfigProjection.routes.
	MaxConfigRoutes = 1000
)

// tooMany is the error for a list of n items over max.
func tooMany(field string, n, limit int) *ValidationError {
	return fieldErr(field, strconv.Itoa(n)+" items", fmt.Sprintf("want at most %d", limit))
}

// ValidateEndpoint checks a ServiceEndpoint before it is written and after it is read. It returns
// a *ValidationError naming the first bad field: service, addresses (1 to MaxEndpointAddresses,
// each a unicast IP address without a zone (hostAddr: not loopback, link-local or unspecified), an IPv4 address in its own form rather than
// IPv4-mapped IPv6 (::ffff:a.b.c.d, which would name the same pod twice over), no duplicates), ports (1 to MaxEndpointPorts,
// 1-65535, a defined protocol,
// unique names; a number repeats only under different names), spiffe_id (validEndpointID), health
// (HEALTHY or UNHEALTHY), kubernetes (pod UID, pod and node name required; node_ip empty or a
// unicast address without a zone, not IPv4-mapped), zone (at most 63 characters, no '/').
func ValidateEndpoint(ep *registryv1.ServiceEndpoint) error {
	if ep == nil {
		return fieldErr("endpoint", "", "required")
	}
	if err := validRef(ep.GetService(), "service"); err != nil {
		return err
	}
	if len(ep.GetZone()) > 63 || strings.Contains(ep.GetZone(), "/") {
		return fieldErr("zone", ep.GetZone(), "want at most 63 characters without '/'")
	}
	if len(ep.GetAddresses()) == 0 {
		return fieldErr("addresses", "", "want at least one pod IP")
	}
	if n := len(ep.GetAddresses()); n > MaxEndpointAddresses {
		return tooMany("addresses", n, MaxEndpointAddresses)
	}
	// Address and port lists are short: quadratic duplicate checks allocate nothing.
	for i, a := range ep.GetAddresses() {
		if !hostAddr(a) {
			return fieldErr(fmt.Sprintf("addresses[%d]", i), a, "want a unicast IPv4 or IPv6 address without a zone, not loopback or link-local (IPv4 as a.b.c.d, not ::ffff:a.b.c.d)")
		}
		ip, _ := netip.ParseAddr(a)
		for _, b := range ep.GetAddresses()[:i] {
			if prev, _ := netip.ParseAddr(b); prev == ip {
				return fieldErr(fmt.Sprintf("addresses[%d]", i), a, "duplicate address")
			}
		}
	}
	if len(ep.GetPorts()) == 0 {
		return fieldErr("ports", "", "want at least one port")
	}
	if n := len(ep.GetPorts()); n > MaxEndpointPorts {
		return tooMany("ports", n, MaxEndpointPorts)
	}
	for i, p := range ep.GetPorts() {
		if p.GetPort() == 0 || p.GetPort() > 65535 {
			return fieldErr(fmt.Sprintf("ports[%d].port", i), strconv.Itoa(int(p.GetPort())), "want 1-65535")
		}
		for _, q := range ep.GetPorts()[:i] {
			// Two named Service ports may reach one container port (80 and 8080 both to 8080):
			// the record keeps both names, which other clusters resolve target ports by.
			if q.GetPort() == p.GetPort() && (p.GetName() == "" || q.GetName() == "") {
				return fieldErr(fmt.Sprintf("ports[%d].port", i), strconv.Itoa(int(p.GetPort())), "duplicate port without a name")
			}
			if p.GetName() != "" && q.GetName() == p.GetName() {
				return fieldErr(fmt.Sprintf("ports[%d].name", i), p.GetName(), "duplicate port name")
			}
		}
		if !knownProtocol(p.GetProtocol()) {
			return validProtocol(p.GetProtocol(), fmt.Sprintf("ports[%d].protocol", i))
		}
	}
	if err := validEndpointID(ep.GetSpiffeId(), ep.GetService().GetNamespace()); err != nil {
		return err
	}
	if h := ep.GetHealth(); h != registryv1.Health_HEALTH_HEALTHY && h != registryv1.Health_HEALTH_UNHEALTHY {
		return fieldErr("health", h.String(), "want HEALTHY or UNHEALTHY")
	}
	k := ep.GetKubernetes()
	if k == nil {
		return fieldErr("kubernetes", "", "required")
	}
	if err := validPodUID(k.GetPodUid()); err != nil {
		e := err.(*ValidationError)
		e.Field = "kubernetes.pod_uid"
		return e
	}
	if k.GetPodName() == "" {
		return fieldErr("kubernetes.pod_name", "", "required")
	}
	if k.GetNodeName() == "" {
		return fieldErr("kubernetes.node_name", "", "required")
	}
	if k.GetNodeIp() != "" && !nodeAddr(k.GetNodeIp()) {
		return fieldErr("kubernetes.node_ip", k.GetNodeIp(), "want a unicast IPv4 or IPv6 address without a zone, not link-local (IPv4 as a.b.c.d, not ::ffff:a.b.c.d), or empty")
	}
	return nil
}

// validEndpointID checks an endpoint's spiffe_id: a SPIFFE ID (go-spiffe's spiffeid.FromString:
// the trust domain and path characters of the SPIFFE ID standard, section 2) of the form
// spiffe://<trust domain>/ns/<namespace>/sa/<service account> whose namespace is the endpoint's
// service's. A record that names another namespace's identity would make the node proxies pin
// that identity for this service's endpoints, so a writer could have its pods accepted as another
// namespace's (the SAN pin of docs/node-proxy.md).
func validEndpointID(id, namespace string) error {
	const want = "want spiffe://<trust domain>/ns/<namespace>/sa/<service account>"
	sid, err := spiffeid.FromString(id)
	if err != nil {
		return fieldErr("spiffe_id", id, want+": "+err.Error())
	}
	rest, ok := strings.CutPrefix(sid.Path(), "/ns/"+namespace+"/sa/")
	if !ok || rest == "" || strings.Contains(rest, "/") {
		return fieldErr("spiffe_id", id, want+" with the service's namespace "+strconv.Quote(namespace))
	}
	return nil
}

// hostAddr reports whether s is an address a pod or node can have and another node can dial: an
// IP address, not unspecified (0.0.0.0, ::: Envoy would dial itself), loopback (127.0.0.0/8,
// ::1: the reader's own host), link-local (169.254.0.0/16, fe80::/10: the reader's own link, and
// 169.254.169.254 the cloud metadata service) or multicast, without an IPv6 zone (which names an
// interface of the writer's node), and an IPv4 address not written as IPv4-mapped IPv6 (RFC 4291
// section 2.5.5.2): the node proxy keys a pod's connections by the address Envoy reports, which
// is a.b.c.d, so ::ffff:a.b.c.d would never match.
func hostAddr(s string) bool {
	ip, err := netip.ParseAddr(s)
	return err == nil && nodeAddr(s) && !ip.IsLoopback()
}

// nodeAddr is hostAddr for a node IP, where loopback is allowed: a cluster on one machine (the
// agent's own tests, a single-node development cluster) has its node at 127.0.0.1, and a reader
// that dials it reaches only its own host's waypoint port.
func nodeAddr(s string) bool {
	ip, err := netip.ParseAddr(s)
	return err == nil && ip.Zone() == "" && !ip.IsUnspecified() && !ip.IsMulticast() && !ip.Is4In6() && !ip.IsLinkLocalUnicast()
}

// ValidateExport checks an ExportMark: service, ports (1 to MaxExportPorts; port 1-65535, target_port
// 0-65535 where 0 means the same as port, a defined protocol, unique ports, where a UDP port and
// a non-UDP port may share a number as they may in a Service: 53/UDP beside 53/TCP; names as a
// Service's: DNS labels, unique, required when there is more than one port) and create_time
// (RFC 3339).
func ValidateExport(m *registryv1.ExportMark) error {
	if m == nil {
		return fieldErr("export", "", "required")
	}
	if err := validRef(m.GetService(), "service"); err != nil {
		return err
	}
	if len(m.GetPorts()) == 0 {
		return fieldErr("ports", "", "want at least one port")
	}
	if n := len(m.GetPorts()); n > MaxExportPorts {
		return tooMany("ports", n, MaxExportPorts)
	}
	type l4Port struct {
		port uint32
		udp  bool
	}
	seen := map[l4Port]bool{}
	for i, p := range m.GetPorts() {
		f := fmt.Sprintf("ports[%d]", i)
		if err := validPort(p.GetPort(), f+".port", false); err != nil {
			return err
		}
		k := l4Port{p.GetPort(), p.GetProtocol() == registryv1.Protocol_PROTOCOL_UDP}
		if seen[k] {
			return fieldErr(f+".port", strconv.Itoa(int(p.GetPort())), "duplicate port")
		}
		seen[k] = true
		// The importing cluster makes a Service of these ports, whose API refuses other names.
		switch name := p.GetName(); {
		case name == "" && len(m.GetPorts()) > 1:
			return fieldErr(f+".name", name, "required when there is more than one port")
		case name != "" && validName(name) != nil:
			return fieldErr(f+".name", name, errNotDNSLabel.Error())
		case name != "" && slices.ContainsFunc(m.GetPorts()[:i], func(q *registryv1.ServicePort) bool { return q.GetName() == name }):
			return fieldErr(f+".name", name, "duplicate port name")
		}
		if err := validPort(p.GetTargetPort(), f+".target_port", true); err != nil {
			return err
		}
		if err := validProtocol(p.GetProtocol(), f+".protocol"); err != nil {
			return err
		}
	}
	if err := validExportedMetadata(m.GetExportedLabels(), "exported_labels", true); err != nil {
		return err
	}
	if err := validExportedMetadata(m.GetExportedAnnotations(), "exported_annotations", false); err != nil {
		return err
	}
	switch a := m.GetSessionAffinity(); a {
	case "", string(corev1.ServiceAffinityNone):
		if t := m.GetSessionAffinityTimeoutSeconds(); t != 0 {
			return fieldErr("session_affinity_timeout_seconds", strconv.FormatUint(uint64(t), 10), "want 0 unless session_affinity is ClientIP")
		}
	case string(corev1.ServiceAffinityClientIP):
		if t := m.GetSessionAffinityTimeoutSeconds(); t > MaxSessionAffinitySeconds {
			return fieldErr("session_affinity_timeout_seconds", strconv.FormatUint(uint64(t), 10), fmt.Sprintf("want 0 (unset) to %d", MaxSessionAffinitySeconds))
		}
	default:
		return fieldErr("session_affinity", a, "want None or ClientIP (Service spec.sessionAffinity)")
	}
	return validTime(m.GetCreateTime(), "create_time")
}

// validExportedMetadata checks a ServiceExport's exportedLabels (labels: label values) or
// exportedAnnotations: keys are Kubernetes qualified names, and the keys and values together
// hold at most MaxExportedMetadataBytes (the API server's limit on a whole object's annotations).
func validExportedMetadata(m map[string]string, field string, labels bool) error {
	size := 0
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fieldErr(field, k, "key: "+strings.Join(errs, "; "))
		}
		if labels {
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				return fieldErr(field+"["+k+"]", v, strings.Join(errs, "; "))
			}
		}
		size += len(k) + len(v)
	}
	if size > MaxExportedMetadataBytes {
		return fieldErr(field, strconv.Itoa(size)+" bytes", fmt.Sprintf("want at most %d bytes of keys and values", MaxExportedMetadataBytes))
	}
	return nil
}

// ValidateConfig checks a ServiceConfigProjection: its encoded size (at most MaxConfigBytes),
// service, version (at least 1), export_time and export_create_time (RFC 3339), routes (at most
// MaxConfigRoutes) and every route, as model.RouteFromProto checks it (kinds, names, parentRefs,
// matches, filters, backends, timeouts, retries, the Gateway API's limits). A refused route field
// is reported with its path under routes[i] ("routes[0].rules[1].filters[0].request_redirect
// .status_code").
func ValidateConfig(c *registryv1.ServiceConfigProjection) error {
	if c == nil {
		return fieldErr("config", "", "required")
	}
	if n := proto.Size(c); n > MaxConfigBytes {
		return fieldErr("config", strconv.Itoa(n)+" bytes", fmt.Sprintf("want at most %d bytes encoded", MaxConfigBytes))
	}
	if err := validRef(c.GetService(), "service"); err != nil {
		return err
	}
	if c.GetVersion() == 0 {
		return fieldErr("version", "0", "want at least 1")
	}
	if err := validTime(c.GetExportTime(), "export_time"); err != nil {
		return err
	}
	if err := validTime(c.GetExportCreateTime(), "export_create_time"); err != nil {
		return err
	}
	if n := len(c.GetRoutes()); n > MaxConfigRoutes {
		return tooMany("routes", n, MaxConfigRoutes)
	}
	for i, r := range c.GetRoutes() {
		f := fmt.Sprintf("routes[%d]", i)
		if r == nil {
			return fieldErr(f, "", "required")
		}
		if _, err := model.RouteFromProto(r); err != nil {
			var fe *model.RouteFieldError
			if errors.As(err, &fe) {
				return fieldErr(f+"."+fe.Field, fe.Value, fe.Reason)
			}
			return fieldErr(f, "", err.Error())
		}
	}
	return nil
}
