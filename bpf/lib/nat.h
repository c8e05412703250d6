/*
 * Packet rewriting for hostPort NAT in tc programs: parse the L4 ports,
 * rewrite an address and port with incremental checksum updates, record and
 * find flows in cni_ct, and forward a translated reply with a FIB lookup.
 */
#pragma once

#include <stddef.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include "endpoint.h"
#include "hostport.h"

#define TCP_CSUM_OFF offsetof(struct tcphdr, check)
#define UDP_CSUM_OFF offsetof(struct udphdr, check)
#define TCP_FLAGS_OFF 13
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_ACK 0x10

/* What the NAT code needs of a packet: one shape for both families. */
struct flow {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 family;
	__u8 proto;
	__u8 syn_only; /* TCP SYN without ACK: a new connection */
	__u8 tcp_flags;
	__u32 l4off;   /* offset of the L4 header from skb->data */
};

/* Loads ports (and TCP flags) at f->l4off. Returns 0, or -1 if not NATable. */
static __always_inline int flow_load_l4(struct __sk_buff *skb, struct flow *f)
{
	__be16 ports[2];

	if (f->proto != IPPROTO_TCP && f->proto != IPPROTO_UDP)
		return -1;
	if (bpf_skb_load_bytes(skb, f->l4off, ports, sizeof(ports)))
		return -1;
	f->sport = ports[0];
	f->dport = ports[1];
	f->syn_only = 0;
	if (f->proto == IPPROTO_TCP) {
		__u8 fl;

		if (bpf_skb_load_bytes(skb, f->l4off + TCP_FLAGS_OFF, &fl, 1))
			return -1;
		f->syn_only = (fl & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
		f->tcp_flags = fl;
	}
	return 0;
}

/* Fills f from an IPv4 header at ETH_HLEN. Fragments are not translated. */
static __always_inline int flow_parse4(struct __sk_buff *skb, const struct iphdr *ip, struct flow *f)
{
	__u32 ihl = ip->ihl * 4;

	if (ihl < sizeof(*ip) || (ip->frag_off & bpf_htons(0x3fff)))
		return -1;
	f->family = AF_INET;
	f->proto = ip->protocol;
	f->l4off = ETH_HLEN + ihl;
	*(__be32 *)f->saddr = ip->saddr;
	*(__be32 *)f->daddr = ip->daddr;
	return flow_load_l4(skb, f);
}

/* Fills f from an IPv6 header at ETH_HLEN (no extension headers). */
static __always_inline int flow_parse6(struct __sk_buff *skb, const struct ipv6hdr *ip6, struct flow *f)
{
	f->family = AF_INET6;
	f->proto = ip6->nexthdr;
	f->l4off = ETH_HLEN + sizeof(*ip6);
	__builtin_memcpy(f->saddr, &ip6->saddr, 16);
	__builtin_memcpy(f->daddr, &ip6->daddr, 16);
	return flow_load_l4(skb, f);
}

static __always_inline int addr_equal(const __u8 *a, const __u8 *b, __u8 family)
{
	if (family == AF_INET)
		return *(const __u32 *)a == *(const __u32 *)b;
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;
	return x[0] == y[0] && x[1] == y[1];
}

/*
 * Rewrites the source (is_src) or destination address and port of the
 * packet described by f to addr:port, fixing the IPv4 header checksum and
 * the L4 checksum (pseudo-header included), and updates f to match.
 * Invalidates packet pointers.
 */
static __always_inline int nat_rewrite(struct __sk_buff *skb, struct flow *f, int is_src, const __u8 *addr,
				       __be16 port)
{
	__u32 csum_off = f->l4off + (f->proto == IPPROTO_TCP ? TCP_CSUM_OFF : UDP_CSUM_OFF);
	/* A UDP/IPv4 checksum of 0 means none: keep it so. */
	__u64 mangled = f->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	__u8 *cur = is_src ? f->saddr : f->daddr;
	__be16 *cur_port = is_src ? &f->sport : &f->dport;

	if (f->family == AF_INET) {
		__be32 from = *(__be32 *)cur, to = *(const __be32 *)addr;
		__u32 off = ETH_HLEN + (is_src ? offsetof(struct iphdr, saddr) : offsetof(struct iphdr, daddr));

		if (from != to) {
			if (bpf_l4_csum_replace(skb, csum_off, from, to, mangled | BPF_F_PSEUDO_HDR | sizeof(to)))
				return -1;
			if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), from, to, sizeof(to)))
				return -1;
			if (bpf_skb_store_bytes(skb, off, &to, sizeof(to), 0))
				return -1;
			*(__be32 *)cur = to;
		}
	} else {
		__u32 off = ETH_HLEN + (is_src ? offsetof(struct ipv6hdr, saddr) : offsetof(struct ipv6hdr, daddr));
		__u8 from[16], to[16];

		__builtin_memcpy(from, cur, 16);
		__builtin_memcpy(to, addr, 16);
		if (!addr_equal(from, to, AF_INET6)) {
			__s64 diff = bpf_csum_diff((__be32 *)from, 16, (__be32 *)to, 16, 0);

			if (bpf_l4_csum_replace(skb, csum_off, 0, diff, mangled | BPF_F_PSEUDO_HDR))
				return -1;
			if (bpf_skb_store_bytes(skb, off, to, 16, 0))
				return -1;
			__builtin_memcpy(cur, to, 16);
		}
	}
	if (*cur_port != port) {
		if (bpf_l4_csum_replace(skb, csum_off, *cur_port, port, mangled | sizeof(port)))
			return -1;
		if (bpf_skb_store_bytes(skb, f->l4off + (is_src ? 0 : 2), &port, sizeof(port), 0))
			return -1;
		*cur_port = port;
	}
	return 0;
}

