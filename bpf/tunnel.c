//go:build ignore

/*
 * Attached to the node's tunnel device (pkg/datapath/tunnel.go): tcx
 * ingress, the trust rule for what comes out of the tunnel (see
 * lib/tunnel.h); tcx egress, the sender's egress NetworkPolicy on what a
 * pod of this node sends into it (lib/policy.h).
 */
#define CNI_PROG EV_PROG_TUNNEL
#include "lib/tunnel.h"
#include "lib/hostport.h"
#include "lib/policy.h"

/*
 * A hostPort dialled at this node's address by a pod of another node
 * comes out of the tunnel (pods' packets to node addresses are routed into
 * it: pkg/agent/tunnelnodes.go), not off an uplink: DNATed here as
 * from_uplink does (lib/hostport.h), after the trust rule, a fragment of
 * its UDP datagram too. So does an ICMP error about the hostPort pod's
 * reply to such a pod (that pod's port unreachable, its node's or a
 * router's "fragmentation needed"): translated into the hostPort pod, as
 * from_uplink translates one off the wire; before, it went to the node's
 * stack, for which it meant nothing. Only TCP, UDP, IPv6 fragments and
 * ICMP with TTL left pay the parse and the mapping lookup.
 */
static __always_inline int tun_hostport(struct __sk_buff *skb, __u8 family)
{
	struct flow f = {};
	__u8 ttl, proto;

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
	/* UDP may follow IPv6 extension headers (lib/hostport.h hp_ip6_chain). */
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP && proto != IPPROTO_FRAGMENT && proto != IPPROTO_ICMP &&
	    proto != IPPROTO_ICMPV6 && proto != IPPROTO_HOPOPTS && proto != IPPROTO_ROUTING && proto != IPPROTO_DSTOPTS)
		return TCX_NEXT;
	if (ttl <= 1 || !node_hooks_enabled())
		return TCX_NEXT;
	if (proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6) {
		struct icmp_err e = {};

		if (icmp_err_parse(skb, family, &e))
			return TCX_NEXT;
		int rc = hostport_icmp_error_in(skb, &e);
		return rc == HP_CONTINUE ? TCX_NEXT : rc;
	}
	long frag_id = 0;
	if (flow_parse(skb, family, &f, 0) && (frag_id = hp_frag_flow(skb, family, &f)) < 0)
		return TCX_NEXT;
	return hostport_from_uplink(skb, &f, frag_id);
}

SEC("tc")
int cni_from_tunnel(struct __sk_buff *skb)
{
	int rc = tun_from(skb);

	if (rc != TC_ACT_OK)
		return rc;
	if (skb->protocol == bpf_htons(ETH_P_IP))
		rc = tun_hostport(skb, AF_INET);
	else if (skb->protocol == bpf_htons(ETH_P_IPV6))
		rc = tun_hostport(skb, AF_INET6);
	else
		rc = TCX_NEXT;
	return rc == TCX_NEXT ? TC_ACT_OK : rc;
}

/*
 * A pod's packet the stack forwards into the tunnel, after kube-proxy's
 * DNAT, still carrying the pod's source: its egress policy judged with the
 * destination the stack chose, as to_uplink.c does on an uplink (a denial
 * from_container deferred is dropped here, not encapsulated). Nothing is
 * masqueraded into the tunnel (pod to pod keeps its address). The node's
 * own packets (no ingress interface) and every packet of a node without
 * networkPolicy cost one map lookup; a pod's forwarded packet adds its
 * endpoint lookup, and for a pod with policy the flow lookup of
 * policy_judge.
 */
SEC("tc")
int cni_to_tunnel(struct __sk_buff *skb)
{
	__u32 from = skb->ingress_ifindex;
	__u8 family;

	if (!from)
		return TCX_NEXT;
	if (skb->protocol == bpf_htons(ETH_P_IP))
		family = AF_INET;
	else if (skb->protocol == bpf_htons(ETH_P_IPV6))
		family = AF_INET6;
	else
		return TCX_NEXT;
	/* A pod's tunnel datagram to a node's address, which the stack's DNAT
	 * may have made of it, now that pods' packets to node addresses go
	 * into the tunnel (pkg/agent/tunnelnodes.go): dropped here as
	 * to_uplink drops it on an uplink (check 3, lib/tunnel.h). A forwarded
	 * packet pays a header test for it (a datagram to a tunnel port, a
	 * lookup of its destination). */
	if (tun_from_pod_forwarded(skb, family, from) == TUN_FWD_NODE) {
		count(from, DIR_EGRESS, REASON_DROP_TUN_SRC, skb->len);
		return TC_ACT_SHOT;
	}
	if (!policy_on_node())
		return TCX_NEXT;
	if (policy_after_stack(skb, family, from) == POL_DENY) {
		count(from, DIR_EGRESS, REASON_DROP_POLICY, skb->len);
		return TC_ACT_SHOT;
	}
	return TCX_NEXT;
}

char __license[] SEC("license") = "Dual BSD/GPL";
