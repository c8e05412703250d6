//go:build ignore

/*
 * Attached to tcx egress of the node's uplinks, beside from_uplink.c: the
 * masquerade SNAT (lib/masq.h). It runs after the stack routed, filtered and
 * NATed the packet (POSTROUTING), so kube-proxy's Service DNAT and its own
 * masquerade have happened already: a packet whose source is no longer a
 * pod's is left alone. The node's own packets (no ingress interface) cost one
 * field read. Everything goes on to the next tcx program of the link.
 */
#include "lib/masq.h"

SEC("tc")
int cni_to_uplink(struct __sk_buff *skb)
{
	__u32 from = skb->ingress_ifindex;

	if (!from || skb->protocol != bpf_htons(ETH_P_IP))
		return TCX_NEXT;

	struct iphdr *ip = pkt_ip4(skb);

	if (!ip)
		return TCX_NEXT;
	/* Forwarded from the pod's own host veth, with its address: the
	 * source was checked there (from_container.c). */
	struct ep_info *ep = ep_lookup4(ip->saddr);
	if (!ep || !(ep->flags & EP_F_MASQ) || ep->ifindex != from)
		return TCX_NEXT;
	int rc = masq_egress(skb, ep);
	if (rc == TC_ACT_SHOT)
		return rc;
	return TCX_NEXT;
}

char __license[] SEC("license") = "Dual BSD/GPL";
