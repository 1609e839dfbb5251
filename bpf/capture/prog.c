//go:build ignore

// Outbound capture of meshed pods by cgroup programs: the eBPF twin of the nft "output_nat"
// chain that package capture builds (capture.Build). docs/ebpf.md describes the maps and the
// decision order; bpf/capture/capture_linux.go is the loader that fills them.
//
// connect4/connect6 rewrite a captured pod's TCP connect to its capture listener (127.0.0.1 or
// ::1, capture_port) and remember the destination the application dialled in the socket's local
// storage; sockops hands it from the client socket to the socket the listener accepts (through
// the connection's 4-tuple); getsockopt answers SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST on that
// accepted socket from it, as the kernel does from conntrack after an nft REDIRECT;
// getpeername4/getpeername6 give the client its dialled destination back as its peer. DNS to
// the cluster DNS service goes to the agent's resolver instead (connect4/6 for TCP and
// connected UDP, sendmsg4/6 for unconnected UDP), and recvmsg4/6 show the answers coming from
// the cluster DNS address. The stats map counts the verdicts.
//
// Every decision is keyed by the netns cookie of the socket (bpf_get_netns_cookie): a socket in a
// netns the agent did not put in "pods" is never changed, so the programs may be attached high
// in the cgroup hierarchy.

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/socket.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char __license[] SEC("license") = "Dual BSD/GPL";

#define AF_INET 2
#define AF_INET6 10
#define SOCK_STREAM 1
#define SOCK_DGRAM 2
#define SOL_IP 0
#define SOL_IPV6 41
// SO_ORIGINAL_DST (<linux/netfilter_ipv4.h>) and IP6T_SO_ORIGINAL_DST
// (<linux/netfilter_ipv6/ip6_tables.h>) are both 80.
#define SO_ORIGINAL_DST 80
#define TCP_CLOSE 7

// Sizes: the loader documents them (capture.MaxPods and friends); keep the two in step.
#define MAX_PODS 4096
#define MAX_CIDRS 65536
#define MAX_PORTS 65536
#define MAX_HANDSHAKES 65536
#define MAX_DNS 16384

// pod_settings.flags
#define POD_IPV6 1 // the pod has an IPv6 address: capture IPv6 TCP; otherwise refuse it

// Actions of a cidrs or ports entry. ACTION_LOCAL and ACTION_EXCLUDE behave alike (no change);
// they differ only so the loader can tell a pod's own addresses from its exclusions when it
// reads the maps back.
#define ACTION_LOCAL 1
#define ACTION_EXCLUDE 2
#define ACTION_DENY 3

// orig_dst.role
#define ROLE_CLIENT 1   // the application's socket (for getpeername)
#define ROLE_ACCEPTED 2 // the socket the capture listener accepted
#define ROLE_DNS 3      // a socket that sent DNS to the resolver (for recvmsg and getpeername)

// The settings of one captured pod, keyed by its netns cookie.
struct pod_settings {
	__u32 bypass_mark;  // SO_MARK of the proxy's own sockets (never redirected); 0: none
	__u16 capture_port; // host byte order
	__u8 flags;         // POD_*
	__u8 pad;
};

// cidrs key: the netns cookie's 64 bits are always inside the prefix (prefixlen >= 64), so a
// lookup never matches another pod's entry. IPv4 addresses are stored IPv4-mapped
// (::ffff:a.b.c.d), so an IPv4 /n is prefixlen 64+96+n.
struct cidr_key {
	__u32 prefixlen;
	__u8 netns[8]; // the cookie's bytes in host order (a byte array keeps the key unpadded)
	__u8 addr[16];
};

// ports key: addr all zero matches every address (ExcludeOutboundPorts); a set addr matches that
// address only (a pass-through address and port, such as the cluster DNS service's port 53).
struct port_key {
	__u64 netns;
	__u8 addr[16];
	__u16 port; // host byte order
	__u16 pad[3];
};

// The destination the application dialled.
struct orig_dst {
	__u8 addr[16]; // IPv4-mapped for IPv4
	__u16 port;    // host byte order
	__u8 family;   // AF_INET or AF_INET6
	__u8 role;     // ROLE_*
	__u8 via[16];  // ROLE_DNS: the resolver it was sent to instead (IPv4-mapped for IPv4)
	__u16 via_port;
	__u16 pad;
};

