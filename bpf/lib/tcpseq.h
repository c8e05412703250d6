/*
 * Which RSTs may close a masqueraded TCP flow (issue 28): only one at
 * exactly the peer's next sequence number, as conntrack closes one (Linux
 * 6.2 on; an in-window rule still let a blind spray of 32769 RSTs, or
 * one-byte segments moving end where the attacker chose, hit it). Without this check
 * any RST naming the flow's wire tuple (node address and port, peer
 * address and port: an attacker on the link can learn or guess them) marked
 * it closing, and a blind spray killed idle connections ten seconds later.
 *
 * Per flow, in its reverse cni_snat entry (SNAT_F_SEQ set):
 *   end  the peer's next sequence number (the end of its segments that
 *        start exactly at end, or what the pod acknowledged when that is
 *        further: never a segment that merely covers end, which a blind
 *        attacker's data could, rst8),
 *        once its SYN-ACK (acking the pod's SYN) was seen: SNAT_F_PEER_END;
 *        before that, the pod's SYN's seq + 1, which an RST refusing the
 *        connection must acknowledge;
 *   win  the largest receive window the pod advertised, scaled by the
 *        shift it offered in its SYN when the peer's SYN-ACK offered one
 *        too (bits SNAT_WS_*); raised from the pod's segments whenever the
 *        entry is written anyway (state changes, once a second), so it may
 *        lag: it is never taken below SEQ_WIN_FLOOR. The masquerade
 *        keeps there the peer's highest ack of the pod's data instead in
 *        the flows it opens (fin21: SNAT_POD_END and SNAT_F_ACKED; fin20's
 *        flows the pod's highest end; masq.h: its wrappers pass a bound
 *        in its place), and in an older build's flows the end of the
 *        pod's FIN until the peer acknowledges it (SNAT_F_FIN_WAIT; the
 *        floor bounds meanwhile).
 * An RST from the peer counts when its seq is end (once the peer's end is
 * known), or when it acknowledges the pod's SYN (before). win bounds how
 * far one segment or ack moves end.
 * One that does not is still translated and handed to the pod, whose own
 * TCP ignores it (RFC 5961); the flow's state does not change. The pod's
 * own RSTs always count. Flows opened by older programs carry no tracking
 * (no SNAT_F_SEQ) and keep the old rule.
 * A SYN of the peer's on a live flow changes nothing, as an RST that does
 * not count; the pod's SYN-ACK acknowledging a new ISN on the tuple (the
 * peer reconnected from the same port) re-seeds the tracking (rst8).
 *
 * The tracking lives in the reverse entry's created_ns, which a TCP reverse
 * entry uses for nothing else (UDP's stream test reads it, the dump shows
 * the forward entry's age): no map changes its layout.
 */
#pragma once

#include "pkt.h"
#include "maps.h"
#include "flowlife.h"

struct snat_seq {
	__u32 end;
	__u32 win;
};

/* snat_val.flags bit 0, free below the FLOW_F_* state (reverse TCP entries
 * with SNAT_F_SEQ): the pod sent a FIN the peer has not acknowledged yet,
 * snat_seq.win holds its end (snat_fin_pod; fin21's flows: the forward
 * entry's created_ns low word). */
#define SNAT_F_FIN_WAIT (1U << 0)
/* snat_val.flags bits above the FLOW_F_* state (reverse TCP entries). */
#define SNAT_F_SEQ (1U << 8)      /* created_ns holds a struct snat_seq */
#define SNAT_F_PEER_END (1U << 9) /* snat_seq.end is the peer's (its SYN-ACK was seen) */
#define SNAT_F_COUNTED (1U << 10) /* any reverse entry: counted in cni_masq_pods (masq.h; older builds' are not) */
#define SNAT_F_UNSHARED (1U << 11) /* a closed flow's reverse entry: its port no longer counted in cni_masq_share (masq.h) */
#define SNAT_WS_SHIFT 12          /* bits 12-15: the pod's window scale */
#define SNAT_WS_MASK (0xfU << SNAT_WS_SHIFT)

#define SEQ_WIN_FLOOR 65535U

