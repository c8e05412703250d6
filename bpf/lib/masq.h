/*
 * Egress masquerade (the ptp/bridge "ipMasq"), IPv4 and IPv6: a pod flagged
 * EP_F_MASQ sending to a destination outside the cluster CIDRs
 * (cni_cluster_cidrs) leaves the node with the node address the FIB prefers
 * as its source and a port (ICMP echo: an id) allocated here; replies
 * arriving on an uplink are translated back. No iptables rule.
 *
 * The pod's packets take the kernel stack like any routed packet (PREROUTING
 * with kube-proxy's Service DNAT, FORWARD, POSTROUTING), and are translated
 * only as they leave:
 *
 *   - uplink tcx egress (to_uplink.c): masq_egress() takes packets the stack
 *     forwarded from a masquerading pod's host veth whose source is still the
 *     pod's (the stack did not SNAT it already), looks the flow up in cni_snat
 *     (forward entry), or allocates a port (snat_alloc), and rewrites the
 *     source address and port. An ICMP error the pod (or the node) sends
 *     about a reply it got is translated too (masq_icmp_error_out).
 *   - uplink tcx ingress (from_uplink.c): masq_reverse() finds the reverse
 *     entry of a reply and rewrites its destination back to the pod, as
 *     masq_icmp_error_in() does for an ICMP error about the pod's packets
 *     (fragmentation needed, packet too big, unreachable, time exceeded);
 *     the stack then delivers it, so conntrack sees both directions of the
 *     flow (kube-proxy drops what it finds INVALID; an error is RELATED) and
 *     reverses its own translations (a Service whose endpoint is outside
 *     the cluster).
 *
 * Ports (cni_masq_config, written at ADD): up to MASQ_RANGES ranges, by
 * default every port from 1024 but the node's ip_local_port_range and the
 * NodePort range, so the node's own connections never collide with a
 * masqueraded flow; a port with a node socket bound to it is skipped too. A
 * pod holds at most pod_limit ports towards one destination (address, port,
 * protocol; counted in cni_masq_share): at its limit it takes back the
 * quietest of its own, never another pod's, so no pod can starve the others
 * of ports to a busy server (a DNS server's :53). And a pod holds at most
 * its quota of flows in all (cni_masq_quota, counted in cni_masq_pods), so
 * that cni_snat never fills to where its LRU evicts: no pod, nor a host
 * outside making a pod answer datagrams, evicts another pod's flow.
 *
 * Entries carry the flow's state and the reverse one a timer (flowlife.h):
 * a flow idle past its timeout (10 s once closed, 60 s when the peer closed
 * first, 30 s for UDP that is no stream) is deleted, and treated as absent
 * meanwhile. DEL scans cni_snat for the pod's host veth.
 */
#pragma once

#include "hostport.h"
#include "tcpseq.h"

#define MASQ_PORT_MIN 61000 /* without a configuration: above the default ip_local_port_range */
#define MASQ_PORT_MAX 65535
#ifndef EBPF_CNI_COMPAT
#define MASQ_PROBES 64
#else
/* Without bpf_loop the verifier walks every probe: 64 exceed its 1M
 * instructions (the probes' outcomes multiply its states); with the
 * NetworkPolicy re-judging of deferred egress in to_uplink 8 no longer fit,
 * 4 do (TestCompatBuildLoads). A pod's flow
 * then finds no free port sooner when the node's ports are crowded. */
#define MASQ_PROBES 4
#endif
#define MASQ_REUSE_CLOSED (NSEC / 2) /* a closed flow quiet this long gives its port up */
/* A flow the peer closed first: the peer holds TIME_WAIT for the translated
 * tuple this long (Linux's TCP_TIMEWAIT_LEN), and refuses by PAWS a SYN on
 * it whose timestamps do not follow its last ones (another tuple's). */
#define MASQ_TIME_WAIT (60 * NSEC)
#define SNAT_STATE_MASK (FLOW_STATE_MASK | FLOW_F_PEER_FIRST)

/* flowlife.h's timeouts, but a flow the peer closed first lives
 * MASQ_TIME_WAIT, so that its node port goes to no other tuple meanwhile. */
static __always_inline __u64 snat_timeout(__u32 flags, __u8 proto)
{
	if ((flags & FLOW_F_CLOSING) && (flags & FLOW_F_PEER_FIRST))
		return MASQ_TIME_WAIT;
	return flow_timeout(flags, proto);
}

static __always_inline int snat_expired(__u32 flags, __u8 proto, __u64 seen_ns, __u64 now)
{
	return flow_past(snat_timeout(flags, proto), seen_ns, now);
}

static __always_inline __u64 snat_time_left(__u32 flags, __u8 proto, __u64 seen_ns, __u64 now)
{
	return flow_left(snat_timeout(flags, proto), seen_ns, now);
}

/* ------------------------------------------------- sequence tracking */

/*
 * What the pod already sent (attack20): an acknowledgement of a FIN's end
 * proves the peer took the FIN only if that end is sequence space the pod
 * had not used before, as conntrack's tcp_in_window keeps each side's end.
 * A FIN one below the pod's next sequence number is an old retransmission
 * to the peer, which drops it and answers with a duplicate ACK of exactly
 * its end. So fin20's flows keep in snat_seq.win the pod's highest end H
 * (its segments' seq + length, SYN and FIN one), where an older build kept
 * the pod's largest window: SNAT_POD_END in the flags, the four window
 * scale bits all set (a scale no TCP offers: at most 14). Such a flow's
 * moves of end are bounded by SNAT_SEQ_BOUND, the largest window a TCP may
 * offer, instead of the pod's (the peer's segments move end only in order,
 * and the pod's acks are its own). While the pod's FIN waits for the
 * peer's ack, H's place holds its end E, the highest.
 *
 * H moved on the pod's word alone (attack21): five data segments the peer
 * drops, each about 2^32/5 past the last, carried it round the sequence
 * space to one below the pod's next, and a FIN there was past it again. So
 * flows this build opens (SNAT_F_ACKED: FLOW_F_STREAM, which means
 * something for UDP only, on a TCP reverse entry with SNAT_POD_END) bound H
 * as conntrack's td_maxend bounds each side: by the other side's ack plus
 * its window. snat_seq.win holds A, the peer's highest ack of the pod's
 * data, moved only by the peer's segments at exactly its next sequence
 * number (a blind attacker outside must know it), by at most
 * SNAT_ACK_BOUND (snat_ack_move); H moves only to ends in
 * (H, A + SNAT_ACK_BOUND], and never lies behind A (then it is A). H (or E
 * while the FIN waits) is the low word of the forward entry's created_ns,
 * whose high word stays a time a little early (snat_stamp): the pod's path
 * has both entries in hand, the peer's looks the forward one up only while
 * the FIN waits (snat_fin_end).
 */
#define SNAT_POD_END SNAT_WS_MASK
#define SNAT_SEQ_BOUND (1U << 29)
#define SNAT_ACK_BOUND (1U << 30) /* past the largest window a TCP may offer, 65535 << 14 */
#define SNAT_F_ACKED FLOW_F_STREAM
#define SNAT_LOW_WORD 0xffffffffULL

/*
 * Flags written from both CPUs (masqrace30): the pod's path and the peer's
 * read an entry's flags, work (the tracking reads the packet), and wrote
 * back a copy, which lost a bit the other CPU set meanwhile (the pod's
 * SNAT_F_FIN_WAIT under the peer's tracking: its FIN never counted and the
 * flow kept its share; TestMasqFlagsTwoCPUs, tag review_repro). Each writer
 * now applies only what it changed: the bits set, the bits cleared. In the
 * full build (bpf_timer: 5.15) with BPF atomic or/and (5.12) on the 8
 * bytes at offset 16 (port, flags, ifindex: only flags change after the
 * insert; the 64-bit form, which clang emits at the objects' default
 * -mcpu); the compat build (5.10: no atomic or/and) with one read and
 * write of the current flags, a window of a few instructions instead of
 * the tracking's. v is the entry (struct snat_val or its head).
 */
_Static_assert(offsetof(struct snat_val, port) == 16 && offsetof(struct snat_val, flags) == 18 &&
		       offsetof(struct snat_val, ifindex) == 20,
	       "port, flags and ifindex share the 8 bytes at offset 16");
static __always_inline void snat_flags_apply(void *v, __u16 set, __u16 clr)
{
#ifndef EBPF_CNI_COMPAT
	__u64 *w = (__u64 *)((char *)v + 16);

	if (set)
		__sync_fetch_and_or(w, (__u64)set << 16);
	if (clr)
		__sync_fetch_and_and(w, ~((__u64)clr << 16));
#else
	__u16 *fl = (__u16 *)((char *)v + 18);

	*fl = (*fl | set) & ~clr;
#endif
}

/* snat_flags_apply of the change from before (what the caller read) to after. */
static __always_inline void snat_flags_write(void *v, __u16 before, __u16 after)
{
	snat_flags_apply(v, after & ~before, before & ~after);
}

/*
 * A FIN of the peer's out of order (reordered): the tracking's end moves
 * only with segments exactly in order, so a FIN arriving while a segment
 * taken out of order left end behind did not count, and the flow kept its
 * share of ports for its hour (masqrace30). Such a FIN, past end by at
 * most SNAT_ACK_BOUND, waits on the forward entry (SNAT_F_PEER_FIN) with
 * its end F in the low word of seen_ns (the high word stays the time:
 * snat_fwd_seen reads it as late as it may be, so the entry never expires
 * earlier; the reverse entry, which owns the timer, keeps its time). It
 * counts when the pod acknowledges exactly F: the pod's TCP acknowledges F
 * only once it received everything up to and with the FIN (a forged FIN at
 * another number is answered with the pod's own next number, never F), and
 * the pod cannot make a FIN of the peer's wait (its packets never reach
 * the peer's path). SNAT_F_PEER_FIN_ACKS: that FIN also acknowledged
 * exactly the end of the pod's waiting FIN (SNAT_F_FIN_WAIT), which then
 * counts with it. A later such FIN takes the place of the waiting one; a
 * SYN reopening the tuple forgets it. Forward TCP entries only: bits 9
 * and 10 are free there (a reverse entry's are SNAT_F_PEER_END and
 * SNAT_F_COUNTED).
 */
#define SNAT_F_PEER_FIN (1U << 9)
#define SNAT_F_PEER_FIN_ACKS (1U << 10)
/*
 * An RST of the peer's that the tracking did not count waits in the same
 * place (pkt31): SNAT_F_PEER_FIN with SNAT_F_PEER_RST, its sequence number
 * S in the low word of seen_ns. RFC 5961's rule stays (an RST merely in the
 * window closes nothing by itself), but the tracking's end can lag behind
 * the pod's next number (data taken out of order moves it only with the
 * pod's ACK of it), so an RST exactly at the pod's next number, which the
 * pod's TCP takes, was inexact here when it overtook that ACK: the flow
 * stayed established until its idle timeout. The pod's next ACK decides:
 * exactly S, sent before its TCP took the RST, counts it (FLOW_F_CLOSING);
 * any other not behind end (the pod's challenge ACK: its next number was
 * not S) drops it, so a forged RST cannot wait for the pod's data to reach
 * its number later; one behind end (sent before) leaves it waiting.
 * Forward TCP entries only: bit 11 is free there (a reverse entry's is
 * SNAT_F_UNSHARED). A FIN or RST waiting nearer end keeps its place; the
 * ACK of S counts only while end is behind S (attack31b).
 */
#define SNAT_F_PEER_RST (1U << 11)

