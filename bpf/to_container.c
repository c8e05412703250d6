//go:build ignore

/*
 * Attached to tcx egress of the host-side veth: every packet the kernel stack
 * sends to the pod, before the host veth's qdisc (a limited pod's ingress
 * queue). Judges the pod's ingress NetworkPolicy, and the sender's egress
 * one when the stack forwarded a pod's packet here (lib/policy.h), addresses
 * it to the pod's current MAC, applies the pod's ingress rate limit, and records flows the stack delivered whose replies
 * must go back through it (see lib/stackflow.h). Same-node traffic
 * redirected with bpf_redirect_peer never passes here; from_container
 * counts it for the destination instead. hostPort traffic for a pod with an
 * ingress limit is sent here by the node hooks (deliver_to_pod), so it
 * meets the queue as the stack's does.
 */
#define CNI_PROG EV_PROG_TO_CONTAINER
#include "lib/stackflow.h"
#include "lib/tunnel.h"

/* Both policies a packet the stack delivers meets: the pod's ingress (its
 * link entry carries EP_F_POLICY), and the sender's egress when the stack
 * forwarded it from a pod's host veth (after its translation). First, on
 * nodes with networkPolicy, a forwarded packet claiming the address of a
 * pod of this node must have come in by that pod's host veth: from any
 * other link (one without a node address, where from_uplink, which drops
 * such packets, is not attached) it is forged, and the pod's peers' rules
 * trust that address. The sender's lookup is the one its egress judgement
 * needs anyway: no cost for the others. A node source is checked likewise,
 * where it is asked (pol_node_link), and a source before kube-proxy's SNAT
 * too (pol_fwd). */
static __always_inline int to_container_policy(struct __sk_buff *skb, const struct link_info *li)
{
	__u32 ifindex = skb->ifindex, from = skb->ingress_ifindex;
	const struct ep_info *src = NULL;
	__u8 family;

	if (skb->protocol == bpf_htons(ETH_P_IP))
		family = AF_INET;
	else if (skb->protocol == bpf_htons(ETH_P_IPV6))
		family = AF_INET6;
	else
		return TC_ACT_OK;
	int pol = from && policy_on_node();
	if (pol) {
		src = policy_source_ep(skb, family);
		/* Counted on the link it came in by, as from_uplink counts it. */
		if (src && src->ifindex != from) {
			count(from, DIR_INGRESS, REASON_DROP_SPOOF_IP, skb->len);
			return TC_ACT_SHOT;
		}
	}
	/* Sent by the node itself (no ingress interface): kubelet's probes.
	 * Forwarded: judged by its sender before any masquerade (lib/nfct.h). */
	if (li && (li->flags & EP_F_POLICY) &&
	    policy_judge(skb, family, ifindex, from ? POL_J_FWD : POL_J_NODE) == POL_DENY) {
		count(ifindex, DIR_INGRESS, REASON_DROP_POLICY, skb->len);
		return TC_ACT_SHOT;
	}
	if (pol && policy_after_stack_src(skb, family, from, src) == POL_DENY) {
		count(from, DIR_EGRESS, REASON_DROP_POLICY, skb->len);
		return TC_ACT_SHOT;
	}
	return TC_ACT_OK;
}

/*
 * Whether a packet the stack delivers to a pod claims a source in the pod
 * CIDR of a node reached through the tunnel (TUN_PEER_ENCAP) without having
 * come out of the tunnel device (from, its ingress interface), where the
 * trust rule judged it. Off the wire in the clear such a source passes
 * from_uplink only to a node address (TUN_CLEAR_NODE, the rolling
 * upgrade's), which no pod sees unless a stack DNAT carries it here
 * (kube-proxy's NodePort with externalTrafficPolicy Local, the portmap
 * plugin's hostPorts): a host on the link forging that node's pod. Called
 * in tunnel mode only, for a forwarded packet: a hash lookup of the
 * ingress link, and an LPM lookup of the source unless it is the tunnel.
 */
static __noinline int tun_clear_to_pod(struct __sk_buff *skb, __u32 from)
{
	/* The tunnel device first: in tunnel mode most pod traffic the stack
	 * delivers comes out of it, and then the LPM lookup is spared. */
	__u32 *what = bpf_map_lookup_elem(&cni_after_links, &from);

	if (what && (*what & AFTER_LINK_TUNNEL))
		return 0;
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return tun_encap_source(skb, AF_INET, NULL);
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return tun_encap_source(skb, AF_INET6, NULL);
	return 0;
}

SEC("tc")
int cni_to_container(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u32 ifindex = skb->ifindex;

	struct link_info *li = bpf_map_lookup_elem(&cni_links, &ifindex);
	__u32 from = skb->ingress_ifindex;

	/* Counted on the link it came in by, as from_uplink counts the same
	 * forgery to a pod's own address. A node hook's delivery (the queue
	 * bit) was judged there. */
	if (from && !(skb->tc_index & TC_INDEX_QUEUED) && node_tunnel_on() && tun_clear_to_pod(skb, from)) {
		count(from, DIR_INGRESS, REASON_DROP_TUN_SRC, skb->len);
		return TC_ACT_SHOT;
	}
	if (to_container_policy(skb, li) == TC_ACT_SHOT)
		return TC_ACT_SHOT;
	/* The node addresses the pod with the MAC its neighbour entry had at ADD
	 * time; the pod may have another by now (see learn_mac). Group
	 * destinations (broadcast ARP, ND multicast) are left alone. The policy
	 * helpers only read the packet: its pointers hold. */
	if ((void *)(eth + 1) <= data_end && !(eth->h_dest[0] & 1)) {
		if (li && !mac_equal(eth->h_dest, li->mac))
			mac_copy(eth->h_dest, li->mac);
	}
	/* Sent here by a node hook for the queue (deliver_to_pod), not by the
	 * stack: counted as redirected, no stack flow recorded. */
	__u32 ours = skb->tc_index & TC_INDEX_QUEUED;
	if (ours)
		skb->tc_index &= ~TC_INDEX_QUEUED;
	/* The ingress queue's admission (lib/bandwidth.h); the helper marks only
	 * ECN-capable packets. Whether the pod has a limit is known since its
	 * ADD: no lookup for those without one (LI_F_BW_KNOWN). */
	enum bw_verdict v = BW_PASS;
	if (!li || !(li->flags & LI_F_BW_KNOWN) || (li->flags & EP_F_BW_INGRESS))
		v = bw_charge(skb->ifindex, DIR_INGRESS, skb->len, 1);
	if (v == BW_DROP) {
		count(skb->ifindex, DIR_INGRESS, REASON_DROP_BANDWIDTH, skb->len);
		return TC_ACT_SHOT;
	}
	if (v == BW_MARK)
		bpf_skb_ecn_set_ce(skb);

	if (ours) {
		count(skb->ifindex, DIR_INGRESS, REASON_REDIRECT, skb->len);
		return TC_ACT_OK;
	}
	if (skb->protocol == bpf_htons(ETH_P_IP))
		stack_flow_record(skb, AF_INET);
	else if (skb->protocol == bpf_htons(ETH_P_IPV6))
		stack_flow_record(skb, AF_INET6);
	count(skb->ifindex, DIR_INGRESS, REASON_FORWARD, skb->len);
	return TC_ACT_OK;
}

char __license[] SEC("license") = "Dual BSD/GPL";
