package model

import (
	"cmp"
	"slices"
)

// ExportOrigin names the cluster an export mark comes from (its registry key path).
type ExportOrigin struct {
	Region  string
	Cluster string
}

// CompareExportAge orders export marks oldest first: Created, then the lexically smaller Cluster,
// then Region. KEP-1645 ("Constraints and Conflict Resolution"): conflicts are resolved by the
// ServiceExports' creationTimestamp, oldest first; that timestamp has one-second resolution, so
// exports created in the same second are ordered by cluster name. The order is total for marks
// of distinct origins, so whatever decides by it is a pure function of the marks.
func CompareExportAge(a, b ExportMark) int {
	if c := a.Created.Compare(b.Created); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Cluster, b.Cluster); c != 0 {
		return c
	}
	return cmp.Compare(a.Region, b.Region)
}

// MergedPort is one port of an imported service: the definition of the oldest export that
// defines it.
type MergedPort struct {
	// Port holds the winning Name, Port and Protocol; TargetPort is 0 (target ports are per
	// cluster: each cluster's endpoints carry their own).
	Port ServicePort
	// Winner is the export whose definition is used.
	Winner ExportOrigin
	// Serving are the exports that define the port exactly as Winner does (same name, number
	// and protocol), Winner first, then oldest first. Only their clusters' endpoints get traffic
	// on this port (aether's rule, docs/registrar.md).
	Serving []ExportOrigin
}

// PortClashReason says why a port definition of an export was not merged.
type PortClashReason string

const (
	// ClashDefinition: an older export defines a port of the same name with another number or
	// protocol.
	ClashDefinition PortClashReason = "DifferentDefinition"
	// ClashNumber: an older export defines a port with the same protocol (UDP or TCP) and number
	// under another name (a Service cannot hold both).
	ClashNumber PortClashReason = "SameNumber"
	// ClashUnnamed: an unnamed port cannot stand beside other ports (a Service with more than one
	// port names every one): the export's unnamed port beside older named ones, or its named
	// port beside an older unnamed one.
	ClashUnnamed PortClashReason = "Unnamed"
)

// PortClash is one port definition of an export that the merge did not use.
type PortClash struct {
	Export ExportOrigin
	// Port is the export's own definition.
	Port ServicePort
	// Merged is the index in PortMerge.Ports of the port it clashed with.
	Merged int
	Reason PortClashReason
}

// PortMerge is the per-port merge of one service's export marks (MergeExportPorts).
type PortMerge struct {
	// Ports are the union of the exports' ports, in merge order: the oldest export's ports in its
	// order, then each younger export's new ports in its order.
	Ports []MergedPort
	// Clashes are the exports' definitions that lost, oldest export first, each in its order.
	Clashes []PortClash
	// Exports are the merged exports, oldest first.
	Exports []ExportOrigin
	// Conflict is true when the exports' ports are not identical (names, numbers, protocols;
	// target ports aside): KEP-1645's PortConflict.
	Conflict bool
}

// l4 is the L4 protocol of a port for the "same protocol and port number" rule: UDP or TCP (a
// mark's HTTP, HTTP2, GRPC and TCP are all TCP).
func l4(p ServicePort) Protocol {
	if p.Protocol == ProtocolUDP {
		return ProtocolUDP
	}
	return ProtocolTCP
}

// sameDefinition reports whether two export ports are the same port to the clusterset: name,
// number and protocol (the registry protocol carries the L4 protocol and the appProtocol).
func sameDefinition(a, b ServicePort) bool {
	return a.Name == b.Name && a.Port == b.Port && a.Protocol == b.Protocol
}

// MergeExportPorts merges the ports of one service's export marks as KEP-1645 ("Service Port")
// says: the imported service exposes the union of the exports' ports; ports are matched first by
// name, then by protocol (UDP or TCP) and port number; where exports define a port differently
// (number, protocol or appProtocol: the registry protocol), the oldest export's definition is used
// (CompareExportAge). An unnamed port is merged only with ports of the same name (a Service of
// more than one port names them all), so a younger export cannot add ports beside an older unnamed
// one. Target ports never conflict: they are per cluster.
//
// Marks without ports (a reader that did not convert them) are left out: they are not in Exports
// and restrict nothing. The result is a pure function of the marks: any order of the same marks
// gives the same merge, so the imported ports never change while the same exports stay.
func MergeExportPorts(marks []ExportMark) PortMerge {
	sorted := make([]ExportMark, 0, len(marks))
	for _, m := range marks {
		if len(m.Ports) > 0 {
			sorted = append(sorted, m)
		}
	}
	slices.SortFunc(sorted, CompareExportAge)
	var out PortMerge
	for _, m := range sorted {
		o := ExportOrigin{Region: m.Region, Cluster: m.Cluster}
		out.Exports = append(out.Exports, o)
		for _, p := range m.Ports {
			p = ServicePort{Name: p.Name, Port: p.Port, Protocol: p.Protocol}
			i, reason := mergeTarget(out.Ports, p)
			switch {
			case i < 0:
				out.Ports = append(out.Ports, MergedPort{Port: p, Winner: o, Serving: []ExportOrigin{o}})
			case reason == "":
				out.Ports[i].Serving = append(out.Ports[i].Serving, o)
			default:
				out.Clashes = append(out.Clashes, PortClash{Export: o, Port: p, Merged: i, Reason: reason})
			}
		}
	}
	out.Conflict = len(out.Clashes) > 0
	for _, mp := range out.Ports {
		if len(mp.Serving) != len(out.Exports) {
			out.Conflict = true
		}
	}
	return out
}