/* A TCP segment's numbers; end = seq + its length (SYN and FIN count one).
 * It lives in the programs' per-CPU scratch (tcp_seg_scratch), with the
 * header bytes read: the tracking runs under callers whose stacks are near
 * the verifier's 512 bytes (from_container, and policy_judge under it). */
struct tcp_seg {
	__u32 seq;
	__u32 ack;
	__u32 end;
	__u32 win;
	__u32 doff;
	__u8 flags;
	__u8 base;  /* where the caller's flag word has the TSEQ_* bits */
	__be16 len; /* the IP header's length field */
	__u8 h[12]; /* the TCP header from its ack */
};

/* In cni_pol_scratch, where policy_judge's pol_work has a union of what it
 * is done with when it tracks a flow (policy.h asserts the offset): a tc
 * program runs to its end on its CPU. */
#define TCP_SEG_SCRATCH_OFF 104 /* offsetof(struct pol_work, seg) */
static __always_inline struct tcp_seg *tcp_seg_scratch(void)
{
	__u32 zero = 0;
	struct pol_scratch *p = bpf_map_lookup_elem(&cni_pol_scratch, &zero);

	return p ? (struct tcp_seg *)(p->data + TCP_SEG_SCRATCH_OFF) : NULL;
}

static __always_inline struct snat_seq *snat_seq_of(struct snat_val *v)
{
	return (struct snat_seq *)&v->created_ns;
}

/* skb->data and skb->data_end, each read by one instruction clang cannot
 * fold with the callers' reads: inlined into from_container's long body,
 * plain reads let it keep &skb->data_end in a register across the calls
 * (a modified ctx pointer, which the verifier refuses). */
static __always_inline void *tseq_data(const struct __sk_buff *skb)
{
	void *p;

	asm volatile("%[p] = *(u32 *)(%[skb] + %[off])"
		     : [p] "=r"(p)
		     : [skb] "r"(skb), [off] "i"(offsetof(struct __sk_buff, data)));
	return p;
}

static __always_inline void *tseq_data_end(const struct __sk_buff *skb)
{
	void *p;

	asm volatile("%[p] = *(u32 *)(%[skb] + %[off])"
		     : [p] "=r"(p)
		     : [skb] "r"(skb), [off] "i"(offsetof(struct __sk_buff, data_end)));
	return p;
}

/* tcp_seg_load's fields of the header bytes in s->h. */
static __always_inline void tcp_seg_fields(struct tcp_seg *s)
{
	__u8 *h = s->h;

	s->seq = bpf_ntohl(*(__be32 *)&h[0]);
	s->ack = bpf_ntohl(*(__be32 *)&h[4]);
	s->doff = (h[8] >> 4) * 4;
	s->flags = h[9];
	s->win = bpf_ntohs(*(__be16 *)&h[10]);
}

/* tcp_seg_load's end, from s->len and the fields. */
static __always_inline int tcp_seg_end(struct __sk_buff *skb, const struct flow *f, struct tcp_seg *s)
{
	__u32 iplen = bpf_ntohs(s->len);
	if (iplen && f->family == AF_INET6)
		iplen += sizeof(struct ipv6hdr);
	if (!iplen)
		iplen = skb->len - ETH_HLEN;
	__u32 hdr = f->l4off - ETH_HLEN + s->doff;
	s->end = s->seq + (iplen > hdr ? iplen - hdr : 0) + !!(s->flags & TCP_FLAG_SYN) + !!(s->flags & TCP_FLAG_FIN);
	return 0;
}

/* Loads the TCP header of f. The length comes from the IP header (a frame
 * arriving may carry Ethernet padding), or the skb's for a BIG TCP packet
 * (length 0). Returns 0 or -1. */
static __always_inline int tcp_seg_load(struct __sk_buff *skb, const struct flow *f, struct tcp_seg *s)
{
	if (bpf_skb_load_bytes(skb, f->l4off + 4, s->h, sizeof(s->h)))
		return -1;
	tcp_seg_fields(s);
	s->len = 0;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + (f->family == AF_INET ? 2 : 4), &s->len, sizeof(s->len)))
		return -1;
	return tcp_seg_end(skb, f, s);
}