#ifndef BPF_TCP_ESTABLISHED
#define BPF_TCP_ESTABLISHED 1
#endif

/*
 * Whether a connected UDP socket of the node owns this exact flow: a node
 * process talking from a port that happens to be a UDP hostPort (say, a
 * resolver's ephemeral port) keeps its replies. Sockets merely bound to the
 * port do not count: a hostPort wins over them, as portmap's DNAT does.
 * TCP needs no such check: only SYNs open a translated flow.
 */
static __always_inline int node_owns_udp_flow(struct __sk_buff *skb, const struct flow *f)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	__u32 len;

	if (f->family == AF_INET) {
		t.ipv4.saddr = *(const __be32 *)f->saddr;
		t.ipv4.daddr = *(const __be32 *)f->daddr;
		t.ipv4.sport = f->sport;
		t.ipv4.dport = f->dport;
		len = sizeof(t.ipv4);
	} else {
		__builtin_memcpy(t.ipv6.saddr, f->saddr, 16);
		__builtin_memcpy(t.ipv6.daddr, f->daddr, 16);
		t.ipv6.sport = f->sport;
		t.ipv6.dport = f->dport;
		len = sizeof(t.ipv6);
	}
	sk = bpf_sk_lookup_udp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	int owned = sk->state == BPF_TCP_ESTABLISHED;
	bpf_sk_release(sk);
	return owned;
}

/*
 * DNATs a packet that matched hostport v to the pod, remembering the flow
 * in cni_ct. snat_to_dialled rewrites the source to the dialled address too
 * (a pod reaching its own hostPort: its reply must come back through the
 * host veth). TCP packets other than a SYN are translated only while their
 * flow is known, and a UDP flow only if no connected node socket owns it,
 * so a node's own connection that happens to use a hostPort number as its
 * local port never has its return traffic stolen.
 * Returns 0 when translated, 1 when the packet must go on untouched, -1 on
 * error.
 */
static __always_inline int hostport_dnat(struct __sk_buff *skb, struct flow *f, const struct hostport_val *v,
					 int snat_to_dialled)
{
	struct ct_key k = { .family = f->family, .proto = f->proto, .pod_port = v->pod_port };
	struct ct_val nv = { .orig_port = f->dport, .client_port = f->sport, .ifindex = v->ifindex };
	struct ct_val *cur;
	__u8 dialled[16];

	addr_copy(k.pod_addr, v->pod_addr, f->family);
	addr_copy(nv.orig_addr, f->daddr, f->family);
	addr_copy(nv.client_addr, f->saddr, f->family);
	addr_copy(dialled, f->daddr, f->family);
	if (snat_to_dialled) {
		addr_copy(k.peer_addr, f->daddr, f->family);
		nv.flags = CT_F_SNAT;
	} else {
		addr_copy(k.peer_addr, f->saddr, f->family);
	}
	k.peer_port = f->sport;

	cur = bpf_map_lookup_elem(&cni_ct, &k);
	if (cur && cur->ifindex == v->ifindex && cur->orig_port == nv.orig_port && cur->flags == nv.flags &&
	    addr_equal(cur->orig_addr, nv.orig_addr, f->family) &&
	    addr_equal(cur->client_addr, nv.client_addr, f->family)) {
		/* Known flow. */
	} else if (f->proto == IPPROTO_TCP && !f->syn_only) {
		hp_count(HP_STAT_NO_FLOW);
		return 1;
	} else if (f->proto == IPPROTO_UDP && node_owns_udp_flow(skb, f)) {
		hp_count(HP_STAT_NO_FLOW);
		return 1;
	} else {
		nv.created_ns = bpf_ktime_get_ns();
		if (bpf_map_update_elem(&cni_ct, &k, &nv, BPF_ANY))
			return -1;
		hp_count(HP_STAT_CT_NEW);
	}

	if (nat_rewrite(skb, f, 0, v->pod_addr, v->pod_port))
		return -1;
	if (snat_to_dialled && nat_rewrite(skb, f, 1, dialled, f->sport))
		return -1;
	return 0;
}

