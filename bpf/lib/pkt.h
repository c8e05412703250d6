/*
 * Packet helpers every feature uses: header pointers with their bounds
 * checks (and their reload after a helper that may move the data), the
 * TTL / hop limit decrement of a packet the datapath routes itself, the L4
 * parse of a flow, and address and port rewrites with incremental checksum
 * updates. Nothing here looks at a map.
 */
#pragma once

#include "types.h"

#define TCP_CSUM_OFF offsetof(struct tcphdr, check)
#define UDP_CSUM_OFF offsetof(struct udphdr, check)
#define TCP_FLAGS_OFF 13
#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

static __always_inline int mac_equal(const __u8 *a, const __u8 *b)
{
	/* 4+2 byte compares instead of a loop: the verifier sees straight-line code. */
	return *(const __u32 *)a == *(const __u32 *)b &&
	       *(const __u16 *)(a + 4) == *(const __u16 *)(b + 4);
}

static __always_inline void mac_copy(__u8 *dst, const __u8 *src)
{
	*(__u32 *)dst = *(const __u32 *)src;
	*(__u16 *)(dst + 4) = *(const __u16 *)(src + 4);
}

static __always_inline void addr_copy(__u8 *dst, const void *src, __u8 family)
{
	if (family == AF_INET) {
		*(__u32 *)dst = *(const __u32 *)src;
	} else {
		__builtin_memcpy(dst, src, 16);
	}
}

static __always_inline int addr_equal(const __u8 *a, const __u8 *b, __u8 family)
{
	if (family == AF_INET)
		return *(const __u32 *)a == *(const __u32 *)b;
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;
	return x[0] == y[0] && x[1] == y[1];
}

static __always_inline int is_link_local6(const struct in6_addr *a)
{
	return a->in6_u.u6_addr8[0] == 0xfe && (a->in6_u.u6_addr8[1] & 0xc0) == 0x80;
}

static __always_inline int is_unspecified6(const struct in6_addr *a)
{
	return (a->in6_u.u6_addr32[0] | a->in6_u.u6_addr32[1] |
		a->in6_u.u6_addr32[2] | a->in6_u.u6_addr32[3]) == 0;
}

/* ---------------------------------------------------- headers and bounds */

/*
 * The Ethernet header with the IP header of family after it in bounds, or
 * NULL when they do not fit. Also how a program gets its pointers back
 * after a helper that may move the data (bpf_skb_store_bytes, the checksum
 * helpers, bpf_skb_change_tail): every earlier packet pointer is invalid.
 */
static __always_inline struct ethhdr *pkt_l3(struct __sk_buff *skb, __u8 family)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u32 len = ETH_HLEN + (family == AF_INET ? sizeof(struct iphdr) : sizeof(struct ipv6hdr));

	if (data + len > data_end)
		return NULL;
	return data;
}

/* The IPv4 header after the Ethernet header, or NULL when it does not fit. */
static __always_inline struct iphdr *pkt_ip4(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + ETH_HLEN;

	if ((void *)(ip + 1) > data_end)
		return NULL;
	return ip;
}

/* The IPv6 header after the Ethernet header, or NULL when it does not fit. */
static __always_inline struct ipv6hdr *pkt_ip6(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ipv6hdr *ip6 = data + ETH_HLEN;

	if ((void *)(ip6 + 1) > data_end)
		return NULL;
	return ip6;
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
 * Prepares a packet the datapath forwards itself, as the stack's forwarding
 * would: reloads the packet pointers (a rewrite may have moved the data)
 * and decrements the TTL or hop limit. Returns the Ethernet header, or NULL
 * when the headers do not fit or the TTL would expire.
 */
static __always_inline struct ethhdr *pkt_forward(struct __sk_buff *skb, __u8 family)
{
	struct ethhdr *eth = pkt_l3(skb, family);

	if (!eth)
		return NULL;
	if (family == AF_INET) {
		struct iphdr *ip = (void *)(eth + 1);

		if (ip->ttl <= 1)
			return NULL;
		ttl_dec4(ip);
	} else {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if (ip6->hop_limit <= 1)
			return NULL;
		ip6->hop_limit--;
	}
	return eth;
}

/* ------------------------------------------------------------------ flows */

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

/* --------------------------------------------------------------- rewrites */

/*
 * Rewrites the source (is_src) or destination address and port of the TCP
 * or UDP packet described by f to addr:port, fixing the IPv4 header
 * checksum and the L4 checksum (pseudo-header included), and updates f to
 * match. Invalidates packet pointers.
 */
static __always_inline int pkt_rewrite(struct __sk_buff *skb, struct flow *f, int is_src, const __u8 *addr,
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

/* pkt_rewrite for an IPv4 ICMP echo, whose id stands for the port. */
static __always_inline int pkt_rewrite_echo4(struct __sk_buff *skb, struct flow *f, int is_src, __be32 addr,
					     __be16 port)
{
	__be32 from = *(__be32 *)(is_src ? f->saddr : f->daddr);
	__be16 *cur_port = is_src ? &f->sport : &f->dport;

	if (from != addr) {
		__u32 off = ETH_HLEN + (is_src ? offsetof(struct iphdr, saddr) : offsetof(struct iphdr, daddr));

		if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), from, addr, sizeof(addr)))
			return -1;
		if (bpf_skb_store_bytes(skb, off, &addr, sizeof(addr), 0))
			return -1;
		*(__be32 *)(is_src ? f->saddr : f->daddr) = addr;
	}
	if (*cur_port != port) {
		/* ICMP's checksum has no pseudo-header: only the id changes it. */
		if (bpf_l4_csum_replace(skb, f->l4off + 2, *cur_port, port, sizeof(port)))
			return -1;
		if (bpf_skb_store_bytes(skb, f->l4off + 4, &port, sizeof(port), 0))
			return -1;
		*cur_port = port;
	}
	return 0;
}

/* Internet checksum of a buffer of 16-bit words, for messages the programs write whole. */
static __always_inline __u32 csum_add_words(const void *p, int words, __u32 sum)
{
	const __u16 *w = p;

#pragma unroll
	for (int i = 0; i < words; i++)
		sum += w[i];
	return sum;
}

static __always_inline __sum16 csum_fold32(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__sum16)~sum;
}