// An address and port (host byte order): where DNS goes instead of the cluster DNS service.
struct dns_target {
	__u8 addr[16]; // IPv4-mapped for IPv4
	__u16 port;
	__u16 pad;
};

// handshakes key: one captured connection between the client's connect and the listener's
// accept, seen from the client (saddr:sport -> daddr:dport = the capture listener).
struct tuple_key {
	__u64 netns;
	__u8 saddr[16];
	__u8 daddr[16];
	__u16 sport; // host byte order
	__u16 dport; // host byte order
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PODS);
	__type(key, __u64);
	__type(value, struct pod_settings);
} pods SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, MAX_CIDRS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cidr_key);
	__type(value, __u8);
} cidrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PORTS);
	__type(key, struct port_key);
	__type(value, __u8);
} ports SEC(".maps");

// DNS redirects, keyed like ports ({netns cookie, cluster DNS address, 53}): TCP and UDP to the
// key go to the value (the agent's resolver), and the answers come back from the key
// (nft: dnat to HOST_IP:18054).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_DNS);
	__type(key, struct port_key);
	__type(value, struct dns_target);
} dns SEC(".maps");

// Per-socket storage: the client socket's dialled destination (for the handshake and
// getpeername) and the accepted socket's (for SO_ORIGINAL_DST). It lives and dies with the
// socket, so nothing outlives a closed connection.
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct orig_dst);
} sock_dst SEC(".maps");

// Connections in their handshake. An entry is removed when the listener's side is established
// or the client closes; LRU bounds what a lost SYN could leave.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_HANDSHAKES);
	__type(key, struct tuple_key);
	__type(value, struct orig_dst);
} handshakes SEC(".maps");

static __always_inline void map_v4(__u8 addr[16], __u32 ip4_be)
{
	__builtin_memset(addr, 0, 10);
	addr[10] = 0xff;
	addr[11] = 0xff;
	__builtin_memcpy(&addr[12], &ip4_be, 4);
}

static __always_inline void copy_v6(__u8 addr[16], const __u32 w0, const __u32 w1, const __u32 w2,
				    const __u32 w3)
{
	__builtin_memcpy(&addr[0], &w0, 4);
	__builtin_memcpy(&addr[4], &w1, 4);
	__builtin_memcpy(&addr[8], &w2, 4);
	__builtin_memcpy(&addr[12], &w3, 4);
}

static __always_inline int is_mapped(const __u8 addr[16])
{
	for (int i = 0; i < 10; i++)
		if (addr[i])
			return 0;
	return addr[10] == 0xff && addr[11] == 0xff;
}

// is_local reports addresses that never leave the netns: 127.0.0.0/8, 0.0.0.0, ::1 and ::
// (nft: oifname "lo" return; the pod's own addresses come from cidrs as ACTION_LOCAL).
static __always_inline int is_local(const __u8 addr[16])
{
	if (is_mapped(addr))
		return addr[12] == 127 || (addr[12] == 0 && addr[13] == 0 && addr[14] == 0 && addr[15] == 0);
	for (int i = 0; i < 15; i++)
		if (addr[i])
			return 0;
	return addr[15] == 0 || addr[15] == 1;
}

// Verdicts of decide.
enum verdict {
	NOT_OURS, // not a captured pod's netns: no change
	PASS,     // a captured pod's connect that goes where it was sent
	REFUSE,   // the connect fails with EPERM
	REDIRECT, // to the capture listener
	DNS,      // to the agent's resolver
};

// Counters of the stats map (per CPU), for captured pods' connects only.
enum stat {
	STAT_REDIRECTED,
	STAT_PASSED,
	STAT_REFUSED,
	STAT_ORIGINAL_DST, // SO_ORIGINAL_DST answered
	STAT_NO_STORAGE,   // a connect left alone because its destination could not be stored
	STAT_DNS,          // TCP connects and UDP sends sent to the resolver
	STAT_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void count(__u32 stat)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &stat);
	if (v)
		*v += 1;
}

// dns_lookup finds the resolver of a DNS destination addr:port of the netns.
static __always_inline struct dns_target *dns_lookup(__u64 netns, const __u8 addr[16], __u16 port)
{
	struct port_key k = {.netns = netns, .port = port};
	__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(&dns, &k);
}

