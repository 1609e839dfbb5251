// Package registrar is the per-cluster, leader-elected controller set behind aether-registrar.
// Run (with RunConfig from ParseRunConfig) is the whole process: it opens the registry, or starts
// the embedded one (registry/embedded) when no endpoints are given, claims this cluster's
// partition and runs the registrar; SetupAuth and Reclaim are its two subcommands
// (setup-registry-auth, reclaim-partition). cmd/aether-registrar only parses flags and calls
// them. New builds a controller-runtime manager (leader election, /healthz, /readyz, metrics) running
// the Multi-Cluster Services controllers of package registrar/mcs — the ExportView, the
// ExportController (ServiceExport to an export mark in this cluster's registry partition, with
// Valid, Ready and Conflict conditions) and the ImportGenerator (ServiceImport and the
// <svc>-clusterset VIP Service from the clusterset-wide export view) —, the route status
// controller of package registrar/routestatus (aether's status.parents entries of the Gateway API
// routes, once their CRDs are installed: GAMMA HTTPRoutes and GRPCRoutes, and every route kind's
// entries for its parentRefs to aether's Gateways), aether's Gateway controller of package
// registrar/gateway (with Config.EdgeEnvoyImage: the GatewayClasses of controllerName
// aether.io/gateway-controller, each of their Gateways' edge Deployment, Service and
// ServiceAccount, the copies of their certificates, Gateway status), the config projections of
// package registrar/configexport (with Config.Configs: this cluster's ServiceConfigProjections of
// its exported Services, hooked into the route status pass, with the ServiceExports'
// aether.io/ConfigExported, the routes' aether.io/BackendsExported and the ServiceImports'
// aether.io/ConfigImported and aether.io/ConfigDrift conditions), and a registry probe that
// makes the registrar not ready while the registry does not answer (and, when the registry
// partition is claimed by another cluster, stops the registrar or, with
// Config.KeepRunningOnClaimConflict, pauses the controllers). docs/registrar.md is the
// operator's guide.
//
// It is the only aether component that writes Kubernetes objects from registry state, and it
// never touches objects aether did not create (label aether.io/managed-by: aether); of other
// objects it writes only status: ServiceExport status (the config projections' condition with
// server-side apply beside the MCS conditions), GatewayClass and Gateway status of aether's
// classes, and its own (controllerName aether.io/gateway-controller) entries of the routes'
// status.parents. Secrets it writes only in its own namespace (the certificate copies). It must not
// write endpoints or another cluster's registry partition (package registry owns the key layout
// and refuses such writes).
package registrar
