// Package registrar is the per-cluster, leader-elected controller set behind aether-registrar:
// the Multi-Cluster Services ExportController (ServiceExport to an export mark in the registry,
// with Valid, Ready and Conflict conditions) and ImportGenerator (ServiceImport and the
// <svc>-clusterset VIP Service from the clusterset-wide export view).
//
// It is the only aether component that writes Kubernetes objects from registry state, and it
// never touches objects aether did not create (label aether.io/managed-by: aether).
package registrar