// decide judges a TCP connect to addr:port (port in host byte order) from the socket of ctx in
// the netns with cookie netns, and fills *to (the capture listener or the resolver) on REDIRECT
// and DNS.
static __always_inline enum verdict decide(struct bpf_sock_addr *ctx, __u64 netns,
					   const __u8 addr[16], __u16 port, struct dns_target *to)
{
	struct pod_settings *pod = bpf_map_lookup_elem(&pods, &netns);
	if (!pod)
		return NOT_OURS;
	if (is_local(addr))
		return PASS;
	// Refusals come first and hold whatever mark the socket carries, as nft refuses in its
	// filter output chain, after and apart from the nat chain's mark return.
	if (!is_mapped(addr) && !(pod->flags & POD_IPV6))
		return REFUSE; // nft drops a pod's IPv6 when it has no IPv6 address
	struct cidr_key ck = {.prefixlen = 64 + 128};
	__builtin_memcpy(ck.netns, &netns, 8);
	__builtin_memcpy(ck.addr, addr, 16);
	__u8 *action = bpf_map_lookup_elem(&cidrs, &ck);
	if (action && *action == ACTION_DENY)
		return REFUSE;
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return PASS;
	if (pod->bypass_mark && sk->mark == pod->bypass_mark)
		return PASS; // the proxy's own socket (nft: meta mark return)
	struct dns_target *d = dns_lookup(netns, addr, port);
	if (d) {
		*to = *d;
		return DNS;
	}
	if (action)
		return PASS; // the pod's own address or an excluded CIDR
	struct port_key pk = {.netns = netns, .port = port};
	__builtin_memcpy(pk.addr, addr, 16);
	if (bpf_map_lookup_elem(&ports, &pk))
		return PASS; // this address and port pass through
	__builtin_memset(pk.addr, 0, 16);
	if (bpf_map_lookup_elem(&ports, &pk))
		return PASS; // an excluded port
	// The capture listener, on the loopback address of the destination's family.
	__builtin_memset(to->addr, 0, 16);
	if (is_mapped(addr)) {
		to->addr[10] = 0xff;
		to->addr[11] = 0xff;
		to->addr[12] = 127;
		to->addr[15] = 1;
	} else {
		to->addr[15] = 1;
	}
	to->port = pod->capture_port;
	return REDIRECT;
}

// dns_decide judges a UDP datagram or connect to addr:port: DNS to the resolver (filling *to),
// anything else left alone. UDP is not captured otherwise.
static __always_inline enum verdict dns_decide(struct bpf_sock_addr *ctx, __u64 netns,
					       const __u8 addr[16], __u16 port, struct dns_target *to)
{
	struct pod_settings *pod = bpf_map_lookup_elem(&pods, &netns);
	if (!pod)
		return NOT_OURS;
	struct bpf_sock *sk = ctx->sk;
	if (!sk || is_local(addr))
		return PASS;
	if (pod->bypass_mark && sk->mark == pod->bypass_mark)
		return PASS;
	struct dns_target *d = dns_lookup(netns, addr, port);
	if (!d)
		return PASS;
	*to = *d;
	return DNS;
}

// remember_dst keeps the socket's destination (and for DNS the resolver it goes to instead).
static __always_inline int remember_dst(struct bpf_sock *sk, const __u8 addr[16], __u16 port,
					__u8 family, __u8 role, const struct dns_target *to)
{
	struct orig_dst *s = bpf_sk_storage_get(&sock_dst, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!s)
		return -1;
	__builtin_memcpy(s->addr, addr, 16);
	s->port = port;
	s->family = family;
	s->role = role;
	__builtin_memcpy(s->via, to->addr, 16);
	s->via_port = to->port;
	return 0;
}

