/*
 * ARP and IPv6 neighbour solicitation responder for the pod's next hop.
 *
 * The pod's gateway address is assigned nowhere on the node: ADD installs a
 * permanent neighbour entry for it inside the pod. The kernel flushes even
 * permanent entries when the pod's MAC changes, and VM runtimes build the
 * guest network from the CNI result alone, so the host veth must also answer
 * "who has <gateway>" itself: with the host veth's MAC, for any address that
 * is not the pod's own, as a router on a point-to-point link would.
 */
#pragma once

#include "endpoint.h"

struct arp_eth {
	__be16 hrd;
	__be16 pro;
	__u8 hln;
	__u8 pln;
	__be16 op;
	__u8 sha[6];
	__be32 spa;
	__u8 tha[6];
	__be32 tpa;
} __attribute__((packed));

#define ARPOP_REQUEST_BE bpf_htons(1)
#define ARPOP_REPLY_BE bpf_htons(2)

/* Turns a validated ARP request into the reply and sends it back to the pod. */
static __always_inline int arp_respond(struct __sk_buff *skb, struct ethhdr *eth, struct arp_eth *arp,
				       const struct link_info *li)
{
	__be32 target = arp->tpa;

	arp->op = ARPOP_REPLY_BE;
	mac_copy(arp->tha, arp->sha);
	arp->tpa = arp->spa;
	mac_copy(arp->sha, li->host_mac);
	arp->spa = target;
	mac_copy(eth->h_dest, eth->h_source);
	mac_copy(eth->h_source, li->host_mac);
	/* Out of the host veth's egress, i.e. into the pod; to_container counts it. */
	return bpf_redirect(skb->ifindex, 0);
}

/* Neighbour advertisement as it goes on the wire after the IPv6 header. */
struct nd_na {
	__u8 type;
	__u8 code;
	__sum16 cksum;
	__be32 flags;
	struct in6_addr target;
	__u8 opt_type; /* 2: target link-layer address */
	__u8 opt_len;  /* in units of 8 bytes */
	__u8 opt_mac[6];
};

#define ND_NS_LEN 24 /* type, code, cksum, reserved, target */
#define NA_FRAME_LEN (sizeof(struct ethhdr) + sizeof(struct ipv6hdr) + sizeof(struct nd_na))

static __always_inline int is_neigh_solicit(const struct ipv6hdr *ip6, const void *data_end)
{
	const __u8 *icmp = (const void *)(ip6 + 1);

	return ip6->nexthdr == IPPROTO_ICMPV6 && (const void *)(icmp + 1) <= data_end && icmp[0] == 135;
}

/*
 * If the packet is a neighbour solicitation we should answer, rewrite it into
 * the advertisement and return the redirect verdict; otherwise return -1 and
 * leave it alone. The caller has validated the source.
 */
