// Package identity issues workload identities: X.509 SVIDs whose URI SAN is the SPIFFE ID
// spiffe://<trustDomain>/ns/<ns>/sa/<sa> (DESIGN.md, names), behind the Source interface so that
// SPIRE (delegated identity API) can replace the development CA later without touching callers.
//
// The development CA (DevCA) signs short-lived SVIDs from a CA certificate and key given as PEM
// files; Rotator keeps one current SVID per SPIFFE ID and renews each at half its lifetime.
// Clusters that share the CA share a trust domain.
//
// It owns key material in memory only: it never writes files, never talks to Envoy (xds serves
// the SVIDs over SDS) and never reads Kubernetes.
package identity
