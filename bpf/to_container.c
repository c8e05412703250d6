//go:build ignore

/*
 * Attached to tcx egress of the host-side veth: every packet the kernel stack
 * sends to the pod. Applies the pod's ingress rate limit. Same-node traffic redirected with bpf_redirect_peer never
 * passes here; from_container counts it for the destination instead.
 */
#include "lib/bandwidth.h"

SEC("tc")
int cni_to_container(struct __sk_buff *skb)
{
	if (!bw_admit(skb->ifindex, DIR_INGRESS, skb->len)) {
		count(skb->ifindex, DIR_INGRESS, REASON_DROP_BANDWIDTH, skb->len);
		return TC_ACT_SHOT;
	}
	count(skb->ifindex, DIR_INGRESS, REASON_FORWARD, skb->len);
	return TC_ACT_OK;
}

char __license[] SEC("license") = "Dual BSD/GPL";
