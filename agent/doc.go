// Package agent is aether's node agent: Config (every flag with its environment variable,
// ParseFlags, Validate) and Run, which composes the node's parts in the order they start: health
// endpoints, the Kubernetes and registry sources, DNS (before anything that can wait on the API
// server or the registry), the model assembler, endpoint registration, the xDS server and the
// node's Envoy, and last the CNI server and the aether-cni install. cmd/aether-agent only parses
// the flags and calls Run. docs/agent.md is the operator's guide.
//
// It owns the wiring and the agent-side state between parts: the registry view (what the node
// holds of every cluster's endpoints, with deletions held through a registry cut), endpoint
// registration under the partition claim, the CNI dataplane (a CNI ADD returns once Envoy ACKed
// the pod's listeners and they are warm), readiness and metrics. It builds no Envoy resource
// (xds), no capture rule (capture), no DNS answer (dnsd), and writes only its own cluster's
// endpoints to the registry.
package agent
