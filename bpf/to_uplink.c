//go:build ignore

/*
 * Attached to tcx egress of the node's uplinks, beside from_uplink.c: the
 * masquerade SNAT (lib/masq.h), IPv4 and IPv6, after the sender's egress
 * NetworkPolicy (lib/policy.h). It runs after the stack
 * routed, filtered and NATed the packet (POSTROUTING), so kube-proxy's
 * Service DNAT and its own masquerade have happened already: a packet whose
 * source is no longer a pod's is left alone. Of the node's own packets (no
 * ingress interface) only ICMP errors are looked at: one about a reply the
 * node could not forward to a masquerading pod quotes the pod's address,
 * which the peer must see as the node's. A pod's tunnel datagram to another
 * node is dropped whatever the stack made of it (lib/tunnel.h). Everything
 * else goes on to the next tcx program of the link.
 */
#define CNI_PROG EV_PROG_TO_UPLINK
#include "lib/masq.h"
#include "lib/tunnel.h"

/*
 * Whether a pod's tunnel datagram to an address no node list names leaves
 * with a node address, in tunnel mode: the stack translated its source
 * (kube-proxy's masquerade; it is no pod's now), or this program would
 * masquerade it (outside the cluster CIDRs). Any address another node
 * holds decapsulates it, and the trust rule there takes a node's address
 * as the node. With its pod's own address it proves nothing and goes on
 * (a pod's VXLAN to a pod of a direct node in hybrid mode, to a host that
 * routes pod addresses).
 */
static __always_inline int tun_leaves_as_node(struct __sk_buff *skb, __u8 family, const struct ep_info *ep, __u32 from)
{
	if (!node_tunnel_on())
		return 0;
	if (!ep || ep->ifindex != from)
		return 1;
	if (!(ep->flags & EP_F_MASQ))
		return 0;
	if (family == AF_INET) {
		struct iphdr *ip = pkt_ip4(skb);

		return ip && !in_cluster((__u8 *)&ip->daddr, AF_INET);
	}
	struct ipv6hdr *ip6 = pkt_ip6(skb);

	return ip6 && !in_cluster((__u8 *)&ip6->daddr, AF_INET6);
}

SEC("tc")
int cni_to_uplink(struct __sk_buff *skb)
{
	__u32 from = skb->ingress_ifindex;
	struct ep_info *ep;
	__u8 family;
	int udp; /* may be a tunnel datagram (tun_dgram): TCP, the bulk, is none */

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = pkt_ip4(skb);

		if (!ip)
			return TCX_NEXT;
		if (!from) {
			if (ip->protocol == IPPROTO_ICMP && node_hooks_enabled() &&
			    masq_icmp_error_out(skb, AF_INET, 0) == TC_ACT_SHOT)
				return TC_ACT_SHOT;
			return TCX_NEXT;
		}
		family = AF_INET;
		udp = ip->protocol == IPPROTO_UDP;
		ep = ep_lookup4(ip->saddr);
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = pkt_ip6(skb);

		if (!ip6)
			return TCX_NEXT;
		if (!from) {
			if (ip6->nexthdr == IPPROTO_ICMPV6 && node_hooks_enabled() &&
			    masq_icmp_error_out(skb, AF_INET6, 0) == TC_ACT_SHOT)
				return TC_ACT_SHOT;
			return TCX_NEXT;
		}
		family = AF_INET6;
		udp = ip6->nexthdr != IPPROTO_TCP; /* UDP may follow extension headers */
		ep = ep_lookup6(&ip6->saddr);
	} else {
		return TCX_NEXT;
	}
	/* A pod's tunnel datagram to another node, as the stack's DNAT and
	 * masquerade left it, or to any address with a node's (lib/tunnel.h). */
	int tun = udp ? tun_from_pod_forwarded(skb, family, from) : TUN_FWD_NONE;
	if (tun == TUN_FWD_NODE || (tun == TUN_FWD_OTHER && tun_leaves_as_node(skb, family, ep, from))) {
		count(from, DIR_EGRESS, REASON_DROP_TUN_SRC, skb->len);
		return TC_ACT_SHOT;
	}
	/* Forwarded from the pod's own host veth, with its address: the
	 * source was checked there (from_container.c). Its egress policy is
	 * judged again with the destination the stack chose (lib/policy.h),
	 * before it is masqueraded. */
	if (!ep) {
		/* Not a pod's source: the stack may have masqueraded a pod's
		 * packet (kube-proxy), which is judged on its conntrack entry. */
		if (policy_on_node() && policy_after_snat(skb, family, from) == POL_DENY) {
			count(from, DIR_EGRESS, REASON_DROP_POLICY, skb->len);
			return TC_ACT_SHOT;
		}
		return TCX_NEXT;
	}
	if (ep->ifindex != from)
		return TCX_NEXT;
	if ((ep->flags & EP_F_POLICY) && policy_judge_after(skb, family, from, POL_J_EGRESS) == POL_DENY) {
		count(from, DIR_EGRESS, REASON_DROP_POLICY, skb->len);
		return TC_ACT_SHOT;
	}
	/* A traced pod's packet leaving, translated or not (its tuple shows
	 * the masquerade's entry). */
	if ((ep->flags & EP_F_MASQ) && masq_egress(skb, ep, family) == TC_ACT_SHOT)
		return TC_ACT_SHOT;
	ev_trace_point(skb, from, DIR_EGRESS, REASON_FORWARD, 0);
	return TCX_NEXT;
}

char __license[] SEC("license") = "Dual BSD/GPL";
