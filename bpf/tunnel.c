//go:build ignore

/*
 * Attached to tcx ingress of the node's tunnel device
 * (pkg/datapath/tunnel.go): the trust rule for what comes out of the
 * tunnel. See lib/tunnel.h.
 */
#include "lib/tunnel.h"

SEC("tc")
int cni_from_tunnel(struct __sk_buff *skb)
{
	return tun_from(skb);
}

char __license[] SEC("license") = "Dual BSD/GPL";
