// Package registry is aether's cross-cluster plane: an origin-partitioned store of service
// endpoints, MCS export marks and config projections in etcd, used by the agent (endpoints) and
// the registrar (exports, config projections) alike. docs/registry.md is the operator's guide.
//
// Keys live under /aether/v1/regions/<region>/clusters/<cluster>/:
//
//	endpoints/<ns>/<svc>/<pod uid>   ServiceEndpoint, bound to the writer's lease
//	exports/<ns>/<svc>               ExportMark
//	config/<base64url(<ns>/<svc>)>   ServiceConfigProjection
//	claim                            PartitionClaim: which real cluster owns the partition
//
// A Registry writes only under its own (region, cluster) prefix and refuses anything else.
// With Config.ClusterID (the UID of the cluster's kube-system Namespace) every write is an etcd
// transaction conditional on the partition's claim naming that cluster, so two clusters given
// the same cluster name cannot both write one partition: the first registrar claims it
// (EnsureClaim), every other cluster's writers are refused (ErrPartitionClaimed), and an
// operator re-claims it explicitly after a rebuild (Reclaim). A writer follows the claim with
// one etcd watch (WatchClaim, ClaimStatus) rather than periodic reads.
// KeepAliveStatus reports how etcd answers the writer's lease keepalives, so that a reader of the
// same Registry learns that it is cut off from etcd without reads of its own.
// Readers list and watch the whole root and take a record's origin from its key path, never from
// its value. Malformed keys or values are skipped, logged with their key and counted
// (aether_registry_bad_records_total); they never stop a reader.
//
// The package owns the etcd key layout, record validation, leases and watches, and the etcd users
// and roles that make origins unforgeable; the embedded etcd server of the single-machine
// deployment is package registry/embedded, so that clients (the agent) link no server code. It
// does not touch Kubernetes objects (that is registrar) or Envoy resources (xds); it converts an
// endpoint to a model.Endpoint, and model never imports it.
package registry
