// Package configexport is the registrar's side of config projections (docs/projections.md, seed
// 000 EM1, EM3, EM4):
//
//   - Exporter writes one ServiceConfigProjection per exported Service into this cluster's
//     registry partition (the producer HTTPRoutes and GRPCRoutes of the Service,
//     model.ProjectService), versioned, refreshed periodically, deleted when the export goes,
//     and keeps the ServiceExport's aether.io/ConfigExported condition; with a control cluster
//     set that is not this cluster, it exports nothing and deletes this cluster's projections;
//   - ConfigView keeps every origin's projections from one registry watch, and counts the
//     projections importers ignore because their origin is not the control cluster;
//   - Hook is the route status pass's ConfigHook (registrar/routestatus): the pass assembles the
//     model with the projections, as agents with --import-config do, and hands the Hook its
//     routes (the Exporter projects them), the aether.io/BackendsExported conditions of the
//     routes it projects (which the route status controller writes), and the import status of
//     every ServiceImport (ImportStatus writes it: aether.io/ConfigImported and
//     aether.io/ConfigDrift).
//
// It owns this cluster's config projections in the registry and, on the ServiceExports and
// ServiceImports, only its own conditions (written with server-side apply under field managers
// of its own, so the MCS controllers' conditions stay theirs). It never writes a route (route
// status is the route status controller's), another cluster's projections (registry.Registry
// refuses them), export marks or endpoints.
package configexport
