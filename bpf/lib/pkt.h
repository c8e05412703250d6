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

/*
 * The offset of an IPv6 packet's L4 header (at ETH_HLEN), past the
 * extension headers a host may put before it (hop-by-hop, routing,
 * destination options, fragment, AH), with its protocol in *proto. 0 when
 * the packet carries none: a later fragment, or no next header. -1 when
 * the chain is truncated or longer than IP6_MAX_EXT: a check that must not
 * be skipped treats that as the worst case.
 */
#define IP6_MAX_EXT 8
#ifndef IPPROTO_NONE
#define IPPROTO_NONE 59
#endif

static __always_inline int ip6_l4(struct __sk_buff *skb, __u8 nexthdr, __u8 *proto)
{
	__u32 off = ETH_HLEN + sizeof(struct ipv6hdr);
	__u8 h[4]; /* next header, then the length, or the fragment's offset in 2-3 */

#pragma unroll
	for (int i = 0; i < IP6_MAX_EXT; i++) {
		switch (nexthdr) {
		case IPPROTO_HOPOPTS:
		case IPPROTO_ROUTING:
		case IPPROTO_DSTOPTS:
			if (bpf_skb_load_bytes(skb, off, h, 2))
				return -1;
			nexthdr = h[0];
			off += ((__u32)h[1] + 1) * 8;
			break;
		case IPPROTO_AH:
			if (bpf_skb_load_bytes(skb, off, h, 2))
				return -1;
			nexthdr = h[0];
			off += ((__u32)h[1] + 2) * 4;
			break;
		case IPPROTO_FRAGMENT:
			if (bpf_skb_load_bytes(skb, off, h, 4))
				return -1;
			if ((h[2] << 5 | h[3] >> 3) != 0)
				return 0;
			nexthdr = h[0];
			off += 8;
			break;
		case IPPROTO_NONE:
			return 0;
		default:
			*proto = nexthdr;
			return off;
		}
	}
	return -1;
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
	__be16 sport; /* ICMP(v6) echo: the id, for a request */
	__be16 dport; /* ICMP(v6) echo: the id, for a reply */
	__u8 family;
	__u8 proto;
	__u8 syn_only; /* TCP SYN without ACK: a new connection */
	union {
		__u8 tcp_flags;
		/* UDP, which has no flags: which fragment of a datagram this is
		 * (FLOW_FRAG_*, hostport.h hp_frag_flow). A union, not a field:
		 * from_container's frame has no byte to spare. */
		__u8 frag;
	};
	__u32 l4off;   /* offset of the L4 header from skb->data */
};

/* Which fragment of a UDP datagram a flow's packet is (flow.frag). */
#define FLOW_FRAG_NONE 0
#define FLOW_FRAG_FIRST 1 /* offset 0, more to come: it has the ports */
#define FLOW_FRAG_LATER 2 /* no L4 header: its ports are its first fragment's */

static __always_inline int flow_frag(const struct flow *f)
{
	return f->proto == IPPROTO_UDP ? f->frag : FLOW_FRAG_NONE;
}

#define ICMP_ECHOREPLY_T 0
#define ICMP_ECHO_T 8
#define ICMP6_ECHO_REQUEST 128
#define ICMP6_ECHO_REPLY 129

/* Which ICMP echo messages a parse takes, and where their id goes. */
#define FLOW_NO_ECHO 0
#define FLOW_ECHO_REQUEST 1 /* the id is the source port */
#define FLOW_ECHO_REPLY 2   /* the id is the destination port */

/* What flow_l4 found at an L4 header. */
#define L4_PORTS 0 /* TCP, UDP, SCTP: f->sport, f->dport (TCP: f->tcp_flags, f->syn_only) */
#define L4_ICMP 1  /* ICMP(v6): its type, code and echo id in the l4_icmp */
#define L4_NONE 2  /* another protocol: no ports */
#define L4_SHORT 3 /* the header does not fit in the packet */

struct l4_icmp {
	__u8 type;
	__u8 code;
	__be16 id; /* an echo's */
};

/*
 * The one reader of L4 headers (the flow parser's and the stack-flow
 * table's): the header of f->proto at off, read in place when it is in the
 * linear data (the common case: every same-node pod-to-pod packet the
 * stack-flow table looks at), else copied out. Ports are 0 unless read.
 */
