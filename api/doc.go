// Package api holds aether's wire records under api/aether/<group>/<version>: the protobuf
// definitions of what the registry stores (registry/v1: endpoints, export marks, config
// projections), with their generated Go code committed beside them, and the JSON protocol
// between the aether-cni plugin and the agent (cni/v1: requests, the pod attachment, responses).
//
// It owns the record shapes and their field numbers, nothing else: no etcd access (that is
// package registry), no CNI handling (cni), no Kubernetes or Envoy types. Protobuf field numbers
// are never reused; a removed field is reserved.
package api