/* tcp_seg_load read in place when the headers are in the linear data (the
 * common case: no helper calls, issue 30), else copied out. The NAT
 * tables' peer segments only, every one of which is tracked: in the pod's
 * (tracked once a second) and policy's, the frame would grow past what
 * policy_judge's chain leaves. */
static __always_inline int tcp_seg_load_in_place(struct __sk_buff *skb, const struct flow *f, struct tcp_seg *s)
{
	void *data = tseq_data(skb);
	void *data_end = tseq_data_end(skb);
	__u32 off = f->l4off;
	__u8 *t = data + (off & 0xff); /* bounded for the verifier, as flow_l4 */
	__u8 *l = data + ETH_HLEN + (f->family == AF_INET ? 2 : 4);

	if (off > 0xff || (void *)(t + 4 + sizeof(s->h)) > data_end || (void *)(l + 2) > data_end)
		return tcp_seg_load(skb, f, s);
	__builtin_memcpy(s->h, t + 4, sizeof(s->h));
	tcp_seg_fields(s);
	s->len = *(__be16 *)l;
	return tcp_seg_end(skb, f, s);
}

/* What tcp_syn_wscale's steps share (bpf_loop: the verifier walks one; the
 * compat build has no bpf_loop and walks them all). */
struct wscale_ctx {
	struct __sk_buff *skb;
	__u16 off; /* the next option */
	__u16 end; /* the end of the options */
	int ws;    /* the result; -1: none */
}; /* 16 bytes: its frame is at the bottom of policy_judge's deepest chain */

/* One option: returns 1 (stop) at the end, at the window scale, or at
 * garbage. */
static long wscale_step(__u32 i, struct wscale_ctx *c)
{
	__u8 o[3];

	if (c->off >= c->end || bpf_skb_load_bytes(c->skb, c->off, o, 1) || o[0] == 0)
		return 1;
	if (o[0] == 1) { /* NOP */
		c->off++;
		return 0;
	}
	if (bpf_skb_load_bytes(c->skb, c->off, o, 2) || o[1] < 2)
		return 1;
	if (o[0] == 3 && o[1] == 3) {
		if (!bpf_skb_load_bytes(c->skb, c->off, o, 3))
			c->ws = o[2] > 14 ? 14 : o[2];
		return 1;
	}
	c->off += o[1];
	return 0;
}

/* The compat build's loop is walked step by step: there tcp_syn_wscale is a
 * global function, which the verifier checks once, not at each of its two
 * calls (both inside to_uplink's walk exceeded its 1M instructions). */
#ifdef EBPF_CNI_COMPAT
#define WSCALE_LINKAGE
#else
#define WSCALE_LINKAGE static
#endif

/* The window scale a SYN offers (its options, from l4off + 20 to l4off +
 * doff), at most 14; -1 when none. */
WSCALE_LINKAGE __noinline int tcp_syn_wscale(struct __sk_buff *skb, __u32 l4off, __u32 doff)
{
	struct wscale_ctx c = { .skb = skb, .off = l4off + 20, .end = l4off + doff, .ws = -1 };

#ifndef EBPF_CNI_COMPAT
	bpf_loop(40, wscale_step, &c, 0);
#else
	/* No bpf_loop (5.17): a bounded loop (5.3). */
	for (__u32 i = 0; i < 40; i++)
		if (wscale_step(i, &c))
			break;
#endif
	return c.ws;
}

/*
 * The tracking above, for any flow table whose entries have 8 bytes for a
 * struct snat_seq and 8 flag bits free at base (TSEQ_* << base): masquerade
 * (cni_snat reverse entries, base 8: the SNAT_F_* bits), hostPort (cni_ct,
 * base 8) and policy (cni_pol_ct_parts, base 16). "local" is the pod, whose
 * TCP the RSTs reach, "remote" the peer whose RSTs are judged; either may
 * have opened the flow: the tracking starts with the pod's SYN (it knows
 * the peer's end once the SYN-ACK comes) or the peer's (its end is known at
 * once; the pod's SYN-ACK gives the window and its scale).
 */