static __always_inline int flow_l4(struct __sk_buff *skb, struct flow *f, __u32 off, struct l4_icmp *ic)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u8 h[14];
	__u32 n;

	f->sport = 0;
	f->dport = 0;
	f->syn_only = 0;
	f->tcp_flags = 0;
	switch (f->proto) {
	case IPPROTO_TCP:
		n = 14;
		break;
	case IPPROTO_UDP:
	case IPPROTO_SCTP:
		n = 4;
		break;
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		n = 8;
		break;
	default:
		return L4_NONE;
	}
	/* off bounded for the verifier: headers at most ETH_HLEN + two IPv4
	 * headers with options and an ICMP header before them. */
	__u8 *p = data + (off & 0xff);
	if (off <= 0xff && n == 14 && (void *)(p + 14) <= data_end)
		__builtin_memcpy(h, p, 14);
	else if (off <= 0xff && n == 4 && (void *)(p + 4) <= data_end)
		__builtin_memcpy(h, p, 4);
	else if (bpf_skb_load_bytes(skb, off, h, n == 14 ? 14 : n == 8 ? 8 : 4))
		return L4_SHORT;
	if (n == 8) {
		ic->type = h[0];
		ic->code = h[1];
		ic->id = *(__be16 *)&h[4];
		return L4_ICMP;
	}
	f->sport = *(__be16 *)&h[0];
	f->dport = *(__be16 *)&h[2];
	if (n == 14) {
		f->tcp_flags = h[13];
		f->syn_only = (h[13] & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
	}
	return L4_PORTS;
}

/* Loads ports (and TCP flags), or an echo's id, at f->l4off. Returns 0, or -1 if not NATable. */
static __always_inline int flow_load_l4(struct __sk_buff *skb, struct flow *f, int echo)
{
	struct l4_icmp ic;
	int k = flow_l4(skb, f, f->l4off, &ic);

	if (k == L4_PORTS)
		return f->proto == IPPROTO_SCTP ? -1 : 0;
	if (k != L4_ICMP || echo == FLOW_NO_ECHO || ic.code != 0)
		return -1;
	int v4 = f->proto == IPPROTO_ICMP;
	__u8 want = echo == FLOW_ECHO_REQUEST ? (v4 ? ICMP_ECHO_T : ICMP6_ECHO_REQUEST)
					      : (v4 ? ICMP_ECHOREPLY_T : ICMP6_ECHO_REPLY);
	if (ic.type != want)
		return -1;
	f->sport = echo == FLOW_ECHO_REQUEST ? ic.id : 0;
	f->dport = echo == FLOW_ECHO_REQUEST ? 0 : ic.id;
	return 0;
}

/* Fills f from an IPv4 header at ETH_HLEN. Fragments are not translated. */
static __always_inline int flow_parse4(struct __sk_buff *skb, const struct iphdr *ip, struct flow *f, int echo)
{
	__u32 ihl = ip->ihl * 4;

	if (ihl < sizeof(*ip) || (ip->frag_off & bpf_htons(0x3fff)))
		return -1;
	f->family = AF_INET;
	f->proto = ip->protocol;
	f->l4off = ETH_HLEN + ihl;
	*(__be32 *)f->saddr = ip->saddr;
	*(__be32 *)f->daddr = ip->daddr;
	return flow_load_l4(skb, f, echo);
}

/* Fills f from an IPv6 header at ETH_HLEN (no extension headers). */
static __always_inline int flow_parse6(struct __sk_buff *skb, const struct ipv6hdr *ip6, struct flow *f, int echo)
{
	f->family = AF_INET6;
	f->proto = ip6->nexthdr;
	f->l4off = ETH_HLEN + sizeof(*ip6);
	__builtin_memcpy(f->saddr, &ip6->saddr, 16);
	__builtin_memcpy(f->daddr, &ip6->daddr, 16);
	return flow_load_l4(skb, f, echo);
}

/* flow_parse4 or flow_parse6 of the packet's IP header. */
static __always_inline int flow_parse(struct __sk_buff *skb, __u8 family, struct flow *f, int echo)
{
	if (family == AF_INET) {
		struct iphdr *ip = pkt_ip4(skb);

		return ip ? flow_parse4(skb, ip, f, echo) : -1;
	}
	struct ipv6hdr *ip6 = pkt_ip6(skb);

	return ip6 ? flow_parse6(skb, ip6, f, echo) : -1;
}

/* --------------------------------------------------------------- rewrites */

/*
 * Rewrites the source (is_src) or destination address and port of the TCP,
 * UDP or ICMP(v6) echo packet described by f to addr:port (an echo's id
 * stands for the port of either side), fixing the IPv4 header checksum and
 * the L4 checksum (pseudo-header included, which ICMPv4 has none of), and
 * updates f to match. A later fragment (FLOW_FRAG_LATER) has no L4 header:
 * only its address changes (and, over IPv6, which has no header checksum
 * to balance it, a received checksum the device computed). Invalidates
 * packet pointers.
 */
