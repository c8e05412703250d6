/*
 * The node tunnel (docs/tunnel.md): one collect_md VXLAN (or Geneve)
 * device per node, which the agent creates and routes other nodes' pod
 * CIDRs into (all of them, or in hybrid mode those of nodes off this
 * node's subnets), each route carrying its node as the tunnel key
 * (pkg/agent/tunnelroute.go: a key set by a program would replace the
 * packet's route, and with it the path MTU the device learns). The
 * ingress program lets in only what a node may send: the outer source is a
 * known node (cni_tun_nodes) and the inner source is in that node's pod
 * CIDRs (cni_tun_cidrs) or one of its addresses. The stack routes both
 * ways, as it does host-gw traffic: its conntrack (Services, kube-proxy)
 * and PMTU see every packet.
 */
#pragma once

#include "endpoint.h"
#include "node.h"

#define TUN_VNI 1  /* every node sends one VNI (the routes' "id"); any is accepted */

/* The pod CIDR entry holding addr, NULL when no other node has one. */
static __always_inline struct tun_peer *tun_cidr_of(const void *addr, __u8 family)
{
	struct cidr_key k = { .prefixlen = family == AF_INET ? 64 : 160, .family = family };

	addr_copy(k.addr, addr, family);
	return bpf_map_lookup_elem(&cni_tun_cidrs, &k);
}

/*
 * Whether the packet's source lies in the pod CIDR of a node the agent
 * routes into the tunnel (TUN_PEER_ENCAP): those pods' packets arrive only
 * encapsulated. dst, when given, gets the destination address (16 bytes).
 * 0 for a packet too short or of another family.
 */
static __always_inline int tun_encap_source(struct __sk_buff *skb, __u8 family, __u8 *dst)
{
	__u8 src[16] = {};

	if (family == AF_INET) {
		struct iphdr *ip = pkt_ip4(skb);

		if (!ip)
			return 0;
		__builtin_memcpy(src, &ip->saddr, 4);
		if (dst)
			__builtin_memcpy(dst, &ip->daddr, 4);
	} else if (family == AF_INET6) {
		struct ipv6hdr *ip6 = pkt_ip6(skb);

		if (!ip6)
			return 0;
		__builtin_memcpy(src, &ip6->saddr, 16);
		if (dst)
			__builtin_memcpy(dst, &ip6->daddr, 16);
	} else {
		return 0;
	}
	struct tun_peer *p = tun_cidr_of(src, family);

	return p && (p->flags & TUN_PEER_ENCAP);
}

#ifndef EBPF_CNI_COMPAT
/* tun_redirect's search of cni_after_links for the tunnel device. */
struct tun_dev_search {
	__u32 ifindex;
};

static __attribute__((unused)) long tun_dev_cb(void *map, __u32 *ifindex, __u32 *what, struct tun_dev_search *s)
{
	if (*what & AFTER_LINK_TUNNEL) {
		s->ifindex = *ifindex;
		return 1;
	}
	return 0;
}

/*
 * Sends a packet a program translated (a hostPort reply, whose source is
 * now a node address: the stack would drop it as martian from a veth)
 * into the tunnel toward the node whose pod CIDR holds its destination, with the
 * tunnel key the route into the device carries: bpf_fib_lookup does not
 * resolve such a route (BPF_FIB_LKUP_RET_UNSUPP_LWT; fib is its query).
 * Returns the redirect, or -1 when the destination is no other node's pod
 * or there is no tunnel device.
 * Only this rare path (a pod of another node dialling a hostPort) pays the
 * search of cni_after_links (the uplinks and the device: a few entries).
 */