/*
 * The room the last reverse lookup saw (masqout31): the pod's data
 * segment of an open fin21 flow looked the reverse entry up only for A
 * (snat_pod_end's bound on H) and its flags, 30-50 ns of the segment's
 * ~510 (docs/performance.md, round 20). SNAT_F_ROOM on the forward entry
 * says that at the flow's last lookup the reverse entry had the plain
 * state (SNAT_POD_END and SNAT_F_ACKED; no SNAT_F_FIN_WAIT, SNAT_F_UNSHARED,
 * FIN or RST) and H lay at most SNAT_ACK_BOUND - 2 * SNAT_ROOM_BLOCK ahead
 * of A. A only moves forward, so while H stays in the block of 2^24
 * sequence numbers it was in then, every end in that block is within
 * A + SNAT_ACK_BOUND: the pod's segment without SYN, FIN or RST, its end in
 * H's block, moves H there (snat_room_end) without the lookup. Any other
 * (another block, a state change, the note once a second, a FIN of the
 * peer's waiting) takes the lookup, which sets or clears the bit again
 * (snat_room_note). Forward TCP entries only: bit 12 is free there (a
 * reverse entry's bits 12-15 are SNAT_POD_END); older builds never set it
 * and leave it as they find it (their writes change state bits only).
 */
#define SNAT_F_ROOM (1U << 12)
#define SNAT_ROOM_BLOCK (1U << 24)

/* The forward entry's last use for its expiry: while a FIN of the peer's
 * waits, the latest time its seen_ns may stand for. */
static __always_inline __u64 snat_fwd_seen(const struct snat_val *fv)
{
	return (fv->flags & SNAT_F_PEER_FIN) ? fv->seen_ns | SNAT_LOW_WORD : fv->seen_ns;
}

static __always_inline int snat_has_pod_end(__u32 fl)
{
	return (fl & SNAT_POD_END) == SNAT_POD_END;
}

static __always_inline int snat_has_ack(__u32 fl)
{
	return snat_has_pod_end(fl) && (fl & SNAT_F_ACKED);
}

/*
 * A forward entry's created_ns holding h in its low word: its high word
 * is t's (real: t is a time, so one 2^32 ns less), so the whole is never
 * later than the flow's creation (by at most 8.6 s earlier): a build that
 * reads it as a time (node_ips_gone, masq_known) checks the node address of
 * a few more flows, never fewer. This build reads only the high word.
 */
static __always_inline __u64 snat_stamp(__u64 t, int real, __u32 h)
{
	__u64 hi = t & ~SNAT_LOW_WORD;

	if (real)
		hi = hi >= (1ULL << 32) ? hi - (1ULL << 32) : 0;
	return hi | h;
}

/* When the forward entry fv of a flow (proto) was made, or a little
 * earlier: a fin21 TCP flow's (SNAT_F_ACKED on it too) stamp's high word,
 * its time at most 4.3 s early. */
static __always_inline __u64 snat_born(const struct snat_val *fv, __u8 proto)
{
	__u64 hi = fv->created_ns & ~SNAT_LOW_WORD;

	if (proto != IPPROTO_TCP || !(fv->flags & SNAT_F_ACKED))
		return fv->created_ns;
	return hi ? hi + (1ULL << 32) : 0;
}

/*
 * A fin21 flow's: the peer's segment f moves A (snat_seq.win) to its ack
 * when it starts exactly at the peer's next sequence number (end) and
 * acknowledges at most SNAT_ACK_BOUND past A. Read in place (every segment,
 * pure ACKs too: an upload's are all pure); headers out of the linear data
 * leave A behind, which only bounds H lower.
 */
static __always_inline void snat_ack_move(struct __sk_buff *skb, const struct flow *f, struct snat_seq *q)
{
	void *data = tseq_data(skb);
	void *data_end = tseq_data_end(skb);
	__u32 off = f->l4off;
	__u8 *t = data + (off & 0xff); /* bounded for the verifier, as flow_l4 */

	if ((f->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_RST | TCP_FLAG_ACK)) != TCP_FLAG_ACK || off > 0xff ||
	    (void *)(t + 12) > data_end)
		return;
	__u32 a = bpf_ntohl(*(__be32 *)(t + 8));

	if (bpf_ntohl(*(__be32 *)(t + 4)) == q->end && a - q->win - 1 < SNAT_ACK_BOUND)
		q->win = a;
}

/* A fin21 flow's H after a segment of the pod's ending at end, A being a:
 * only within (H, a + SNAT_ACK_BOUND], and never behind a. */
static __always_inline __u32 snat_end_move(__u32 h, __u32 a, __u32 end)
{
	__u32 o = end - a;

	if (h - a > SNAT_ACK_BOUND)
		h = a;
	return o <= SNAT_ACK_BOUND && o > h - a ? end : h;
}

/*
 * The pod's segment f (not a SYN) of a flow with SNAT_POD_END: H follows
 * its highest end (fin20's flows: in win; fin21's: in *created, bounded
 * by A). While its FIN waits, a segment without a FIN whose data reaches
 * the FIN's end used the FIN's place for data: the FIN was not the pod's
 * TCP's (a raw one sent ahead of data, which the peer drops once the data
 * fills the hole): it no longer waits. Read in place (every segment
 * carrying data comes here).
 */
static __noinline void snat_pod_end(struct __sk_buff *skb, const struct flow *f, struct snat_val *rv,
				   struct snat_val *fv)
{
	struct tcp_seg *sp = tcp_seg_scratch();
	struct snat_seq *q = snat_seq_of(rv);

	if (!sp || !snat_has_pod_end(rv->flags) || tcp_seg_load_in_place(skb, f, sp) || sp->end == sp->seq)
		return;
	__u32 fl = rv->flags;
	__u64 c = fv->created_ns;
	__u32 h = snat_has_ack(fl) ? (__u32)c : q->win;
	__s32 d = (__s32)(sp->end - h);

	if ((fl & SNAT_F_FIN_WAIT) && !(sp->flags & TCP_FLAG_FIN) && d >= 0)
	{
		fl &= ~SNAT_F_FIN_WAIT;
		snat_flags_apply(rv, 0, SNAT_F_FIN_WAIT);
	}
	if (!snat_has_ack(fl)) {
		if (d > 0)
			q->win = sp->end;
	} else if (!(fl & SNAT_F_FIN_WAIT)) {
		__u32 n = snat_end_move(h, q->win, sp->end);

		if (n != h)
			fv->created_ns = (c & ~SNAT_LOW_WORD) | n;
	}
}

/* snat_seq_pod's SYN, tracked (its state fl): the flow is fin21's. Out of
 * line: snat_alloc's frame is at the bottom of to_uplink's deepest chain. */
static __noinline void snat_seq_syn(struct snat_val *rv, __u32 b, __u32 fl, struct snat_val *fv)
{
	struct tcp_seg *sp = tcp_seg_scratch();

	if (!sp) {
		snat_flags_write(rv, b, fl);
		return;
	}
	snat_flags_write(rv, b, fl | SNAT_POD_END | SNAT_F_ACKED);
	snat_seq_of(rv)->win = sp->end;
	if (fv) {
		fv->created_ns = snat_stamp(fv->created_ns, !(fv->flags & SNAT_F_ACKED), sp->end);
		snat_flags_apply(fv, SNAT_F_ACKED, 0);
	}
}

/* The masquerade's: the pod's segment f of the flow whose reverse entry is
 * rv (*created: its forward entry's created_ns). While its FIN waits for
 * the peer's ack, the pod's segments move end no more (a SYN reopening the
 * tuple starts afresh), nor, in a flow before fin20's (no SNAT_POD_END),
 * the window in win (the FIN's end). The pod's SYN (re)opens the flow as
 * fin21's: A and H its end (what its SYN-ACK acknowledges, or less when
 * the peer refuses the data of a fast open: A ahead of the peer's acks
 * moves no more until they pass it, and H is the pod's end anyway). In
 * snat_alloc (created NULL) the forward entry is made after. */
static __always_inline void snat_seq_pod(struct __sk_buff *skb, const struct flow *f, struct snat_val *rv,
					 struct snat_val *fv)
{
	__u32 fl = rv->flags, b = fl;
	struct snat_seq *q = snat_seq_of(rv);

	if (f->syn_only) {
		fl &= ~SNAT_F_FIN_WAIT;
	} else if (snat_has_pod_end(fl)) {
		if (!(fl & SNAT_F_FIN_WAIT)) {
			/* The bound in win's place in a copy, never in the
			 * entry: the peer's path on another CPU reads win (A)
			 * meanwhile, and the bound there once made it take the
			 * pod's FIN for old data and move H to the bound (the
			 * flow never closed: TestAttack23MasqShareReopenedTuple). */
			__u32 e = q->end;
			struct snat_seq t = { .end = e, .win = SNAT_SEQ_BOUND };

			tcp_seq_local(skb, f, &t, &fl, 8, tcp_seg_scratch());
			if (t.end != e)
				q->end = t.end;
			snat_flags_write(rv, b, fl | SNAT_POD_END);
		}
		snat_pod_end(skb, f, rv, fv);
		return;
	} else if (fl & SNAT_F_FIN_WAIT) {
		return;
	}
	tcp_seq_local(skb, f, q, &fl, 8, tcp_seg_scratch());
	if (f->syn_only && (fl & SNAT_F_SEQ))
		snat_seq_syn(rv, b, fl, fv);
	else
		snat_flags_write(rv, b, fl);
}

/*
 * The pod's FIN counts only once the peer acknowledged it, as the peer's
 * TCP takes it (conntrack's tcp_in_window, in the small): a FIN the peer
 * ignores (out of its window, attack16) closed the flow as the datapath saw
 * it and released the pod's share of ports towards the peer while the
 * connection went on. Its next state fl (flow_next's, fv->flags before) of a
 * tracked flow whose entries are rv and fv: the pod's first FIN's end E
 * goes to H's place (SNAT_F_FIN_WAIT), FLOW_F_FIN_ORIG waits for the peer's
 * ack of it (snat_seq_peer). A FIN again while waiting (a retransmit, or
 * the real one after a forged one) takes its place. In a flow with
 * SNAT_POD_END only a FIN past the pod's highest end waits (or the waiting
 * one again), in fin21's within A + SNAT_ACK_BOUND too. Returns fl without
 * the FIN.
 */
static __noinline __u32 snat_fin_pod(struct __sk_buff *skb, const struct flow *f, struct snat_val *rv,
				     struct snat_val *fv, __u32 fl)
{
	struct tcp_seg *sp = tcp_seg_scratch();
	__u32 cur = fv->flags;

	if (!(f->tcp_flags & TCP_FLAG_FIN) || (f->tcp_flags & TCP_FLAG_RST) || (rv->flags & FLOW_F_FIN_ORIG) ||
	    !(rv->flags & SNAT_F_SEQ) || !sp || tcp_seg_load(skb, f, sp))
		return fl;
	struct snat_seq *q = snat_seq_of(rv);
	__u32 v = rv->flags;
	__s32 d = (__s32)(sp->end - q->win);

	/* A FIN over sequence space the pod had used (its end not past the
	 * pod's highest, unless it is the waiting FIN again) is an old
	 * segment to the peer: ignored, its ack proves nothing (attack20). */
	if (snat_has_ack(v)) {
		__u64 c = fv->created_ns;
		__u32 h = (__u32)c, a = q->win, o = sp->end - a;

		if (!(v & SNAT_F_FIN_WAIT) && h - a > SNAT_ACK_BOUND)
			h = a;
		if (o <= SNAT_ACK_BOUND && (o > h - a || (o == h - a && (v & SNAT_F_FIN_WAIT)))) {
			fv->created_ns = (c & ~SNAT_LOW_WORD) | sp->end;
			snat_flags_apply(rv, SNAT_F_FIN_WAIT, 0);
		}
	} else if (!snat_has_pod_end(v) || d > 0 || (d == 0 && (v & SNAT_F_FIN_WAIT))) {
		q->win = sp->end;
		snat_flags_apply(rv, SNAT_F_FIN_WAIT, 0);
	}
	return (fl & ~(FLOW_F_FIN_ORIG | FLOW_F_CLOSING)) | (cur & FLOW_F_CLOSING);
}

