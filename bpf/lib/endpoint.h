/*
 * A pod's endpoint: its addresses (cni_endpoints), its host veth
 * (cni_links) and counters (cni_stats). Anti-spoofing, MAC learning, the
 * same-node fast path (bpf_redirect_peer) and the router messages a pod may
 * not send.
 */
#pragma once

#include "maps.h"
#include "pkt.h"
#include "bandwidth.h"
#include "events.h"
#include "policy.h"

/*
 * Every verdict on a pod's packet is counted here, and sends its events
 * (lib/events.h) from here: a new drop reason needs no event code. count()
 * and drop() are macros over the skb of the calling program, so call sites
 * stay as they were; drop_aux() carries a detail for the event (the policy
 * rule of a policy drop).
 */
static __always_inline void count_stats(__u32 ifindex, __u8 dir, __u8 reason, __u32 len)
{
	struct stats_key k = { .ifindex = ifindex, .dir = dir, .reason = reason };
	struct stats_val *v = bpf_map_lookup_elem(&cni_stats, &k);

	if (v) {
		/* Per-CPU value: no atomics needed. */
		v->packets++;
		v->bytes += len;
	} else {
		struct stats_val nv = { .packets = 1, .bytes = len };

		bpf_map_update_elem(&cni_stats, &k, &nv, BPF_NOEXIST);
	}
}

static __always_inline void count_pkt(struct __sk_buff *skb, __u32 ifindex, __u8 dir, __u8 reason, __u32 len,
				      __u32 aux)
{
	count_stats(ifindex, dir, reason, len);
	ev_packet(skb, ifindex, dir, reason, len, aux);
}

#define count(ifindex, dir, reason, len) count_pkt(skb, ifindex, dir, reason, len, 0)

/* Verdicts on a packet from the pod (host veth ingress), counted. */
static __always_inline int drop_pkt(struct __sk_buff *skb, __u32 ifindex, __u8 reason, __u32 len, __u32 aux)
{
	count_pkt(skb, ifindex, DIR_EGRESS, reason, len, aux);
	return TC_ACT_SHOT;
}

#define drop(ifindex, reason, len) drop_pkt(skb, ifindex, reason, len, 0)
#define drop_aux(ifindex, reason, len, aux) drop_pkt(skb, ifindex, reason, len, aux)

/*
 * A drop on a path with no stack to spare (the node hooks' translations,
 * whose callers sit at the 512-byte limit with policy_judge): counted out
 * of line, so the caller's frame does not grow by count_pkt's. Only drops
 * call it: the packets handed on pay nothing.
 */
static __noinline __attribute__((unused)) int drop_slow(struct __sk_buff *skb, __u32 ifindex, __u32 dir_reason)
{
	if (!skb)
		return TC_ACT_SHOT;
	/* Only drops come here: ev_packet_drop never calls the flow code,
	 * whose frame would not fit on top of this one's callers. */
	count_stats(ifindex, dir_reason >> 8, dir_reason & 0xff, skb->len);
	ev_packet_drop(skb, ifindex, dir_reason >> 8, dir_reason & 0xff, skb->len, 0);
	return TC_ACT_SHOT;
}

/* Counted in direction dir (DIR_EGRESS: from the pod) and dropped. */
#define drop_dir(ifindex, dir, reason) drop_slow(skb, ifindex, (__u32)(dir) << 8 | (reason))

static __always_inline int pass_pkt(struct __sk_buff *skb, __u32 ifindex, __u32 len)
{
	count_pkt(skb, ifindex, DIR_EGRESS, REASON_FORWARD, len, 0);
	return TC_ACT_OK;
}

#define pass(ifindex, len) pass_pkt(skb, ifindex, len)

/* An endpoint key in words: ep_key's bytes have no alignment, and clang
 * builds a zeroed one of them by shifts and byte moves; word stores are
 * one instruction each (every packet looks up two, issue 30). */
union ep_key_w {
	struct ep_key k;
	__u32 w[sizeof(struct ep_key) / 4];
};

static __always_inline struct ep_info *ep_lookup4(__be32 addr)
{
	union ep_key_w u = {};

	u.w[0] = addr;
	u.k.family = AF_INET;
	return bpf_map_lookup_elem(&cni_endpoints, &u.k);
}

static __always_inline struct ep_info *ep_lookup6(const struct in6_addr *addr)
{
	union ep_key_w u = {};

	__builtin_memcpy(u.w, addr, 16);
	u.k.family = AF_INET6;
	return bpf_map_lookup_elem(&cni_endpoints, &u.k);
}

static __always_inline struct ep_info *ep_lookup_addr(const __u8 *addr, __u8 family)
{
	union ep_key_w u = {};

	addr_copy(u.k.addr, addr, family);
	u.k.family = family;
	return bpf_map_lookup_elem(&cni_endpoints, &u.k);
}

/*
 * The pod's MAC is whatever the pod sends from. On a veth it authenticates
 * nothing (the source IP is checked against the ingress interface), and it
 * changes under us: a chained tuning plugin, a runtime, the workload. So the
 * datapath learns it from the pod's own frames (and from the gratuitous ARP
 * and unsolicited NAs the pod's kernel sends on a change, see ADD): cni_links
 * holds the pod's current MAC, each cni_endpoints entry the MAC its address
 * was last seen from. The per-packet check compares with the entry already
 * looked up (no extra lookup), only a change writes. Delivery: the stack's
 * packets get the cni_links MAC in to_container; redirected ones the entry's
 * (no lookup), which the receiving end of bpf_redirect_peer does not check:
 * an entry one change behind still delivered when this was built. A group
 * (multicast) source MAC is never a host's: such frames are dropped, not
 * learned.
 */
