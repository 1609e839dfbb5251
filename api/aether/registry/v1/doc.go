// Package registryv1 holds the generated Go code of aether's registry records
// (registry.proto): ServiceEndpoint, ExportMark and ServiceConfigProjection with its route model.
// Regenerate with hack/update-proto.sh; hack/verify-proto.sh fails when the committed code is
// stale. Validation, keys and etcd access live in package registry, not here.
package registryv1