// mergeTarget finds the merged port p matches: its index and "" when p defines it the same way,
// its index and the clash reason when p clashes with it, or -1 when p is a new port.
func mergeTarget(merged []MergedPort, p ServicePort) (int, PortClashReason) {
	if i := slices.IndexFunc(merged, func(mp MergedPort) bool { return mp.Port.Name == p.Name }); i >= 0 {
		if sameDefinition(merged[i].Port, p) {
			return i, ""
		}
		return i, ClashDefinition
	}
	if i := slices.IndexFunc(merged, func(mp MergedPort) bool { return mp.Port.Port == p.Port && l4(mp.Port) == l4(p) }); i >= 0 {
		return i, ClashNumber
	}
	if len(merged) > 0 && p.Name == "" {
		return 0, ClashUnnamed
	}
	if i := slices.IndexFunc(merged, func(mp MergedPort) bool { return mp.Port.Name == "" }); i >= 0 {
		return i, ClashUnnamed
	}
	return -1, ""
}

// ServedPortNames returns, for each export of the merge, the names of the merged ports it
// defines the winning way (those its cluster's endpoints serve), sorted.
func (pm PortMerge) ServedPortNames() map[ExportOrigin][]string {
	out := make(map[ExportOrigin][]string, len(pm.Exports))
	for _, o := range pm.Exports {
		out[o] = nil
	}
	for _, mp := range pm.Ports {
		for _, o := range mp.Serving {
			out[o] = append(out[o], mp.Port.Name)
		}
	}
	for _, names := range out {
		slices.Sort(names)
	}
	return out
}

// importPortFilter holds, for each service whose exports' ports conflict, the port names each
// exporting cluster's endpoints serve (PortMerge.ServedPortNames). Services whose exports agree
// have no entry: their endpoints serve every port.
type importPortFilter map[ServiceKey]map[ExportOrigin][]string

// newImportPortFilter merges the ports of every service exported by more than one cluster.
func newImportPortFilter(marks []ExportMark) importPortFilter {
	n := map[ServiceKey]int{}
	for _, m := range marks {
		n[m.Service]++
	}
	bySvc := map[ServiceKey][]ExportMark{}
	for _, m := range marks {
		if n[m.Service] > 1 {
			bySvc[m.Service] = append(bySvc[m.Service], m)
		}
	}
	var f importPortFilter
	for k, ms := range bySvc {
		if pm := MergeExportPorts(ms); pm.Conflict {
			if f == nil {
				f = importPortFilter{}
			}
			f[k] = pm.ServedPortNames()
		}
	}
	return f
}

// endpoint returns e as it serves its service in the model of cluster: aether's rule beyond
// KEP-1645, traffic on each port of an imported service reaches only the clusters whose export
// defines that port the winning way, so another cluster's endpoint keeps only the ports (by
// name, as EndpointPort matches them) its cluster's export defines so. This cluster's endpoints,
// endpoints of services whose exports agree, and endpoints of a cluster without a merged mark
// are returned as they are. e's Ports are copied when some are dropped, never changed in place.
func (f importPortFilter) endpoint(e *Endpoint, cluster string) Endpoint {
	served, ok := f[e.Service][ExportOrigin{Region: e.Region, Cluster: e.Cluster}]
	if !ok || e.Cluster == cluster {
		return *e
	}
	keep := func(p EndpointPort) bool {
		_, found := slices.BinarySearch(served, p.Name)
		return found
	}
	if !slices.ContainsFunc(e.Ports, func(p EndpointPort) bool { return !keep(p) }) {
		return *e
	}
	out := *e
	out.Ports = make([]EndpointPort, 0, len(e.Ports))
	for _, p := range e.Ports {
		if keep(p) {
			out.Ports = append(out.Ports, p)
		}
	}
	return out
}