// connect_verdict decides, keeps the socket's storage in step (the dialled destination on
// REDIRECT and DNS; none otherwise, should the socket have connected before) and counts. It
// returns 1 to rewrite the destination to *to, 0 to leave it, -1 to refuse the connect.
static __always_inline int connect_verdict(struct bpf_sock_addr *ctx, const __u8 addr[16],
					   __u16 port, __u8 family, struct dns_target *to)
{
	__u64 netns = bpf_get_netns_cookie(ctx);
	int tcp = ctx->type == SOCK_STREAM && ctx->protocol == IPPROTO_TCP;
	enum verdict v = tcp ? decide(ctx, netns, addr, port, to) : dns_decide(ctx, netns, addr, port, to);
	struct bpf_sock *sk = ctx->sk;
	switch (v) {
	case NOT_OURS:
		return 0;
	case REFUSE:
		count(STAT_REFUSED);
		return -1;
	case PASS:
		if (tcp)
			count(STAT_PASSED);
		if (sk)
			bpf_sk_storage_delete(&sock_dst, sk);
		return 0;
	default:
		break;
	}
	if (!sk || remember_dst(sk, addr, port, family, v == DNS ? ROLE_DNS : ROLE_CLIENT, to)) {
		count(STAT_NO_STORAGE); // leave the connect alone rather than lose its destination
		return 0;
	}
	count(v == DNS ? STAT_DNS : STAT_REDIRECTED);
	return 1;
}

// is_udp_or_tcp is the sockets the programs look at.
static __always_inline int is_udp_or_tcp(struct bpf_sock_addr *ctx)
{
	return (ctx->type == SOCK_STREAM && ctx->protocol == IPPROTO_TCP) ||
	       (ctx->type == SOCK_DGRAM && ctx->protocol == IPPROTO_UDP);
}

static __always_inline void set_ip4(struct bpf_sock_addr *ctx, const struct dns_target *to)
{
	__u32 ip4;
	__builtin_memcpy(&ip4, &to->addr[12], 4);
	ctx->user_ip4 = ip4;
	ctx->user_port = bpf_htons(to->port);
}

static __always_inline void set_ip6(struct bpf_sock_addr *ctx, const __u8 addr[16], __u16 port)
{
	__u32 w[4];
	__builtin_memcpy(w, addr, 16);
	ctx->user_ip6[0] = w[0];
	ctx->user_ip6[1] = w[1];
	ctx->user_ip6[2] = w[2];
	ctx->user_ip6[3] = w[3];
	ctx->user_port = bpf_htons(port);
}

SEC("cgroup/connect4")
int aether_connect4(struct bpf_sock_addr *ctx)
{
	if (!is_udp_or_tcp(ctx))
		return 1;
	__u8 addr[16];
	map_v4(addr, ctx->user_ip4);
	struct dns_target to = {};
	int r = connect_verdict(ctx, addr, bpf_ntohs((__u16)ctx->user_port), AF_INET, &to);
	if (r < 0)
		return 0; // connect fails with EPERM
	if (r > 0)
		set_ip4(ctx, &to);
	return 1;
}

SEC("cgroup/connect6")
int aether_connect6(struct bpf_sock_addr *ctx)
{
	if (!is_udp_or_tcp(ctx))
		return 1;
	__u8 addr[16];
	copy_v6(addr, ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3]);
	// An IPv4-mapped destination on an IPv6 socket is an IPv4 connection (the kernel runs no
	// connect4 for it): it goes to ::ffff:127.0.0.1 (or the IPv4 resolver, mapped).
	struct dns_target to = {};
	int r = connect_verdict(ctx, addr, bpf_ntohs((__u16)ctx->user_port),
				is_mapped(addr) ? AF_INET : AF_INET6, &to);
	if (r < 0)
		return 0;
	if (r > 0)
		set_ip6(ctx, to.addr, to.port);
	return 1;
}

// sendmsg4/sendmsg6 send an unconnected UDP socket's DNS to the resolver; recvmsg4/recvmsg6
// give its answers the cluster DNS address back as their source.
SEC("cgroup/sendmsg4")
int aether_sendmsg4(struct bpf_sock_addr *ctx)
{
	if (ctx->type != SOCK_DGRAM || ctx->protocol != IPPROTO_UDP)
		return 1;
	__u8 addr[16];
	map_v4(addr, ctx->user_ip4);
	struct dns_target to = {};
	if (connect_verdict(ctx, addr, bpf_ntohs((__u16)ctx->user_port), AF_INET, &to) > 0)
		set_ip4(ctx, &to);
	return 1;
}

