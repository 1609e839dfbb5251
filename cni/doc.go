// Package cni is aether's chained CNI plugin logic (the aether-cni binary, CNI spec 1.1: ADD,
// DEL, CHECK, STATUS, GC, VERSION) and the agent side of it: the unix-socket server that turns a
// CNI ADD into a persisted PodAttachment, capture in the pod's netns and Envoy listeners, and the
// installer that appends aether-cni to the node's conflist.
//
// It must never change the prevResult it was given, never write the CNI result anywhere but
// stdout, and never leave a pod half-captured: a failed ADD undoes everything. Capture rules
// themselves live in package capture.
package cni