/* The waiting FIN's end of a fin21 flow (reverse entry rv, the peer's
 * segment f): its forward entry's low word; -1 without one. */
static __noinline __s64 snat_fin_end(const struct snat_val *rv, const struct flow *f);

/*
 * snat_seq_peer while the pod's FIN waits: every segment is read (a pure
 * ACK may be the one), with SNAT_SEQ_BOUND (a flow before fin20's: the
 * window's floor) for how far it moves end. An ACK of exactly the FIN's
 * end (fin21's flows: in the forward entry, A in win; fin20's: in win), in
 * order, makes the pod's FIN count (FLOW_F_FIN_ORIG; A the FIN's end; in a
 * flow before fin20's win back to the floor, raised again by the pod's
 * segments; in fin20's it stays the pod's end). One whose sequence number
 * is end + 1 with no FIN of the peer's seen comes after a FIN the node did
 * not see (lost on the way, retransmitted later): the peer sent its FIN
 * before it had the pod's, it holds TIME_WAIT (FLOW_F_PEER_FIRST; a FIN of
 * the peer's before the ack gets it in snat_next). Else a lost FIN looked
 * like the pod closing first, and its node port went to another pod after
 * half a second (attack15).
 */
static __noinline int snat_seq_peer_fin(struct __sk_buff *skb, const struct flow *f, struct snat_val *rv)
{
	struct tcp_seg *sp = tcp_seg_scratch();
	struct snat_seq *q = snat_seq_of(rv);
	__u32 fl = rv->flags, b = fl;
	__u32 pe = fl & SNAT_POD_END;
	int acked = snat_has_ack(fl);
	struct snat_seq t = { .end = q->end, .win = snat_has_pod_end(fl) ? SNAT_SEQ_BOUND : 0 };

	if (!sp)
		return 1;
	sp->base = 8;
	sp->flags = 0;
	int r = tcp_seq_remote_nat_(skb, f, &t, &fl, sp);
	__u32 ahead = sp->seq - q->end;
	__s64 e = acked ? snat_fin_end(rv, f) : q->win;

	t.win = q->win;
	/* Only once the peer's end is known (its SYN-ACK): else end is the
	 * pod's SYN's, in the pod's numbers, which a pod re-seeding its live
	 * flow with a raw SYN can line up with the peer's (fin20). */
	if (r && (sp->flags & (TCP_FLAG_ACK | TCP_FLAG_RST | TCP_FLAG_SYN)) == TCP_FLAG_ACK && sp->ack == e &&
	    ahead <= 1 && (fl & SNAT_F_PEER_END)) {
		if (ahead && !(fl & FLOW_F_FIN_REPLY))
			fl |= FLOW_F_PEER_FIRST;
		fl = (fl | FLOW_F_FIN_ORIG) & ~SNAT_F_FIN_WAIT;
		if (acked)
			t.win = sp->ack; /* A: the peer acknowledged the FIN */
		else if (pe != SNAT_POD_END)
			t.win = 0; /* a flow before fin20's: the window again */
	}
	*q = t;
	snat_flags_write(rv, b, pe == SNAT_POD_END ? fl | SNAT_POD_END : fl);
	return r ? 1 : 0;
}

/* The masquerade's: the peer's segment f of the flow whose reverse entry is
 * rv; 0 for an RST outside the pod's window. A reverse entry's tracking
 * starts with the pod's SYN only (the masquerade opens no flow for a peer). */
static __always_inline int snat_seq_peer(struct __sk_buff *skb, const struct flow *f, struct snat_val *rv)
{
	__u32 fl = rv->flags, b = fl;
	int r;

	if (!(fl & SNAT_F_SEQ))
		return 1;
	if (snat_has_ack(fl) && (fl & SNAT_F_PEER_END))
		snat_ack_move(skb, f, snat_seq_of(rv));
	if (fl & SNAT_F_FIN_WAIT)
		return snat_seq_peer_fin(skb, f, rv);
	if (snat_has_pod_end(fl)) {
		/* win holds the pod's end, or A; the tracking reads the bound in its place. */
		struct snat_seq *q = snat_seq_of(rv);

		if (tcp_seg_quiet(skb, f))
			return 1;
		/* In a copy, as snat_seq_pod: the pod's path reads win. */
		__u32 e = q->end;
		struct snat_seq t = { .end = e, .win = SNAT_SEQ_BOUND };

		r = tcp_seq_remote(skb, f, &t, &fl, 8, NULL);
		if (t.end != e)
			q->end = t.end;
		snat_flags_write(rv, b, fl | SNAT_POD_END);
		return r;
	}
	r = tcp_seq_remote(skb, f, snat_seq_of(rv), &fl, 8, NULL);
	snat_flags_write(rv, b, fl);
	return r;
}

/*
 * flow_next, plus who closed first: FLOW_F_PEER_FIRST when the peer's FIN
 * came before the pod's (the peer then holds TIME_WAIT); cleared by an RST
 * before the close (no TIME_WAIT follows one) and whenever no FIN is seen
 * (a SYN reopening the tuple).
 */
static __always_inline __u16 snat_next(__u16 cur, const struct flow *f, int reply, __u64 created_ns, __u64 now)
{
	__u32 n = flow_next(cur, f, reply, created_ns, now);
	__u8 fl = f->tcp_flags;

	if (f->proto != IPPROTO_TCP)
		return n;
	if (reply && (fl & TCP_FLAG_FIN) && !(fl & TCP_FLAG_RST) && !(n & FLOW_F_FIN_ORIG))
		n |= FLOW_F_PEER_FIRST;
	if (!(n & (FLOW_F_FIN_ORIG | FLOW_F_FIN_REPLY)) || ((fl & TCP_FLAG_RST) && !(cur & FLOW_F_CLOSING)))
		n &= ~FLOW_F_PEER_FIRST;
	return n;
}

static __always_inline void masq_count(__u32 what)
{
	__u64 *c = bpf_map_lookup_elem(&cni_masq_stats, &what);

	if (c)
		*c += 1;
}

static __always_inline int in_cluster(const __u8 *addr, __u8 family)
{
	struct cidr_key k = { .prefixlen = family == AF_INET ? 64 : 160, .family = family };

	addr_copy(k.addr, addr, family);
	return bpf_map_lookup_elem(&cni_cluster_cidrs, &k) != NULL;
}

static __always_inline __u32 mix32(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

static __always_inline void snat_key_of(struct snat_key *k, __u8 dir, const __u8 *addr, __be16 port,
					const __u8 *peer, __be16 peer_port, __u8 family, __u8 proto)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->family = family;
	k->proto = proto;
	k->dir = dir;
	k->port = port;
	k->peer_port = peer_port;
	addr_copy(k->addr, addr, family);
	addr_copy(k->peer_addr, peer, family);
}

static __noinline __s64 snat_fin_end(const struct snat_val *rv, const struct flow *f)
{
	struct snat_key k;

	snat_key_of(&k, SNAT_DIR_FWD, rv->addr, rv->port, f->saddr, f->sport, f->family, f->proto);
	struct snat_val *fv = bpf_map_lookup_elem(&cni_snat, &k);

	return fv ? (__s64)(__u32)fv->created_ns : -1;
}

/*
 * The peer's FIN f that the tracking did not count (snat_seq_peer: not in
 * order) of the flow whose reverse entry is rv: when its end F (in the
 * programs' scratch, which the tracking loaded) is past the peer's end by
 * at most SNAT_ACK_BOUND (a segment taken out of order left end behind),
 * it waits on the forward entry for the pod's ack of exactly F
 * (SNAT_F_PEER_FIN, F in the low word of its seen_ns; snat_peer_fin_acked).
 * Rare (a FIN out of order): the forward entry is looked up only then.
 */
static __noinline void snat_peer_fin_wait(const struct flow *f, struct snat_val *rv)
{
	struct tcp_seg *sp = tcp_seg_scratch();
	__u32 fl = rv->flags;
	struct snat_key k;

	if (!sp || !(sp->flags & TCP_FLAG_FIN) || (sp->flags & (TCP_FLAG_RST | TCP_FLAG_SYN)) ||
	    (fl & (SNAT_F_SEQ | SNAT_F_PEER_END)) != (SNAT_F_SEQ | SNAT_F_PEER_END) ||
	    (fl & (FLOW_F_FIN_REPLY | FLOW_F_CLOSING | SNAT_F_UNSHARED)))
		return;
	__u32 e = sp->end;
	if (e - snat_seq_of(rv)->end - 1 >= SNAT_ACK_BOUND)
		return; /* not ahead of end, or too far */
	snat_key_of(&k, SNAT_DIR_FWD, rv->addr, rv->port, f->saddr, f->sport, f->family, f->proto);
	struct snat_val *fv = bpf_map_lookup_elem(&cni_snat, &k);
	if (!fv)
		return;
	/* A FIN already waiting nearer end (still ahead of it) keeps its
	 * place: the server sends one FIN at one number (its retransmissions
	 * too), so a farther one is forged; one forged from outside at any
	 * number ahead took the real one's place, whose ack then counted
	 * nothing (attack30c). A blind forger now has to land between end
	 * and the real FIN. */
	__u32 end = snat_seq_of(rv)->end, w = (__u32)fv->seen_ns;
	if ((fv->flags & SNAT_F_PEER_FIN) && w - end - 1 < SNAT_ACK_BOUND && e - end > w - end)
		return;
	/* It acknowledges the pod's waiting FIN (fin21's flows: its end is
	 * the forward entry's low word). */
	__u32 acks = (fl & SNAT_F_FIN_WAIT) && snat_has_ack(fl) && (sp->flags & TCP_FLAG_ACK) &&
		     sp->ack == (__u32)fv->created_ns;
	fv->seen_ns = (fv->seen_ns & ~SNAT_LOW_WORD) | e;
	snat_flags_apply(fv, SNAT_F_PEER_FIN | (acks ? SNAT_F_PEER_FIN_ACKS : 0),
			 (acks ? 0 : SNAT_F_PEER_FIN_ACKS) | SNAT_F_PEER_RST);
}

/*
 * The peer's RST f that the tracking did not count (not at its end) of the
 * flow whose reverse entry is rv: when its number S (in the programs'
 * scratch, which the tracking loaded) is past end by at most
 * SNAT_ACK_BOUND, it waits on the forward entry for the pod's next ACK
 * (SNAT_F_PEER_RST; snat_peer_fin_acked). Rare: the forward entry is looked
 * up only then.
 */
static __noinline void snat_peer_rst_wait(const struct flow *f, struct snat_val *rv)
{
	struct tcp_seg *sp = tcp_seg_scratch();
	__u32 fl = rv->flags;
	struct snat_key k;

	if (!sp || !(sp->flags & TCP_FLAG_RST) || (sp->flags & TCP_FLAG_SYN) ||
	    (fl & (SNAT_F_SEQ | SNAT_F_PEER_END)) != (SNAT_F_SEQ | SNAT_F_PEER_END) ||
	    (fl & (FLOW_F_CLOSING | SNAT_F_UNSHARED)))
		return;
	__u32 s = sp->seq, end = snat_seq_of(rv)->end;
	if (s - end - 1 >= SNAT_ACK_BOUND)
		return; /* not ahead of end, or too far */
	snat_key_of(&k, SNAT_DIR_FWD, rv->addr, rv->port, f->saddr, f->sport, f->family, f->proto);
	struct snat_val *fv = bpf_map_lookup_elem(&cni_snat, &k);
	if (!fv)
		return;
	/* A FIN or RST waiting nearer end (still ahead of it) keeps its
	 * place, as snat_peer_fin_wait's: a FIN kept its place wherever it
	 * was, so one forged anywhere in the bound ahead (a blind forger: one
	 * guess in four; the pod's answer, behind it, leaves it waiting)
	 * turned away the real RST, which then counted nothing (attack31b).
	 * A blind forger now has to land between end and the real one. */
	__u32 w = (__u32)fv->seen_ns;
	if ((fv->flags & SNAT_F_PEER_FIN) && w - end - 1 < SNAT_ACK_BOUND && s - end > w - end)
		return;
	fv->seen_ns = (fv->seen_ns & ~SNAT_LOW_WORD) | s;
	snat_flags_apply(fv, SNAT_F_PEER_FIN | SNAT_F_PEER_RST, SNAT_F_PEER_FIN_ACKS);
}