#define TSEQ_F_SEQ 1U      /* the entry's snat_seq is live */
#define TSEQ_F_PEER_END 2U /* snat_seq.end is the remote's next sequence number */
#define TSEQ_WS_SHIFT 4    /* bits 4-7 (above base): the pod's window scale */
#define TSEQ_WS_MASK (0xfU << TSEQ_WS_SHIFT)
#define TSEQ_BASE_NOSCALE 16 /* bits at base 16 (policy): the pod's window scale is not read, 14 assumed */
_Static_assert(SNAT_F_SEQ == TSEQ_F_SEQ << 8 && SNAT_F_PEER_END == TSEQ_F_PEER_END << 8 &&
		       SNAT_WS_MASK == TSEQ_WS_MASK << 8,
	       "the masquerade's tcpseq bits are TSEQ_* at base 8");

/* The pod's segment f of a flow whose tracking is q, with its bits in *fl
 * at base: its SYN starts the tracking, its SYN-ACK (the peer opened the
 * flow) gives the window, its later segments raise the window seen.
 * Returns the SYN's header length when its window scale is to be read
 * (tcp_seq_local does, out of this frame: the callers' stacks are near
 * the verifier's limit), else 0. */
static __noinline int tcp_seq_local_(struct __sk_buff *skb, const struct flow *f, struct snat_seq *q, __u32 *fl,
				   struct tcp_seg *sp)
{

