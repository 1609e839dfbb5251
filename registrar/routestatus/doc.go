// Package routestatus writes the status of Gateway API mesh routes (GAMMA, GEP-1294 and
// GEP-1748): for every HTTPRoute and GRPCRoute, one status.parents entry with controllerName
// model.GatewayControllerName per parentRef of kind Service or ServiceImport, with the Accepted,
// ResolvedRefs and (when rules were dropped) PartiallyInvalid conditions that model.Assemble
// resolves. ParentStatuses is the pure merge of that status into what a route holds (bounded: at
// most MaxParents entries in all, messages of at most MaxMessage bytes); Controller watches the
// routes (while their CRDs are installed), Services, ServiceImports and Namespaces and writes the
// merged status when it differs.
//
// It owns aether's entries of route status.parents and nothing else: entries of other controllers
// (a Gateway parentRef's) are left as they are, and it never writes a route's spec, metadata or
// any other object, nor the registry. It reads the registry's endpoint records and export marks
// (EndpointSource, ExportSource) for the protocols of ports without appProtocol, which
// model.Assemble takes from them as the agents do. Routing itself (what the node proxies serve)
// is the agents' (model, xds).
package routestatus