/*
 * The pod's segment f of a flow whose forward entry fv holds a waiting FIN
 * of the peer's (SNAT_F_PEER_FIN), fl its next state: an ACK of exactly
 * the FIN's end counts the FIN (FLOW_F_FIN_REPLY, and FLOW_F_PEER_FIRST
 * when the pod's FIN has not counted; with SNAT_F_PEER_FIN_ACKS the pod's
 * waiting FIN too, A its end), and the peer's end is the FIN's (what the
 * pod acknowledged it received), unless the peer's end reached the FIN's
 * end already: the peer's data, in order, covered the FIN's number, which
 * a real FIN's never carries (a FIN forged ahead, whose end the pod's ack
 * of that data matched: attack31). An ACK past the FIN's end (within the
 * bound) ends the wait too, counting nothing: the pod received past it, so
 * no FIN was there (left waiting, it came ahead of end again once the
 * numbers wrapped). Any other segment leaves it waiting. A waiting RST
 * (SNAT_F_PEER_RST) counts as FLOW_F_CLOSING at an ACK of exactly its
 * number while end is still behind it (attack31b: as the FIN's), and is
 * dropped at any other not behind end. Returns the state.
 */
static __noinline __u16 snat_peer_fin_acked(struct __sk_buff *skb, const struct flow *f, struct snat_val *fv, __u16 fl)
{
	void *data = tseq_data(skb);
	void *data_end = tseq_data_end(skb);
	__u32 off = f->l4off;
	__u8 *t = data + (off & 0xff); /* bounded for the verifier, as flow_l4 */
	__u32 pf = fv->flags, e = (__u32)fv->seen_ns;
	struct snat_key k;

	if ((f->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_RST | TCP_FLAG_ACK)) != TCP_FLAG_ACK || off > 0xff ||
	    (void *)(t + 12) > data_end)
		return fl;
	__u32 a = bpf_ntohl(*(__be32 *)(t + 8));
	if (a != e && !(pf & SNAT_F_PEER_RST)) {
		if (a - e < SNAT_ACK_BOUND)
			snat_flags_apply(fv, 0, SNAT_F_PEER_FIN | SNAT_F_PEER_FIN_ACKS);
		return fl;
	}
	snat_key_of(&k, SNAT_DIR_REV, fv->addr, fv->port, f->daddr, f->dport, f->family, f->proto);
	struct snat_val *rv = bpf_map_lookup_elem(&cni_snat, &k);
	if (a != e) {
		/* A waiting RST: the pod's next number not behind end and
		 * not S (its challenge ACK): the RST was not taken. One
		 * behind end was sent before (a duplicate ACK). */
		if (rv && (__s32)(a - snat_seq_of(rv)->end) >= 0)
			snat_flags_apply(fv, 0, SNAT_F_PEER_FIN | SNAT_F_PEER_RST);
		return fl;
	}
	snat_flags_apply(fv, 0, SNAT_F_PEER_FIN | SNAT_F_PEER_FIN_ACKS | SNAT_F_PEER_RST);
	if (!rv || !(rv->flags & SNAT_F_SEQ) ||
	    (rv->flags & (SNAT_F_UNSHARED | FLOW_F_CLOSING | ((pf & SNAT_F_PEER_RST) ? 0 : FLOW_F_FIN_REPLY))))
		return fl;
	struct snat_seq *q = snat_seq_of(rv);
	__u32 rfl = rv->flags;

	/* Only while end is still behind the FIN's end or the RST's number:
	 * the peer's data, in order, reached it, so no FIN was there, and the
	 * pod's ACK of that data is no sign it took an RST there (a forged
	 * one whose challenge ACK came back behind end: attack31b). */
	if (e - q->end - 1 >= SNAT_ACK_BOUND)
		return fl;
	q->end = e;
	/* The RST counts as one at end would have (flow_next, snat_next). */
	if (pf & SNAT_F_PEER_RST)
		return (fl | FLOW_F_CLOSING) & ~FLOW_F_PEER_FIRST;
	if ((pf & SNAT_F_PEER_FIN_ACKS) && (rfl & SNAT_F_FIN_WAIT) && snat_has_ack(rfl)) {
		q->win = (__u32)fv->created_ns; /* A: the peer acknowledged the pod's FIN */
		snat_flags_apply(rv, 0, SNAT_F_FIN_WAIT);
		fl |= FLOW_F_FIN_ORIG;
	}
	if (!(fl & FLOW_F_FIN_ORIG))
		fl |= FLOW_F_PEER_FIRST;
	fl |= FLOW_F_FIN_REPLY;
	if ((fl & FLOW_F_FIN_BOTH) == FLOW_F_FIN_BOTH)
		fl |= FLOW_F_CLOSING;
	return fl;
}

/* -------------------------------------------------- shares and life cycle */

static __always_inline void share_key_of(struct masq_share_key *k, const struct snat_key *rk, __u32 ifindex)
{
	__builtin_memset(k, 0, sizeof(*k));
	addr_copy(k->peer_addr, rk->peer_addr, rk->family);
	k->peer_port = rk->peer_port;
	k->family = rk->family;
	k->proto = rk->proto;
	k->ifindex = ifindex;
}

/* The count of ports the pod behind ifindex holds towards rk's destination. */
static __always_inline __u32 *share_of(const struct snat_key *rk, __u32 ifindex)
{
	struct masq_share_key k;
	__u32 zero = 0;

	share_key_of(&k, rk, ifindex);
	__u32 *n = bpf_map_lookup_elem(&cni_masq_share, &k);
	if (n)
		return n;
	bpf_map_update_elem(&cni_masq_share, &k, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&cni_masq_share, &k);
}

/* ------------------------------------------------ the pods' quota of cni_snat */

#ifndef EBPF_CNI_COMPAT
/* The flows the pod behind ifindex holds (ifindex 0: the node's total),
 * created at its first flow. NULL when cni_masq_pods is full. */
static __always_inline struct masq_pod_val *masq_pod(__u32 ifindex)
{
	struct masq_pod_val zero = {};
	struct masq_pod_val *v = bpf_map_lookup_elem(&cni_masq_pods, &ifindex);

	if (v)
		return v;
	bpf_map_update_elem(&cni_masq_pods, &ifindex, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&cni_masq_pods, &ifindex);
}

/* One flow more for the pod and the node. A function of its own: the
 * caller's stack is full. */
static __noinline void masq_pod_add(__u32 ifindex)
{
	struct masq_pod_val *v = masq_pod(ifindex);

	if (v)
		__sync_fetch_and_add(&v->flows, 1);
	v = masq_pod(0);
	if (v)
		__sync_fetch_and_add(&v->flows, 1);
}

/* One flow less. Never below 0: flows opened by an older build (before the
 * counts) were never counted. */
static __always_inline void masq_pod_release(__u32 ifindex)
{
	struct masq_pod_val *v = bpf_map_lookup_elem(&cni_masq_pods, &ifindex);

	if (v && v->flows > 0)
		__sync_fetch_and_add(&v->flows, -1);
	ifindex = 0;
	v = bpf_map_lookup_elem(&cni_masq_pods, &ifindex);
	if (v && v->flows > 0)
		__sync_fetch_and_add(&v->flows, -1);
}

/*
 * Whether the pod behind ifindex may open a flow with a port of its own
 * (else it may only take back one of its own, as at its per-destination
 * limit): under its reserve always; above it while the node's total is
 * under the pool and the pod under pod_max. Then the flows of all pods
 * never pass pool + attachments x reserve, which cni_snat holds with the
 * free entries its LRU needs to spare: nothing a pod sends, nor what a host
 * outside makes a pod answer, evicts another pod's flow. Unconfigured (pins
 * of an older build of the layout): no quota.
 */
static __noinline int masq_quota_allows(__u32 ifindex)
{
	__u32 zero = 0;
	struct masq_quota *q = bpf_map_lookup_elem(&cni_masq_quota, &zero);

	if (!q || !q->pod_max)
		return 1;
	__u32 reserve = q->reserve, pool = q->pool, pod_max = q->pod_max;
	struct masq_pod_val *all = masq_pod(0);
	if (!all)
		return 0; /* a flow nobody counts would break the bound */
	struct masq_pod_val *pod = masq_pod(ifindex);
	if (!pod)
		return all->flows < pool; /* no room for its count (entries of pods gone without DEL): the pool alone */
	__u32 held = pod->flows;
	if (held < reserve)
		return 1;
	return held < pod_max && all->flows < pool;
}

static __always_inline void masq_quota_drop(__u32 ifindex)
{
	struct masq_pod_val *v = bpf_map_lookup_elem(&cni_masq_pods, &ifindex);

	if (v)
		__sync_fetch_and_add(&v->drops, 1);
}
#else
/* The compat build deletes no expired flow (no bpf_timer): counts would
 * keep dead flows, so it keeps the node-wide LRU without a quota. */
static __always_inline void masq_pod_add(__u32 ifindex) {}
static __always_inline void masq_pod_release(__u32 ifindex) {}
static __always_inline int masq_quota_allows(__u32 ifindex) { return 1; }
static __always_inline void masq_quota_drop(__u32 ifindex) {}
#endif

static __always_inline void share_release(const struct snat_key *rk, __u32 ifindex)
{
	struct masq_share_key k;

	share_key_of(&k, rk, ifindex);
	__u32 *n = bpf_map_lookup_elem(&cni_masq_share, &k);
	if (n && *n > 0)
		__sync_fetch_and_add(n, -1);
}

/*
 * Deletes the flow whose reverse entry is rk (its pod's address and port,
 * and host veth, given): the forward entry if it still maps to rk, the
 * reverse one, and the port from the pod's share (only by whoever deleted
 * it, so two CPUs never release it twice).
 */
static __always_inline void snat_forget(const struct snat_key *rk, const __u8 *pod, __be16 pod_port, __u32 ifindex,
					__u16 flags)
{
	struct snat_key fk;

	snat_key_of(&fk, SNAT_DIR_FWD, pod, pod_port, rk->peer_addr, rk->peer_port, rk->family, rk->proto);
	struct snat_val *fv = bpf_map_lookup_elem(&cni_snat, &fk);
	if (fv && fv->port == rk->port && addr_equal(fv->addr, rk->addr, rk->family))
		bpf_map_delete_elem(&cni_snat, &fk);
	if (bpf_map_delete_elem(&cni_snat, rk) == 0) {
		if (!(flags & SNAT_F_UNSHARED))
			share_release(rk, ifindex);
		if (flags & SNAT_F_COUNTED)
			masq_pod_release(ifindex);
	}
}

#ifndef EBPF_CNI_COMPAT
/* A reverse entry's timer ran out: the flow goes unless a packet came meanwhile. */
static int snat_expire(void *map, struct snat_key *key, struct snat_val *v)
{
	struct snat_key rk = *key;
	__u64 left = snat_time_left(v->flags, rk.proto, v->seen_ns, bpf_ktime_get_ns());

	if (rk.dir != SNAT_DIR_REV)
		return 0;
	if (left) {
		bpf_timer_start(&v->timer, left, 0);
		return 0;
	}
	__u8 pod[16];
	__be16 pod_port = v->port;
	__u32 ifindex = v->ifindex;
	__builtin_memcpy(pod, v->addr, 16);
	snat_forget(&rk, pod, pod_port, ifindex, v->flags);
	masq_count(MASQ_STAT_EXPIRED);
	return 0;
}

