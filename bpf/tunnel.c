//go:build ignore

/*
 * Attached to tcx ingress and egress of the node's tunnel device
 * (pkg/datapath/tunnel.go): the trust rule for what comes out of the
 * tunnel, the destination node of what goes in. See lib/tunnel.h.
 */
#include "lib/tunnel.h"

SEC("tc")
int cni_from_tunnel(struct __sk_buff *skb)
{
	return tun_from(skb);
}

SEC("tc")
int cni_to_tunnel(struct __sk_buff *skb)
{
	return tun_to(skb);
}

char __license[] SEC("license") = "Dual BSD/GPL";