static __noinline __attribute__((unused)) int tun_redirect(struct __sk_buff *skb, struct bpf_fib_lookup *fib)
{
	struct tun_dev_search s = {};
	struct bpf_tunnel_key k = {};
	__u64 flags = BPF_F_DONT_FRAGMENT;
	__u8 dst[16] = {};
	struct tun_peer *p;

	if (fib->family == AF_INET)
		__builtin_memcpy(dst, &fib->ipv4_dst, 4);
	else
		__builtin_memcpy(dst, fib->ipv6_dst, 16);
	p = tun_cidr_of(dst, fib->family);
	if (!p)
		return -1;
	bpf_for_each_map_elem(&cni_after_links, tun_dev_cb, &s, 0);
	if (!s.ifindex)
		return -1;
	if (p->family == AF_INET) {
		__u32 a;

		__builtin_memcpy(&a, p->addr, 4);
		k.remote_ipv4 = bpf_ntohl(a);
	} else {
		__builtin_memcpy(k.remote_ipv6, p->addr, 16);
		flags |= BPF_F_TUNINFO_IPV6;
	}
	k.tunnel_id = TUN_VNI;
	k.tunnel_ttl = 64;
	if (!pkt_forward(skb, fib->family) || bpf_skb_set_tunnel_key(skb, &k, sizeof(k), flags))
		return -1;
	return bpf_redirect(s.ifindex, 0);
}

/*
 * Whether a hostPort reply, before its translation (f: as the pod sent it),
 * toward a pod CIDR routed into the tunnel is larger than that route's MTU:
 * the path MTU the agent learned and locked on it (docs/tunnel.md, MTU).
 * tun_redirect sends past the route, and the router's "fragmentation
 * needed" about the outer datagram reaches only the node, so nothing else
 * would tell the pod: its large replies were lost for good. Such a reply
 * goes to the stack untranslated instead, whose forwarding answers the pod
 * with "fragmentation needed" / "packet too big" about its own flow, and
 * drops it. IPv4 only with DF: the stack would fragment the rest, with the
 * pod's address. A GSO packet is judged by its segments' size. With
 * tot_len set, bpf_fib_lookup checks the route's MTU before it refuses the
 * tunnel route (FRAG_NEEDED before UNSUPP_LWT). Only replies toward a
 * tunnelled pod CIDR pay the lookup; the caller calls it in tunnel mode
 * only (node_tunnel_on).
 */
static __noinline __attribute__((unused)) int tun_reply_too_big(struct __sk_buff *skb, struct flow *f)
{
	struct bpf_fib_lookup p = {};
	struct tun_peer *t;
	__u32 len;

	t = tun_cidr_of(f->daddr, f->family);
	if (!t || !(t->flags & TUN_PEER_ENCAP))
		return 0;
	p.family = f->family;
	p.ifindex = skb->ifindex;
	p.l4_protocol = f->proto;
	p.sport = f->sport;
	p.dport = f->dport;
	if (f->family == AF_INET) {
		struct iphdr *ip = pkt_ip4(skb);

		if (!ip || !(ip->frag_off & bpf_htons(0x4000)))
			return 0;
		len = bpf_ntohs(ip->tot_len);
		p.tos = ip->tos;
		p.ipv4_src = ip->saddr;
		p.ipv4_dst = ip->daddr;
	} else {
		struct ipv6hdr *ip6 = pkt_ip6(skb);

		if (!ip6)
			return 0;
		len = sizeof(*ip6) + bpf_ntohs(ip6->payload_len);
		__builtin_memcpy(p.ipv6_src, &ip6->saddr, 16);
		__builtin_memcpy(p.ipv6_dst, &ip6->daddr, 16);
	}
	if (skb->gso_size) {
		__u32 hl = 8; /* UDP */

		if (f->proto == IPPROTO_TCP) {
			__u8 doff;

			if (bpf_skb_load_bytes(skb, f->l4off + 12, &doff, 1))
				return 0;
			hl = (doff >> 4) * 4;
		}
		len = f->l4off - ETH_HLEN + hl + skb->gso_size;
	}
	p.tot_len = len;
	return bpf_fib_lookup(skb, &p, sizeof(p), 0) == BPF_FIB_LKUP_RET_FRAG_NEEDED;
}
#endif

