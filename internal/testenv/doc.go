// Package testenv finds and starts the real components aether's tests run against: Envoy, a
// kube-apiserver with its etcd, an embedded etcd, the reference CNI plugins, and fresh network
// namespaces whose work runs on a locked OS thread.
//
// Binaries come from the tool cache that hack/tools.sh fills (hack/versions.env names every
// version); environment variables override each path. When a tool is missing, the test fails
// with the command that installs it: nothing here skips silently. Privileged helpers fail, not
// skip, when CI is set.
package testenv
