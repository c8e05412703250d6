//go:build ignore

/*
 * Attached to tcx ingress of the node's uplinks (links holding node
 * addresses; see pkg/datapath/nodehooks.go): traffic from other hosts.
 *
 *   - A reply of a masqueraded flow gets its destination set back to the pod
 *     and goes on to the stack, which delivers it (lib/masq.h).
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

SEC("tc")
int cni_from_uplink(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct flow f = {};

	if (!node_hooks_enabled() || (void *)(eth + 1) > data_end)
		return TCX_NEXT;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		/* Replies of masqueraded flows first: their ports were allocated
		 * around the node's hostPorts. */
		int rc = masq_reverse(skb);
		if (rc != MASQ_CONTINUE)
			return rc;
		struct iphdr *ip = pkt_ip4(skb);

		/* TTL 1: not ours to forward; the stack answers. */
		if (!ip || ip->ttl <= 1 || flow_parse4(skb, ip, &f))
			return TCX_NEXT;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end || ip6->hop_limit <= 1 || flow_parse6(skb, ip6, &f))
			return TCX_NEXT;
	} else {
		return TCX_NEXT;
	}
	return hostport_from_uplink(skb, &f);
}

char __license[] SEC("license") = "Dual BSD/GPL";
