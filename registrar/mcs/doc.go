// Package mcs is aether's Multi-Cluster Services implementation (sigs.k8s.io/mcs-api v1beta1),
// backed by the origin-partitioned registry instead of EndpointSlice import:
//
//   - ExportView keeps the clusterset-wide export view (every cluster's export marks) from one
//     registry watch;
//   - ExportController turns this cluster's ServiceExports into export marks in this cluster's
//     partition and keeps their Valid, Ready and Conflict conditions;
//   - Resolve decides each exported service deterministically (KEP-1645): ports merged per port
//     (model.MergeExportPorts, the function the agents filter endpoints with), the oldest export
//     (create_time, then cluster name) winning each conflicting port and the exported labels,
//     annotations and session affinity; every export of a conflicted service gets a Conflict;
//   - ImportGenerator materialises, in this cluster, a ServiceImport (ClusterSetIP) and a
//     selectorless <svc>-clusterset VIP Service per exported service.
//
// It owns ServiceExport status, and the ServiceImports and <svc>-clusterset Services labelled
// aether.io/managed-by: aether. It must not touch any other Kubernetes object, nor another
// cluster's registry partition (registry.Registry refuses such writes), nor endpoints (the
// agents register those). docs/registrar.md says what operators see.
package mcs
