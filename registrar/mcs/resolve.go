package mcs

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	registryv1 "github.com/aethermesh/aether/api/aether/registry/v1"
	"github.com/aethermesh/aether/model"
	"github.com/aethermesh/aether/registry"
)

// Mark is one export mark of the clusterset-wide export view with its origin (from the registry
// key path).
type Mark = registry.Record[*registryv1.ExportMark]

// InvalidExportError says why a Service cannot be exported; Reason is the MCS Valid condition
// reason (mcsv1beta1.ServiceExportReasonNoService or ServiceExportReasonInvalidServiceType).
type InvalidExportError struct {
	Reason  mcsv1beta1.ServiceExportConditionReason
	Message string
}

// Error is "<reason>: <message>", the reason being the ServiceExport condition's.
func (e *InvalidExportError) Error() string { return string(e.Reason) + ": " + e.Message }

// ServiceExportReasonInvalidExportedMetadata is the Valid=False reason of a ServiceExport whose
// spec.exportedLabels or spec.exportedAnnotations aether refuses: a key aether sets itself (see
// reservedKey), or a key or value Kubernetes would refuse on the ServiceImport. The MCS API lets
// controllers raise Valid with reasons of their own.
const ServiceExportReasonInvalidExportedMetadata mcsv1beta1.ServiceExportConditionReason = "InvalidExportedMetadata"

// MarkFromService builds the export mark of ServiceExport se and its backing Service svc: one
// registry port per Service port (name, port, numeric target port or 0 for a named one,
// protocol), create_time se's creationTimestamp, exported_labels and exported_annotations se's
// spec.exportedLabels and spec.exportedAnnotations, and the Service's session affinity
// (session_affinity "ClientIP" with its timeoutSeconds, or "" for None). Following KEP-1645
// ("Constraints and Conflict Resolution"), the mark's age is the export's age and stays the same
// whenever the mark is rewritten (after a restart, a leader change or a lost mark).
//
// The protocol is UDP for a UDP port, else the port's appProtocol (model.ParseProtocol), else HTTP:
// a mark cannot say "unspecified" (registry.ValidateExport), so HTTP doubles as the default and
// the ServiceImport leaves appProtocol unset for it (see importPorts). SCTP ports are left out:
// capture does not take SCTP, so they are not meshed (and 80/SCTP beside 80/TCP would be two
// ports 80 in the mark).
//
// It returns an *InvalidExportError for a Service the clusterset cannot import: svc nil
// (NoService), type ExternalName, a headless Service (aether imports ClusterSetIP services only),
// one of aether's own <svc>-clusterset Services, or one without ports other than SCTP
// (InvalidServiceType); and for exported labels or annotations it refuses
// (ServiceExportReasonInvalidExportedMetadata, naming the key).
func MarkFromService(svc *corev1.Service, se *mcsv1beta1.ServiceExport) (*registryv1.ExportMark, error) {
	if svc == nil {
		return nil, &InvalidExportError{Reason: mcsv1beta1.ServiceExportReasonNoService, Message: "no Service with the ServiceExport's namespace and name"}
	}
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return nil, &InvalidExportError{Reason: mcsv1beta1.ServiceExportReasonInvalidServiceType, Message: "Service type ExternalName cannot be exported (MCS API)"}
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		return nil, &InvalidExportError{Reason: mcsv1beta1.ServiceExportReasonInvalidServiceType, Message: "headless Services are not exported: aether imports ClusterSetIP services only"}
	case svc.Labels[model.LabelManagedBy] == model.ManagedByAether:
		return nil, &InvalidExportError{Reason: mcsv1beta1.ServiceExportReasonInvalidServiceType, Message: "the Service is one of aether's own (label " + model.LabelManagedBy + ")"}
	case len(svc.Spec.Ports) == 0:
		return nil, &InvalidExportError{Reason: mcsv1beta1.ServiceExportReasonInvalidServiceType, Message: "the Service has no ports"}
	}
	m := &registryv1.ExportMark{
		Service:             &registryv1.ServiceRef{Namespace: svc.Namespace, Name: svc.Name},
		CreateTime:          se.CreationTimestamp.UTC().Format(time.RFC3339Nano),
		ExportedLabels:      maps.Clone(se.Spec.ExportedLabels),
		ExportedAnnotations: maps.Clone(se.Spec.ExportedAnnotations),
	}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		m.SessionAffinity = string(corev1.ServiceAffinityClientIP)
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil && *c.ClientIP.TimeoutSeconds > 0 {
			m.SessionAffinityTimeoutSeconds = uint32(*c.ClientIP.TimeoutSeconds)
		}
	}
	for _, p := range svc.Spec.Ports {
		if p.Protocol == corev1.ProtocolSCTP {
			continue
		}
		sp := &registryv1.ServicePort{Name: p.Name, Port: uint32(p.Port), Protocol: markProtocol(p)}
		if p.TargetPort.IntValue() > 0 {
			sp.TargetPort = uint32(p.TargetPort.IntValue())
		}
		m.Ports = append(m.Ports, sp)
	}
	if len(m.Ports) == 0 {
		return nil, &InvalidExportError{Reason: mcsv1beta1.ServiceExportReasonInvalidServiceType, Message: "the Service has only SCTP ports, which aether does not mesh"}
	}
	if err := checkExportedMetadata(m); err != nil {
		return nil, err
	}
	return m, nil
}

