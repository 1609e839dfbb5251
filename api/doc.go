// Package api holds aether's wire records: the protobuf definitions of what the registry stores
// (endpoints, export marks, config projections) under api/aether/<group>/<version>, with their
// generated Go code committed beside them.
//
// It owns the record shapes and their field numbers, nothing else: no etcd access (that is
// registrar/registry), no Kubernetes or Envoy types. Field numbers are never reused; a removed
// field is reserved.
package api
