/*
 * The life cycle of a translated flow, the same for hostPort's cni_ct and
 * masquerade's cni_snat: a state kept from the packets seen (FLOW_F_* in
 * types.h), the timeout that state gives (conntrack's, shorter where a NAT
 * table shared by every pod of the node needs it), and a bpf_timer in each
 * entry that deletes it once it has been idle for that long. So a closed or
 * abandoned flow leaves the table within seconds, with or without the agent,
 * instead of waiting for the LRU to push it out (and with it, on a busy node,
 * live flows that were merely quiet).
 *
 * Timeouts (idle time, since the last packet either way):
 *   TCP   handshake not completed 120 s, established 1 h, closing (RST, or a
 *         FIN each way) 10 s; a SYN on a closing tuple opens it again;
 *   UDP   30 s, 120 s once replied and still in use 2 s after it began (a
 *         stream, as conntrack tells them apart);
 *   ICMP  echo 30 s.
 * An entry past its timeout is treated as absent even before its timer runs.
 * The compat build (EBPF_CNI_COMPAT: kernels without bpf_timer or bpf_loop,
 * docs/compat.md) arms no timer: such entries wait for a probe or the LRU.
 */
#pragma once

#include "pkt.h"

#define FLOW_TIMEOUT_TCP_OPENING (120 * NSEC)
#define FLOW_TIMEOUT_TCP (3600 * NSEC)
#define FLOW_TIMEOUT_UDP (30 * NSEC)
#define FLOW_TIMEOUT_UDP_STREAM (120 * NSEC)
#define FLOW_TIMEOUT_ICMP (30 * NSEC)
#define FLOW_TIMEOUT_CLOSING (10 * NSEC)
#define FLOW_STREAM_AFTER (2 * NSEC)

#ifndef CLOCK_MONOTONIC
#define CLOCK_MONOTONIC 1
#endif

#define FLOW_STATE_MASK (FLOW_F_REPLIED | FLOW_F_ASSURED | FLOW_F_STREAM | FLOW_F_FIN_ORIG | FLOW_F_FIN_REPLY | FLOW_F_CLOSING)

static __always_inline __u64 flow_timeout(__u32 flags, __u8 proto)
{
	if (flags & FLOW_F_CLOSING)
		return FLOW_TIMEOUT_CLOSING;
	if (proto == IPPROTO_TCP)
		return (flags & FLOW_F_ASSURED) ? FLOW_TIMEOUT_TCP : FLOW_TIMEOUT_TCP_OPENING;
	if (proto == IPPROTO_UDP)
		return (flags & FLOW_F_STREAM) ? FLOW_TIMEOUT_UDP_STREAM : FLOW_TIMEOUT_UDP;
	return FLOW_TIMEOUT_ICMP;
}

/* Whether an entry last used at seen_ns is past timeout to (a clock read
 * before seen_ns was written on another CPU is not). */
static __always_inline int flow_past(__u64 to, __u64 seen_ns, __u64 now)
{
	return now > seen_ns && now - seen_ns > to;
}

/* The time left before an entry last used at seen_ns is past timeout to. */
static __always_inline __u64 flow_left(__u64 to, __u64 seen_ns, __u64 now)
{
	if (now < seen_ns)
		return to;
	if (now - seen_ns >= to)
		return 0;
	return seen_ns + to - now;
}

static __always_inline int flow_expired(__u32 flags, __u8 proto, __u64 seen_ns, __u64 now)
{
	return flow_past(flow_timeout(flags, proto), seen_ns, now);
}

/*
 * The state after packet f of a flow created at created_ns (reply: it goes
 * the reply direction). Only the FLOW_F_* bits of cur change.
 */
static __always_inline __u32 flow_next(__u32 cur, const struct flow *f, int reply, __u64 created_ns, __u64 now)
{
	__u32 n = cur;

	if (reply)
		n |= FLOW_F_REPLIED;
	if (f->proto == IPPROTO_TCP) {
		__u8 fl = f->tcp_flags;

		if (fl & TCP_FLAG_RST) {
			n |= FLOW_F_CLOSING;
		} else if (!reply && f->syn_only) {
			/* A new connection on this tuple (the client port reused). */
			n &= ~FLOW_STATE_MASK;
		} else {
			if (fl & TCP_FLAG_FIN)
				n |= reply ? FLOW_F_FIN_REPLY : FLOW_F_FIN_ORIG;
			/* The originator's ACK of the reply's SYN-ACK. */
			if (!reply && (n & FLOW_F_REPLIED) && !(fl & TCP_FLAG_SYN))
				n |= FLOW_F_ASSURED;
		}
		if ((n & FLOW_F_FIN_BOTH) == FLOW_F_FIN_BOTH)
			n |= FLOW_F_CLOSING;
	} else if (f->proto == IPPROTO_UDP) {
		if ((n & FLOW_F_REPLIED) && now - created_ns > FLOW_STREAM_AFTER)
			n |= FLOW_F_STREAM;
	}
	return n;
}

/* The time left before an entry in state flags, last used at seen_ns, expires. */
static __always_inline __u64 flow_time_left(__u32 flags, __u8 proto, __u64 seen_ns, __u64 now)
{
	return flow_left(flow_timeout(flags, proto), seen_ns, now);
}