// reservedKey reports whether an exported label (label true) or annotation key is one aether
// keeps for itself on the ServiceImport: a key of the aether.io domain or one of its subdomains
// (aether.io/managed-by, which every aether object carries, among them), and, for labels, the
// multicluster.kubernetes.io labels the MCS API defines (service-name, source-cluster).
func reservedKey(k string, label bool) bool {
	prefix, _, ok := strings.Cut(k, "/")
	switch {
	case !ok:
		return false
	case prefix == "aether.io" || strings.HasSuffix(prefix, ".aether.io"):
		return true
	}
	return label && prefix == "multicluster.kubernetes.io"
}

// checkExportedMetadata refuses a mark's exported labels and annotations with a reserved key
// (reservedKey) or one the registry refuses (registry.ValidateExport: qualified-name keys, label
// values, their total size), as an *InvalidExportError naming the ServiceExport field and key.
func checkExportedMetadata(m *registryv1.ExportMark) error {
	for _, f := range []struct {
		field string
		m     map[string]string
		label bool
	}{{"spec.exportedLabels", m.ExportedLabels, true}, {"spec.exportedAnnotations", m.ExportedAnnotations, false}} {
		for _, k := range slices.Sorted(maps.Keys(f.m)) {
			if reservedKey(k, f.label) {
				return &InvalidExportError{Reason: ServiceExportReasonInvalidExportedMetadata, Message: fmt.Sprintf(
					"%s[%q]: reserved: aether sets aether.io/ keys (and the multicluster.kubernetes.io/ labels) on the ServiceImport itself; remove it to export the service", f.field, k)}
			}
		}
	}
	var ve *registry.ValidationError
	if err := registry.ValidateExport(m); errors.As(err, &ve) && strings.HasPrefix(ve.Field, "exported_") {
		field := "spec.exportedLabels"
		if strings.HasPrefix(ve.Field, "exported_annotations") {
			field = "spec.exportedAnnotations"
		}
		return &InvalidExportError{Reason: ServiceExportReasonInvalidExportedMetadata, Message: fmt.Sprintf("%s: %q: %s", field, ve.Value, ve.Reason)}
	}
	return nil
}

func markProtocol(p corev1.ServicePort) registryv1.Protocol {
	if p.Protocol == corev1.ProtocolUDP {
		return registryv1.Protocol_PROTOCOL_UDP
	}
	if p.AppProtocol != nil {
		if mp, err := model.ParseProtocol(*p.AppProtocol); err == nil {
			if rp, err := registry.ProtocolFromModel(mp); err == nil {
				return rp
			}
		}
	}
	return registryv1.Protocol_PROTOCOL_HTTP
}

