/*
 * ICMP and ICMPv6 errors about translated flows: destination unreachable
 * (fragmentation needed, port and host unreachable), packet too big, time
 * exceeded, parameter problem. An error quotes the head of the packet it is
 * about, as that packet looked where it failed: to reach the host that sent
 * it, the quoted packet must be translated like the flow it belongs to, and
 * the error itself addressed like that flow's replies. Path-MTU discovery
 * depends on it (a lost "fragmentation needed" or "packet too big" stalls
 * every transfer larger than the path's smallest MTU), and so do
 * traceroute and a client's "connection refused".
 *
 * Parsing and rewriting only: masq.h and hostport.h look the quoted flow up
 * in their tables. Every checksum a rewrite touches is updated
 * incrementally (RFC 1624): the quoted IPv4 header's, the quoted L4
 * header's when the quote holds it (UDP's always does, TCP's from 18 bytes),
 * the error's own ICMP checksum (which covers the quote, and for ICMPv6 the
 * outer addresses) and the outer IPv4 header's. Nothing here looks at a map.
 */
#pragma once

#include "pkt.h"

/* An ICMP(v6) error and the packet it quotes. */
struct icmp_err {
	struct flow q;   /* the quoted packet: addresses, protocol, ports (an echo request's id in sport) */
	__u32 icmp_off;  /* the error's ICMP header */
	__u32 q_off;     /* the quoted IP header */
	__u32 q_len;     /* bytes of the quote from its L4 header (q.l4off) to the end of the packet */
	__u8 family;
	__u8 type;
};

static __always_inline int icmp_is_error(__u8 family, __u8 type)
{
	if (family == AF_INET)
		return type == 3 || type == 11 || type == 12; /* unreachable, time exceeded, parameter problem */
	return type >= 1 && type <= 4; /* unreachable, packet too big, time exceeded, parameter problem */
}

/*
 * Parses the packet (IP header at ETH_HLEN) as an ICMP(v6) error quoting a
 * TCP, UDP or ICMP(v6) echo request packet of family. Returns 0, or -1 when
 * it is none (or an outer IPv4 fragment, an outer IPv6 extension header,
 * or a quoted later fragment, which has no ports: not translated). The
 * quote's IPv6 extension headers are walked (ip6_ext_chain), so its L4
 * header (q.l4off) may lie past them.
 */
static __always_inline int icmp_err_parse(struct __sk_buff *skb, __u8 family, struct icmp_err *e)
{
	__u8 h[8];

	e->family = family;
	e->q.family = family;
	if (family == AF_INET) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) || ip.protocol != IPPROTO_ICMP || ip.ihl < 5 ||
		    (ip.frag_off & bpf_htons(0x3fff)))
			return -1;
		e->icmp_off = ETH_HLEN + ip.ihl * 4;
	} else {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) || ip6.nexthdr != IPPROTO_ICMPV6)
			return -1;
		e->icmp_off = ETH_HLEN + sizeof(ip6);
	}
	if (bpf_skb_load_bytes(skb, e->icmp_off, h, 2) || !icmp_is_error(family, h[0]))
		return -1;
	e->type = h[0];
	e->q_off = e->icmp_off + 8;

	if (family == AF_INET) {
		struct iphdr q;

		/* A quoted first fragment has its ports; a later one has none. */
		if (bpf_skb_load_bytes(skb, e->q_off, &q, sizeof(q)) || q.version != 4 || q.ihl < 5 ||
		    (q.frag_off & bpf_htons(0x1fff)))
			return -1;
		e->q.proto = q.protocol;
		*(__be32 *)e->q.saddr = q.saddr;
		*(__be32 *)e->q.daddr = q.daddr;
		e->q.l4off = e->q_off + q.ihl * 4;
	} else {
		struct ipv6hdr q;

		if (bpf_skb_load_bytes(skb, e->q_off, &q, sizeof(q)))
			return -1;
		/* The quote's extension headers, walked as the packet's own
		 * (a hostPort's datagrams carry them): a quoted first fragment
		 * has its ports after the fragment header, a later one none. */
		long c = ip6_ext_chain(skb, q.nexthdr, e->q_off + sizeof(q), NULL);
		if (c < 0 || IP6X_FRAG(c) == FLOW_FRAG_LATER)
			return -1;
		e->q.proto = IP6X_PROTO(c);
		__builtin_memcpy(e->q.saddr, &q.saddr, 16);
		__builtin_memcpy(e->q.daddr, &q.daddr, 16);
		e->q.l4off = IP6X_L4OFF(c);
	}
	/* Every error quotes at least 8 bytes of the L4 header (RFC 792). */
	if (bpf_skb_load_bytes(skb, e->q.l4off, h, 8))
		return -1;
	e->q_len = skb->len - e->q.l4off;
	e->q.syn_only = 0;
	e->q.tcp_flags = 0;
	if (e->q.proto == IPPROTO_TCP || e->q.proto == IPPROTO_UDP) {
		e->q.sport = *(__be16 *)&h[0];
		e->q.dport = *(__be16 *)&h[2];
		return 0;
	}
	/* Errors about echo requests: traceroute and ping -M do. */
	if ((e->q.proto == IPPROTO_ICMP && family == AF_INET && h[0] == ICMP_ECHO_T) ||
	    (e->q.proto == IPPROTO_ICMPV6 && family == AF_INET6 && h[0] == ICMP6_ECHO_REQUEST)) {
		e->q.sport = *(__be16 *)&h[4];
		e->q.dport = 0;
		return 0;
	}
	return -1;
}

