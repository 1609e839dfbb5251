package mcs

import (
	"cmp"
	"fmt"
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

func (e *InvalidExportError) Error() string { return string(e.Reason) + ": " + e.Message }

// MarkFromService builds the export mark of a ServiceExport's backing Service: one registry port
// per Service port (name, port, numeric target port or 0 for a named one, protocol), stamped with
// created as create_time. Following KEP-1645 ("Constraints and Conflict Resolution"), created is
// the ServiceExport's creationTimestamp, so the mark's age is the export's age and stays the same
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
// (InvalidServiceType).
func MarkFromService(svc *corev1.Service, created time.Time) (*registryv1.ExportMark, error) {
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
		Service:    &registryv1.ServiceRef{Namespace: svc.Namespace, Name: svc.Name},
		CreateTime: created.UTC().Format(time.RFC3339Nano),
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
	return m, nil
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

// SameMark reports whether two marks of one service say the same thing (ports and create_time),
// so rewriting one would change nothing.
func SameMark(a, b *registryv1.ExportMark) bool {
	if a.GetCreateTime() != b.GetCreateTime() || len(a.GetPorts()) != len(b.GetPorts()) {
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

// portsCompatible reports whether two exports offer the same ports to the clusterset: the same
// set of (name, port, protocol). Target ports may differ: they are per cluster (the registered
// endpoints carry them).
func portsCompatible(a, b *registryv1.ExportMark) bool {
	key := func(m *registryv1.ExportMark) []string {
		var out []string
		for _, p := range m.GetPorts() {
			out = append(out, p.GetName()+"/"+strconv.Itoa(int(p.GetPort()))+"/"+p.GetProtocol().String())
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(key(a), key(b))
}

// Resolution is the clusterset's view of one exported service: which export defines it and which
// exports conflict with that one.
type Resolution struct {
	// Winner is the export that defines the service's ports: the oldest by create_time, then by
	// cluster name, then by region (KEP-1645: the oldest export wins). The outcome depends only on
	// the marks' create_time, origin and ports, so it never changes while the same exports stay.
	Winner Mark
	// Clusters are the exporting clusters, sorted, without duplicates.
	Clusters []string
	// Conflicts maps the origin of every export whose ports are not compatible with the winner's
	// to the conflict reason (mcsv1beta1.ServiceExportReasonPortConflict).
	Conflicts map[registry.Origin]mcsv1beta1.ServiceExportConditionReason
}

// markTime parses a validated mark's create_time (registry.ValidateExport checked it).
func markTime(m Mark) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, m.Value.GetCreateTime())
	return t
}

// compareAge orders marks oldest first: create_time, then cluster name, then region.
func compareAge(a, b Mark) int {
	if c := markTime(a).Compare(markTime(b)); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Origin.Cluster, b.Origin.Cluster); c != 0 {
		return c
	}
	return cmp.Compare(a.Origin.Region, b.Origin.Region)
}

// Resolve decides one service from all its export marks (any order, at least one). It is pure:
// the same marks give the same Resolution. It returns false for no marks.
func Resolve(marks []Mark) (Resolution, bool) {
	if len(marks) == 0 {
		return Resolution{}, false
	}
	sorted := slices.Clone(marks)
	slices.SortFunc(sorted, compareAge)
	r := Resolution{Winner: sorted[0], Conflicts: map[registry.Origin]mcsv1beta1.ServiceExportConditionReason{}}
	for _, m := range sorted {
		r.Clusters = append(r.Clusters, m.Origin.Cluster)
		if !portsCompatible(m.Value, r.Winner.Value) {
			r.Conflicts[m.Origin] = mcsv1beta1.ServiceExportReasonPortConflict
		}
	}
	slices.Sort(r.Clusters)
	r.Clusters = slices.Compact(r.Clusters)
	return r, true
}

// ConflictCondition returns the Conflict condition for the export of origin in r: True with the
// conflict reason and the winner named when origin's ports differ from the winner's, else False
// with reason NoConflicts. generation is the ServiceExport's metadata.generation.
func ConflictCondition(r Resolution, origin registry.Origin, generation int64) metav1.Condition {
	c := metav1.Condition{Type: string(mcsv1beta1.ServiceExportConditionConflict), ObservedGeneration: generation}
	if reason, ok := r.Conflicts[origin]; ok {
		c.Status, c.Reason = metav1.ConditionTrue, string(reason)
		c.Message = fmt.Sprintf("ports differ from the export of cluster %s (region %s), the oldest export (created %s), whose ports the clusterset uses",
			r.Winner.Origin.Cluster, r.Winner.Origin.Region, r.Winner.Value.GetCreateTime())
		return c
	}
	c.Status, c.Reason, c.Message = metav1.ConditionFalse, string(mcsv1beta1.ServiceExportReasonNoConflicts), "no conflicting exports"
	return c
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

// importPorts maps the winner's ports to ServiceImport ports: L4 protocol UDP for UDP, else TCP;
// appProtocol "kubernetes.io/h2c", "grpc" or "tcp" for HTTP2, GRPC and TCP, unset for HTTP (the
// default, see MarkFromService), in the mark's order.
func importPorts(m *registryv1.ExportMark) []mcsv1beta1.ServicePort {
	out := make([]mcsv1beta1.ServicePort, 0, len(m.GetPorts()))
	for _, p := range m.GetPorts() {
		sp := mcsv1beta1.ServicePort{Name: p.GetName(), Port: int32(p.GetPort()), Protocol: corev1.ProtocolTCP}
		var app string
		switch p.GetProtocol() {
		case registryv1.Protocol_PROTOCOL_UDP:
			sp.Protocol = corev1.ProtocolUDP
		case registryv1.Protocol_PROTOCOL_HTTP2:
			app = "kubernetes.io/h2c"
		case registryv1.Protocol_PROTOCOL_GRPC:
			app = "grpc"
		case registryv1.Protocol_PROTOCOL_TCP:
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
// the winner's ports, ips (the clusterset VIP Service's ClusterIPs, may be empty before it has
// one), label aether.io/managed-by: aether, and status.clusters listing the exporting clusters.
func DesiredImport(ns, name string, r Resolution, ips []string) *mcsv1beta1.ServiceImport {
	si := &mcsv1beta1.ServiceImport{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{model.LabelManagedBy: model.ManagedByAether}},
		Spec: mcsv1beta1.ServiceImportSpec{
			Type:  mcsv1beta1.ClusterSetIP,
			Ports: importPorts(r.Winner.Value),
			IPs:   slices.Clone(ips),
		},
	}
	for _, c := range r.Clusters {
		si.Status.Clusters = append(si.Status.Clusters, mcsv1beta1.ClusterStatus{Cluster: c})
	}
	return si
}

// DesiredClustersetService returns the selectorless <name>-clusterset Service for r in namespace
// ns: type ClusterIP, the winner's ports (target port = port; nothing selects pods, the agents
// capture the VIP), label aether.io/managed-by: aether, annotations aether.io/mesh-service:
// <ns>/<name> and aether.io/mesh-port (see meshPortAnnotation). It returns the error of
// ClustersetServiceName.
func DesiredClustersetService(ns, name string, r Resolution) (*corev1.Service, error) {
	svcName, err := ClustersetServiceName(name)
	if err != nil {
		return nil, err
	}
	ports := importPorts(r.Winner.Value)
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