// SameMark reports whether two marks of one service say the same thing (ports, create_time,
// exported labels and annotations, session affinity), so rewriting one would change nothing.
func SameMark(a, b *registryv1.ExportMark) bool {
	if a.GetCreateTime() != b.GetCreateTime() || len(a.GetPorts()) != len(b.GetPorts()) ||
		!maps.Equal(a.GetExportedLabels(), b.GetExportedLabels()) || !maps.Equal(a.GetExportedAnnotations(), b.GetExportedAnnotations()) ||
		affinity(a) != affinity(b) || a.GetSessionAffinityTimeoutSeconds() != b.GetSessionAffinityTimeoutSeconds() {
		return false
	}
	for i, p := range a.GetPorts() {
		q := b.GetPorts()[i]
		if p.GetName() != q.GetName() || p.GetPort() != q.GetPort() || p.GetTargetPort() != q.GetTargetPort() || p.GetProtocol() != q.GetProtocol() {
			return false
		}
	}
	return true
}

// affinity is a mark's session affinity, "" (None, the default) read as None.
func affinity(m *registryv1.ExportMark) corev1.ServiceAffinity {
	if a := m.GetSessionAffinity(); a != "" {
		return corev1.ServiceAffinity(a)
	}
	return corev1.ServiceAffinityNone
}

// Resolution is the clusterset's view of one exported service, decided by KEP-1645's conflict
// resolution policy: the oldest export takes precedence (ServiceExport creationTimestamp, then the
// lexically smaller cluster name, then region: model.CompareExportAge). It depends only on the
// marks, never on their order, so it never changes while the same exports stay.
type Resolution struct {
	// Exports are the service's export marks, oldest first. Exports[0] (Oldest) defines the
	// service's exported labels and annotations and its session affinity.
	Exports []Mark
	// Ports is the per-port merge of the exports' ports (model.MergeExportPorts, the function the
	// agents' model filters endpoints with): the union, each port as the oldest export that
	// defines it defines it.
	Ports model.PortMerge
	// Clusters are the exporting clusters, sorted, without duplicates.
	Clusters []string
	// Conflicts are the reasons the exports conflict, in the order PortConflict,
	// SessionAffinityConflict, SessionAffinityConfigConflict, LabelsConflict, AnnotationsConflict;
	// empty when they agree. KEP-1645 sets the Conflict condition on all the service's exports.
	Conflicts []mcsv1beta1.ServiceExportConditionReason
}

// Oldest returns the oldest export, whose exported labels, annotations and session affinity the
// service takes.
func (r Resolution) Oldest() Mark { return r.Exports[0] }

// Resolve decides one service from all its export marks (any order). It is pure: the same marks
// give the same Resolution. It returns false for no marks.
func Resolve(marks []Mark) (Resolution, bool) {
	if len(marks) == 0 {
		return Resolution{}, false
	}
	type pair struct {
		mark Mark
		x    model.ExportMark
	}
	pairs := make([]pair, len(marks))
	xs := make([]model.ExportMark, len(marks))
	for i, m := range marks {
		pairs[i] = pair{m, registry.ToModelExport(m)}
		xs[i] = pairs[i].x
	}
	slices.SortFunc(pairs, func(a, b pair) int { return model.CompareExportAge(a.x, b.x) })
	r := Resolution{Ports: model.MergeExportPorts(xs)}
	for _, p := range pairs {
		r.Exports = append(r.Exports, p.mark)
		r.Clusters = append(r.Clusters, p.mark.Origin.Cluster)
	}
	slices.Sort(r.Clusters)
	r.Clusters = slices.Compact(r.Clusters)

	oldest := r.Oldest().Value
	differs := func(f func(m *registryv1.ExportMark) bool) bool {
		return slices.ContainsFunc(r.Exports, func(m Mark) bool { return f(m.Value) })
	}
	if r.Ports.Conflict {
		r.Conflicts = append(r.Conflicts, mcsv1beta1.ServiceExportReasonPortConflict)
	}
	if differs(func(m *registryv1.ExportMark) bool { return affinity(m) != affinity(oldest) }) {
		r.Conflicts = append(r.Conflicts, mcsv1beta1.ServiceExportReasonSessionAffinityConflict)
	}
	// The timeout conflicts only between exports of the same affinity (a None export has none).
	if differs(func(m *registryv1.ExportMark) bool {
		return affinity(m) == affinity(oldest) && m.GetSessionAffinityTimeoutSeconds() != oldest.GetSessionAffinityTimeoutSeconds()
	}) {
		r.Conflicts = append(r.Conflicts, mcsv1beta1.ServiceExportReasonSessionAffinityConfigConflict)
	}
	if differs(func(m *registryv1.ExportMark) bool {
		return !maps.Equal(m.GetExportedLabels(), oldest.GetExportedLabels())
	}) {
		r.Conflicts = append(r.Conflicts, mcsv1beta1.ServiceExportReasonLabelsConflict)
	}
	if differs(func(m *registryv1.ExportMark) bool {
		return !maps.Equal(m.GetExportedAnnotations(), oldest.GetExportedAnnotations())
	}) {
		r.Conflicts = append(r.Conflicts, mcsv1beta1.ServiceExportReasonAnnotationsConflict)
	}
	return r, true
}