	if (tcp_seg_load(skb, f, sp))
		return 0;
	/* Read after the load: fewer values live across its calls (the
	 * frame must stay small, see tcp_seq_local). */
	__u32 base = sp->base;
	__u32 seq = TSEQ_F_SEQ << base, peer_end = TSEQ_F_PEER_END << base, wsm = TSEQ_WS_MASK << base;
	__u32 v = *fl;
	if ((sp->flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN) {
		q->end = sp->seq + 1;
		q->win = sp->win; /* a SYN's window is never scaled */
		*fl = (v & ~(peer_end | wsm)) | seq;
		return sp->doff;
	}
	if (!(v & seq))
		return 0;
	if (sp->flags & TCP_FLAG_SYN) {
		/* The pod answers the peer's SYN: it offers a scale only when
		 * the peer did (RFC 7323), so its offer is the one in use. Its
		 * ack is the peer's ISN + 1: when that is not end, the peer
		 * reused the tuple with a new ISN and the pod took it (a live
		 * socket answers a SYN with a challenge ACK, RFC 5961 4.2, not
		 * a SYN-ACK): the tracking follows the new connection, its
		 * state is a handshake's (as conntrack re-syncs on a SYN-ACK
		 * acknowledging a SYN it ignored). The pod's packets are its
		 * own (anti-spoofing): nothing from outside moves this. */
		if ((sp->flags & TCP_FLAG_ACK) && (v & peer_end)) {
			if (sp->ack != q->end)
				v = (v & ~FLOW_STATE_MASK) | FLOW_F_REPLIED;
			q->end = sp->ack;
			q->win = sp->win;
			*fl = v & ~wsm;
			return sp->doff;
		}
		return 0;
	}
	__u32 w = sp->win << ((v & wsm) >> (TSEQ_WS_SHIFT + base));
	if (w > q->win)
		q->win = w;
	/* What the pod acknowledged, it received: end catches up with data
	 * that reached it out of order (the peer's segments move end only in
	 * order). The pod's TCP accepts nothing whose ack it did not send for. */
	if ((v & peer_end) && (sp->flags & TCP_FLAG_ACK)) {
		__s32 d = (__s32)(sp->ack - q->end);

		if (d > 0 && (__u32)d <= (q->win > SEQ_WIN_FLOOR ? q->win : SEQ_WIN_FLOOR) << 2)
			q->end = sp->ack;
	}
	return 0;
}

/*
 * The peer's segment f of a flow tracked in q and *fl (at base): nonzero
 * when it may change the flow's state (its header length for a SYN-ACK
 * whose window scale is to be read), 0 for an RST outside the pod's window
 * (or a FIN out of order). Its SYN opening the flow starts the tracking; its
 * SYN-ACK (acking the pod's SYN) and its later segments move end forward
 * (by at most four windows at once: a forged segment far ahead cannot
 * carry it off).
 */
static __always_inline int tcp_seq_remote_body(struct __sk_buff *skb, const struct flow *f, struct snat_seq *q,
					       __u32 *fl, struct tcp_seg *sp, int in_place)
{
	if (in_place ? tcp_seg_load_in_place(skb, f, sp) : tcp_seg_load(skb, f, sp))
		return 1;
	/* Read after the load: fewer values live across its calls (the
	 * frame must stay small, see tcp_seq_local). */
	__u32 base = sp->base;
	__u32 seq = TSEQ_F_SEQ << base, peer_end = TSEQ_F_PEER_END << base, wsm = TSEQ_WS_MASK << base;
	__u32 v = *fl;
	/* The peer opens the flow, or again once it closed (its port reused):
	 * its end is known from its SYN; the pod's window until its SYN-ACK
	 * says more: the floor. A SYN on a live tracked flow moves nothing
	 * (else a forged one would set end for a forged RST to hit). */
	if (!(v & seq) || (v & FLOW_F_CLOSING)) {
		if ((sp->flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_RST)) == TCP_FLAG_SYN) {
			q->end = sp->end;
			q->win = 0;
			*fl = (v & ~wsm) | seq | peer_end;
			return 1;
		}
		if (!(v & seq))
			return 1;
	}
	__u32 w = q->win > SEQ_WIN_FLOOR ? q->win : SEQ_WIN_FLOOR;
	if (w > (1U << 29))
		w = 1U << 29;
	if (sp->flags & TCP_FLAG_RST) {
		if (!(v & peer_end))
			return (sp->flags & TCP_FLAG_ACK) && sp->ack == q->end;
		/* Exactly the peer's next sequence number, as conntrack (Linux
		 * 6.2 on) closes a flow: an RST merely inside the window let a
		 * blind spray of 2^32 / 2w RSTs (32769 at the floor) hit one.
		 * The pod's TCP answers an inexact one with a challenge ACK,
		 * which a real peer answers with an exact RST. */
		return sp->seq == q->end;
	}
	if (sp->flags & TCP_FLAG_SYN) {
		if ((sp->flags & TCP_FLAG_ACK) && !(v & peer_end) && sp->ack == q->end) {
			q->end = sp->end;
			*fl = v | peer_end;
			return sp->doff; /* tcp_seq_remote reads its scale */
		}
		/* Any other SYN on a live flow changes nothing, its state
		 * neither: a forged one would set end for a forged RST to hit,
		 * or reset an established flow to a handshake's 120 s. The
		 * pod's TCP answers a real client's new connection on the
		 * tuple with a SYN-ACK, which re-seeds the tracking
		 * (tcp_seq_local), or, its socket live, with a challenge ACK
		 * that the client answers with an RST at end. A SYN-ACK
		 * moves no state but the reply seen (flow_next), as before. */
		return !!(sp->flags & TCP_FLAG_ACK);
	}
	if (v & peer_end) {
		__s32 d = (__s32)(sp->end - q->end);

		/* A FIN closes the flow with the pod's: only the peer's own, in
		 * order (at end, or the one that moved end there), counts; a
		 * blind one anywhere else would kill a half-closed connection
		 * ten seconds later. */
		if ((sp->flags & TCP_FLAG_FIN) && sp->seq != q->end && d != 0)
			return 0;

		/* Only a segment exactly in order carries end: one merely
		 * covering it let a blind attacker move end with a data
		 * segment anywhere in L bytes before it, then match it with an
		 * RST (2^32 / L pairs, not 2^32 RSTs); one anywhere ahead let
		 * it set end where it liked. Data that reached the pod out of
		 * order moves end once the pod acknowledges it
		 * (tcp_seq_local). */
		if (sp->seq == q->end && d > 0 && (__u32)d <= w << 2)
			q->end = sp->end;
	}
	return 1;
}

/* The body apart for policy (headers copied out: its chain under
 * policy_judge is at the verifier's 512 bytes) and for the NAT tables
 * (cni_ct, cni_snat: read in place, every peer segment of every flow). */
static __noinline int tcp_seq_remote_(struct __sk_buff *skb, const struct flow *f, struct snat_seq *q, __u32 *fl,
				    struct tcp_seg *sp)
{
	return tcp_seq_remote_body(skb, f, q, fl, sp, 0);
}