/* (Re)starts a reverse entry's timer to run in ns (after every write of it). */
static __always_inline void snat_arm(struct snat_val *v, __u64 ns)
{
	bpf_timer_init(&v->timer, &cni_snat, CLOCK_MONOTONIC); /* -EBUSY when done already */
	bpf_timer_set_callback(&v->timer, snat_expire);
	bpf_timer_start(&v->timer, ns, 0);
}
#else
/* The compat build (no bpf_timer): expired flows are treated as absent and
 * freed when a probe meets them (snat_alloc) or by the LRU. */
static __always_inline void snat_arm(struct snat_val *v, __u64 ns) {}
#endif

/* Records a state change or a use in an entry. Only the state bits are the
 * flow's: the others are the entry's own (tcpseq.h), and so is a TCP
 * entry's FLOW_F_STREAM (SNAT_F_ACKED on a reverse one; a SYN's flow_next
 * clears it, a forward entry has none). */
static __always_inline void snat_note(struct snat_val *v, __u16 base, __u16 next, __u64 now, __u8 proto)
{
	__u16 m = proto == IPPROTO_TCP ? SNAT_STATE_MASK & ~FLOW_F_STREAM : SNAT_STATE_MASK;

	/* Only the state bits this packet changed from base, the state the
	 * caller read (snat_flags_write): another CPU's change meanwhile stays. */
	snat_flags_write(v, base & m, next & m);
	v->seen_ns = now;
}

/* snat_note of a forward entry: its state becomes next's (the reverse
 * entry, which owns the flow, keeps what another CPU changed; this one
 * mirrors it), its own bits stay (SNAT_F_KEPT, SNAT_F_PEER_FIN: atomics),
 * and a waiting FIN's end (SNAT_F_PEER_FIN) stays in the low word of
 * seen_ns. */
static __always_inline void snat_note_fwd(struct snat_val *v, __u16 next, __u64 now, __u8 proto)
{
	__u32 f = (__u32)v->seen_ns;

	snat_note(v, v->flags, next, now, proto);
	if (v->flags & SNAT_F_PEER_FIN)
		v->seen_ns = (now & ~SNAT_LOW_WORD) | f;
}

/*
 * snat_note of the reverse entry rv (key rk, the pod's host veth ifindex),
 * which owns the flow's timer and its share: the timer shortens when the
 * flow closes (to MASQ_TIME_WAIT when the peer closed first), a flow closed
 * by a FIN each way holds no share of its pod's ports towards the
 * destination (cni_masq_share), and a SYN that opens the tuple again takes
 * it back.
 * Quiet for MASQ_REUSE_CLOSED a closed flow's port is anyone's
 * (alloc_probe); counted until its entry went (10 s), the closed flows of a
 * pod opening thousands of short connections a second to one server put it
 * "at its limit", where each new flow took back a port another of its
 * tuples had just closed, and the server, still in TIME_WAIT for that
 * tuple, dropped the SYN if its timestamps did not follow (PAWS; a second's
 * retransmit; issue 30). Two CPUs closing one flow at once can both release
 * it: the count then runs low by one, never below 0.
 */
#define SNAT_F_KEPT (1U << 8) /* forward TCP entries: the flow took its share back after its release (snat_share_back) */

/* snat_kept and snat_share_back are global functions (verified once, on
 * their own, not at each of their callers' states) but in the compat
 * build, whose kernels take no pointer arguments of a global one (as
 * masq_known). */
#ifdef EBPF_CNI_COMPAT
#define SHARE_LINKAGE static
#else
#define SHARE_LINKAGE
#endif

/* What they read of a reverse entry: its head, without the bpf_timer a
 * global function may not be handed (the verifier checks the whole type). */
struct snat_val_head {
	__u8 addr[16];
	__be16 port;
	__u16 flags;
	__u32 ifindex;
};
_Static_assert(offsetof(struct snat_val_head, ifindex) == offsetof(struct snat_val, ifindex) &&
		       offsetof(struct snat_val_head, flags) == offsetof(struct snat_val, flags),
	       "snat_val_head is snat_val's head");
#define SNAT_HEAD(v) ((struct snat_val_head *)(v))

/* Whether the flow whose reverse entry is rv (key rk) took its share back
 * after its release (SNAT_F_KEPT on its forward entry): it stays counted.
 * Looked up only when a FIN each way would release the share: once per
 * flow, but for a kept one. Out of line: the callers' frames are full. */
SHARE_LINKAGE __noinline int snat_kept(const struct snat_val_head *rv, const struct snat_key *rk)
{
	struct snat_key fk;

	if (!rv || !rk)
		return 0;

	snat_key_of(&fk, SNAT_DIR_FWD, rv->addr, rv->port, rk->peer_addr, rk->peer_port, rk->family, rk->proto);
	struct snat_val *fv = bpf_map_lookup_elem(&cni_snat, &fk);
	return fv && (fv->flags & SNAT_F_KEPT);
}

static __always_inline void snat_note_rev(struct snat_val *rv, const struct snat_key *rk, __u32 ifindex, __u16 base,
					  __u16 next, __u64 now)
{
	__u16 cur = rv->flags;

	snat_note(rv, base, next, now, rk->proto);
	if ((next & FLOW_F_CLOSING) && !(cur & FLOW_F_CLOSING))
		snat_arm(rv, (next & FLOW_F_PEER_FIRST) ? MASQ_TIME_WAIT : FLOW_TIMEOUT_CLOSING);
	/* A FIN each way only: the pod's own RST is trusted for the flow's
	 * state, but a pod could send one the peer ignores and go on using the
	 * connection, past its share (attack15). A flow an RST closed counts
	 * until it goes (its port, free of TIME_WAIT, is the pod's to recycle). */
	__u16 fl = rv->flags;
	if ((fl & FLOW_F_FIN_BOTH) == FLOW_F_FIN_BOTH && !(fl & SNAT_F_UNSHARED) && !snat_kept(SNAT_HEAD(rv), rk)) {
		snat_flags_apply(rv, SNAT_F_UNSHARED, 0);
		share_release(rk, ifindex);
	} else if (!(fl & FLOW_F_CLOSING) && (fl & SNAT_F_UNSHARED)) {
		snat_flags_apply(rv, 0, SNAT_F_UNSHARED);
		__u32 *n = share_of(rk, ifindex);
		if (n)
			__sync_fetch_and_add(n, 1);
	}
}

/*
 * The backstop of the share (share25): whatever the tracking believes, a
 * flow whose share was released (SNAT_F_UNSHARED: a FIN each way seen) is
 * done with. The tracking can be fooled by an accomplice outside forging
 * the peer's address: the pod's raw SYN on its live tuple re-seeds it, the
 * accomplice answers with a SYN-ACK and later acknowledges the pod's raw
 * FIN with a FIN-ACK, and no number of the real peer's is used
 * (TestAttack23MasqShareForgedSynAck: 16 of 16 live at a limit of 8). So
 * payload either way on a released flow takes the share back, or, the pod
 * at its limit, is dropped and counted (drop_pod_limit, REASON_DROP_NAT_POD_LIMIT
 * in the direction of the packet). No allowance for retransmissions on
 * either side: one below a recorded end let an attacker place that end
 * just past the real one (share24's first build, TestShare25MasqAligned*).
 * The price: a pod at its limit whose closed connection needs a
 * retransmission of data after both FINs loses it (pure ACKs and FINs
 * pass). A flow taken back stays counted until its entry goes
 * (SNAT_F_KEPT on its forward entry: snat_note_rev releases it no more).
 * The pod's SYN reopening a released tuple is judged against the limit as
 * a new flow: below it snat_note_rev counts it again; at it the released
 * flow goes (its port, uncounted, given back) and the SYN takes the path
 * of a new flow (snat_alloc: one of the pod's own counted flows recycled,
 * or dropped): returns 2. Returns 1 when the packet is to be dropped
 * (the caller counts it: here a call deeper, the stack would pass 512
 * bytes under from_uplink), else 0.
 */
SHARE_LINKAGE __noinline int snat_share_back(struct __sk_buff *skb, const struct flow *f, struct snat_val_head *rv,
					     const struct snat_key *rk, int reply)
{
	__u32 zero = 0;

	if (!f || !rv || !rk || !(rv->flags & SNAT_F_UNSHARED))
		return 0;
	__u32 ifindex = rv->ifindex;
	struct masq_config *cfg = bpf_map_lookup_elem(&cni_masq_config, &zero);
	struct tcp_seg *sp = tcp_seg_scratch();
	int syn = !reply && f->syn_only;

	if (!syn) {
		if (!sp || tcp_seg_load(skb, f, sp))
			return 0;
		if (sp->end - sp->seq == !!(sp->flags & TCP_FLAG_SYN) + !!(sp->flags & TCP_FLAG_FIN))
			return 0; /* no payload: an ACK, a FIN again */
	}
	__u32 limit = cfg && cfg->total ? cfg->pod_limit : 0;
	__u32 *share = share_of(rk, ifindex);
	if (share && limit && *share >= limit) {
		if (syn) {
			__u8 pod[16];
			__be16 pod_port = rv->port;

			__builtin_memcpy(pod, rv->addr, 16);
			snat_forget(rk, pod, pod_port, ifindex, rv->flags);
			return 2;
		}
		return 1;
	}
	if (syn)
		return 0; /* a new flow: snat_note_rev counts it (its state cleared) */
	if (share)
		__sync_fetch_and_add(share, 1);
	snat_flags_apply(rv, 0, SNAT_F_UNSHARED);
	struct snat_key fk;
	snat_key_of(&fk, SNAT_DIR_FWD, rv->addr, rv->port, rk->peer_addr, rk->peer_port, rk->family, rk->proto);
	struct snat_val *fv = bpf_map_lookup_elem(&cni_snat, &fk);
	if (fv)
		snat_flags_apply(fv, SNAT_F_KEPT, 0);
	return 0;
}

/* ------------------------------------------------------------ allocation */

#ifndef BPF_TCP_LISTEN
#define BPF_TCP_LISTEN 10
#endif

/* Whether a node socket has node:port for the reply of rk's flow: a TCP
 * listener or connection, a bound or connected UDP socket. Such ports are
 * left to the node. */
static __always_inline int node_port_taken(struct __sk_buff *skb, const struct snat_key *rk)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk = NULL;
	__u32 len;

	if (rk->family == AF_INET) {
		t.ipv4.saddr = *(const __be32 *)rk->peer_addr;
		t.ipv4.daddr = *(const __be32 *)rk->addr;
		t.ipv4.sport = rk->peer_port;
		t.ipv4.dport = rk->port;
		len = sizeof(t.ipv4);
	} else {
		__builtin_memcpy(t.ipv6.saddr, rk->peer_addr, 16);
		__builtin_memcpy(t.ipv6.daddr, rk->addr, 16);
		t.ipv6.sport = rk->peer_port;
		t.ipv6.dport = rk->port;
		len = sizeof(t.ipv6);
	}
	if (rk->proto == IPPROTO_TCP)
		sk = bpf_skc_lookup_tcp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
	else if (rk->proto == IPPROTO_UDP)
		sk = bpf_sk_lookup_udp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	bpf_sk_release(sk);
	return 1;
}

