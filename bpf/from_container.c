//go:build ignore

/*
 * Attached to tcx ingress of the host-side veth: every packet the pod sends.
 * Enforces the pod's source IP, learns its MAC (see learn_mac), enforces its
 * egress rate limit, drops router advertisements and redirects, judges the
 * pod's egress NetworkPolicy, translates hostPort traffic (replies back to
 * what the client dialled, hairpin to a node address:hostPort), short-cuts
 * same-node pod-to-pod traffic with bpf_redirect_peer (applying the
 * destination's ingress policy and limit), and hands
 * everything else to the kernel stack. Each step is its feature's: see
 * lib/endpoint.h, lib/neigh.h, lib/bandwidth.h, lib/policy.h, lib/hostport.h
 * and lib/stackflow.h.
 */
#define CNI_PROG EV_PROG_FROM_CONTAINER
#include "lib/neigh.h"
#include "lib/hostport.h"
#include "lib/tunnel.h"

static __always_inline int handle_ipv4(struct __sk_buff *skb, struct ethhdr *eth, void *data_end)
{
	struct iphdr *ip = (void *)(eth + 1);
	__u32 ifindex = skb->ifindex;

	if ((void *)(ip + 1) > data_end)
		return drop(ifindex, REASON_DROP_MALFORMED, skb->len);

	struct ep_info *src = ep_lookup4(ip->saddr);
	if (!src || src->ifindex != ifindex)
		return drop(ifindex, REASON_DROP_SPOOF_IP, skb->len);
	if (!mac_equal(eth->h_source, src->mac) && !learn_mac(ifindex, src, eth->h_source))
		return drop(ifindex, REASON_DROP_SPOOF_MAC, skb->len);
	if (ip->protocol == IPPROTO_ICMP && router_msg4(skb, ip))
		return drop(ifindex, REASON_DROP_ROUTER_MSG, skb->len);
	if ((src->flags & EP_F_BW_EGRESS) && !bw_admit(ifindex, DIR_EGRESS, skb->len))
		return drop(ifindex, REASON_DROP_BANDWIDTH, skb->len);

	struct ep_info *dst = ep_lookup4(ip->daddr);
	/* Only UDP can be a tunnel datagram: TCP, the bulk, skips the call. */
	if (!dst && ip->protocol == IPPROTO_UDP && tun_from_pod(skb, AF_INET))
		return drop(ifindex, REASON_DROP_TUN_SRC, skb->len);
	__u32 hp_flags;
	if ((src->flags & EP_F_POLICY) && policy_egress(skb, AF_INET, ifindex, dst != NULL) == POL_DENY) {
		/* Final, but for a hostPort on a node address: judged on its
		 * backend only (hostport_from_pod, HP_F_DEFER). */
		if (dst || !node_hooks_enabled())
			return drop(ifindex, REASON_DROP_POLICY, skb->len);
		hp_flags = src->flags | HP_F_DEFER;
		goto hostport;
	}
	/* ADD's flag and the destination first: same-node traffic of a pod
	 * without hostPorts, the bulk, skips the node config's read. */
	if (((src->flags & EP_F_HOSTPORT) || !dst) && node_hooks_enabled()) {
		hp_flags = src->flags;
hostport:;
		int rc = hostport_from_pod(skb, AF_INET, hp_flags, dst != NULL);

		if (rc != HP_CONTINUE)
			return rc;
		/* Untouched, but the helpers it called may have moved the data. */
		eth = pkt_l3(skb, AF_INET);
		if (!eth)
			return drop(ifindex, REASON_DROP_MALFORMED, skb->len);
		ip = (void *)(eth + 1);
	}
	if (!dst || ip->ttl <= 1 || stack_flow_reply(skb, AF_INET, src, dst))
		return pass(ifindex, skb->len);

	/* We route, so decrement TTL. */
	ttl_dec4(ip);

	/* the destination's entry: a trace event's map entry */
	count_pkt(skb, ifindex, DIR_EGRESS, REASON_REDIRECT, skb->len, dst->ifindex);
	return redirect_to_endpoint(skb, eth, dst);
}