static __always_inline int learn_mac(__u32 ifindex, struct ep_info *ep, const __u8 *mac)
{
	if (mac[0] & 1)
		return 0;
	if (ep)
		mac_copy(ep->mac, mac);
	struct link_info *li = bpf_map_lookup_elem(&cni_links, &ifindex);
	if (li)
		mac_copy(li->mac, mac);
	return 1;
}

/*
 * Deliver straight into the destination pod's netns: rewrite MACs to what the
 * pod would see from its gateway and skip the host stack.
 */
static __always_inline int redirect_to_endpoint(struct __sk_buff *skb, struct ethhdr *eth,
						const struct ep_info *dst)
{
	/* bpf_redirect_peer skips the destination host veth's egress hook, so its
	 * ingress policy, limit and counters are applied here. */
	if ((dst->flags & EP_F_POLICY) && policy_ingress_redirect(skb, dst->ifindex) == POL_DENY) {
		count(dst->ifindex, DIR_INGRESS, REASON_DROP_POLICY, skb->len);
		return TC_ACT_SHOT;
	}
	if ((dst->flags & EP_F_BW_INGRESS) && !bw_admit(dst->ifindex, DIR_INGRESS, skb->len)) {
		count(dst->ifindex, DIR_INGRESS, REASON_DROP_BANDWIDTH, skb->len);
		return TC_ACT_SHOT;
	}
	mac_copy(eth->h_source, dst->host_mac);
	mac_copy(eth->h_dest, dst->mac);
	count_pkt(skb, dst->ifindex, DIR_INGRESS, REASON_REDIRECT, skb->len, skb->ifindex); /* entry: whence */
	return bpf_redirect_peer(dst->ifindex, 0);
}

/*
 * Delivers a packet a node hook translated (a hostPort client's, remote or
 * hairpin, an ICMP error about one) to a pod of this node. A pod with an
 * ingress limit gets it through its host veth's egress, as the stack's
 * packets: to_container admits it into the ingress queue, which
 * bpf_redirect_peer would skip (only the bucket would drop, and TCP from
 * other hosts starves on that: bandwidth.h). Others get it straight in.
 */
static __always_inline int deliver_to_pod(struct __sk_buff *skb, struct ethhdr *eth, const struct ep_info *dst)
{
	if (!(dst->flags & EP_F_BW_INGRESS))
		return redirect_to_endpoint(skb, eth, dst);
	mac_copy(eth->h_source, dst->host_mac);
	mac_copy(eth->h_dest, dst->mac);
	skb->tc_index |= TC_INDEX_QUEUED;
	return bpf_redirect(dst->ifindex, 0);
}

/*
 * Router advertisements and redirects are how a router reconfigures the hosts
 * of its link. A pod is no router: its RA would give the node (accept_ra=2, or
 * a node that is no router) a default route or prefix through the pod, its
 * redirect would reroute the node's traffic. Both are dropped, whatever
 * extension headers they hide behind; a chain of more extension headers than
 * any pod needs is dropped too, rather than left unread.
 */
#define ICMP6_ROUTER_ADVERT 134
#define ICMP6_REDIRECT 137
#define ICMP_REDIRECT 5
#define MAX_EXT_HEADERS 8

static __always_inline int router_msg6(struct __sk_buff *skb, __u8 nexthdr)
{
	__u32 off = ETH_HLEN + sizeof(struct ipv6hdr);

#pragma unroll
	for (int i = 0; i < MAX_EXT_HEADERS; i++) {
		switch (nexthdr) {
		case IPPROTO_ICMPV6: {
			__u8 type;

			if (bpf_skb_load_bytes(skb, off, &type, 1))
				return 0;
			return type == ICMP6_ROUTER_ADVERT || type == ICMP6_REDIRECT;
		}
		case IPPROTO_HOPOPTS:
		case IPPROTO_ROUTING:
		case IPPROTO_DSTOPTS: {
			__u8 h[2]; /* next header, length in 8 bytes beyond the first 8 */

			if (bpf_skb_load_bytes(skb, off, h, 2))
				return 0;
			nexthdr = h[0];
			off += ((__u32)h[1] + 1) * 8;
			break;
		}
		case IPPROTO_FRAGMENT: {
			__u8 h[4]; /* next header, reserved, offset and flags */

			if (bpf_skb_load_bytes(skb, off, h, 4))
				return 0;
			if ((h[2] << 5 | h[3] >> 3) != 0)
				return 0; /* not the first fragment: no ICMPv6 header here */
			nexthdr = h[0];
			off += 8;
			break;
		}
		default:
			return 0;
		}
	}
	return 1;
}

static __always_inline int router_msg4(struct __sk_buff *skb, const struct iphdr *ip)
{
	__u8 type;

	if (ip->protocol != IPPROTO_ICMP || (ip->frag_off & bpf_htons(0x1fff)))
		return 0;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + ip->ihl * 4, &type, 1))
		return 0;
	return type == ICMP_REDIRECT;
}
