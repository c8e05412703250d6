//go:build ignore

/*
 * cgroup/sock_addr hooks on the cgroup2 root: hostPorts for connections the
 * node's own processes make, to a node address, 127.0.0.0/8 or ::1. The
 * socket's destination is rewritten to the pod at connect (TCP, connected
 * UDP) or per datagram at sendmsg (unconnected UDP): no packet is translated.
 * recvmsg and getpeername show the address the process asked for, remembered
 * per socket in cni_sock_rnat.
 *
 * A root hook runs for every socket of the machine, in every network
 * namespace: each acts only in the node's netns, whose cookie the attaching
 * process stored in cni_hp_config.
 */
#include "lib/hostport.h"

#define SOCK_PASS 1

static __always_inline int in_node_netns(struct bpf_sock_addr *ctx)
{
	struct hp_config *c = hp_config();

	return c && (c->flags & HP_CFG_ENABLED) && c->netns_cookie == bpf_get_netns_cookie(ctx);
}

static __always_inline int l4_ok(struct bpf_sock_addr *ctx)
{
	__u32 p = ctx->protocol;

	return p == IPPROTO_TCP || p == IPPROTO_UDP;
}

/* Remembers what the socket asked for, once per socket and pod address. */
static __always_inline void rnat_put(struct bpf_sock_addr *ctx, __u8 family, const __u8 *pod_addr, __be16 pod_port,
				     const __u8 *orig_addr, __be16 orig_port, __u32 ifindex)
{
	struct sock_rnat_key k = { .cookie = bpf_get_socket_cookie(ctx), .port = pod_port, .family = family };
	struct sock_rnat_val v = { .port = orig_port, .ifindex = ifindex };
	struct sock_rnat_val *cur;

	addr_copy(k.addr, pod_addr, family);
	addr_copy(v.addr, orig_addr, family);
	cur = bpf_map_lookup_elem(&cni_sock_rnat, &k);
	if (cur && cur->port == v.port && cur->ifindex == v.ifindex) {
		const __u64 *a = (const __u64 *)cur->addr, *b = (const __u64 *)v.addr;
		if (a[0] == b[0] && a[1] == b[1])
			return;
	}
	bpf_map_update_elem(&cni_sock_rnat, &k, &v, BPF_ANY);
}

static __always_inline int xlate4(struct bpf_sock_addr *ctx)
{
	if (!l4_ok(ctx) || !in_node_netns(ctx))
		return SOCK_PASS;
	__be32 dst = ctx->user_ip4;
	__be16 port = (__be16)ctx->user_port;
	int loopback = (bpf_ntohl(dst) >> 24) == 127;
	struct hostport_val *v = hostport_lookup(&dst, AF_INET, ctx->protocol, port, loopback);
	if (!v)
		return SOCK_PASS;

	rnat_put(ctx, AF_INET, v->pod_addr, v->pod_port, (const __u8 *)&dst, port, v->ifindex);
	ctx->user_ip4 = *(const __u32 *)v->pod_addr;
	ctx->user_port = v->pod_port;
	hp_count(HP_STAT_SOCK);
	return SOCK_PASS;
}

static __always_inline int is_v4mapped(const __u32 *a)
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0xffff);
}

static __always_inline int xlate6(struct bpf_sock_addr *ctx)
{
	if (!l4_ok(ctx) || !in_node_netns(ctx))
		return SOCK_PASS;
	__u32 a[4], n[4];
	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
	__be16 port = (__be16)ctx->user_port;
	struct hostport_val *v;

	if (is_v4mapped(a)) {
		/* An IPv6 socket dialling an IPv4 address (::ffff:a.b.c.d). */
		__be32 d4 = a[3];
		v = hostport_lookup(&d4, AF_INET, ctx->protocol, port, (bpf_ntohl(d4) >> 24) == 127);
		if (!v)
			return SOCK_PASS;
		n[0] = 0;
		n[1] = 0;
		n[2] = bpf_htonl(0xffff);
		n[3] = *(const __u32 *)v->pod_addr;
	} else {
		int loopback = a[0] == 0 && a[1] == 0 && a[2] == 0 && a[3] == bpf_htonl(1);
		v = hostport_lookup(a, AF_INET6, ctx->protocol, port, loopback);
		if (!v)
			return SOCK_PASS;
		__builtin_memcpy(n, v->pod_addr, 16);
	}
	rnat_put(ctx, AF_INET6, (const __u8 *)n, v->pod_port, (const __u8 *)a, port, v->ifindex);
	ctx->user_ip6[0] = n[0];
	ctx->user_ip6[1] = n[1];
	ctx->user_ip6[2] = n[2];
	ctx->user_ip6[3] = n[3];
	ctx->user_port = v->pod_port;
	hp_count(HP_STAT_SOCK);
	return SOCK_PASS;
}

/* The peer address a process sees: the pod's, back to what it dialled. */
static __always_inline int rnat4(struct bpf_sock_addr *ctx)
{
	if (!in_node_netns(ctx))
		return SOCK_PASS;
	struct sock_rnat_key k = {
		.cookie = bpf_get_socket_cookie(ctx), .port = (__be16)ctx->user_port, .family = AF_INET,
	};
	*(__u32 *)k.addr = ctx->user_ip4;
	struct sock_rnat_val *v = bpf_map_lookup_elem(&cni_sock_rnat, &k);
	if (!v)
		return SOCK_PASS;
	ctx->user_ip4 = *(const __u32 *)v->addr;
	ctx->user_port = v->port;
	return SOCK_PASS;
}

static __always_inline int rnat6(struct bpf_sock_addr *ctx)
{
	if (!in_node_netns(ctx))
		return SOCK_PASS;
	struct sock_rnat_key k = {
		.cookie = bpf_get_socket_cookie(ctx), .port = (__be16)ctx->user_port, .family = AF_INET6,
	};
	__u32 *a = (__u32 *)k.addr;
	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
	struct sock_rnat_val *v = bpf_map_lookup_elem(&cni_sock_rnat, &k);
	if (!v)
		return SOCK_PASS;
	const __u32 *o = (const __u32 *)v->addr;
	ctx->user_ip6[0] = o[0];
	ctx->user_ip6[1] = o[1];
	ctx->user_ip6[2] = o[2];
	ctx->user_ip6[3] = o[3];
	ctx->user_port = v->port;
	return SOCK_PASS;
}

SEC("cgroup/connect4")
int cni_sock_connect4(struct bpf_sock_addr *ctx) { return xlate4(ctx); }

SEC("cgroup/sendmsg4")
int cni_sock_sendmsg4(struct bpf_sock_addr *ctx) { return xlate4(ctx); }

SEC("cgroup/recvmsg4")
int cni_sock_recvmsg4(struct bpf_sock_addr *ctx) { return rnat4(ctx); }

SEC("cgroup/getpeername4")
int cni_sock_peer4(struct bpf_sock_addr *ctx) { return rnat4(ctx); }

SEC("cgroup/connect6")
int cni_sock_connect6(struct bpf_sock_addr *ctx) { return xlate6(ctx); }

SEC("cgroup/sendmsg6")
int cni_sock_sendmsg6(struct bpf_sock_addr *ctx) { return xlate6(ctx); }

SEC("cgroup/recvmsg6")
int cni_sock_recvmsg6(struct bpf_sock_addr *ctx) { return rnat6(ctx); }

SEC("cgroup/getpeername6")
int cni_sock_peer6(struct bpf_sock_addr *ctx) { return rnat6(ctx); }

char __license[] SEC("license") = "Dual BSD/GPL";