/* What snat_alloc's probes share (bpf_loop: the verifier walks one probe). */
struct alloc_ctx {
	struct snat_key rk; /* the reverse entry tried; rk.port is the candidate */
	struct snat_val rv; /* what it gets */
	struct masq_config cfg;
	struct __sk_buff *skb;
	__u64 take_seen;
	__u32 h;
	__u32 stride;
	__u32 ifindex;
	__u16 own;   /* the pod's own port, when one of ours: the first candidate */
	__be16 port; /* the port got */
	__be16 take; /* at the limit: the pod's own quietest port seen; else the quietest held for a peer's TIME_WAIT */
	__u8 over;   /* 1: the pod is at its limit towards this destination; 2: at its quota */
	__be16 first; /* at the limit: the first candidate, found free, where a port given back goes */
};

static __always_inline __u16 masq_port_at(const struct masq_config *c, __u32 idx)
{
#pragma unroll
	for (int r = 0; r < MASQ_RANGES; r++) {
		if (idx < c->len[r])
			return c->lo[r] + idx;
		idx -= c->len[r];
	}
	return 0;
}

static __always_inline int masq_port_ours(const struct masq_config *c, __u16 port)
{
#pragma unroll
	for (int r = 0; r < MASQ_RANGES; r++) {
		if (port >= c->lo[r] && port - c->lo[r] < c->len[r])
			return 1;
	}
	return 0;
}

/* Whether c->rk.port is free of the node's hostPorts and sockets. */
static __always_inline int alloc_port_free(struct alloc_ctx *c)
{
	return c->rk.proto == IPPROTO_ICMP || c->rk.proto == IPPROTO_ICMPV6 ||
	       !(hostport_lookup(c->rk.addr, c->rk.family, c->rk.proto, c->rk.port, 0) || node_port_taken(c->skb, &c->rk));
}

/*
 * At its limit (or quota) a pod gives back one of its own ports for a new
 * flow. The flow then goes to its first candidate when that was free (the
 * node port its own tuple maps to), not to the port given back: that one
 * was another of the pod's tuples', which the server may still hold in
 * TIME_WAIT, refusing the SYN (PAWS, see snat_alloc). Returns 1 when
 * c->port got the first candidate; c->rk.port is left as it was otherwise.
 */
static __always_inline int alloc_first(struct alloc_ctx *c)
{
	__be16 given = c->rk.port;

	if (!c->first)
		return 0;
	c->rk.port = c->first;
	if (!bpf_map_update_elem(&cni_snat, &c->rk, &c->rv, BPF_NOEXIST)) {
		c->port = c->first;
		return 1;
	}
	c->rk.port = given;
	return 0;
}

#define SNAT_PORT_LIVE 0
#define SNAT_PORT_FREE 1
#define SNAT_PORT_HELD 2

/*
 * Whether a candidate's flow (its reverse entry's flags and last use) leaves
 * the port free: an expired flow, or (as conntrack reuses CLOSE tuples) a
 * closed TCP flow quiet for MASQ_REUSE_CLOSED, unless the peer closed
 * first: it holds TIME_WAIT for the tuple and would refuse another tuple's
 * SYN (PAWS), so the port is held (SNAT_PORT_HELD), as conntrack's
 * TIME_WAIT entry makes MASQUERADE pick another port. Global: verified once,
 * not in every state of alloc_probe's loop (to_uplink's 1M instructions).
 */
__noinline int snat_port_state(__u32 flags, __u32 proto, __u64 seen, __u64 now)
{
	if (snat_expired(flags, proto, seen, now))
		return SNAT_PORT_FREE;
	if (!(flags & FLOW_F_CLOSING) || now - seen <= MASQ_REUSE_CLOSED)
		return SNAT_PORT_LIVE;
	return (flags & FLOW_F_PEER_FIRST) ? SNAT_PORT_HELD : SNAT_PORT_FREE;
}

/* One candidate: returns 1 (stop) when c->port got it. A function of its
 * own in the compat build too (its loop calls it). */
static __noinline long alloc_probe(__u32 i, struct alloc_ctx *c)
{
	__u16 p = c->own;

	if (i > 0 || !p)
		p = masq_port_at(&c->cfg, (c->h + i * c->stride) % c->cfg.total);
	if (!p)
		return 0;
	c->rk.port = bpf_htons(p);
	struct snat_val *cur = bpf_map_lookup_elem(&cni_snat, &c->rk);
	if (cur) {
		int st = snat_port_state(cur->flags, c->rk.proto, cur->seen_ns, c->rv.seen_ns);
		/* The entry read again after the call, not kept in registers
		 * across it: to_uplink's stack is at the 512-byte limit. */
		asm volatile("" ::: "memory");
		__u64 seen = cur->seen_ns;
		__u32 owner = cur->ifindex;
		if (st != SNAT_PORT_FREE) {
			/* At the limit: the pod's own quietest; else the quietest
			 * held for a peer's TIME_WAIT (taken when nothing is free). */
			if ((c->over ? owner == c->ifindex : st == SNAT_PORT_HELD) && (!c->take || seen < c->take_seen)) {
				c->take = c->rk.port;
				c->take_seen = seen;
			}
			return 0;
		}
		snat_forget(&c->rk, cur->addr, cur->port, owner, cur->flags);
		if (c->over && owner != c->ifindex) {
			if (i == 0 && alloc_port_free(c))
				c->first = c->rk.port;
			return 0; /* freed for the others, not for a pod at its limit */
		}
		if (c->over && alloc_first(c))
			return 1; /* one of its own given back */
	} else if (c->over) {
		if (i == 0 && alloc_port_free(c))
			c->first = c->rk.port;
		return 0;
	}
	if (!alloc_port_free(c))
		return 0;
	/* The insert is what makes the port ours: of two CPUs, one wins. */
	if (bpf_map_update_elem(&cni_snat, &c->rk, &c->rv, BPF_NOEXIST))
		return 0;
	c->port = c->rk.port;
	return 1;
}

/*
 * Allocates a node port for the flow f (pod's view) towards node address
 * node, and inserts both entries. Candidates: the pod's own port when it is
 * one of ours, then MASQ_PROBES - 1 more from a hash of the flow, walked
 * with a stride coprime with the ports' count. A pod at its limit towards
 * f's destination takes no free port: it takes back its own quietest one
 * among the candidates; so does a pod at its quota (*why is
 * MASQ_STAT_POD_LIMIT on entry). Returns the port (network order), or 0 with *why
 * the counter that says why none. Not inlined: its probes' stack comes on
 * top of the caller's.
 */
static __noinline __be16 snat_alloc(struct __sk_buff *skb, const struct flow *f, const __u8 *node, __u32 ifindex,
				    __u32 *why)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 zero = 0;
	struct alloc_ctx c = {};
	struct masq_config *cfg = bpf_map_lookup_elem(&cni_masq_config, &zero);

	if (cfg && cfg->total) {
		c.cfg = *cfg;
	} else {
		c.cfg.lo[0] = MASQ_PORT_MIN;
		c.cfg.len[0] = MASQ_PORT_MAX - MASQ_PORT_MIN + 1;
		c.cfg.total = c.cfg.len[0];
	}
	snat_key_of(&c.rk, SNAT_DIR_REV, node, 0, f->daddr, f->dport, f->family, f->proto);
	addr_copy(c.rv.addr, f->saddr, f->family);
	c.rv.port = f->sport;
	c.rv.ifindex = ifindex;
	c.rv.flags = SNAT_F_COUNTED; /* the caller counts it in cni_masq_pods */
	c.rv.created_ns = now;
	c.rv.seen_ns = now;
	c.skb = skb;
	c.ifindex = ifindex;
	/* A TCP flow opens with the pod's SYN: the reverse entry tracks
	 * sequence numbers from it (tcpseq.h), the forward one the pod's
	 * highest end (snat_stamp). */
	if (f->proto == IPPROTO_TCP)
		snat_seq_pod(skb, f, &c.rv, NULL);
	c.stride = c.cfg.total % 2053 ? 2053 : 2063; /* primes: one of them is coprime with the count */
	__u32 a = ((const __u32 *)f->saddr)[0] ^ ((const __u32 *)f->saddr)[3];
	__u32 b = ((const __u32 *)f->daddr)[0] ^ ((const __u32 *)f->daddr)[3];
	/* The candidates follow the pod's port: an offset per pod and
	 * destination, plus the port. One pod's ports towards one destination
	 * then map one to one onto ours (its ephemeral range is no wider than
	 * the default range), and a port the pod uses again gets the node port
	 * it had. A peer that closed first keeps TIME_WAIT for the translated
	 * tuple and takes a new SYN on it only if its timestamps follow the
	 * last ones (PAWS), which holds for the pod's own tuple, not for
	 * another's (the kernel's timestamp offset is per tuple): a hash of the
	 * whole flow gave two of the pod's ports one node port, and the peer
	 * dropped one in 5 of the pod's SYNs at 5000 connections/s (a second's
	 * retransmit each; issue 30). */
	c.h = mix32(a ^ mix32(b) ^ f->dport ^ f->proto) % c.cfg.total + bpf_ntohs(f->sport);
	/* The pod's own port first when it is one of ours (as MASQUERADE keeps
	 * ports where it can); an echo's id likewise. */
	if (masq_port_ours(&c.cfg, bpf_ntohs(f->sport)))
		c.own = bpf_ntohs(f->sport);

	__u32 *share = share_of(&c.rk, ifindex);
	c.over = share && c.cfg.pod_limit && *share >= c.cfg.pod_limit;
	if (*why == MASQ_STAT_POD_LIMIT)
		c.over |= 2; /* at its quota (the caller checked): it only takes back its own */

#ifndef EBPF_CNI_COMPAT
	bpf_loop(MASQ_PROBES, alloc_probe, &c, 0);
#else
	/* No bpf_loop (5.17): a bounded loop the verifier walks probe by probe. */
	for (__u32 i = 0; i < MASQ_PROBES; i++)
		if (alloc_probe(i, &c))
			break;
#endif

	if (!c.port && c.take) {
		/* At the limit: the quietest of the pod's own flows gives its
		 * port up. Else no candidate was free: availability over PAWS,
		 * the quietest port a peer's TIME_WAIT holds is taken. */
		c.rk.port = c.take;
		struct snat_val *cur = bpf_map_lookup_elem(&cni_snat, &c.rk);
		if (cur && (c.over ? cur->ifindex == ifindex : (cur->flags & FLOW_F_CLOSING))) {
			snat_forget(&c.rk, cur->addr, cur->port, cur->ifindex, cur->flags);
			if ((c.over && alloc_first(&c)) || !bpf_map_update_elem(&cni_snat, &c.rk, &c.rv, BPF_NOEXIST)) {
				if (!c.port)
					c.port = c.take;
				if (c.over)
					masq_count(MASQ_STAT_RECYCLED);
			}
		}
	}
	/* At its limit the flow given back may be one whose share was
	 * released (SNAT_F_UNSHARED, share25): taken, it put the pod one past
	 * its limit; the port goes back. Checked here, not in alloc_probe: a
	 * test of the candidate's flags there took to_uplink from 303286
	 * verified instructions to 469k (the bpf_loop callback's states). */
	share = c.over & 1 ? share_of(&c.rk, ifindex) : NULL;
	if (c.port && share && *share >= c.cfg.pod_limit) {
		c.rk.port = c.port;
		bpf_map_delete_elem(&cni_snat, &c.rk);
		c.port = 0;
	}
	if (!c.port) {
		*why = c.over ? MASQ_STAT_POD_LIMIT : MASQ_STAT_EXHAUSTED;
		return 0;
	}
	share = share_of(&c.rk, ifindex);
	if (share)
		__sync_fetch_and_add(share, 1);
	struct snat_val *rv = bpf_map_lookup_elem(&cni_snat, &c.rk);
	if (rv)
		snat_arm(rv, flow_timeout(0, f->proto));

	/* The forward entry, in c.rk and c.rv, which the reverse one is done with. */
	snat_key_of(&c.rk, SNAT_DIR_FWD, f->saddr, f->sport, f->daddr, f->dport, f->family, f->proto);
	addr_copy(c.rv.addr, node, f->family);
	c.rv.port = c.port;
	if (snat_has_ack(c.rv.flags)) {
		c.rv.created_ns = snat_stamp(now, 1, snat_seq_of(&c.rv)->win);
		c.rv.flags = SNAT_F_ACKED; /* the pod's end in created_ns */
	} else {
		c.rv.created_ns = now;
		c.rv.flags = 0;
	}
	if (bpf_map_update_elem(&cni_snat, &c.rk, &c.rv, BPF_ANY)) {
		/* Not counted in cni_masq_pods yet: the caller counts a flow got. */
		snat_key_of(&c.rk, SNAT_DIR_REV, node, c.port, f->daddr, f->dport, f->family, f->proto);
		if (bpf_map_delete_elem(&cni_snat, &c.rk) == 0)
			share_release(&c.rk, ifindex);
		*why = MASQ_STAT_ERROR;
		return 0;
	}
	return c.port;
}