SEC("cgroup/sendmsg6")
int aether_sendmsg6(struct bpf_sock_addr *ctx)
{
	if (ctx->type != SOCK_DGRAM || ctx->protocol != IPPROTO_UDP)
		return 1;
	__u8 addr[16];
	copy_v6(addr, ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3]);
	struct dns_target to = {};
	if (connect_verdict(ctx, addr, bpf_ntohs((__u16)ctx->user_port),
			    is_mapped(addr) ? AF_INET : AF_INET6, &to) > 0)
		set_ip6(ctx, to.addr, to.port);
	return 1;
}

// dns_source returns the storage of a DNS socket when addr:port (a datagram's source) is the
// resolver it sent to.
static __always_inline struct orig_dst *dns_source(struct bpf_sock_addr *ctx, const __u8 addr[16],
						   __u16 port)
{
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return 0;
	struct orig_dst *s = bpf_sk_storage_get(&sock_dst, sk, 0, 0);
	if (!s || s->role != ROLE_DNS || s->via_port != port)
		return 0;
	for (int i = 0; i < 16; i++)
		if (s->via[i] != addr[i])
			return 0;
	return s;
}

SEC("cgroup/recvmsg4")
int aether_recvmsg4(struct bpf_sock_addr *ctx)
{
	__u8 addr[16];
	map_v4(addr, ctx->user_ip4);
	struct orig_dst *s = dns_source(ctx, addr, bpf_ntohs((__u16)ctx->user_port));
	if (s) {
		__u32 ip4;
		__builtin_memcpy(&ip4, &s->addr[12], 4);
		ctx->user_ip4 = ip4;
		ctx->user_port = bpf_htons(s->port);
	}
	return 1;
}

SEC("cgroup/recvmsg6")
int aether_recvmsg6(struct bpf_sock_addr *ctx)
{
	__u8 addr[16];
	copy_v6(addr, ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3]);
	struct orig_dst *s = dns_source(ctx, addr, bpf_ntohs((__u16)ctx->user_port));
	if (s)
		set_ip6(ctx, s->addr, s->port);
	return 1;
}

// sock_view is a socket's own addresses, read from the sock_ops context once, field by field:
// the verifier refuses context reads through a computed pointer, which the compiler makes when
// it moves reads into branches (libbpf's barrier_var stops it).
struct sock_view {
	__u8 local[16], remote[16];
	__u16 lport, rport; // host byte order
};

static __always_inline void read_view(struct bpf_sock_ops *skops, struct sock_view *v)
{
	__u32 family = skops->family;
	__u32 l4 = skops->local_ip4, r4 = skops->remote_ip4;
	__u32 l0 = skops->local_ip6[0], l1 = skops->local_ip6[1], l2 = skops->local_ip6[2],
	      l3 = skops->local_ip6[3];
	__u32 r0 = skops->remote_ip6[0], r1 = skops->remote_ip6[1], r2 = skops->remote_ip6[2],
	      r3 = skops->remote_ip6[3];
	__u32 lport = skops->local_port;   // host byte order
	__u32 rport = skops->remote_port;  // network order in the upper half
	barrier_var(l4);
	barrier_var(r4);
	barrier_var(l0);
	barrier_var(l1);
	barrier_var(l2);
	barrier_var(l3);
	barrier_var(r0);
	barrier_var(r1);
	barrier_var(r2);
	barrier_var(r3);
	if (family == AF_INET) {
		map_v4(v->local, l4);
		map_v4(v->remote, r4);
	} else {
		copy_v6(v->local, l0, l1, l2, l3);
		copy_v6(v->remote, r0, r1, r2, r3);
	}
	v->lport = (__u16)lport;
	v->rport = (__u16)bpf_ntohl(rport);
}

// tuple fills k with the client's view of its connection: from the client socket itself, or
// (swap) from the accepted socket, whose remote end is the client.
static __always_inline void tuple(struct bpf_sock_ops *skops, struct tuple_key *k, int swap)
{
	struct sock_view v;
	read_view(skops, &v);
	k->netns = bpf_get_netns_cookie(skops);
	if (swap) {
		__builtin_memcpy(k->saddr, v.remote, 16);
		__builtin_memcpy(k->daddr, v.local, 16);
		k->sport = v.rport;
		k->dport = v.lport;
	} else {
		__builtin_memcpy(k->saddr, v.local, 16);
		__builtin_memcpy(k->daddr, v.remote, 16);
		k->sport = v.lport;
		k->dport = v.rport;
	}
}

