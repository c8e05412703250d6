//go:build ignore

/*
 * Attached to tcx ingress of the node's uplinks (links holding node
 * addresses; see pkg/datapath/hostport.go): traffic from other hosts.
 *
 *   - A reply of a masqueraded flow gets its destination set back to the pod
 *     and goes on to the stack, which delivers it (lib/masq.h).
 *   - A packet to a node address (or a mapping's hostIP) : hostPort is DNATed
 *     to the pod, its flow recorded in cni_ct for the replies (from_container.c
 *     translates those back), and delivered straight into the pod with
 *     bpf_redirect_peer.
 *
 * Everything else goes on untouched to the next tcx program of the link (the
 * stack when there is none): TCX_NEXT, never TC_ACT_OK, which would end the
 * chain for another tool's programs.
 */
#include "lib/masq.h"

static __always_inline int dnat(struct __sk_buff *skb, struct flow *f)
{
	struct hostport_val *v = hostport_lookup(f->daddr, f->family, f->proto, f->dport, 0);
	if (!v)
		return TCX_NEXT;
	struct ep_info *ep = ep_lookup_addr(v->pod_addr, f->family);
	if (!ep || ep->ifindex != v->ifindex)
		return TCX_NEXT; /* the pod is going away */

	int rc = hostport_dnat(skb, f, v, 0);
	if (rc < 0) {
		hp_count(HP_STAT_ERROR);
		return TC_ACT_SHOT;
	}
	if (rc)
		return TCX_NEXT;

	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return TC_ACT_SHOT;
	if (f->family == AF_INET) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > data_end)
			return TC_ACT_SHOT;
		ttl_dec4(ip);
	} else {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return TC_ACT_SHOT;
		ip6->hop_limit--;
	}
	hp_count(HP_STAT_DNAT_UPLINK);
	return redirect_to_endpoint(skb, eth, ep);
}

SEC("tc")
int cni_from_uplink(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct flow f = {};

	if (!hostports_enabled() || (void *)(eth + 1) > data_end)
		return TCX_NEXT;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		/* Replies of masqueraded flows first: their ports were allocated
		 * around the node's hostPorts. */
		int rc = masq_reverse(skb);
		if (rc != MASQ_CONTINUE)
			return rc;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		struct iphdr *ip = data + ETH_HLEN;

		/* TTL 1: not ours to forward; the stack answers. */
		if ((void *)(ip + 1) > data_end || ip->ttl <= 1 || flow_parse4(skb, ip, &f))
			return TCX_NEXT;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end || ip6->hop_limit <= 1 || flow_parse6(skb, ip6, &f))
			return TCX_NEXT;
	} else {
		return TCX_NEXT;
	}
	return dnat(skb, &f);
}

char __license[] SEC("license") = "Dual BSD/GPL";
