/*
 * Per-pod rate limits: a token bucket per (host veth, direction), enforced by
 * the host-veth programs with no qdisc. This kernel has no sch_fq, so EDT
 * (setting skb->tstamp) would be ignored; a bucket that drops early keeps
 * latency low instead of queueing.
 *
 * Tokens are kept as nanoseconds of transmission time at the configured rate,
 * so the per-packet cost is a multiply and a shift: ns_per_byte is computed
 * once at ADD time. A packet is admitted whenever the bucket is not in debt and
 * then charged in full, so a 64 KiB GSO packet passes even when the bucket is
 * smaller than it; the rate over any interval stays exact and the overshoot is
 * bounded by the burst plus one packet.
 */
#pragma once

#include "maps.h"

struct bw_key {
	__u32 ifindex; /* host veth */
	__u32 dir;     /* enum cni_dir */
};

struct bw_state {
	struct bpf_spin_lock lock;
	__u32 mark_us; /* PROTOTYPE: CE-mark ECT packets once this much backlog (us) is queued; 0: never */
	__u64 ns_per_byte; /* 16.16 fixed point: (1e9 << 16) / bytes per second */
	__u64 burst_ns;    /* bucket depth, in ns at the rate */
	__s64 tokens_ns;   /* current fill; negative while paying off a packet */
	__u64 last_ns;     /* bpf_ktime_get_ns() of the last refill */
	__u64 rate_bps;    /* configured rate, bits per second (for dumps and CHECK) */
	__u64 burst_bits;  /* effective burst, bits (for dumps and CHECK) */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ENDPOINTS * 2);
	__type(key, struct bw_key);
	__type(value, struct bw_state);
} cni_bandwidth SEC(".maps");

/* Returns 1 to admit the packet, 0 to drop it, 2 to admit and CE-mark it.
 * Unlimited interfaces admit. */
static __always_inline int bw_admit_mark(__u32 ifindex, __u32 dir, __u32 len)
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
	if (ok && s->mark_us && (__s64)s->burst_ns - t > (__s64)s->mark_us * 1000)
		ok = 2;
	bpf_spin_unlock(&s->lock);
	return ok;
}

static __always_inline int bw_admit(__u32 ifindex, __u32 dir, __u32 len)
{
	return bw_admit_mark(ifindex, dir, len) != 0;
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
 * only on the netns this node's pods and the node itself live in.
 */
#define NETNS_F_NODE (1U << 0) /* the node's own netns (pods are reached from it) */

struct netns_info {
	__u64 egress_rate; /* bytes per second the netns' pod may send; 0: none */
	__u32 flags;
	__u32 ingress_wnd; /* receive window clamp of the pod's TCP sockets, bytes; 0: none */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ENDPOINTS + 1);
	__type(key, __u64); /* netns cookie */
	__type(value, struct netns_info);
} cni_netns SEC(".maps");
