/*
 * Per-pod rate limits: a token bucket per (host veth, direction), enforced by
 * the host-veth programs.
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
 *
 * Ingress queue. A bucket alone starves TCP from senders this node cannot
 * pace (other hosts): at sub-millisecond RTTs no window slows a flow to the
 * rate, so it only learns from bursts of drops (0.3x of the limit measured,
 * docs/bandwidth.md). Where the kernel has HTB, ADD therefore puts a queue on
 * the host veth: an HTB class at the ingress rate that counts bytes as this
 * bucket does (skb->len, through a size table), fed after the to-pod
 * program. The bucket then mirrors the queue: burst_ns - tokens_ns is its
 * backlog in ns. The program decides what enters it: a packet is admitted
 * while the backlog is within queue_ns (the queue's capacity), dropped
 * beyond; over mark_ns of backlog ECN-capable packets are marked CE instead
 * of waiting for a drop. TCP senders that do not use ECN are held back by
 * the pod's receive window (below), so the queue stays at a few
 * milliseconds. Packets that do not enter the queue (same-node traffic
 * redirected into the pod) are only charged, against the burst as before.
 * Without HTB queue_ns is 0 and the bucket polices alone. EDT (skb->tstamp)
 * would need sch_fq on the device, which a node may not have.
 */
#pragma once

#include "maps.h"

/* skb->tc_index bit: a node hook translated the packet for a pod with an
 * ingress limit and sent it to the pod's host veth egress (deliver_to_pod,
 * endpoint.h) so it meets the queue like the stack's packets; to_container
 * clears it and records no stack flow for it. Nothing of the node's sets
 * tc_index (the dsmark/tcindex users are gone from the kernel); a pod that
 * sets it with tc programs of its own only keeps its own flows out of
 * cni_stack_flows (their Service replies then bypass conntrack). */
#define TC_INDEX_QUEUED 0x100

enum bw_verdict {
	BW_DROP = 0,
	BW_PASS = 1,
	BW_MARK = 2, /* pass, and mark CE if the packet is ECN-capable */
};

/* Charges a packet to a bucket. queued: the packet goes on into the host
 * veth's queue (if it has one), else straight into the pod. Unlimited
 * interfaces pass. */
static __always_inline enum bw_verdict bw_charge(__u32 ifindex, __u32 dir, __u32 len, int queued)
{
	struct bw_key k = { .ifindex = ifindex, .dir = dir };
	struct bw_state *s = bpf_map_lookup_elem(&cni_bandwidth, &k);

	if (!s)
		return BW_PASS;

	__u64 now = bpf_ktime_get_ns(); /* no helper calls under the lock */
	__s64 cost = (__s64)(((__u64)len * s->ns_per_byte) >> 16);
	enum bw_verdict v = BW_DROP;

	bpf_spin_lock(&s->lock);
	__s64 t = s->tokens_ns + (__s64)(now - s->last_ns);
	if (t > (__s64)s->burst_ns)
		t = s->burst_ns;
	s->last_ns = now;
	/* The least fill that still admits: not in debt, or for the queue its
	 * capacity of backlog (which may reach below zero when the requested
	 * burst is shorter). */
	__s64 floor = queued && s->queue_ns ? (__s64)s->burst_ns - (__s64)s->queue_ns : 0;
	if (t >= floor) {
		t -= cost;
		v = queued && s->queue_ns && (__s64)s->burst_ns - t > (__s64)s->mark_ns ? BW_MARK : BW_PASS;
	}
	s->tokens_ns = t;
	bpf_spin_unlock(&s->lock);
	return v;
}

/* Returns 1 to admit the packet, 0 to drop it (paths with no queue behind). */
static __always_inline int bw_admit(__u32 ifindex, __u32 dir, __u32 len)
{
	return bw_charge(ifindex, dir, len, 0) != BW_DROP;
}

/*
 * TCP pacing. A token bucket alone starves a single TCP flow when the RTT is
 * tiny (pod to pod, node to pod): no window is small enough to slow it down,
 * so it learns only from bursts of drops and timeouts. The sock_ops program
 * (sock_ops.c) therefore sets SO_MAX_PACING_RATE on the TCP sockets a limit
 * applies to; TCP paces itself (internal pacing, no fq needed) and the bucket
 * above stays the hard limit for everything else (UDP, senders on other hosts).
 *
 * Receive window. Senders on other hosts are not ours to pace; what bounds
 * their flight, and so the ingress queue above, is the window the pod
 * advertises. The same program clamps the receive window (TCP_WINDOW_CLAMP,
 * about 2 ms of the rate) of the TCP sockets of a pod with an ingress limit,
 * on connections with peers it does not pace, and puts the clamp back on the
 * socket's every outgoing segment because the kernel lifts it. The receive
 * buffer itself is left to the kernel's autotuning, so a reader that stalls
 * for a while does not close the window.
 *
 * The root-cgroup hook sees sockets of every netns on the machine, so it acts
 * only on the netns this node's pods and the node itself live in (cni_netns).
 */

/* The pod of this node at addr (family AF_INET or AF_INET6; IPv4 in the
 * first 4 bytes), if any. */
static __always_inline struct ep_info *bw_pod_at(__u32 family, const __u32 *addr)
{
	struct ep_key k = {};

	if (family == AF_INET) {
		k.family = AF_INET;
		*(__u32 *)k.addr = addr[0];
	} else if (family == AF_INET6) {
		k.family = AF_INET6;
		__builtin_memcpy(k.addr, addr, 16);
	} else {
		return NULL;
	}
	return bpf_map_lookup_elem(&cni_endpoints, &k);
}

/* Ingress limit of the pod at addr, in bytes per second; 0: none. */
static __always_inline __u64 bw_ingress_rate(__u32 family, const __u32 *addr)
{
	struct ep_info *ep = bw_pod_at(family, addr);

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