static __always_inline int ns_respond(struct __sk_buff *skb, const struct link_info *li)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	__u8 *icmp = (void *)(ip6 + 1);

	if ((void *)(icmp + ND_NS_LEN) > data_end)
		return -1;
	if (ip6->nexthdr != IPPROTO_ICMPV6 || icmp[0] != 135 /* NS */ || icmp[1] != 0 || ip6->hop_limit != 255)
		return -1;

	struct in6_addr target, solicitor;
	__builtin_memcpy(&target, icmp + 8, 16);
	__builtin_memcpy(&solicitor, &ip6->saddr, 16);

	/* Duplicate address detection (from ::) and the pod's own addresses are
	 * not ours to answer; link-local targets are the host veth's own, and the
	 * kernel answers those. */
	if (is_unspecified6(&solicitor) || is_link_local6(&target))
		return -1;
	struct ep_info *own = ep_lookup6(&target);
	if (own && own->ifindex == skb->ifindex)
		return -1;

	/* Resize to exactly one NA with a target link-layer option, then write it whole. */
	if (bpf_skb_change_tail(skb, NA_FRAME_LEN, 0))
		return -1;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	ip6 = (void *)(eth + 1);
	struct nd_na *na = (void *)(ip6 + 1);
	if ((void *)(na + 1) > data_end)
		return -1;

	mac_copy(eth->h_dest, eth->h_source);
	mac_copy(eth->h_source, li->host_mac);

	ip6->priority = 0;
	ip6->version = 6;
	ip6->flow_lbl[0] = ip6->flow_lbl[1] = ip6->flow_lbl[2] = 0;
	ip6->payload_len = bpf_htons(sizeof(struct nd_na));
	ip6->nexthdr = IPPROTO_ICMPV6;
	ip6->hop_limit = 255;
	__builtin_memcpy(&ip6->saddr, &target, 16);
	__builtin_memcpy(&ip6->daddr, &solicitor, 16);

	na->type = 136; /* NA */
	na->code = 0;
	na->cksum = 0;
	na->flags = bpf_htonl(0xe0000000); /* router, solicited, override */
	__builtin_memcpy(&na->target, &target, 16);
	na->opt_type = 2;
	na->opt_len = 1;
	mac_copy(na->opt_mac, li->host_mac);

	/* Pseudo-header (addresses, length, next header) plus the message. */
	__u32 sum = csum_add_words(&target, 8, 0);
	sum = csum_add_words(&solicitor, 8, sum);
	sum += bpf_htons(sizeof(struct nd_na));
	sum += bpf_htons(IPPROTO_ICMPV6);
	sum = csum_add_words(na, sizeof(struct nd_na) / 2, sum);
	na->cksum = csum_fold32(sum);

	return bpf_redirect(skb->ifindex, 0);
}

/* Answers a neighbour solicitation for the pod's next hop, else passes to the stack. */
static __always_inline int nd_or_pass(struct __sk_buff *skb, const struct link_info *li)
{
	__u32 ifindex = skb->ifindex, len = skb->len;
	int ret = ns_respond(skb, li);

	if (ret < 0)
		return pass(ifindex, len);
	count(ifindex, DIR_EGRESS, REASON_NEIGH_REPLY, len);
	return ret;
}

/* An ARP frame from the pod: checked like its IP packets (its MAC, its
 * address), answered when it asks for the next hop, else passed. */
static __always_inline int neigh_from_pod_arp(struct __sk_buff *skb, struct ethhdr *eth, void *data_end)
{
	struct arp_eth *arp = (void *)(eth + 1);
	__u32 ifindex = skb->ifindex;

	if ((void *)(arp + 1) > data_end)
		return drop(ifindex, REASON_DROP_MALFORMED, skb->len);
	if (arp->hrd != bpf_htons(1) || arp->pro != bpf_htons(ETH_P_IP) ||
	    arp->hln != 6 || arp->pln != 4)
		return drop(ifindex, REASON_DROP_PROTO, skb->len);

	struct link_info *li = bpf_map_lookup_elem(&cni_links, &ifindex);
	if (!li)
		return drop(ifindex, REASON_DROP_UNKNOWN, skb->len);
	/* The MAC the pod claims in ARP is the one it sends from. */
	if (!mac_equal(arp->sha, eth->h_source))
		return drop(ifindex, REASON_DROP_SPOOF_MAC, skb->len);
	struct ep_info *src = NULL;
	if (arp->spa != 0) { /* 0.0.0.0 is an address probe */
		src = ep_lookup4(arp->spa);
		if (!src || src->ifindex != ifindex)
			return drop(ifindex, REASON_DROP_SPOOF_IP, skb->len);
	}
	if (!mac_equal(eth->h_source, li->mac) && !learn_mac(ifindex, src, eth->h_source))
		return drop(ifindex, REASON_DROP_SPOOF_MAC, skb->len);
	if (arp->op == ARPOP_REQUEST_BE && arp->spa != 0 && arp->tpa != arp->spa) {
		/* Not a probe nor a gratuitous ARP: answer for the next hop, unless the
		 * pod asks for one of its own addresses. */
		struct ep_info *own = ep_lookup4(arp->tpa);
		if (!own || own->ifindex != ifindex) {
			count(ifindex, DIR_EGRESS, REASON_NEIGH_REPLY, skb->len);
			return arp_respond(skb, eth, arp, li);
		}
	}
	return pass(ifindex, skb->len);
}
