// Package model is the mesh model: plain Go types for local pods, services with their ports,
// protocols and VIPs, endpoints and workload identities, and the assembly of one immutable model
// value from Kubernetes objects (k8s.io/api types, listed by the agent's informers) and the
// registry's records. It links no Kubernetes client: reading the API server is package agent's.
//
// The node parts (xds, dnsd, tunnel) import model and read the values it hands them; model
// imports none of them and holds no Envoy, kernel or DNS types. A model value is never changed
// after it is published: a change makes a new value.
package model