static __always_inline int pkt_rewrite(struct __sk_buff *skb, struct flow *f, int is_src, const __u8 *addr,
				       __be16 port)
{
	__u32 csum_off = f->l4off + TCP_CSUM_OFF;
	__u32 port_off = f->l4off + (is_src ? 0 : 2);
	__u64 mangled = 0, pseudo = BPF_F_PSEUDO_HDR;
	__u8 *cur = is_src ? f->saddr : f->daddr;
	__be16 *cur_port = is_src ? &f->sport : &f->dport;

	int l4 = 1;

	if (f->proto == IPPROTO_UDP) {
		csum_off = f->l4off + UDP_CSUM_OFF;
		/* A UDP/IPv4 checksum of 0 means none: keep it so. */
		mangled = BPF_F_MARK_MANGLED_0;
		l4 = f->frag != FLOW_FRAG_LATER;
	} else if (f->proto == IPPROTO_ICMP || f->proto == IPPROTO_ICMPV6) {
		csum_off = f->l4off + 2;
		port_off = f->l4off + 4;
		if (f->proto == IPPROTO_ICMP)
			pseudo = 0;
	}

	if (f->family == AF_INET) {
		__be32 from = *(__be32 *)cur, to = *(const __be32 *)addr;
		__u32 off = ETH_HLEN + (is_src ? offsetof(struct iphdr, saddr) : offsetof(struct iphdr, daddr));

		if (from != to) {
			if (l4 && pseudo && bpf_l4_csum_replace(skb, csum_off, from, to, mangled | pseudo | sizeof(to)))
				return -1;
			if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), from, to, sizeof(to)))
				return -1;
			if (bpf_skb_store_bytes(skb, off, &to, sizeof(to), 0))
				return -1;
			*(__be32 *)cur = to;
		}
	} else {
		__u32 off = ETH_HLEN + (is_src ? offsetof(struct ipv6hdr, saddr) : offsetof(struct ipv6hdr, daddr));

		if (!addr_equal(cur, addr, AF_INET6)) {
			__s64 diff = bpf_csum_diff((__be32 *)cur, 16, (__be32 *)addr, 16, 0);

			if (!l4)
				bpf_csum_update(skb, diff); /* CHECKSUM_COMPLETE only */
			else if (bpf_l4_csum_replace(skb, csum_off, 0, diff, mangled | BPF_F_PSEUDO_HDR))
				return -1;
			if (bpf_skb_store_bytes(skb, off, addr, 16, 0))
				return -1;
			__builtin_memcpy(cur, addr, 16);
		}
	}
	if (*cur_port != port) {
		if (!l4) {
			*cur_port = port;
			return 0;
		}
		if (bpf_l4_csum_replace(skb, csum_off, *cur_port, port, mangled | sizeof(port)))
			return -1;
		if (bpf_skb_store_bytes(skb, port_off, &port, sizeof(port), 0))
			return -1;
		*cur_port = port;
	}
	return 0;
}

/* ------------------------------------------------------------- checksums */

/* Folds a 32-bit one's complement sum to 16 bits. */
static __always_inline __u32 csum_fold16(__u32 s)
{
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return s;
}

/* The one's complement sum of an address's 16-bit words (4 or 16 bytes). */
static __always_inline __u32 addr_sum(const __u8 *a, __u8 family)
{
	const __u16 *w = (const __u16 *)a;
	__u32 s = (__u32)w[0] + w[1];

	if (family == AF_INET6)
		s += (__u32)w[2] + w[3] + w[4] + w[5] + w[6] + w[7];
	return s;
}

/* What a one's complement sum changes by when words summing to from are
 * replaced by words summing to to (RFC 1624: ~m + m'), to add to others. */
static __always_inline __u32 csum_delta(__u32 from, __u32 to)
{
	return (0xffff - csum_fold16(from)) + csum_fold16(to);
}