/* Loads a 16-bit field, applies delta to it as a checksum, stores it;
 * returns the change to the sum of the words it lies in (for the checksums
 * covering it), or -1. */
static __always_inline __s64 csum_field_apply(struct __sk_buff *skb, __u32 off, __u32 delta, int udp)
{
	__u16 c, n;

	if (bpf_skb_load_bytes(skb, off, &c, 2))
		return -1;
	if (udp && c == 0)
		return 0; /* a UDP/IPv4 datagram without a checksum keeps none */
	n = csum_apply(c, delta);
	if (udp && n == 0)
		n = 0xffff;
	if (bpf_skb_store_bytes(skb, off, &n, 2, 0))
		return -1;
	return csum_delta(c, n);
}

/*
 * Rewrites the quoted packet's source (q_src) or destination address and
 * port (an echo request's id for the source) to addr:port, and the outer
 * address that stands for the same host: the error's destination for a
 * quoted source (an error goes back to the packet's sender), its source for
 * a quoted destination when it is that address (the destination itself
 * refused the packet, as for a port unreachable). Checksums as above.
 * Updates e->q. Returns 0 or -1.
 */
static __always_inline int icmp_err_rewrite(struct __sk_buff *skb, struct icmp_err *e, int q_src, const __u8 *addr,
					    __be16 port)
{
	__u8 family = e->family, old[16], outer[16];
	__u32 alen = family == AF_INET ? 4 : 16;
	__u32 q_addr_off = e->q_off + (family == AF_INET ? (q_src ? 12 : 16) : (q_src ? 8 : 24));
	__u32 o_addr_off = ETH_HLEN + (family == AF_INET ? (q_src ? 16 : 12) : (q_src ? 24 : 8));
	__be16 old_port = q_src ? e->q.sport : e->q.dport;
	int echo = e->q.proto == IPPROTO_ICMP || e->q.proto == IPPROTO_ICMPV6;
	__u32 icmp = 0; /* change of the words the error's ICMP checksum covers */
	__s64 d;

	if (echo && !q_src)
		return -1; /* an echo request's id is its source's */
	__builtin_memset(old, 0, sizeof(old));
	__builtin_memset(outer, 0, sizeof(outer));
	addr_copy(old, q_src ? e->q.saddr : e->q.daddr, family);
	__u32 d_addr = csum_delta(addr_sum(old, family), addr_sum(addr, family));
	__u32 d_port = csum_delta(old_port, port);

	/* The quoted address, and the quoted IPv4 header's checksum. */
	if (bpf_skb_store_bytes(skb, q_addr_off, addr, alen, 0))
		return -1;
	icmp += d_addr;
	if (family == AF_INET) {
		d = csum_field_apply(skb, e->q_off + offsetof(struct iphdr, check), d_addr, 0);
		if (d < 0)
			return -1;
		icmp += d;
	}

	/* The quoted L4 checksum, when the quote holds it: it covers the port
	 * (an echo's id) and, through the pseudo-header, the addresses
	 * (ICMPv4 has none). */
	__u32 csum_off = 0, delta = d_port;
	int udp = 0;
	if (e->q.proto == IPPROTO_TCP && e->q_len >= TCP_CSUM_OFF + 2) {
		csum_off = e->q.l4off + TCP_CSUM_OFF;
		delta += d_addr;
	} else if (e->q.proto == IPPROTO_UDP) {
		csum_off = e->q.l4off + UDP_CSUM_OFF;
		delta += d_addr;
		udp = family == AF_INET;
	} else if (echo) {
		csum_off = e->q.l4off + 2;
		if (family == AF_INET6)
			delta += d_addr;
	}
	if (csum_off) {
		d = csum_field_apply(skb, csum_off, delta, udp);
		if (d < 0)
			return -1;
		icmp += d;
	}

	/* The quoted port (an echo request's id). */
	__u32 port_off = e->q.l4off + (echo ? 4 : (q_src ? 0 : 2));
	if (bpf_skb_store_bytes(skb, port_off, &port, sizeof(port), 0))
		return -1;
	icmp += d_port;

	/* The outer address standing for the same host. */
	if (bpf_skb_load_bytes(skb, o_addr_off, outer, alen))
		return -1;
	if (addr_equal(outer, old, family)) {
		if (family == AF_INET) {
			if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), *(__be32 *)old,
						*(const __be32 *)addr, 4))
				return -1;
		} else {
			icmp += d_addr; /* ICMPv6's pseudo-header */
		}
		if (bpf_skb_store_bytes(skb, o_addr_off, addr, alen, 0))
			return -1;
	}

	/* The error's own checksum. */
	d = csum_field_apply(skb, e->icmp_off + 2, icmp, 0);
	if (d < 0)
		return -1;

	addr_copy(q_src ? e->q.saddr : e->q.daddr, addr, family);
	if (q_src)
		e->q.sport = port;
	else
		e->q.dport = port;
	return 0;
}
