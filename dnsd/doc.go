// Package dnsd is the node agent's DNS resolver on HOST_IP:18054 (UDP and TCP): authoritative for
// the mesh domain and for <svc>.<ns>.svc.clusterset.local from local ServiceImports, answering the
// search-list expansions of mesh names directly, and forwarding every other name to the
// upstreams from the agent's resolv.conf (kube-dns).
//
// Pieces, from pure to effectful:
//   - Index (NewIndex): built from one *model.Mesh; every authoritative answer is prepared in
//     wire form, and Index.Respond answers a query or says it must be forwarded. Pure, tested
//     as data (TestRespond). Index.RespondWire is the same for the common UDP query, straight
//     from its wire form (TestRespondWireMatchesRespond proves the two give the same bytes).
//   - Forwarder: the upstreams, a timeout per upstream, failover, demotion of failed upstreams;
//     its connections to each upstream (UDP sockets, TCP connections) are reused and expire when
//     idle (connpool.go), and each exchange reads into a pooled buffer of the client's UDP size
//     (exchange.go).
//   - Resolver: the dns.Handler; holds the current Index in an atomic pointer (Update swaps it,
//     lookups never wait), the Forwarder, the cache and the Prometheus metrics.
//   - cache (ResolverOptions.Cache): forwarded answers in wire form, LRU-bounded, kept per RFC
//     2308 and capped like NodeLocal DNSCache; identical queries in flight go upstream once.
//     Optionally (stale.go) expired answers answer when the upstreams fail or are slow
//     (serve-stale, RFC 8767, marked by an RFC 8914 Extended DNS Error) and popular ones are
//     refreshed before they expire (prefetch).
//     Mesh answers are never cached (the index is authoritative).
//   - Server: two miekg/dns servers (UDP, TCP), each with its own ServeMux, explicit timeouts,
//     readiness through NotifyStartedFunc, ShutdownContext to stop. The UDP server's reader
//     (fastUDPReader) answers the common queries, cache hits included, inside its read loop,
//     in batches of datagrams on Linux (recvmmsg/sendmmsg), and hands the others to miekg/dns
//     and ServeDNS.
//
// It reads the mesh model and never changes it; it never touches Kubernetes, the registry, the
// pod network namespaces or their capture rules (the DNAT of pod DNS to this resolver belongs to
// capture/).
package dnsd