static __always_inline int handle_ipv6(struct __sk_buff *skb, struct ethhdr *eth, void *data_end)
{
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	__u32 ifindex = skb->ifindex;

	if ((void *)(ip6 + 1) > data_end)
		return drop(ifindex, REASON_DROP_MALFORMED, skb->len);

	if (is_link_local6(&ip6->saddr) || is_unspecified6(&ip6->saddr)) {
		/* Neighbour discovery and friends: link scope, never routed. Only the MAC is ours to check. */
		struct link_info *li = bpf_map_lookup_elem(&cni_links, &ifindex);
		if (!li)
			return drop(ifindex, REASON_DROP_UNKNOWN, skb->len);
		if (!mac_equal(eth->h_source, li->mac) && !learn_mac(ifindex, NULL, eth->h_source))
			return drop(ifindex, REASON_DROP_SPOOF_MAC, skb->len);
		if (router_msg6(skb, ip6->nexthdr))
			return drop(ifindex, REASON_DROP_ROUTER_MSG, skb->len);
		/* Link scope is no way around the pod's limit. No endpoint entry
		 * (and so no flag) here: the bucket is looked up, on these rare
		 * packets only. */
		if (!bw_admit(ifindex, DIR_EGRESS, skb->len))
			return drop(ifindex, REASON_DROP_BANDWIDTH, skb->len);
		/* Link-local unicast reaches the node's sockets: judged like any
		 * egress (ND and multicast pass, lib/policy.h). */
		if ((li->flags & EP_F_POLICY) && policy_judge(skb, AF_INET6, ifindex, POL_J_EGRESS) == POL_DENY)
			return drop(ifindex, REASON_DROP_POLICY, skb->len);
		return nd_or_pass(skb, li);
	}

	struct ep_info *src = ep_lookup6(&ip6->saddr);
	if (!src || src->ifindex != ifindex)
		return drop(ifindex, REASON_DROP_SPOOF_IP, skb->len);
	if (!mac_equal(eth->h_source, src->mac) && !learn_mac(ifindex, src, eth->h_source))
		return drop(ifindex, REASON_DROP_SPOOF_MAC, skb->len);
	/* TCP and UDP, the bulk, skip the header walk. */
	if (ip6->nexthdr != IPPROTO_TCP && ip6->nexthdr != IPPROTO_UDP && router_msg6(skb, ip6->nexthdr))
		return drop(ifindex, REASON_DROP_ROUTER_MSG, skb->len);
	/* Every packet the pod sends counts, neighbour solicitations too. */
	if ((src->flags & EP_F_BW_EGRESS) && !bw_admit(ifindex, DIR_EGRESS, skb->len))
		return drop(ifindex, REASON_DROP_BANDWIDTH, skb->len);
	if (is_neigh_solicit(ip6, data_end)) {
		/* Only ND needs the link entry; other traffic never looks it up. */
		struct link_info *li = bpf_map_lookup_elem(&cni_links, &ifindex);
		if (li)
			return nd_or_pass(skb, li);
	}

	struct ep_info *dst = ep_lookup6(&ip6->daddr);
	/* TCP is no tunnel datagram (other protocols may hide UDP behind
	 * extension headers): it skips the call. */
	if (!dst && ip6->nexthdr != IPPROTO_TCP && tun_from_pod(skb, AF_INET6))
		return drop(ifindex, REASON_DROP_TUN_SRC, skb->len);
	__u32 hp_flags;
	if ((src->flags & EP_F_POLICY) && policy_egress(skb, AF_INET6, ifindex, dst != NULL) == POL_DENY) {
		/* Final, but for a hostPort on a node address: judged on its
		 * backend only (hostport_from_pod, HP_F_DEFER). */
		if (dst || !node_hooks_enabled())
			return drop(ifindex, REASON_DROP_POLICY, skb->len);
		hp_flags = src->flags | HP_F_DEFER;
		goto hostport;
	}
	if (((src->flags & EP_F_HOSTPORT) || !dst) && node_hooks_enabled()) {
		hp_flags = src->flags;
hostport:;
		int rc = hostport_from_pod(skb, AF_INET6, hp_flags, dst != NULL);

		if (rc != HP_CONTINUE)
			return rc;
		eth = pkt_l3(skb, AF_INET6);
		if (!eth)
			return drop(ifindex, REASON_DROP_MALFORMED, skb->len);
		ip6 = (void *)(eth + 1);
	}
	if (!dst || ip6->hop_limit <= 1 || stack_flow_reply(skb, AF_INET6, src, dst))
		return pass(ifindex, skb->len);

	ip6->hop_limit--;
	/* the destination's entry: a trace event's map entry */
	count_pkt(skb, ifindex, DIR_EGRESS, REASON_REDIRECT, skb->len, dst->ifindex);
	return redirect_to_endpoint(skb, eth, dst);
}

SEC("tc")
int cni_from_container(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return drop(skb->ifindex, REASON_DROP_MALFORMED, skb->len);

	switch (eth->h_proto) {
	case bpf_htons(ETH_P_IP):
		return handle_ipv4(skb, eth, data_end);
	case bpf_htons(ETH_P_IPV6):
		return handle_ipv6(skb, eth, data_end);
	case bpf_htons(ETH_P_ARP):
		/* ARP counts against the pod's limit like any packet it sends
		 * (the bucket is looked up: no endpoint entry at hand). */
		if (!bw_admit(skb->ifindex, DIR_EGRESS, skb->len))
			return drop(skb->ifindex, REASON_DROP_BANDWIDTH, skb->len);
		return neigh_from_pod_arp(skb, eth, data_end);
	default:
		return drop(skb->ifindex, REASON_DROP_PROTO, skb->len);
	}
}

char __license[] SEC("license") = "Dual BSD/GPL";
