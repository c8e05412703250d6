/* Endpoint lookups and the same-node fast path shared by the host-veth programs. */
#pragma once

#include "maps.h"
#include "bandwidth.h"

static __always_inline struct ep_info *ep_lookup4(__be32 addr)
{
	struct ep_key k = { .family = AF_INET };

	*(__be32 *)k.addr = addr;
	return bpf_map_lookup_elem(&cni_endpoints, &k);
}

static __always_inline struct ep_info *ep_lookup6(const struct in6_addr *addr)
{
	struct ep_key k = { .family = AF_INET6 };

	__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(&cni_endpoints, &k);
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

/*
 * Deliver straight into the destination pod's netns: rewrite MACs to what the
 * pod would see from its gateway and skip the host stack.
 */
static __always_inline int redirect_to_endpoint(struct __sk_buff *skb, struct ethhdr *eth,
						const struct ep_info *dst)
{
	/* bpf_redirect_peer skips the destination host veth's egress hook, so its
	 * ingress limit and counters are applied here. */
	if ((dst->flags & EP_F_BW_INGRESS) && !bw_admit(dst->ifindex, DIR_INGRESS, skb->len)) {
		count(dst->ifindex, DIR_INGRESS, REASON_DROP_BANDWIDTH, skb->len);
		return TC_ACT_SHOT;
	}
	mac_copy(eth->h_source, dst->host_mac);
	mac_copy(eth->h_dest, dst->mac);
	count(dst->ifindex, DIR_INGRESS, REASON_REDIRECT, skb->len);
	return bpf_redirect_peer(dst->ifindex, 0);
}