static __noinline int tcp_seq_remote_nat_(struct __sk_buff *skb, const struct flow *f, struct snat_seq *q, __u32 *fl,
					struct tcp_seg *sp)
{
	return tcp_seq_remote_body(skb, f, q, fl, sp, 1);
}

/* tcp_seq_local_ with the SYN's window scale read: the pod's segment f. */
static __always_inline void tcp_seq_local(struct __sk_buff *skb, const struct flow *f, struct snat_seq *q, __u32 *fl,
					  __u32 base, struct tcp_seg *sp)
{
	if (!sp)
		return;
	sp->base = base;
	int doff = tcp_seq_local_(skb, f, q, fl, sp);

	if (doff > 0) {
		/* No room to read the options (policy_judge's chain, below
		 * from_container's frame): the largest scale. The window only
		 * bounds how far the pod's own acks move end; the peer's
		 * segments move it only when they cover it. */
		int ws = base == TSEQ_BASE_NOSCALE ? 14 : tcp_syn_wscale(skb, f->l4off, doff);

		*fl |= (__u32)(ws > 0 ? ws : 0) << (TSEQ_WS_SHIFT + base);
	}
}

/*
 * Whether the peer's segment f can move nothing in tcp_seq_remote_: no
 * SYN, FIN or RST, and no payload (seq == end: a pure ACK, half the
 * peer's segments of a download). Such a segment leaves the tracking as it
 * is and counts (returns 1) whatever the tracking holds, so it skips the
 * call, the scratch and the header loads (issue 30: the hostPort and
 * masquerade replies' per-packet cost). Read in place from the linear
 * data; anything else (headers out of it, BIG TCP's length 0) takes the
 * full path.
 */
static __always_inline int tcp_seg_quiet(struct __sk_buff *skb, const struct flow *f)
{
	void *data = tseq_data(skb);
	void *data_end = tseq_data_end(skb);
	__u32 off = f->l4off, iplen;

	if ((f->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_FIN | TCP_FLAG_RST)) || off > 0xff)
		return 0;
	__u8 *t = data + (off & 0xff); /* bounded for the verifier, as flow_l4 */
	if ((void *)(t + 13) > data_end)
		return 0;
	if (f->family == AF_INET) {
		struct iphdr *ip = data + ETH_HLEN;

		if ((void *)(ip + 1) > data_end)
			return 0;
		iplen = bpf_ntohs(ip->tot_len);
	} else {
		struct ipv6hdr *ip6 = data + ETH_HLEN;

		if ((void *)(ip6 + 1) > data_end || !ip6->payload_len)
			return 0;
		iplen = bpf_ntohs(ip6->payload_len) + sizeof(struct ipv6hdr);
	}
	/* tcp_seg_load's end - seq: the length past the headers, 0 when the
	 * IP length does not exceed them. */
	return iplen && iplen <= off - ETH_HLEN + (t[12] >> 4) * 4;
}

/* tcp_seq_remote_ with the SYN-ACK's window scale read: the peer's segment
 * f; 0 for an RST outside the pod's window. sp NULL: the programs' scratch.
 * The NAT tables' (base 8) skip a quiet segment before the scratch and the
 * call, and read the headers in place; policy's (TSEQ_BASE_NOSCALE) as
 * before: its chain has no room for either. */
static __always_inline int tcp_seq_remote(struct __sk_buff *skb, const struct flow *f, struct snat_seq *q, __u32 *fl,
					  __u32 base, struct tcp_seg *sp)
{
	int nat = base != TSEQ_BASE_NOSCALE;

	if (nat && tcp_seg_quiet(skb, f))
		return 1;
	if (!sp)
		sp = tcp_seg_scratch();
	if (!sp)
		return 1;
	sp->base = base;
	int r = nat ? tcp_seq_remote_nat_(skb, f, q, fl, sp) : tcp_seq_remote_(skb, f, q, fl, sp);

	if (r > 1) {
		if (base != TSEQ_BASE_NOSCALE && tcp_syn_wscale(skb, f->l4off, r) < 0)
			*fl &= ~(TSEQ_WS_MASK << base); /* no scaling unless both offer it */
		r = 1;
	}
	return r;
}

/* The masquerade's wrappers (snat_seq_pod, snat_seq_peer, and its FIN
 * rule) are in masq.h, its only user. */
