//go:build ignore

/*
 * Attached to tcx ingress of the node's uplinks (links holding node
 * addresses; see pkg/datapath/nodehooks.go): traffic from other hosts.
 *
 *   - A reply of a masqueraded flow gets its destination set back to the pod
 *     and goes on to the stack, which delivers it (lib/masq.h).
 *   - An ICMP error about a masqueraded flow likewise; one about a pod's
 *     hostPort reply goes straight into the pod (lib/hostport.h).
 *   - A packet to a node address (or a mapping's hostIP) : hostPort is DNATed
 *     to the pod, its flow recorded in cni_ct for the replies (from_container.c
 *     translates those back), and delivered straight into the pod with
 *     bpf_redirect_peer (lib/hostport.h).
 *
 * Everything else goes on untouched to the next tcx program of the link (the
 * stack when there is none): TCX_NEXT, never TC_ACT_OK, which would end the
 * chain for another tool's programs.
 */
#include "lib/masq.h"

static __always_inline int from_uplink(struct __sk_buff *skb, __u8 family)
{
	struct flow f = {};
	__u8 proto, ttl;

	/* Replies of masqueraded flows first: their ports were allocated
	 * around the node's hostPorts. */
	int rc = masq_reverse(skb, family);
	if (rc != MASQ_CONTINUE)
		return rc;

	if (family == AF_INET) {
		struct iphdr *ip = pkt_ip4(skb);

		if (!ip)
			return TCX_NEXT;
		proto = ip->protocol;
		ttl = ip->ttl;
	} else {
		struct ipv6hdr *ip6 = pkt_ip6(skb);

		if (!ip6)
			return TCX_NEXT;
		proto = ip6->nexthdr;
		ttl = ip6->hop_limit;
	}
	if (proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6) {
		struct icmp_err e = {};

		if (icmp_err_parse(skb, family, &e))
			return TCX_NEXT;
		rc = masq_icmp_error_in(skb, &e);
		if (rc != MASQ_CONTINUE)
			return rc;
		/* TTL 1: not ours to forward; the stack answers. */
		if (ttl <= 1)
			return TCX_NEXT;
		rc = hostport_icmp_error_in(skb, &e);
		return rc == HP_CONTINUE ? TCX_NEXT : rc;
	}
	if (ttl <= 1 || flow_parse(skb, family, &f, FLOW_NO_ECHO))
		return TCX_NEXT;
	return hostport_from_uplink(skb, &f);
}

SEC("tc")
int cni_from_uplink(struct __sk_buff *skb)
{
	if (!node_hooks_enabled())
		return TCX_NEXT;
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return from_uplink(skb, AF_INET);
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return from_uplink(skb, AF_INET6);
	return TCX_NEXT;
}

char __license[] SEC("license") = "Dual BSD/GPL";