// maxConflictPorts bounds the ports a Conflict message lists.
const maxConflictPorts = 10

// ConflictCondition returns the Conflict condition for the export of origin in r. When the
// exports conflict it is True on every export of the service (KEP-1645: "on all ServiceExports
// for the conflicted service"), the reasons joined by commas (as the MCS API allows), and the
// message names, per conflicting property, the cluster whose export is used and what this export
// says: per port (at most maxConflictPorts), the port, the winning cluster, the clusters its
// traffic reaches and whether this export's definition is used. Else it is False, NoConflicts.
// generation is the ServiceExport's metadata.generation.
func ConflictCondition(r Resolution, origin registry.Origin, generation int64) metav1.Condition {
	c := metav1.Condition{Type: string(mcsv1beta1.ServiceExportConditionConflict), ObservedGeneration: generation}
	if len(r.Conflicts) == 0 {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, string(mcsv1beta1.ServiceExportReasonNoConflicts), "no conflicting exports"
		return c
	}
	reasons := make([]string, len(r.Conflicts))
	for i, x := range r.Conflicts {
		reasons[i] = string(x)
	}
	c.Status, c.Reason = metav1.ConditionTrue, strings.Join(reasons, ",")
	oldest := r.Oldest()
	var own *registryv1.ExportMark
	if i := slices.IndexFunc(r.Exports, func(m Mark) bool { return m.Origin == origin }); i >= 0 {
		own = r.Exports[i].Value
	}
	from := fmt.Sprintf("cluster %s (region %s, the oldest export, created %s)", oldest.Origin.Cluster, oldest.Origin.Region, oldest.Value.GetCreateTime())
	if oldest.Origin == origin {
		from = "this export (the oldest)"
	}
	same := func(eq bool) string {
		if eq {
			return "this export's are the same"
		}
		return "this export's differ"
	}
	var parts []string
	for _, reason := range r.Conflicts {
		switch reason {
		case mcsv1beta1.ServiceExportReasonPortConflict:
			parts = append(parts, portConflictMessage(r.Ports, model.ExportOrigin{Region: origin.Region, Cluster: origin.Cluster}))
		case mcsv1beta1.ServiceExportReasonSessionAffinityConflict:
			parts = append(parts, fmt.Sprintf("session affinity: %s of %s is used; this export has %s", affinity(oldest.Value), from, affinity(own)))
		case mcsv1beta1.ServiceExportReasonSessionAffinityConfigConflict:
			parts = append(parts, fmt.Sprintf("session affinity timeout: %ds of %s is used (0: unset); this export has %ds",
				oldest.Value.GetSessionAffinityTimeoutSeconds(), from, own.GetSessionAffinityTimeoutSeconds()))
		case mcsv1beta1.ServiceExportReasonLabelsConflict:
			parts = append(parts, fmt.Sprintf("exportedLabels differ between the exports: those of %s are used; %s", from, same(maps.Equal(own.GetExportedLabels(), oldest.Value.GetExportedLabels()))))
		case mcsv1beta1.ServiceExportReasonAnnotationsConflict:
			parts = append(parts, fmt.Sprintf("exportedAnnotations differ between the exports: those of %s are used; %s", from, same(maps.Equal(own.GetExportedAnnotations(), oldest.Value.GetExportedAnnotations()))))
		}
	}
	c.Message = strings.Join(parts, ". ")
	return c
}