/* The id of the node that has addr, 0 when none. */
static __always_inline __u32 tun_node_of(const void *addr, __u8 family)
{
	struct ep_key k = { .family = family };

	addr_copy(k.addr, addr, family);
	__u32 *id = bpf_map_lookup_elem(&cni_tun_nodes, &k);
	return id ? *id : 0;
}

/* The inner source address and family of a packet, 0 when it has none. */
static __always_inline __u8 tun_inner(struct __sk_buff *skb, __u8 *src, __u8 *dst)
{
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = pkt_ip4(skb);

		if (!ip)
			return 0;
		__builtin_memcpy(src, &ip->saddr, 4);
		__builtin_memcpy(dst, &ip->daddr, 4);
		return AF_INET;
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = pkt_ip6(skb);

		if (!ip6)
			return 0;
		__builtin_memcpy(src, &ip6->saddr, 16);
		__builtin_memcpy(dst, &ip6->daddr, 16);
		return AF_INET6;
	}
	return 0;
}

/*
 * The outer source and destination of a decapsulated packet. The key's
 * local_ipv4/local_ipv6 (the outer destination) came with Linux 5.19;
 * older kernels refuse a key of that size (5.10: -EINVAL), and then only
 * the source is read (the layout before local_ipv4, what every kernel
 * since 4.x accepts) and *has_dst is 0. The tunnel device needs tcx
 * (6.6), so where the tunnel runs the destination is always there.
 */
#define TUN_KEY_SIZE offsetof(struct bpf_tunnel_key, local_ipv4)

static __always_inline __u8 tun_outer(struct __sk_buff *skb, __u8 *src, __u8 *dst, int *has_dst)
{
	struct bpf_tunnel_key key = {};

	*has_dst = 1;
	if (bpf_skb_get_tunnel_key(skb, &key, sizeof(key), 0) == 0) {
		__u32 a = bpf_htonl(key.remote_ipv4), l = bpf_htonl(key.local_ipv4);

		__builtin_memcpy(src, &a, 4);
		__builtin_memcpy(dst, &l, 4);
		return AF_INET;
	}
	if (bpf_skb_get_tunnel_key(skb, &key, sizeof(key), BPF_F_TUNINFO_IPV6) == 0) {
		__builtin_memcpy(src, key.remote_ipv6, 16);
		__builtin_memcpy(dst, key.local_ipv6, 16);
		return AF_INET6;
	}
	*has_dst = 0;
	if (bpf_skb_get_tunnel_key(skb, &key, TUN_KEY_SIZE, 0) == 0) {
		__u32 a = bpf_htonl(key.remote_ipv4);

		__builtin_memcpy(src, &a, 4);
		return AF_INET;
	}
	if (bpf_skb_get_tunnel_key(skb, &key, TUN_KEY_SIZE, BPF_F_TUNINFO_IPV6) == 0) {
		__builtin_memcpy(src, key.remote_ipv6, 16);
		return AF_INET6;
	}
	return 0;
}

/* Whether the outer destination is an address this node is known by
 * (cni_tun_self); 1 until the agent wrote them (HP_CFG_TUN_SELF), so a
 * program upgraded before its agent drops nothing genuine. */
static __always_inline int tun_to_self(const __u8 *dst, __u8 family)
{
	struct hp_config *c = node_config();
	struct ep_key k = { .family = family };

	if (!c || !(c->flags & HP_CFG_TUN_SELF))
		return 1;
	addr_copy(k.addr, dst, family);
	return bpf_map_lookup_elem(&cni_tun_self, &k) != NULL;
}

/* Counted on the tunnel device (cni_stats keyed by its ifindex), with an
 * event like a pod's drop. */
#define tun_drop(dir, reason) ({ count(skb->ifindex, dir, reason, skb->len); TC_ACT_SHOT; })

