// Package embedded runs the registry's single-member etcd server in process
// (go.etcd.io/etcd/server/v3/embed): the registrar's single-machine, single-replica default, and
// tests that need a real etcd. It owns only the server's lifecycle; the key layout, records and
// clients are package registry's. The node agent never imports it, so the agent binary links no
// etcd server code.
package embedded
