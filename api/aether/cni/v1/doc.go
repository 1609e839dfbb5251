// Package cniv1 is the wire protocol between the aether-cni plugin and the node agent: JSON
// over HTTP on the agent's unix socket. It is the one definition both sides import: the plugin
// (cni/plugin, which must stay small and link no Kubernetes package) and the agent (cni, model).
// It imports nothing but the standard library.
package cniv1