/* Ingress of the tunnel device: the trust rule. */
static __always_inline int tun_from(struct __sk_buff *skb)
{
	__u8 outer[16] = {}, odst[16] = {}, src[16] = {}, dst[16] = {};
	__u8 ofam, fam;
	int has_dst;

	fam = tun_inner(skb, src, dst);
	if (!fam)
		return tun_drop(DIR_INGRESS, REASON_DROP_PROTO);
	ofam = tun_outer(skb, outer, odst, &has_dst);
	__u32 sender = ofam ? tun_node_of(outer, ofam) : 0;
	if (!sender)
		return tun_drop(DIR_INGRESS, REASON_DROP_TUN_NODE);
	/* Sent to an address this node is not known by (a second address,
	 * an ExternalIP): no node encapsulates there, so it is a node's
	 * address put on someone else's datagram (a masquerade). */
	if (has_dst && !tun_to_self(odst, ofam))
		return tun_drop(DIR_INGRESS, REASON_DROP_TUN_SRC);
	struct tun_peer *p = tun_cidr_of(src, fam);
	if ((!p || p->node != sender) && tun_node_of(src, fam) != sender)
		return tun_drop(DIR_INGRESS, REASON_DROP_TUN_SRC);
	/* The inner destination MAC is the sending node's device's (NOARP:
	 * its own address): take it as ours, or the stack would drop it as
	 * another host's. */
	bpf_skb_change_type(skb, 0 /* PACKET_HOST */);
	return TC_ACT_OK;
}

/*
 * A datagram to a tunnel port (VXLAN 4789, Geneve 6081) found past any IPv6
 * extension headers: 1 with its addresses copied out, 0 when the packet is
 * none (not UDP, a later fragment, another port), -1 when its headers
 * cannot be read to the UDP port (a check treats that as one).
 */
#define TUN_PORT_VXLAN 4789
#define TUN_PORT_GENEVE 6081

/* The checks below are subprograms (their frames apart from the caller's,
 * which from_container keeps near the 512-byte limit); each program uses
 * some of them only. */
#define TUN_SUBPROG static __noinline __attribute__((unused))

static __always_inline int tun_dgram(struct __sk_buff *skb, __u8 family, __u8 *saddr, __u8 *daddr)
{
	__be16 dport;
	int off;

	if (family == AF_INET) {
		struct iphdr *ip = pkt_ip4(skb);

		if (!ip)
			return -1;
		if (ip->protocol != IPPROTO_UDP || (ip->frag_off & bpf_htons(0x1fff)))
			return 0;
		__builtin_memcpy(saddr, &ip->saddr, 4);
		__builtin_memcpy(daddr, &ip->daddr, 4);
		off = ETH_HLEN + ip->ihl * 4;
	} else {
		struct ipv6hdr *ip6 = pkt_ip6(skb);
		__u8 proto = 0;

		if (!ip6)
			return -1;
		__builtin_memcpy(saddr, &ip6->saddr, 16);
		__builtin_memcpy(daddr, &ip6->daddr, 16);
		/* TCP and UDP without extension headers, the bulk, skip the walk. */
		if (ip6->nexthdr == IPPROTO_UDP) {
			off = ETH_HLEN + sizeof(*ip6);
		} else {
			if (ip6->nexthdr == IPPROTO_TCP)
				return 0;
			off = ip6_l4(skb, ip6->nexthdr, &proto);
			if (off <= 0)
				return off;
			if (proto != IPPROTO_UDP)
				return 0;
		}
	}
	if (bpf_skb_load_bytes(skb, off + offsetof(struct udphdr, dest), &dport, sizeof(dport)))
		return -1;
	return dport == bpf_htons(TUN_PORT_VXLAN) || dport == bpf_htons(TUN_PORT_GENEVE);
}

/*
 * Whether a pod's packet, at its host veth, is a tunnel datagram to a node
 * (another node, or this one): dropped there. Once masqueraded it would
 * leave with this node's address and pass the receiving node's trust rule
 * with any source of this node's pod CIDRs. Only a datagram to a tunnel
 * port is looked up.
 */
TUN_SUBPROG int tun_from_pod(struct __sk_buff *skb, __u8 family)
{
	__u8 saddr[16] = {}, daddr[16] = {};

	if (!tun_dgram(skb, family, saddr, daddr))
		return 0;
	return tun_node_of(daddr, family) || is_node_ip(daddr, family);
}

