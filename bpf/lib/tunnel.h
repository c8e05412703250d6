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

#define TUN_VNI 1  /* every node sends one VNI (the routes' "id"); any is accepted */

/* The pod CIDR entry holding addr, NULL when no other node has one. */
static __always_inline struct tun_peer *tun_cidr_of(const void *addr, __u8 family)
{
	struct cidr_key k = { .prefixlen = family == AF_INET ? 64 : 160, .family = family };

	addr_copy(k.addr, addr, family);
	return bpf_map_lookup_elem(&cni_tun_cidrs, &k);
}

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

/* The outer source of a decapsulated packet (key layout before local_ipv4:
 * what every kernel since 4.x accepts). */
#define TUN_KEY_SIZE offsetof(struct bpf_tunnel_key, local_ipv4)

static __always_inline __u8 tun_outer_src(struct __sk_buff *skb, __u8 *addr)
{
	struct bpf_tunnel_key key = {};

	if (bpf_skb_get_tunnel_key(skb, &key, TUN_KEY_SIZE, 0) == 0) {
		__u32 a = bpf_htonl(key.remote_ipv4);

		__builtin_memcpy(addr, &a, 4);
		return AF_INET;
	}
	if (bpf_skb_get_tunnel_key(skb, &key, TUN_KEY_SIZE, BPF_F_TUNINFO_IPV6) == 0) {
		__builtin_memcpy(addr, key.remote_ipv6, 16);
		return AF_INET6;
	}
	return 0;
}

/* Counted on the tunnel device (cni_stats keyed by its ifindex), with an
 * event like a pod's drop. */
#define tun_drop(dir, reason) ({ count(skb->ifindex, dir, reason, skb->len); TC_ACT_SHOT; })

/* Ingress of the tunnel device: the trust rule. */
static __always_inline int tun_from(struct __sk_buff *skb)
{
	__u8 outer[16] = {}, src[16] = {}, dst[16] = {};
	__u8 ofam, fam;

	fam = tun_inner(skb, src, dst);
	if (!fam)
		return tun_drop(DIR_INGRESS, REASON_DROP_PROTO);
	ofam = tun_outer_src(skb, outer);
	__u32 sender = ofam ? tun_node_of(outer, ofam) : 0;
	if (!sender)
		return tun_drop(DIR_INGRESS, REASON_DROP_TUN_NODE);
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
 * Whether a pod's packet is a tunnel datagram (UDP to the VXLAN or Geneve
 * port) for another node: dropped at the pod's host veth. Once
 * masqueraded it would leave with this node's address and pass the
 * receiving node's trust rule with any source of this node's pod CIDRs.
 * Only UDP to a node address is looked up (IPv6: the fixed header's
 * next header only).
 */
#define TUN_PORT_VXLAN 4789
#define TUN_PORT_GENEVE 6081

static __always_inline int tun_from_pod(struct __sk_buff *skb, __u8 family)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct udphdr *udp;
	const void *daddr;

	if (family == AF_INET) {
		struct iphdr *ip = data + ETH_HLEN;

		if ((void *)(ip + 1) > data_end || ip->protocol != IPPROTO_UDP || (ip->frag_off & bpf_htons(0x1fff)))
			return 0;
		udp = (void *)ip + ip->ihl * 4;
		daddr = &ip->daddr;
	} else {
		struct ipv6hdr *ip6 = data + ETH_HLEN;

		if ((void *)(ip6 + 1) > data_end || ip6->nexthdr != IPPROTO_UDP)
			return 0;
		udp = (void *)(ip6 + 1);
		daddr = &ip6->daddr;
	}
	if ((void *)(udp + 1) > data_end)
		return 0;
	if (udp->dest != bpf_htons(TUN_PORT_VXLAN) && udp->dest != bpf_htons(TUN_PORT_GENEVE))
		return 0;
	return tun_node_of(daddr, family) != 0;
}