/* A checksum field after the data it covers changed by delta (csum_delta sums). */
static __always_inline __u16 csum_apply(__u16 check, __u32 delta)
{
	return (__u16)~csum_fold16((__u32)(__u16)~check + csum_fold16(delta));
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

/*
 * An IPv6 packet's extension headers from off, where the header nexthdr
 * names begins: the packet's own (hostPort's datagrams and fragments,
 * hostport.h) or those of the packet an ICMPv6 error quotes (icmp.h).
 * Hop-by-hop, routing and destination options headers, before a fragment
 * header (where other stacks and middleboxes put them, and Linux its
 * hop-by-hop) or after it (Linux's destination options, IPV6_DSTOPTS), up
 * to IP6_EXT_MAX headers in all. The fragment header's identification
 * (into *id, unless id is NULL) and place in the datagram, and for a first
 * fragment or a whole datagram the header after the chain (its offset, its
 * protocol). Returns -1 for a truncated chain, one too long, two fragment
 * headers, or a routing header with segments left.
 */
#define IP6_EXT_MAX 4
#define IP6X_L4OFF(c) ((__u32)(c) & 0xffff) /* the header after the chain; 0 in a later fragment */
#define IP6X_PROTO(c) ((__u8)((c) >> 16))   /* its protocol */
#define IP6X_FRAG(c) (((c) >> 24) & 3)      /* FLOW_FRAG_*, NONE for no (or an atomic) fragment header */
#define IP6X_SEEN (1 << 26)                 /* a fragment header was read: its identification is in *id */

/* Packed in a return value, the identification written to *id (the
 * caller's key): from_container's frame is at its limit, and this runs in
 * subprograms whose frames add to it. h: 4 bytes for the headers' fields
 * (next header, length; a fragment header's next header, reserved, offset
 * and M), the caller's scratch where its frame has no room (policy.h). */
static __always_inline long ip6_ext_chain_in(struct __sk_buff *skb, __u8 nexthdr, __u32 off, __u32 *id, __u8 *h)
{
	/* One variable in the packing of the result: fewer spills. */
	long c = (long)nexthdr << 16 | off;

#pragma unroll
	for (int i = 0; i < IP6_EXT_MAX; i++) {
		__u8 nh = IP6X_PROTO(c);

		if (nh == IPPROTO_HOPOPTS || nh == IPPROTO_ROUTING || nh == IPPROTO_DSTOPTS) {
			/* A routing header with segments left: this node is a
			 * waypoint, the packet not its own (RFC 8200 4.4); the
			 * stack answers it as for any port. */
			if (bpf_skb_load_bytes(skb, IP6X_L4OFF(c), h, 4) || (nh == IPPROTO_ROUTING && h[3]))
				return -1;
			c = (c & ~0xffffffL) | (long)h[0] << 16 | (IP6X_L4OFF(c) + ((__u32)h[1] + 1) * 8);
		} else if (nh == IPPROTO_FRAGMENT) {
			if ((c & IP6X_SEEN) || bpf_skb_load_bytes(skb, IP6X_L4OFF(c), h, 4) ||
			    (id && bpf_skb_load_bytes(skb, IP6X_L4OFF(c) + 4, id, 4)))
				return -1;
			if ((h[2] << 5 | h[3] >> 3) != 0) /* what follows is the datagram's middle */
				return IP6X_SEEN | (long)FLOW_FRAG_LATER << 24;
			/* an atomic fragment (offset 0, no more) is the whole datagram */
			c = IP6X_SEEN | (long)((h[3] & 1) ? FLOW_FRAG_FIRST : FLOW_FRAG_NONE) << 24 | (long)h[0] << 16 |
			    (IP6X_L4OFF(c) + 8);
		} else {
			break;
		}
	}
	/* The offset fits its 16 bits: a quote's chain starts at 102 (error,
	 * quoted header), + IP6_EXT_MAX x 2048 at most. */
	return c;
}

static __always_inline long ip6_ext_chain(struct __sk_buff *skb, __u8 nexthdr, __u32 off, __u32 *id)
{
	__u8 h[4];

	return ip6_ext_chain_in(skb, nexthdr, off, id, h);
}

/*
 * flow_parse6 of a whole IPv6 datagram whose transport header lies behind
 * extension headers (the ip6_ext_chain walk), which flow_parse6 refuses: a
 * peer's reply to a masqueraded flow may carry a destination options or
 * hop-by-hop header (masq.h masq_reverse). No fragment (an atomic one is
 * whole). Returns 0, or -1 (also for a packet without extension headers:
 * flow_parse6's answer stands), or FLOW_EXT_UNWALKED when the walk did not
 * reach the chain's end (more than IP6_EXT_MAX headers, truncated, a
 * routing header with segments left): its transport is unknown. Out of line: its walk's stack is not on the
 * caller's.
 */
#define FLOW_EXT_UNWALKED (-2)
static __noinline __attribute__((unused)) int flow_parse6_ext(struct __sk_buff *skb, struct flow *f, int echo)
{
	__u8 nh = 0;

	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, nexthdr), &nh, 1) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, saddr), f->saddr, 16) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, daddr), f->daddr, 16))
		return -1;
	long c = ip6_ext_chain(skb, nh, ETH_HLEN + sizeof(struct ipv6hdr), NULL);
	__u8 p = IP6X_PROTO(c);
	if (c < 0 || p == IPPROTO_HOPOPTS || p == IPPROTO_ROUTING || p == IPPROTO_DSTOPTS || p == IPPROTO_FRAGMENT)
		return FLOW_EXT_UNWALKED;
	if (IP6X_FRAG(c) != FLOW_FRAG_NONE || IP6X_L4OFF(c) == ETH_HLEN + sizeof(struct ipv6hdr))
		return -1;
	f->family = AF_INET6;
	f->proto = IP6X_PROTO(c);
	f->l4off = IP6X_L4OFF(c);
	f->frag = FLOW_FRAG_NONE; /* whatever flow_parse6 left */
	return flow_load_l4(skb, f, echo);
}