// portConflictMessage describes, for the export of origin o, each merged port that not every
// export defines the same way.
func portConflictMessage(pm model.PortMerge, o model.ExportOrigin) string {
	var entries []string
	more := 0
	for i, mp := range pm.Ports {
		if len(mp.Serving) == len(pm.Exports) {
			continue
		}
		if len(entries) == maxConflictPorts {
			more++
			continue
		}
		var serving []string
		for _, s := range mp.Serving {
			serving = append(serving, s.Cluster)
		}
		var own string
		switch j := slices.IndexFunc(pm.Clashes, func(c model.PortClash) bool { return c.Export == o && c.Merged == i }); {
		case mp.Winner == o:
			own = "this export's definition is used"
		case slices.Contains(mp.Serving, o):
			own = "this export defines it the same way"
		case j >= 0:
			own = "this export's " + clashText(pm.Clashes[j]) + " is not imported and gets no traffic on it"
		default:
			own = "this export does not define it"
		}
		entries = append(entries, fmt.Sprintf("port %s %s from cluster %s, traffic to cluster(s) %s: %s",
			portName(mp.Port.Name), portDef(mp.Port), mp.Winner.Cluster, strings.Join(serving, ","), own))
	}
	msg := "ports differ between the exports; the ServiceImport has their union, each port as the oldest export defining it defines it (KEP-1645), and only clusters defining a port that way get its traffic: " +
		strings.Join(entries, "; ")
	if more > 0 {
		msg += fmt.Sprintf("; and %d more port(s)", more)
	}
	return msg
}

func portName(n string) string {
	if n == "" {
		return "(unnamed)"
	}
	return strconv.Quote(n)
}

// portDef renders a port's number and protocol as "80/HTTP".
func portDef(p model.ServicePort) string { return strconv.Itoa(int(p.Port)) + "/" + string(p.Protocol) }

func clashText(c model.PortClash) string {
	def := "port " + portName(c.Port.Name) + " " + portDef(c.Port)
	switch c.Reason {
	case model.ClashNumber:
		return def + " (same protocol and number under another name)"
	case model.ClashUnnamed:
		return def + " (an unnamed port cannot stand beside other ports)"
	}
	return def
}

// ClustersetServiceName returns the name of the clusterset VIP Service of service name,
// <name>-clusterset, or an error when that is not a valid Service name (an RFC 1035 label of at
// most 63 characters).
func ClustersetServiceName(name string) (string, error) {
	n := name + model.ClustersetServiceSuffix
	if errs := validation.IsDNS1035Label(n); len(errs) > 0 {
		return "", fmt.Errorf("clusterset Service name %q: %s", n, strings.Join(errs, "; "))
	}
	return n, nil
}

// importPorts maps the merged ports to ServiceImport ports, in merge order: L4 protocol UDP for
// UDP, else TCP; appProtocol "kubernetes.io/h2c", "grpc" or "tcp" for HTTP2, GRPC and TCP, unset
// for HTTP (the default, see MarkFromService).
func importPorts(pm model.PortMerge) []mcsv1beta1.ServicePort {
	out := make([]mcsv1beta1.ServicePort, 0, len(pm.Ports))
	for _, mp := range pm.Ports {
		p := mp.Port
		sp := mcsv1beta1.ServicePort{Name: p.Name, Port: int32(p.Port), Protocol: corev1.ProtocolTCP}
		var app string
		switch p.Protocol {
		case model.ProtocolUDP:
			sp.Protocol = corev1.ProtocolUDP
		case model.ProtocolHTTP2:
			app = "kubernetes.io/h2c"
		case model.ProtocolGRPC:
			app = "grpc"
		case model.ProtocolTCP:
			app = "tcp"
		}
		if app != "" {
			sp.AppProtocol = &app
		}
		out = append(out, sp)
	}
	return out
}

