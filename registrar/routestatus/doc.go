// Package routestatus writes the status of Gateway API routes (HTTPRoute, GRPCRoute, TCPRoute,
// TLSRoute, UDPRoute): for every route, one status.parents entry with controllerName
// model.GatewayControllerName per parentRef of kind Service or ServiceImport (GAMMA, GEP-1294 and
// GEP-1748; HTTPRoutes and GRPCRoutes), with the Accepted, ResolvedRefs and (when rules were
// dropped) PartiallyInvalid conditions that model.Assemble resolves, and, with the Gateway
// controller on (Controller.Gateways), one per parentRef to one of aether's Gateways, with the
// Accepted and ResolvedRefs conditions model.ResolveGateways resolves. ParentStatuses is the pure
// merge of that status into what a route holds (bounded: at most MaxParents entries in all,
// messages of at most MaxMessage bytes); Controller watches the Gateway API objects (each kind
// while its CRD is installed), Services, ServiceImports, Namespaces and the certificate Secrets
// and writes the merged status when it differs.
//
// It is also aether's reader of Gateway API objects for the Gateway controller (package
// registrar/gateway, whose doc says why): its pass resolves the Gateways and hands that
// controller a gateway.View. With a ConfigHook (package registrar/configexport) its pass assembles
// the model with the config projections, as agents with --import-config do, hands the hook the
// routes and the model (the config export and the ServiceImports' import status come from them)
// and writes the conditions the hook returns (aether.io/BackendsExported) in aether's mesh entries.
//
// It owns aether's entries of route status.parents and nothing else: entries of other controllers
// (another Gateway implementation's) are left as they are, and it never writes a route's spec,
// metadata or any other object, nor the registry. It reads the registry's endpoint records and
// export marks (EndpointSource, ExportSource) for the protocols of ports without appProtocol,
// which model.Assemble takes from them as the agents do. Routing itself (what the node proxies
// and edge Envoys serve) is the agents' (model, xds).
package routestatus
