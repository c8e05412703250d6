//go:build ignore

/*
 * Attached to tcx egress of the host-side veth: every packet the kernel stack
 * sends to the pod, before the host veth's qdisc (a limited pod's ingress
 * queue). Addresses it to the pod's current MAC, applies the pod's ingress
 * rate limit, and records flows the stack delivered whose replies
 * must go back through it (see lib/stackflow.h). Same-node traffic
 * redirected with bpf_redirect_peer never
 * passes here; from_container counts it for the destination instead.
 */
#include "lib/masq.h"

/* Whether a masqueraded flow of the pod has this tuple: the packet is the
 * reply the uplink translated back, not a flow that came in. */
static __always_inline int masq_flow_exists(const struct flow *f)
{
	struct snat_key fk = { .family = AF_INET, .proto = f->proto, .dir = SNAT_DIR_FWD,
			       .port = f->dport, .peer_port = f->sport };

	*(__u32 *)fk.addr = *(const __u32 *)f->daddr;
	*(__u32 *)fk.peer_addr = *(const __u32 *)f->saddr;
	return bpf_map_lookup_elem(&cni_snat, &fk) != NULL;
}

static __always_inline void stack_flow_record(struct __sk_buff *skb, __u8 family)
{
	struct flow f = {};
	int kind = sf_parse(skb, &f, family);

	if (kind != SF_PKT_FLOW && kind != SF_PKT_OPEN)
		return;
	/* ICMP: only echo requests open something the pod answers. */
	if ((f.proto == IPPROTO_ICMP || f.proto == IPPROTO_ICMPV6) && kind != SF_PKT_OPEN)
		return;

	__u32 flags = 0;
	if (ep_lookup_addr(f.saddr, family)) {
		flags = SF_PEER_POD;
	} else if (f.proto == IPPROTO_UDP) {
		if (hostports_enabled() && is_node_ip(f.saddr, family)) {
			flags = SF_PEER_NODE;
		} else if (family == AF_INET) {
			struct ep_info *dst = ep_lookup_addr(f.daddr, family);

			if (dst && (dst->flags & EP_F_MASQ) && dst->ifindex == skb->ifindex && !masq_flow_exists(&f))
				flags = SF_INBOUND;
		}
	}
	if (!flags)
		return;

	struct sf_key k;
	__u64 now = bpf_ktime_get_ns();

	sf_key_delivered(&k, &f);
	struct sf_val *v = bpf_map_lookup_elem(&cni_stack_flows, &k);
	if (v && v->ifindex == skb->ifindex) {
		if ((v->flags & flags) != flags || now - v->seen_ns > NSEC) {
			v->flags |= flags;
			v->seen_ns = now;
		}
		return;
	}
	struct sf_val nv = { .ifindex = skb->ifindex, .flags = flags, .seen_ns = now };
	bpf_map_update_elem(&cni_stack_flows, &k, &nv, BPF_ANY);
}

SEC("tc")
int cni_to_container(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u32 ifindex = skb->ifindex;

	/* The node addresses the pod with the MAC its neighbour entry had at ADD
	 * time; the pod may have another by now (see learn_mac). Group
	 * destinations (broadcast ARP, ND multicast) are left alone. */
	if ((void *)(eth + 1) <= data_end && !(eth->h_dest[0] & 1)) {
		struct link_info *li = bpf_map_lookup_elem(&cni_links, &ifindex);

		if (li && !mac_equal(eth->h_dest, li->mac))
			mac_copy(eth->h_dest, li->mac);
	}
	/* The ingress queue's admission (lib/bandwidth.h); the helper marks only
	 * ECN-capable packets. */
	enum bw_verdict v = bw_charge(skb->ifindex, DIR_INGRESS, skb->len, 1);
	if (v == BW_DROP) {
		count(skb->ifindex, DIR_INGRESS, REASON_DROP_BANDWIDTH, skb->len);
		return TC_ACT_SHOT;
	}
	if (v == BW_MARK)
		bpf_skb_ecn_set_ce(skb);

	if (skb->protocol == bpf_htons(ETH_P_IP))
		stack_flow_record(skb, AF_INET);
	else if (skb->protocol == bpf_htons(ETH_P_IPV6))
		stack_flow_record(skb, AF_INET6);
	count(skb->ifindex, DIR_INGRESS, REASON_FORWARD, skb->len);
	return TC_ACT_OK;
}

char __license[] SEC("license") = "Dual BSD/GPL";