// meshPortAnnotation is the value of aether.io/mesh-port on a clusterset Service: the service's
// ports at the VIP, comma-separated, in the ServiceImport's order (e.g. "80,9090").
func meshPortAnnotation(ports []mcsv1beta1.ServicePort) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(int(p.Port))
	}
	return strings.Join(s, ",")
}

// DesiredImport returns the ServiceImport aether keeps for r in namespace ns: type ClusterSetIP,
// the merged ports (r.Ports), ips (the clusterset VIP Service's ClusterIPs, may be empty before
// it has one), the oldest export's session affinity (sessionAffinity None or ClientIP, with
// sessionAffinityConfig for a ClientIP timeout) and, in its metadata, the oldest export's exported
// labels and annotations (KEP-1645, "Labels and Annotations") beside the label
// aether.io/managed-by: aether; status.clusters lists the exporting clusters.
//
// Reserved keys (reservedKey) in a mark are left out here too: the exporting registrar refuses
// them, but a mark written into the registry some other way must not set aether's own labels or
// annotations on the ServiceImport.
func DesiredImport(ns, name string, r Resolution, ips []string) *mcsv1beta1.ServiceImport {
	oldest := r.Oldest().Value
	unreserved := func(m map[string]string, label bool) map[string]string {
		out := make(map[string]string, len(m))
		for k, v := range m {
			if !reservedKey(k, label) {
				out[k] = v
			}
		}
		return out
	}
	labels := unreserved(oldest.GetExportedLabels(), true)
	labels[model.LabelManagedBy] = model.ManagedByAether
	var annotations map[string]string
	if a := unreserved(oldest.GetExportedAnnotations(), false); len(a) > 0 {
		annotations = a
	}
	si := &mcsv1beta1.ServiceImport{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, Annotations: annotations},
		Spec: mcsv1beta1.ServiceImportSpec{
			Type:            mcsv1beta1.ClusterSetIP,
			Ports:           importPorts(r.Ports),
			IPs:             slices.Clone(ips),
			SessionAffinity: affinity(oldest),
		},
	}
	if t := int32(oldest.GetSessionAffinityTimeoutSeconds()); si.Spec.SessionAffinity == corev1.ServiceAffinityClientIP && t > 0 {
		si.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &t}}
	}
	for _, c := range r.Clusters {
		si.Status.Clusters = append(si.Status.Clusters, mcsv1beta1.ClusterStatus{Cluster: c})
	}
	return si
}

// DesiredClustersetService returns the selectorless <name>-clusterset Service for r in namespace
// ns: type ClusterIP, the merged ports (target port = port; nothing selects pods, the agents
// capture the VIP), label aether.io/managed-by: aether, annotations aether.io/mesh-service:
// <ns>/<name> and aether.io/mesh-port (see meshPortAnnotation). It returns the error of
// ClustersetServiceName.
func DesiredClustersetService(ns, name string, r Resolution) (*corev1.Service, error) {
	svcName, err := ClustersetServiceName(name)
	if err != nil {
		return nil, err
	}
	ports := importPorts(r.Ports)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: svcName,
			Labels: map[string]string{model.LabelManagedBy: model.ManagedByAether, mcsv1beta1.LabelServiceName: name},
			Annotations: map[string]string{
				model.AnnotationMeshService: ns + "/" + name,
				model.AnnotationMeshPort:    meshPortAnnotation(ports),
			},
		},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP},
	}
	for _, p := range ports {
		name := p.Name
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: name, Port: p.Port, Protocol: p.Protocol, AppProtocol: p.AppProtocol})
	}
	return svc, nil
}
