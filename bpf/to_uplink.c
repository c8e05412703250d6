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

SEC("tc")
int cni_to_uplink(struct __sk_buff *skb)
{
	__u32 from = skb->ingress_ifindex;
	struct ep_info *ep;
	__u8 family;

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
		ep = ep_lookup6(&ip6->saddr);
	} else {
		return TCX_NEXT;
	}
	/* A pod's tunnel datagram to another node, as the stack's DNAT and
	 * masquerade left it (lib/tunnel.h). */
	if (tun_from_pod_forwarded(skb, family, from)) {
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
	if ((ep->flags & EP_F_POLICY) && policy_judge(skb, family, from, POL_J_EGRESS | POL_J_AFTER) == POL_DENY) {
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