/*
 * The same after the stack (to_uplink): a packet forwarded from a pod's
 * host veth (from, its ingress interface) that is a tunnel datagram,
 * whatever DNAT (a Service whose endpoint is a node's tunnel port, a
 * NodePort) and masquerade (kube-proxy's, already done) made of it. The
 * host veth saw only the destination the pod chose. TUN_FWD_NODE: to
 * another node's listed address, dropped always; TUN_FWD_OTHER: to any
 * other address, dropped in tunnel mode when it leaves with a node
 * address (to_uplink.c), for every address a node holds (a second one, an
 * ExternalIP) is decapsulated by that node's tunnel socket, and no list
 * names them all.
 */
#define TUN_FWD_NONE 0
#define TUN_FWD_NODE 1
#define TUN_FWD_OTHER 2

TUN_SUBPROG int tun_from_pod_forwarded(struct __sk_buff *skb, __u8 family, __u32 from)
{
	__u8 saddr[16] = {}, daddr[16] = {};

	if (!tun_dgram(skb, family, saddr, daddr) || !bpf_map_lookup_elem(&cni_links, &from))
		return TUN_FWD_NONE;
	return tun_node_of(daddr, family) ? TUN_FWD_NODE : TUN_FWD_OTHER;
}

/*
 * A tunnel datagram off the wire (an uplink's ingress, before the stack
 * decapsulates it) claiming a node's address as its outer source must have
 * been sent by the next hop toward that node: its Ethernet source must be
 * the MAC this node would send to that address through (the node's own on
 * a shared subnet, the gateway's for a routed one), as bpf_fib_lookup
 * finds it, on the link it came in by. A host on the link forging a
 * node's address from its own MAC is TUN_HOP_BAD; so are no route, a next
 * hop not resolved (the agent keeps it resolved: pkg/agent/tunnelhops.go)
 * and another link. TUN_HOP_OK: a genuine node's, which goes straight to
 * the stack's tunnel socket (no hostPort mapping of the tunnel port takes
 * it).
 *
 * The FIB lookup (with the node's rules: the agent's table 199 rule makes
 * it walk them) cost as much as the rest of from_uplink, for every
 * datagram, ACKs included; its answer for a node changes only with a
 * route or a neighbour. So a MAC it found is remembered (cni_tun_hops, by
 * link and addresses) for TUN_HOP_TTL_NS, and a datagram from that MAC
 * within it passes without asking again. Only a match is taken from there:
 * any other MAC is asked of the FIB, as before, so nothing is refused
 * that the FIB would accept, and what the FIB would refuse passes only
 * from the MAC it gave up to TUN_HOP_TTL_NS after a route or neighbour
 * changed (the kernel's own neighbour entry is trusted for seconds).
 */
#define TUN_HOP_NONE 0 /* no tunnel datagram claiming a node */
#define TUN_HOP_OK 1
#define TUN_HOP_BAD 2
#define TUN_HOP_TTL_NS 100000000ULL /* 100 ms */

/* Whether smac is the next hop toward the node at k->saddr as the FIB
 * says it (and remember the answer), or as it said less than
 * TUN_HOP_TTL_NS ago. from_uplink is near the verifier's 512-byte stack:
 * the lookup's parameters are the new entry's buffer afterwards. */