SEC("sockops")
int aether_sockops(struct bpf_sock_ops *skops)
{
	struct tuple_key k = {};
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return 1;
	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB: {
		// The client socket has its source port now and has not sent its SYN yet: publish its
		// destination under the 4-tuple the listener will see. The socket keeps its own copy
		// for getpeername.
		struct orig_dst *s = bpf_sk_storage_get(&sock_dst, sk, 0, 0);
		if (!s || s->role != ROLE_CLIENT)
			break;
		struct orig_dst v = *s;
		tuple(skops, &k, 0);
		bpf_map_update_elem(&handshakes, &k, &v, BPF_ANY);
		// Hear of the client's close, to drop a handshake the listener never completed.
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
		break;
	}
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB: {
		tuple(skops, &k, 1);
		struct orig_dst *h = bpf_map_lookup_elem(&handshakes, &k);
		if (!h)
			break;
		struct orig_dst v = *h;
		v.role = ROLE_ACCEPTED;
		bpf_map_delete_elem(&handshakes, &k);
		bpf_sk_storage_get(&sock_dst, sk, &v, BPF_SK_STORAGE_GET_F_CREATE);
		break;
	}
	case BPF_SOCK_OPS_STATE_CB:
		if (skops->args[1] != TCP_CLOSE)
			break;
		tuple(skops, &k, 0);
		bpf_map_delete_elem(&handshakes, &k);
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags & ~BPF_SOCK_OPS_STATE_CB_FLAG);
		break;
	}
	return 1;
}

SEC("cgroup/getsockopt")
int aether_getsockopt(struct bpf_sockopt *ctx)
{
	if (ctx->optname != SO_ORIGINAL_DST || (ctx->level != SOL_IP && ctx->level != SOL_IPV6))
		return 1;
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return 1;
	struct orig_dst *s = bpf_sk_storage_get(&sock_dst, sk, 0, 0);
	if (!s || s->role != ROLE_ACCEPTED)
		return 1; // not ours: keep the kernel's answer
	if (ctx->level == SOL_IP) {
		struct sockaddr_in *sin = ctx->optval;
		if (s->family != AF_INET || (void *)(sin + 1) > ctx->optval_end)
			return 1;
		__builtin_memset(sin, 0, sizeof(*sin));
		sin->sin_family = AF_INET;
		sin->sin_port = bpf_htons(s->port);
		__builtin_memcpy(&sin->sin_addr, &s->addr[12], 4);
		ctx->optlen = sizeof(*sin);
	} else {
		// An IPv4 destination is answered IPv4-mapped, as a dual-stack listener sees it.
		struct sockaddr_in6 *sin6 = ctx->optval;
		if ((void *)(sin6 + 1) > ctx->optval_end)
			return 1;
		__builtin_memset(sin6, 0, sizeof(*sin6));
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = bpf_htons(s->port);
		__builtin_memcpy(&sin6->sin6_addr, s->addr, 16);
		ctx->optlen = sizeof(*sin6);
	}
	ctx->retval = 0;
	count(STAT_ORIGINAL_DST);
	return 1;
}

// getpeername on a redirected client socket (or a connected DNS socket) gives the destination
// the application dialled, as it does after nft's REDIRECT or DNAT (conntrack undoes the NAT),
// not the capture listener or the resolver.
SEC("cgroup/getpeername4")
int aether_getpeername4(struct bpf_sock_addr *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return 1;
	struct orig_dst *s = bpf_sk_storage_get(&sock_dst, sk, 0, 0);
	if (!s || (s->role != ROLE_CLIENT && s->role != ROLE_DNS) || s->family != AF_INET)
		return 1;
	__u32 ip4;
	__builtin_memcpy(&ip4, &s->addr[12], 4);
	ctx->user_ip4 = ip4;
	ctx->user_port = bpf_htons(s->port);
	return 1;
}

SEC("cgroup/getpeername6")
int aether_getpeername6(struct bpf_sock_addr *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return 1;
	struct orig_dst *s = bpf_sk_storage_get(&sock_dst, sk, 0, 0);
	if (!s || (s->role != ROLE_CLIENT && s->role != ROLE_DNS))
		return 1;
	set_ip6(ctx, s->addr, s->port); // IPv4 stays IPv4-mapped on an IPv6 socket
	return 1;
}
