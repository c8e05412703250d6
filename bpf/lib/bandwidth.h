/*
 * Per-pod rate limits: a token bucket per (host veth, direction), enforced by
 * the host-veth programs with no qdisc. EDT (setting skb->tstamp) needs sch_fq
 * on the device, which a node may not have; a bucket that drops early keeps
 * latency low instead of queueing.
 *
 * Tokens are kept as nanoseconds of transmission time at the configured rate,
 * so the per-packet cost is a multiply and a shift: ns_per_byte is computed
 * once at ADD time. A packet is admitted whenever the bucket is not in debt and
 * then charged in full, so a 64 KiB GSO packet passes even when the bucket is
 * smaller than it; the rate over any interval stays exact and the overshoot is
 * bounded by the burst plus one packet.
 *
 * Pods with a limit carry EP_F_BW_EGRESS / EP_F_BW_INGRESS in their endpoint
 * entries, so unlimited pods never look the bucket up on the redirect path.
 */
#pragma once

#include "maps.h"

/* Returns 1 to admit the packet, 0 to drop it. Unlimited interfaces admit. */
static __always_inline int bw_admit(__u32 ifindex, __u32 dir, __u32 len)
{
	struct bw_key k = { .ifindex = ifindex, .dir = dir };
	struct bw_state *s = bpf_map_lookup_elem(&cni_bandwidth, &k);

	if (!s)
		return 1;

	__u64 now = bpf_ktime_get_ns(); /* no helper calls under the lock */
	__s64 cost = (__s64)(((__u64)len * s->ns_per_byte) >> 16);
	int ok;

	bpf_spin_lock(&s->lock);
	__s64 t = s->tokens_ns + (__s64)(now - s->last_ns);
	if (t > (__s64)s->burst_ns)
		t = s->burst_ns;
	s->last_ns = now;
	ok = t >= 0;
	if (ok)
		t -= cost;
	s->tokens_ns = t;
	bpf_spin_unlock(&s->lock);
	return ok;
}

/*
 * TCP pacing. A token bucket alone starves a single TCP flow when the RTT is
 * tiny (pod to pod, node to pod): no window is small enough to slow it down,
 * so it learns only from bursts of drops and timeouts. The sock_ops program
 * (sock_ops.c) therefore sets SO_MAX_PACING_RATE on the TCP sockets a limit
 * applies to; TCP paces itself (internal pacing, no fq needed) and the bucket
 * above stays the hard limit for everything else (UDP, senders on other hosts).
 *
 * The root-cgroup hook sees sockets of every netns on the machine, so it acts
 * only on the netns this node's pods and the node itself live in (cni_netns).
 */

/* Ingress limit of the pod at addr (family AF_INET or AF_INET6; IPv4 in the
 * first 4 bytes), in bytes per second; 0: none. */
static __always_inline __u64 bw_ingress_rate(__u32 family, const __u32 *addr)
{
	struct ep_key k = {};
	struct ep_info *ep;

	if (family == AF_INET) {
		k.family = AF_INET;
		*(__u32 *)k.addr = addr[0];
	} else if (family == AF_INET6) {
		k.family = AF_INET6;
		__builtin_memcpy(k.addr, addr, 16);
	} else {
		return 0;
	}
	ep = bpf_map_lookup_elem(&cni_endpoints, &k);
	if (!ep || !(ep->flags & EP_F_BW_INGRESS))
		return 0;
	struct bw_key bk = { .ifindex = ep->ifindex, .dir = DIR_INGRESS };
	struct bw_state *s = bpf_map_lookup_elem(&cni_bandwidth, &bk);
	return s ? s->rate_bps / 8 : 0;
}

/*
 * The pacing rate of a TCP connection of a netns of this node (ns, its
 * cni_netns entry) to the remote address, in bytes per second: the lower of
 * the netns' pod's egress limit and the remote pod's ingress limit; 0: none.
 */
static __always_inline __u64 bw_pacing_rate(const struct netns_info *ns, __u32 family, const __u32 *remote)
{
	__u64 rate = ns->egress_rate;
	__u64 in = bw_ingress_rate(family, remote);

	if (in && (!rate || in < rate))
		rate = in;
	return rate;
}