/* ---------------------------------------------------------------- packets */

#define MASQ_CONTINUE FEATURE_CONTINUE

/*
 * An ICMP error about a reply a masquerading pod got (the quote: peer ->
 * pod), leaving through an uplink: sent by the pod behind ifindex (a port
 * unreachable), or by the node itself (ifindex 0: a reply it could not
 * forward to the pod, say for the pod's smaller MTU). The quote's
 * destination goes to the flow's node address and port, as does the
 * error's source when it is the pod. Returns MASQ_CONTINUE or TC_ACT_SHOT.
 */
static __noinline int masq_icmp_error_out(struct __sk_buff *skb, __u8 family, __u32 ifindex)
{
	struct icmp_err e = {};

	if (icmp_err_parse(skb, family, &e) || (e.q.proto != IPPROTO_TCP && e.q.proto != IPPROTO_UDP) ||
	    in_cluster(e.q.saddr, family))
		return MASQ_CONTINUE;
	struct snat_key fk;
	snat_key_of(&fk, SNAT_DIR_FWD, e.q.daddr, e.q.dport, e.q.saddr, e.q.sport, family, e.q.proto);
	struct snat_val *fv = bpf_map_lookup_elem(&cni_snat, &fk);
	if (!fv || snat_expired(fv->flags, fk.proto, snat_fwd_seen(fv), bpf_ktime_get_ns()))
		return MASQ_CONTINUE;
	__u8 node[16];
	__be16 port = fv->port;
	__u32 owner = fv->ifindex;
	__builtin_memcpy(node, fv->addr, 16);
	if (ifindex) {
		if (owner != ifindex)
			return MASQ_CONTINUE;
	} else {
		struct ep_info *ep = ep_lookup_addr(e.q.daddr, family);

		if (!ep || !(ep->flags & EP_F_MASQ) || ep->ifindex != owner)
			return MASQ_CONTINUE;
	}
	if (icmp_err_rewrite(skb, &e, 0, node, port)) {
		masq_count(MASQ_STAT_ERROR);
		/* The pod's own error is its drop; the node's is the uplink's. */
		return drop_dir(ifindex ? ifindex : skb->ifindex, DIR_EGRESS, REASON_DROP_MALFORMED);
	}
	masq_count(MASQ_STAT_ICMP_ERR_OUT);
	return MASQ_CONTINUE;
}

/* Word i of the address cni_node_ips keeps for uplink k (see types.h). */
static __always_inline int uplink_word(struct ep_key *k, int i, __u8 *node)
{
	k->addr[4] = i;
	__u32 *w = bpf_map_lookup_elem(&cni_node_ips, k);

	if (!w)
		return -1;
	__builtin_memcpy(node + 4 * i, w, 4);
	return 0;
}

/* Without BPF_FIB_LOOKUP_SRC (kernels before 6.7, or forced): the address
 * of the family the node keeps for uplink oif (cni_node_ips' uplink
 * entries). Returns 0 or -1. */
static __always_inline int uplink_source(__u32 oif, __u8 family, __u8 *node)
{
	struct ep_key k = { .family = family | NODE_IP_UPLINK_SRC };

	__builtin_memcpy(k.addr, &oif, 4);
	if (uplink_word(&k, 0, node))
		return -1;
	if (family == AF_INET)
		return 0;
	if (uplink_word(&k, 1, node) || uplink_word(&k, 2, node) || uplink_word(&k, 3, node))
		return -1;
	return 0;
}

/* The source the node would pick for f's route (BPF_FIB_LOOKUP_SRC), as
 * MASQUERADE picks the outgoing link's address. Returns 0 or -1. */
static __noinline int masq_source(struct __sk_buff *skb, const struct flow *f, __u32 ifindex, __u8 *node)
{
	struct hp_config *c = node_config();
	__u32 fib_flags = c && (c->flags & HP_CFG_FIB_NO_SRC) ? 0 : BPF_FIB_LOOKUP_SRC;
	struct bpf_fib_lookup p = { .family = f->family, .ifindex = ifindex, .l4_protocol = f->proto };

	if (f->family == AF_INET) {
		__u8 tos = 0;

		bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, tos), &tos, 1);
		p.tos = tos;
		p.ipv4_src = *(const __be32 *)f->saddr;
		p.ipv4_dst = *(const __be32 *)f->daddr;
	} else {
		__builtin_memcpy(p.ipv6_src, f->saddr, 16);
		__builtin_memcpy(p.ipv6_dst, f->daddr, 16);
	}
	int rc = bpf_fib_lookup(skb, &p, sizeof(p), fib_flags);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return -1;
	if (!fib_flags)
		return uplink_source(p.ifindex, f->family, node);
	if (f->family == AF_INET) {
		if (!p.ipv4_src)
			return -1;
		*(__be32 *)node = p.ipv4_src;
		return 0;
	}
	if (is_unspecified6((struct in6_addr *)p.ipv6_src))
		return -1;
	__builtin_memcpy(node, p.ipv6_src, 16);
	return 0;
}

/* SNAT_F_ROOM's cut: the pod's segment f of a flow whose forward entry
 * fv has the bit (fl: its next flags, the packet's) moves H within its
 * block. Returns 1 when done, 0 for the lookup. */
static __noinline int snat_room_end(struct __sk_buff *skb, const struct flow *f, struct snat_val *fv, __u32 fl)
{
	struct tcp_seg *sp;

	if (!skb || !f || !fv || (fl & (SNAT_F_ROOM | SNAT_F_ACKED)) != (SNAT_F_ROOM | SNAT_F_ACKED) ||
	    (fl & (FLOW_F_FIN_BOTH | FLOW_F_CLOSING | SNAT_F_PEER_FIN | SNAT_F_KEPT)) ||
	    (f->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_FIN | TCP_FLAG_RST)))
		return 0;
	sp = tcp_seg_scratch();
	if (!sp || tcp_seg_load_in_place(skb, f, sp))
		return 0;
	__u64 c = fv->created_ns;
	__u32 h = (__u32)c;

	if ((sp->end ^ h) >= SNAT_ROOM_BLOCK)
		return 0;
	if ((__s32)(sp->end - h) > 0)
		fv->created_ns = (c & ~SNAT_LOW_WORD) | sp->end;
	return 1;
}

/* After the lookup: SNAT_F_ROOM on the forward entry fv as the reverse
 * entry rv (NULL: none) stands now. */
static __noinline void snat_room_note(struct snat_val *fv, const struct snat_val *rv)
{
	if (!fv)
		return;
	__u32 fl = fv->flags;
	int room = rv && snat_has_ack(rv->flags) &&
		   !(rv->flags & (SNAT_F_FIN_WAIT | SNAT_F_UNSHARED | FLOW_F_FIN_BOTH | FLOW_F_CLOSING)) &&
		   (__u32)fv->created_ns - snat_seq_of((struct snat_val *)rv)->win <= SNAT_ACK_BOUND - 2 * SNAT_ROOM_BLOCK;

	if (room && !(fl & SNAT_F_ROOM))
		snat_flags_apply(fv, SNAT_F_ROOM, 0);
	else if (!room && (fl & SNAT_F_ROOM))
		snat_flags_apply(fv, 0, SNAT_F_ROOM);
}

/* What a known flow's packet leaves with (masq_known). */
struct masq_to {
	__u8 addr[16];
	__be16 port;
};

/* masq_known is a global function (verified once, on its own) but in the
 * compat build, whose kernels (5.10) take no pointer arguments of a global
 * one: verified inline at each state of to_uplink's walk that reaches it,
 * fin21's tracking took to_uplink past the verifier's million instructions
 * (996503 before it). */
#ifdef EBPF_CNI_COMPAT
#define MASQ_KNOWN_LINKAGE static
#else
#define MASQ_KNOWN_LINKAGE
#endif

/*
 * The pod's packet f of a flow it has: *node and *port get what it leaves
 * with, its entries the packet's state. Returns 1, 0 for a new flow (or
 * a SYN reopening a released tuple at the pod's limit, its entries gone),
 * or 2 for a packet to drop (snat_share_back). A known flow keeps its node address while the node has it: looked up only
 * for flows made before the node last lost one (node_ips_gone). Not inlined:
 * its stack is not on top of snat_alloc's.
 */
MASQ_KNOWN_LINKAGE __noinline int masq_known(struct __sk_buff *skb, const struct flow *f, __u32 ifindex,
					     struct masq_to *to)
{
	__u64 now = bpf_ktime_get_ns();
	struct snat_key k;

	if (!f || !to)
		return 0;

	snat_key_of(&k, SNAT_DIR_FWD, f->saddr, f->sport, f->daddr, f->dport, f->family, f->proto);
	struct snat_val *fv = bpf_map_lookup_elem(&cni_snat, &k);
	if (!fv || fv->ifindex != ifindex || snat_expired(fv->flags, f->proto, snat_fwd_seen(fv), now) ||
	    (snat_born(fv, f->proto) <= node_ips_gone() && !is_node_ip(fv->addr, f->family)))
		return 0;
	__u16 fcur = fv->flags;
	__u16 fl = snat_next(fcur, f, 0, fv->created_ns, now);

	/* A FIN of the peer's waits for the pod's ack of its end. */
	if (f->proto == IPPROTO_TCP && (fv->flags & SNAT_F_PEER_FIN))
		fl = snat_peer_fin_acked(skb, f, fv, fl);
	addr_copy(to->addr, fv->addr, f->family);
	to->port = fv->port;
	/* The pod's SYN always reaches the tracking: it re-seeds the flow
	 * (tcpseq.h), even within a second of the last write. */
	int note = fl != fv->flags || now - fv->seen_ns > NSEC || (f->tcp_flags & TCP_FLAG_SYN);
	/* Each TCP segment carrying data reaches the tracking: the pod's
	 * highest end decides which of its FINs count (snat_pod_end). */
	int seg = f->proto == IPPROTO_TCP && !tcp_seg_quiet(skb, f);