static __always_inline int tun_hop_mac_ok(struct __sk_buff *skb, const struct tun_hop_key *k, const __u8 *smac)
{
	__u8 hop[8] __attribute__((aligned(4))); /* mac_equal reads words */
	struct bpf_fib_lookup p __attribute__((aligned(8)));
	__u64 now = bpf_ktime_get_ns();

	struct tun_hop_val *v = bpf_map_lookup_elem(&cni_tun_hops, k);
	if (v && now - v->seen_ns < TUN_HOP_TTL_NS && mac_equal(smac, v->mac))
		return 1;
	/* Zeroed on a miss only: a hit (every datagram but one a TTL) never
	 * reads the 64 bytes. */
	__builtin_memset(&p, 0, sizeof(p));
	p.family = k->family;
	p.ifindex = skb->ifindex;
	if (k->family == AF_INET) {
		__builtin_memcpy(&p.ipv4_src, k->daddr, 4);
		__builtin_memcpy(&p.ipv4_dst, k->saddr, 4);
	} else {
		__builtin_memcpy(p.ipv6_src, k->daddr, 16);
		__builtin_memcpy(p.ipv6_dst, k->saddr, 16);
	}
	if (bpf_fib_lookup(skb, &p, sizeof(p), 0) != BPF_FIB_LKUP_RET_SUCCESS || p.ifindex != skb->ifindex)
		return 0;
	__builtin_memcpy(hop, p.dmac, 6);
	if (!mac_equal(smac, hop))
		return 0;
	struct tun_hop_val *nv = (struct tun_hop_val *)&p;
	nv->seen_ns = now;
	__builtin_memcpy(nv->mac, hop, 6);
	nv->pad[0] = nv->pad[1] = 0;
	bpf_map_update_elem(&cni_tun_hops, k, nv, BPF_ANY);
	return 1;
}

TUN_SUBPROG int tun_hop_check(struct __sk_buff *skb, __u8 family)
{
	struct tun_hop_key k = { .ifindex = skb->ifindex, .family = family };
	__u8 smac[8] __attribute__((aligned(4))); /* mac_equal reads words */

	if (!tun_dgram(skb, family, k.saddr, k.daddr) || !tun_node_of(k.saddr, family))
		return TUN_HOP_NONE;
	/* Turned off for underlays whose genuine datagrams come from another
	 * MAC than the next hop's (docs/tunnel.md): weaker, any host on the
	 * link may then claim a node. */
	struct hp_config *c = node_config();
	if (c && (c->flags & HP_CFG_TUN_NO_MAC))
		return TUN_HOP_OK;
	if (bpf_skb_load_bytes(skb, offsetof(struct ethhdr, h_source), smac, 6))
		return TUN_HOP_BAD;
	return tun_hop_mac_ok(skb, &k, smac) ? TUN_HOP_OK : TUN_HOP_BAD;
}

/*
 * A packet off the wire that is no genuine node's tunnel datagram, claiming
 * a source in a pod CIDR the agent routes into the tunnel (TUN_PEER_ENCAP):
 * this build's nodes send those pods' packets only encapsulated, where the
 * trust rule on the tunnel device judges them (their traffic to a node
 * address too: pkg/agent/tunnelnodes.go). To a pod, or anywhere but this
 * node's own addresses, it is a host on the link forging it, which IPv6
 * (no reverse-path check) and IPv4's loose rp_filter (the source is routed,
 * into the tunnel) would forward, and a NetworkPolicy admitting that node's
 * pod would admit: TUN_CLEAR_DROP. To an address of this node it is what a
 * node of the previous build sends (its pods' packets to other nodes'
 * addresses in the clear), which reaches no pod and no policy unless a
 * hostPort translates it (the caller drops those): TUN_CLEAR_NODE, as
 * host-gw mode lets it pass, so a rolling upgrade loses none of it
 * (docs/tunnel.md). A direct node's pod CIDR (hybrid mode) passes, as
 * host-gw's do. Called in tunnel mode only: one LPM lookup per packet, a
 * hash lookup for a tunnelled source.
 */
#define TUN_CLEAR_NONE 0
#define TUN_CLEAR_NODE 1
#define TUN_CLEAR_DROP 2

TUN_SUBPROG int tun_clear_peer_source(struct __sk_buff *skb, __u8 family)
{
	__u8 dst[16] = {};

	if (!tun_encap_source(skb, family, dst))
		return TUN_CLEAR_NONE;
	return is_node_ip(dst, family) ? TUN_CLEAR_NODE : TUN_CLEAR_DROP;
}
