// Package cni is the agent side of aether's chained CNI plugin: the unix-socket server that turns
// a CNI request from aether-cni into a persisted PodAttachment (Store), capture in the pod's netns
// (package capture) and the pod's Envoy listeners (the Dataplane interface, implemented by the
// xDS part); the per-pod inbound policies (SetInboundPolicies, persisted beside the attachments);
// repair of all of it when the agent starts; the client-go pod lookup (KubePods); and
// the Installer that puts aether-cni into the node's conflist and keeps it there. The plugin
// binary's own logic is in cni/plugin, which must stay free of model and client-go; the wire
// protocol both sides speak is api/aether/cni/v1.
//
// It must never leave a pod half-captured (a failed ADD undoes rules, listeners and record),
// never change the parts of the conflist that are not aether-cni's, and never touch rules that
// are not aether's. It does not build rules itself (capture does) nor Envoy resources (xds does).
package cni
