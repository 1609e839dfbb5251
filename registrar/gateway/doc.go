// Package gateway is aether's Gateway API controller (Gateway API v1.6.3, docs/gateway.md): the
// part of the registrar (leader-elected: one writer per cluster) that serves the GatewayClasses
// whose spec.controllerName is model.GatewayControllerName ("aether.io/gateway-controller") and
// their Gateways.
//
// Architecture:
//   - Classes. aether accepts a GatewayClass of its controllerName (status Accepted=True), unless
//     it has a parametersRef (Accepted=False, InvalidParameters: aether has no parameters). Only
//     the Gateways of a class it accepts are aether's.
//   - The edge data plane. Each of aether's Gateways <gw> in namespace <ns> gets, all named
//     <gw>-aether-edge (model.EdgeServiceAccountName), owned by the Gateway (controller
//     ownerReference) and labelled aether.io/managed-by: aether and
//     gateway.networking.k8s.io/gateway-name: <gw>: a ServiceAccount (its workload identity, token
//     not mounted); a Deployment of one replica running Envoy from the agent DaemonSet's Envoy
//     image (registrar flag --edge-envoy-image) with a bootstrap (node id edge~<ns>~<gw>) that
//     takes xDS from 127.0.0.1:15010 in the pod's network namespace, where the node agent of the
//     pod's node serves it, the pod opting out of capture (aether.io/capture: "false"); and a
//     Service of type LoadBalancer, one port per listener port and transport, whose externalIPs
//     are the Gateway's spec.addresses of type IPAddress that AssignAddresses gives it (how a
//     cluster without a load-balancer controller, the local substrate, reaches a Gateway at an
//     address routed to its nodes). Builders: ServiceAccount, Deployment, Service (pure). The
//     objects converge by server-side apply, skipped when nothing changed (AnnotationAppliedHash);
//     the garbage collector removes them with their Gateway, and the controller removes those of
//     a Gateway whose class is no longer aether's.
//   - Addresses. kube-proxy answers an external IP on every node, for every client, so
//     AssignAddresses gives an address only inside --gateway-address-cidrs (none by default),
//     never a Node's InternalIP or ExternalIP, never an address another Service uses (cluster,
//     external or load balancer IP), and one edge port of an address to one Gateway: the one that
//     has it keeps it, else the oldest asking (creationTimestamp, then namespace/name); a refused
//     address is reported in Programmed=False,
//     AddressNotUsable. It reads every Service and Node from the manager's cache (Nodes only
//     their addresses, CacheByObject) and fails the pass, applying nothing, when it cannot.
//   - Certificates. For every certificateRef of a programmed listener that
//     model.ResolveGateways found usable, a copy in the registrar's own namespace
//     (CertificateCopy: a kubernetes.io/tls Secret named model.EdgeCertificateSecretName(ref),
//     labelled model.LabelEdgeCertificate, annotated model.AnnotationCertificateRef); copies no
//     longer referenced are deleted. The agents, which may read Secrets only in that namespace,
//     watch these.
//   - Status. Gateway status is model.ResolveGateways's (conditions, listeners, attachedRoutes,
//     observedGeneration), but Programmed=True needs the edge Deployment to have an available
//     replica and the Service an address (else Programmed=False, Pending or AddressNotAssigned);
//     status.addresses are the Service's load balancer ingress, else its externalIPs, else its
//     ClusterIPs (in-cluster clients reach the Gateway there). Status.
//   - Who computes what. The route status controller (registrar/routestatus) reads every Gateway
//     API object aether uses (GatewayClasses, Gateways, ReferenceGrants and the five route kinds,
//     each once its CRD is installed), the certificate Secrets, namespace labels and the mesh
//     services it already assembles from the API server and the registry, and calls
//     model.ResolveGateways in the same pass as model.Assemble. It writes the routes' status
//     (mesh parents and Gateway parents: one writer per route object) and hands this package's
//     Controller a View of each pass (SetView), which it applies. The route status controller
//     calls model.ResolveGateways itself, rather than being handed the routes' Gateway statuses,
//     because it already reads every route and assembles the mesh services (with the protocols
//     the registry's endpoint records give their ports) that the resolution needs: the other way
//     round this package would read the routes and follow the registry too. So the resolution is
//     computed once, from one consistent read, the route status controller stays the one writer
//     of route status, and this package reads no Gateway API object itself: only its own
//     objects, the certificate Secrets and (for the addresses) Services and Nodes, from the
//     manager's cache. Its provisioning does not depend on the resolution (only on the
//     Gateway's class, listeners and addresses, and the other objects using those); its
//     certificate copies and Gateway status do.
//
// It writes only objects labelled aether.io/managed-by: aether (the chart's
// ValidatingAdmissionPolicy refuses it any other), Secrets only in the registrar's namespace, and
// of other objects only the status of GatewayClasses and Gateways. It does not write routes (the
// route status controller does) nor serve xDS (the node agents do).
package gateway
