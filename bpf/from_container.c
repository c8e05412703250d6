//go:build ignore

/*
 * Attached to tcx ingress of the host-side veth: every packet the pod sends.
 * Enforces the pod's source IP, learns its MAC (see learn_mac), enforces its
 * egress rate limit, drops router advertisements and redirects, translates
 * hostPort traffic (replies back to what the client dialled, hairpin to a node
 * address:hostPort), short-cuts same-node pod-to-pod traffic with
 * bpf_redirect_peer (applying the destination's ingress limit), and hands
 * everything else to the kernel stack.
 */
#include "lib/neigh.h"
#include "lib/stackflow.h"

static __always_inline int drop(__u32 ifindex, __u8 reason, __u32 len)
{
	count(ifindex, DIR_EGRESS, reason, len);
	return TC_ACT_SHOT;
}

static __always_inline int pass(__u32 ifindex, __u32 len)
{
	count(ifindex, DIR_EGRESS, REASON_FORWARD, len);
	return TC_ACT_OK;
}

#define HP_CONTINUE -1

/*
 * hostPort work on a packet whose source checked out: a reply of a translated
 * flow (only pods with mappings have any) gets its source set back to what
 * the client dialled; a packet to a node address:hostPort (hairpin; dst_is_pod
 * rules that out) is DNATed to the mapping's pod. Returns the verdict of a
 * translated packet, or HP_CONTINUE, the packet untouched, for the normal path.
 */
static __always_inline int hostport_from_pod(struct __sk_buff *skb, __u8 family, __u32 src_flags, int dst_is_pod)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u32 ifindex = skb->ifindex;
	struct flow f = {};
	int rc = 0;

	if (family == AF_INET) {
		struct iphdr *ip = data + ETH_HLEN;

		if ((void *)(ip + 1) > data_end || flow_parse4(skb, ip, &f))
			return HP_CONTINUE;
	} else {
		struct ipv6hdr *ip6 = data + ETH_HLEN;

		if ((void *)(ip6 + 1) > data_end || flow_parse6(skb, ip6, &f))
			return HP_CONTINUE;
	}

	if (src_flags & EP_F_HOSTPORT) {
		rc = hostport_reverse(skb, &f, ifindex);
		if (rc < 0)
			goto error;
		if (rc)
			hp_count(HP_STAT_REPLY);
	}
	if (!rc) {
		if (dst_is_pod)
			return HP_CONTINUE;
		struct hostport_val *v = hostport_lookup(f.daddr, f.family, f.proto, f.dport, 0);
		if (!v)
			return HP_CONTINUE;
		if (f.proto == IPPROTO_UDP) {
			/* The pod answering a node address whose flow the stack
			 * delivered (a node socket, a masqueraded client) on a port
			 * that happens to be a hostPort: not a hairpin. */
			struct sf_key k;

			sf_key_sent(&k, &f);
			if (sf_lookup(&k, ifindex))
				return HP_CONTINUE;
		}
		/* Reaching its own hostPort, the pod must not see its own address
		 * as the source: SNAT to the dialled address. */
		rc = hostport_dnat(skb, &f, v, v->ifindex == ifindex);
		if (rc < 0)
			goto error;
		if (rc)
			return HP_CONTINUE;
		hp_count(HP_STAT_DNAT_HAIRPIN);
	}

	/* Translated. A pod of this node gets it directly; anything else leaves
	 * through the FIB's device (its source is a node address now, which the
	 * stack would take for a martian coming in from a veth). */
	struct ep_info *dst = ep_lookup_addr(f.daddr, f.family);
	if (!dst) {
		__u32 len = skb->len;

		rc = fib_redirect(skb, ifindex);
		if (rc != TC_ACT_SHOT)
			count(ifindex, DIR_EGRESS, REASON_FORWARD, len);
		return rc;
	}
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		goto error;
	if (family == AF_INET) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > data_end || ip->ttl <= 1)
			goto error;
		ttl_dec4(ip);
	} else {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end || ip6->hop_limit <= 1)
			goto error;
		ip6->hop_limit--;
	}
	count(ifindex, DIR_EGRESS, REASON_REDIRECT, skb->len);
	return redirect_to_endpoint(skb, eth, dst);
error:
	hp_count(HP_STAT_ERROR);
	return drop(ifindex, REASON_DROP_MALFORMED, skb->len);
}

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
	if (hostports_enabled() && ((src->flags & EP_F_HOSTPORT) || !dst)) {
		int rc = hostport_from_pod(skb, AF_INET, src->flags, dst != NULL);

		if (rc != HP_CONTINUE)
			return rc;
		data_end = (void *)(long)skb->data_end;
		eth = (void *)(long)skb->data;
		ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end)
			return drop(ifindex, REASON_DROP_MALFORMED, skb->len);
	}
	if (!dst || ip->ttl <= 1 || stack_flow_reply(skb, AF_INET, ifindex))
		return pass(ifindex, skb->len);

	/* We route, so decrement TTL; incremental checksum update as ip_decrease_ttl. */
	__u32 check = ip->check;
	check += bpf_htons(0x0100);
	ip->check = (__u16)(check + (check >= 0xFFFF));
	ip->ttl--;

	count(ifindex, DIR_EGRESS, REASON_REDIRECT, skb->len);
	return redirect_to_endpoint(skb, eth, dst);
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
	if (is_neigh_solicit(ip6, data_end)) {
		/* Only ND needs the link entry; other traffic never looks it up. */
		struct link_info *li = bpf_map_lookup_elem(&cni_links, &ifindex);
		if (li)
			return nd_or_pass(skb, li);
	}

	if ((src->flags & EP_F_BW_EGRESS) && !bw_admit(ifindex, DIR_EGRESS, skb->len))
		return drop(ifindex, REASON_DROP_BANDWIDTH, skb->len);

	struct ep_info *dst = ep_lookup6(&ip6->daddr);
	if (hostports_enabled() && ((src->flags & EP_F_HOSTPORT) || !dst)) {
		int rc = hostport_from_pod(skb, AF_INET6, src->flags, dst != NULL);

		if (rc != HP_CONTINUE)
			return rc;
		data_end = (void *)(long)skb->data_end;
		eth = (void *)(long)skb->data;
		ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > data_end)
			return drop(ifindex, REASON_DROP_MALFORMED, skb->len);
	}
	if (!dst || ip6->hop_limit <= 1 || stack_flow_reply(skb, AF_INET6, ifindex))
		return pass(ifindex, skb->len);

	ip6->hop_limit--;
	count(ifindex, DIR_EGRESS, REASON_REDIRECT, skb->len);
	return redirect_to_endpoint(skb, eth, dst);
}

static __always_inline int handle_arp(struct __sk_buff *skb, struct ethhdr *eth, void *data_end)
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
		return handle_arp(skb, eth, data_end);
	default:
		return drop(skb->ifindex, REASON_DROP_PROTO, skb->len);
	}
}

char __license[] SEC("license") = "Dual BSD/GPL";