/*
 * A packet from the pod behind ifindex: if it is the reply of a translated
 * flow, rewrite it back to what the client dialled. Returns 1 when
 * translated, 0 when not a translated flow, -1 on error.
 */
static __always_inline int hostport_reverse(struct __sk_buff *skb, struct flow *f, __u32 ifindex)
{
	struct ct_key k = { .family = f->family, .proto = f->proto, .pod_port = f->sport, .peer_port = f->dport };
	struct ct_val *ct;

	addr_copy(k.pod_addr, f->saddr, f->family);
	addr_copy(k.peer_addr, f->daddr, f->family);
	ct = bpf_map_lookup_elem(&cni_ct, &k);
	if (!ct)
		return 0;
	if (ct->ifindex != ifindex) {
		/* Left by an earlier pod that had this address: never applies. */
		bpf_map_delete_elem(&cni_ct, &k);
		return 0;
	}
	/* Copy before rewriting: the entry may be evicted meanwhile. */
	struct ct_val v = *ct;
	if (nat_rewrite(skb, f, 1, v.orig_addr, v.orig_port))
		return -1;
	if ((v.flags & CT_F_SNAT) && nat_rewrite(skb, f, 0, v.client_addr, v.client_port))
		return -1;
	return 1;
}

static __always_inline struct ep_info *ep_lookup_addr(const __u8 *addr, __u8 family)
{
	struct ep_key k = { .family = family };

	addr_copy(k.addr, addr, family);
	return bpf_map_lookup_elem(&cni_endpoints, &k);
}

/* Decrements the IPv4 TTL with an incremental checksum update (as ip_decrease_ttl). */
static __always_inline void ttl_dec4(struct iphdr *ip)
{
	__u32 check = ip->check;

	check += bpf_htons(0x0100);
	ip->check = (__u16)(check + (check >= 0xFFFF));
	ip->ttl--;
}

/*
 * Sends a translated reply (its source is now a node address, which the
 * stack would drop as martian if handed in from the veth) straight out of
 * the egress device the FIB picks, as the stack would forward it.
 */
static __always_inline int fib_redirect(struct __sk_buff *skb, __u32 ifindex)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct bpf_fib_lookup p = {};
	int rc;

	if ((void *)(eth + 1) > data_end)
		return TC_ACT_SHOT;
	p.ifindex = ifindex;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > data_end)
			return TC_ACT_SHOT;
		if (ip->ttl <= 1)
			goto no_route;
		p.family = AF_INET;
		p.tos = ip->tos;
		p.l4_protocol = ip->protocol;
		p.ipv4_src = ip->saddr;
		p.ipv4_dst = ip->daddr;
	} else {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return TC_ACT_SHOT;
		if (ip6->hop_limit <= 1)
			goto no_route;
		p.family = AF_INET6;
		p.l4_protocol = ip6->nexthdr;
		__builtin_memcpy(p.ipv6_src, &ip6->saddr, 16);
		__builtin_memcpy(p.ipv6_dst, &ip6->daddr, 16);
	}
	/* tot_len 0: the helper checks the skb (GSO aware) against the MTU. */
	rc = bpf_fib_lookup(skb, &p, sizeof(p), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		goto no_route;

	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return TC_ACT_SHOT;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > data_end)
			return TC_ACT_SHOT;
		ttl_dec4(ip);
	} else {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return TC_ACT_SHOT;
		ip6->hop_limit--;
	}
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		struct bpf_redir_neigh nh = { .nh_family = p.family };

		if (p.family == AF_INET)
			nh.ipv4_nh = p.ipv4_dst;
		else
			__builtin_memcpy(nh.ipv6_nh, p.ipv6_dst, 16);
		return bpf_redirect_neigh(p.ifindex, &nh, sizeof(nh), 0);
	}
	/* p.dmac is only 2-byte aligned on the stack: no mac_copy. */
	__builtin_memcpy(eth->h_dest, p.dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, p.smac, ETH_ALEN);
	return bpf_redirect(p.ifindex, 0);
no_route:
	hp_count(HP_STAT_NO_ROUTE);
	return TC_ACT_SHOT;
}