	/* Within the room the last lookup saw: no lookup (SNAT_F_ROOM). */
	if (seg && !note && snat_room_end(skb, f, fv, fl))
		return 1;
	if (note || seg) {
		snat_key_of(&k, SNAT_DIR_REV, to->addr, to->port, f->daddr, f->dport, f->family, f->proto);
		struct snat_val *rv = bpf_map_lookup_elem(&cni_snat, &k);
		__u16 rcur = rv ? rv->flags : 0;
		/* A released flow: its payload takes the share back or is
		 * dropped, its SYN is judged as a new flow's (share25); its
		 * tracking stays as it is but for a SYN (a new flow). */
		if (rv && f->proto == IPPROTO_TCP && (rv->flags & SNAT_F_UNSHARED)) {
			int b = snat_share_back(skb, f, SNAT_HEAD(rv), &k, 0);
			if (b)
				return b == 1 ? 2 : 0; /* 2: a new flow's SYN (the entries gone) */
			if ((rv->flags & SNAT_F_UNSHARED) && !f->syn_only) {
				/* Still released: the state noted, the tracking
				 * left as it is (a branch of its own: the verifier's
				 * walk of what follows is not doubled). */
				if (note) {
					snat_note_fwd(fv, fl, now, f->proto);
					snat_note_rev(rv, &k, ifindex, rcur, fl, now);
				}
				return 1;
			}
		}
		/* A SYN: a new flow on the tuple, kept no more (no branch). */
		if (f->syn_only)
			snat_flags_apply(fv, 0, SNAT_F_KEPT | SNAT_F_PEER_FIN | SNAT_F_PEER_FIN_ACKS | SNAT_F_PEER_RST);
		/* The pod's FIN waits for the peer's ack (both entries). */
		if (rv && f->proto == IPPROTO_TCP && (f->tcp_flags & TCP_FLAG_FIN))
			fl = snat_fin_pod(skb, f, rv, fv, fl);
		if (note)
			snat_note_fwd(fv, fl, now, f->proto);
		if (rv) {
			if (note)
				snat_note_rev(rv, &k, ifindex, rcur, fl, now);
			if (f->proto == IPPROTO_TCP && note)
				snat_seq_pod(skb, f, rv, fv);
			else if (f->proto == IPPROTO_TCP)
				snat_pod_end(skb, f, rv, fv);
		}
		if (f->proto == IPPROTO_TCP)
			snat_room_note(fv, rv);
	}
	return 1;
}

/*
 * A new flow of the pod behind ifindex that got no port (*why from
 * snat_alloc; or a released flow's payload at its limit, snat_share_back), or
 * a packet it cannot translate (MASQ_STAT_ERROR): counted
 * in cni_masq_stats, in the pod's refusals when at its quota, and as the
 * pod's drop with its event. Out of line: to_uplink's
 * frame has no room for it (policy_judge sits on it at the 512-byte limit).
 */
static __noinline int masq_alloc_failed(struct __sk_buff *skb, __u32 ifindex, __u32 why, int quota)
{
	if (!quota)
		masq_quota_drop(ifindex);
	masq_count(why);
	if (!skb)
		return TC_ACT_SHOT;
	count_pkt(skb, ifindex, DIR_EGRESS,
		  why == MASQ_STAT_EXHAUSTED ? REASON_DROP_NAT_EXHAUSTED :
		  why == MASQ_STAT_POD_LIMIT ? REASON_DROP_NAT_POD_LIMIT : REASON_DROP_MALFORMED,
		  skb->len, 0);
	return TC_ACT_SHOT;
}

/*
 * A packet leaving the node through an uplink, forwarded from the host veth
 * of the masquerading pod ep with the pod's address as its source (the
 * caller checked). Returns MASQ_CONTINUE after translating it or leaving it
 * alone (destinations in the cluster CIDRs, what is not TCP/UDP/ICMP echo or
 * an ICMP error about a masqueraded flow, a TCP segment of no known flow),
 * or TC_ACT_SHOT.
 */
static __always_inline int masq_egress(struct __sk_buff *skb, const struct ep_info *ep, __u8 family)
{
	struct flow f = {};
	struct masq_to to = {};

	/* Over IPv6 also behind extension headers (flow_parse6_ext): else the
	 * pod's packet would leave with its own address. */
	int ext = 0;
	if (flow_parse(skb, family, &f, FLOW_ECHO_REQUEST) &&
	    (family != AF_INET6 || (ext = flow_parse6_ext(skb, &f, FLOW_ECHO_REQUEST)))) {
		__u8 proto = 0;

		/* A chain the bounded walk cannot see the end of (more than
		 * IP6_EXT_MAX headers, attack15): no translation, and no leak
		 * of the pod's address either. Dropped, counted as the
		 * masquerade's error and the pod's malformed drop. */
		if (ext == FLOW_EXT_UNWALKED && !in_cluster(f.daddr, family))
			return masq_alloc_failed(skb, ep->ifindex, MASQ_STAT_ERROR, 1);

		bpf_skb_load_bytes(skb, ETH_HLEN + (family == AF_INET ? offsetof(struct iphdr, protocol)
								       : offsetof(struct ipv6hdr, nexthdr)), &proto, 1);
		if (proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6)
			return masq_icmp_error_out(skb, family, ep->ifindex);
		return MASQ_CONTINUE;
	}
	if (in_cluster(f.daddr, family))
		return MASQ_CONTINUE;

	int known = masq_known(skb, &f, ep->ifindex, &to);
	if (known == 2)
		return masq_alloc_failed(skb, ep->ifindex, MASQ_STAT_POD_LIMIT, 1); /* a released flow's payload at the pod's limit */
	if (!known) {
		/* Only what opens a flow allocates: a TCP segment of no known flow
		 * (the pod answering a client that reached it directly over routes
		 * to the pod) is not rewritten. What decides is the pod's packet
		 * alone: nothing a host outside sends can exempt a pod's UDP
		 * (any datagram opens a flow; a client that reaches pods directly
		 * belongs in clusterCIDRs). */
		if (f.proto == IPPROTO_TCP && !f.syn_only) {
			masq_count(MASQ_STAT_NOT_NEW);
			return MASQ_CONTINUE;
		}
		if (masq_source(skb, &f, ep->ifindex, to.addr))
			return MASQ_CONTINUE;
		/* At its quota the pod opens no flow with a port of its own. */
		int quota = masq_quota_allows(ep->ifindex);
		__u32 why = quota ? MASQ_STAT_EXHAUSTED : MASQ_STAT_POD_LIMIT;
		to.port = snat_alloc(skb, &f, to.addr, ep->ifindex, &why);
		if (!to.port)
			return masq_alloc_failed(skb, ep->ifindex, why, quota);
		masq_pod_add(ep->ifindex); /* here: snat_alloc's stack is full */
		masq_count(MASQ_STAT_NEW);
	}

	if (pkt_rewrite(skb, &f, 1, to.addr, to.port)) {
		masq_count(MASQ_STAT_ERROR);
		/* ep->ifindex, which the caller checked: not kept live for this */
		return drop_dir(skb->ingress_ifindex, DIR_EGRESS, REASON_DROP_MALFORMED);
	}
	masq_count(MASQ_STAT_SNAT);
	return MASQ_CONTINUE;
}

/*
 * A packet arriving on an uplink: if it answers a masqueraded flow, rewrite
 * its destination back to the pod. Returns the verdict (TCX_NEXT: on to the
 * stack), or MASQ_CONTINUE when it is not ours.
 */
static __always_inline int masq_reverse(struct __sk_buff *skb, const struct flow *fp, __u8 family)
{
	/* fp: the packet parsed with FLOW_ECHO_REPLY, by the caller, which
	 * hands the same flow to hostPort: one parse per packet (issue 30).
	 * Left untouched when it returns MASQ_CONTINUE; copied (the rewrite
	 * updates it) only for a reply of ours. */
	struct snat_key rk;
	snat_key_of(&rk, SNAT_DIR_REV, fp->daddr, fp->dport, fp->saddr, fp->sport, family, fp->proto);
	struct snat_val *rv = bpf_map_lookup_elem(&cni_snat, &rk);
	if (!rv)
		return MASQ_CONTINUE;
	struct flow f = *fp;
	__u64 now = bpf_ktime_get_ns();
	if (snat_expired(rv->flags, f.proto, rv->seen_ns, now))
		return MASQ_CONTINUE;
	__u8 pod[16];
	__be16 pod_port = rv->port;
	__u32 ifindex = rv->ifindex;
	__builtin_memcpy(pod, rv->addr, 16);
	struct ep_info *ep = ep_lookup_addr(pod, family);
	if (!ep || ep->ifindex != ifindex)
		return MASQ_CONTINUE; /* the pod is gone */
	/* An RST outside the pod's window (a blind attacker's) changes
	 * nothing; it still goes to the pod, whose TCP ignores it. */
	/* The tracking may count the pod's FIN (its ack): compared with the
	 * state before, so that both entries take it. */
	__u16 cur = rv->flags;
	/* A released flow (share25): the peer's payload takes the share
	 * back or is dropped at the pod's limit; the tracking stays as it is. */
	int counts = 1;
	if (f.proto == IPPROTO_TCP && (cur & SNAT_F_UNSHARED)) {
		if (snat_share_back(skb, &f, SNAT_HEAD(rv), &rk, 1)) {
			masq_count(MASQ_STAT_POD_LIMIT);
			return drop_dir(ifindex, DIR_INGRESS, REASON_DROP_NAT_POD_LIMIT);
		}
	} else if (f.proto == IPPROTO_TCP) {
		counts = snat_seq_peer(skb, &f, rv);
		/* A FIN out of order waits for the pod's ack of its end. */
		if (!counts && (f.tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)) == TCP_FLAG_FIN)
			snat_peer_fin_wait(&f, rv);
		/* One ahead of end waits for the pod's next ACK (RFC 5961's
		 * challenge ACK shows where the pod's next number is). */
		else if (!counts && (f.tcp_flags & TCP_FLAG_RST))
			snat_peer_rst_wait(&f, rv);
	}
	__u16 base = rv->flags;
	__u16 fl = snat_next(base, &f, 1, rv->created_ns, now);
	if (counts && (fl != cur || now - rv->seen_ns > NSEC)) {
		snat_note_rev(rv, &rk, ifindex, base, fl, now);
		struct snat_key fk;
		snat_key_of(&fk, SNAT_DIR_FWD, pod, pod_port, f.saddr, f.sport, family, f.proto);
		struct snat_val *fv = bpf_map_lookup_elem(&cni_snat, &fk);
		if (fv)
			snat_note_fwd(fv, fl, now, f.proto);
	}

	if (pkt_rewrite(skb, &f, 0, pod, pod_port)) {
		masq_count(MASQ_STAT_ERROR);
		return drop_dir(ifindex, DIR_INGRESS, REASON_DROP_MALFORMED);
	}
	masq_count(MASQ_STAT_REVERSE);
	ev_trace_point(skb, ifindex, DIR_INGRESS, REASON_FORWARD, 0);
	/* On to the stack, which forwards it to the pod. */
	return TCX_NEXT;
}

/*
 * An ICMP error from another host (parsed into e) about a packet a
 * masquerading pod sent: the quote is node:port -> peer. Its source goes
 * back to the pod's address and port, as does the error's destination, and
 * the stack delivers it to the pod (conntrack finds it RELATED to the pod's
 * flow). Returns TCX_NEXT, TC_ACT_SHOT, or MASQ_CONTINUE when it is not
 * about a masqueraded flow.
 */
static __always_inline int masq_icmp_error_in(struct __sk_buff *skb, struct icmp_err *e)
{
	__u8 family = e->family;
	struct snat_key rk;

	snat_key_of(&rk, SNAT_DIR_REV, e->q.saddr, e->q.sport, e->q.daddr, e->q.dport, family, e->q.proto);
	struct snat_val *rv = bpf_map_lookup_elem(&cni_snat, &rk);
	if (!rv || snat_expired(rv->flags, rk.proto, rv->seen_ns, bpf_ktime_get_ns()))
		return MASQ_CONTINUE;
	__u8 pod[16];
	__be16 pod_port = rv->port;
	__u32 ifindex = rv->ifindex;
	__builtin_memcpy(pod, rv->addr, 16);
	struct ep_info *ep = ep_lookup_addr(pod, family);
	if (!ep || ep->ifindex != ifindex)
		return MASQ_CONTINUE;
	if (icmp_err_rewrite(skb, e, 1, pod, pod_port)) {
		masq_count(MASQ_STAT_ERROR);
		return drop_dir(ifindex, DIR_INGRESS, REASON_DROP_MALFORMED);
	}
	masq_count(MASQ_STAT_ICMP_ERR_IN);
	return TCX_NEXT;
}
