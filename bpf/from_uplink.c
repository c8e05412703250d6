//go:build ignore

/*
 * Attached to tcx ingress of the node's uplinks (links holding node
 * addresses; see pkg/datapath/hostport.go): traffic from other hosts. A
 * packet to a node address (or a mapping's hostIP) : hostPort is DNATed to
 * the pod, its flow recorded in cni_ct for the replies (from_container.c
 * translates those back), and delivered straight into the pod with
 * bpf_redirect_peer. Everything else goes on to the stack untouched.
 */
#include "lib/masq.h"

static __always_inline int dnat(struct __sk_buff *skb, struct flow *f)
{
	struct hostport_val *v = hostport_lookup(f->daddr, f->family, f->proto, f->dport, 0);
	if (!v)
		return TC_ACT_OK;
	struct ep_info *ep = ep_lookup_addr(v->pod_addr, f->family);
	if (!ep || ep->ifindex != v->ifindex)
		return TC_ACT_OK; /* the pod is going away */

	int rc = hostport_dnat(skb, f, v, 0);
	if (rc < 0) {
		hp_count(HP_STAT_ERROR);
		return TC_ACT_SHOT;
	}
	if (rc)
		return TC_ACT_OK;

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
		return TC_ACT_OK;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		/* TTL 1: not ours to forward; the stack answers. */
		if ((void *)(ip + 1) > data_end || ip->ttl <= 1)
			return TC_ACT_OK;
		/* Replies of masqueraded flows first: their ports were allocated
		 * around the node's hostPorts. */
		int rc = masq_reverse(skb);
		if (rc != MASQ_CONTINUE)
			return rc;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		ip = data + ETH_HLEN;
		if ((void *)(ip + 1) > data_end || flow_parse4(skb, ip, &f))
			return TC_ACT_OK;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end || ip6->hop_limit <= 1 || flow_parse6(skb, ip6, &f))
			return TC_ACT_OK;
	} else {
		return TC_ACT_OK;
	}
	return dnat(skb, &f);
}

char __license[] SEC("license") = "Dual BSD/GPL";
