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
 *   end  the peer's next sequence number (the end of its in-order segments,
 *        or what the pod acknowledged when that is further),
 *        once its SYN-ACK (acking the pod's SYN) was seen: SNAT_F_PEER_END;
 *        before that, the pod's SYN's seq + 1, which an RST refusing the
 *        connection must acknowledge;
 *   win  the largest receive window the pod advertised, scaled by the
 *        shift it offered in its SYN when the peer's SYN-ACK offered one
 *        too (bits SNAT_WS_*); raised from the pod's segments whenever the
 *        entry is written anyway (state changes, once a second), so it may
 *        lag: it is never taken below SEQ_WIN_FLOOR.
 * An RST from the peer counts when its seq is end (once the peer's end is
 * known), or when it acknowledges the pod's SYN (before). win bounds how
 * far one segment or ack moves end.
 * One that does not is still translated and handed to the pod, whose own
 * TCP ignores it (RFC 5961); the flow's state does not change. The pod's
 * own RSTs always count. Flows opened by older programs carry no tracking
 * (no SNAT_F_SEQ) and keep the old rule.
 *
 * The tracking lives in the reverse entry's created_ns, which a TCP reverse
 * entry uses for nothing else (UDP's stream test reads it, the dump shows
 * the forward entry's age): no map changes its layout.
 */
#pragma once

#include "pkt.h"

struct snat_seq {
	__u32 end;
	__u32 win;
};

/* snat_val.flags bits above the FLOW_F_* state (reverse TCP entries). */
#define SNAT_F_SEQ (1U << 8)      /* created_ns holds a struct snat_seq */
#define SNAT_F_PEER_END (1U << 9) /* snat_seq.end is the peer's (its SYN-ACK was seen) */
#define SNAT_F_COUNTED (1U << 10) /* any reverse entry: counted in cni_masq_pods (masq.h; older builds' are not) */
#define SNAT_WS_SHIFT 12          /* bits 12-15: the pod's window scale */
#define SNAT_WS_MASK (0xfU << SNAT_WS_SHIFT)

#define SEQ_WIN_FLOOR 65535U

/* A TCP segment's numbers; end = seq + its length (SYN and FIN count one). */
struct tcp_seg {
	__u32 seq;
	__u32 ack;
	__u32 end;
	__u32 win;
	__u32 doff;
	__u8 flags;
};

static __always_inline struct snat_seq *snat_seq_of(struct snat_val *v)
{
	return (struct snat_seq *)&v->created_ns;
}

/* Loads the TCP header of f. The length comes from the IP header (a frame
 * arriving may carry Ethernet padding), or the skb's for a BIG TCP packet
 * (length 0). Returns 0 or -1. */
static __always_inline int tcp_seg_load(struct __sk_buff *skb, const struct flow *f, struct tcp_seg *s)
{
	__u8 h[12];
	__be16 len = 0;

	if (bpf_skb_load_bytes(skb, f->l4off + 4, h, sizeof(h)))
		return -1;
	s->seq = bpf_ntohl(*(__be32 *)&h[0]);
	s->ack = bpf_ntohl(*(__be32 *)&h[4]);
	s->doff = (h[8] >> 4) * 4;
	s->flags = h[9];
	s->win = bpf_ntohs(*(__be16 *)&h[10]);
	if (bpf_skb_load_bytes(skb, ETH_HLEN + (f->family == AF_INET ? 2 : 4), &len, sizeof(len)))
		return -1;
	__u32 iplen = bpf_ntohs(len);
	if (iplen && f->family == AF_INET6)
		iplen += sizeof(struct ipv6hdr);
	if (!iplen)
		iplen = skb->len - ETH_HLEN;
	__u32 hdr = f->l4off - ETH_HLEN + s->doff;
	s->end = s->seq + (iplen > hdr ? iplen - hdr : 0) + !!(s->flags & TCP_FLAG_SYN) + !!(s->flags & TCP_FLAG_FIN);
	return 0;
}

/* What tcp_syn_wscale's steps share (bpf_loop: the verifier walks one; the
 * compat build has no bpf_loop and walks them all). */
struct wscale_ctx {
	struct __sk_buff *skb;
	__u32 off; /* the next option */
	__u32 end; /* the end of the options */
	int ws;    /* the result; -1: none */
};

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

/* The pod's segment f of the flow whose reverse entry is rv: its SYN starts
 * the tracking, its later segments raise the window seen. */
static __noinline void snat_seq_pod(struct __sk_buff *skb, const struct flow *f, struct snat_val *rv)
{
	struct snat_seq *q = snat_seq_of(rv);
	struct tcp_seg s;

	if (tcp_seg_load(skb, f, &s))
		return;
	if ((s.flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN) {
		int ws = tcp_syn_wscale(skb, f->l4off, s.doff);

		q->end = s.seq + 1;
		q->win = s.win; /* a SYN's window is never scaled */
		rv->flags = (rv->flags & ~(SNAT_F_PEER_END | SNAT_WS_MASK)) | SNAT_F_SEQ |
			    ((ws > 0 ? ws : 0) << SNAT_WS_SHIFT);
		return;
	}
	if (!(rv->flags & SNAT_F_SEQ) || (s.flags & TCP_FLAG_SYN))
		return;
	__u32 w = s.win << ((rv->flags & SNAT_WS_MASK) >> SNAT_WS_SHIFT);
	if (w > q->win)
		q->win = w;
	/* What the pod acknowledged, it received: end catches up with data
	 * that reached it out of order (the peer's segments move end only in
	 * order). The pod's TCP accepts nothing whose ack it did not send for. */
	if ((rv->flags & SNAT_F_PEER_END) && (s.flags & TCP_FLAG_ACK)) {
		__s32 d = (__s32)(s.ack - q->end);

		if (d > 0 && (__u32)d <= (q->win > SEQ_WIN_FLOOR ? q->win : SEQ_WIN_FLOOR) << 2)
			q->end = s.ack;
	}
}

/*
 * The peer's segment f of the flow whose reverse entry is rv: 1 when it may
 * change the flow's state, 0 for an RST outside the pod's window. Its
 * SYN-ACK (acking the pod's SYN) and its later segments move end forward
 * (by at most four windows at once: a forged segment far ahead cannot
 * carry it off).
 */
static __noinline int snat_seq_peer(struct __sk_buff *skb, const struct flow *f, struct snat_val *rv)
{
	struct snat_seq *q = snat_seq_of(rv);
	struct tcp_seg s;

	if (!(rv->flags & SNAT_F_SEQ) || tcp_seg_load(skb, f, &s))
		return 1;
	__u32 w = q->win > SEQ_WIN_FLOOR ? q->win : SEQ_WIN_FLOOR;
	if (w > (1U << 29))
		w = 1U << 29;
	if (s.flags & TCP_FLAG_RST) {
		if (!(rv->flags & SNAT_F_PEER_END))
			return (s.flags & TCP_FLAG_ACK) && s.ack == q->end;
		/* Exactly the peer's next sequence number, as conntrack (Linux
		 * 6.2 on) closes a flow: an RST merely inside the window let a
		 * blind spray of 2^32 / 2w RSTs (32769 at the floor) hit one.
		 * The pod's TCP answers an inexact one with a challenge ACK,
		 * which a real peer answers with an exact RST. */
		return s.seq == q->end;
	}
	if (s.flags & TCP_FLAG_SYN) {
		if ((s.flags & TCP_FLAG_ACK) && !(rv->flags & SNAT_F_PEER_END) && s.ack == q->end) {
			if (tcp_syn_wscale(skb, f->l4off, s.doff) < 0)
				rv->flags &= ~SNAT_WS_MASK; /* no scaling unless both offer it */
			q->end = s.end;
			rv->flags |= SNAT_F_PEER_END;
		}
		return 1;
	}
	if (rv->flags & SNAT_F_PEER_END) {
		__s32 d = (__s32)(s.end - q->end);

		/* A FIN closes the flow with the pod's: only the peer's own, in
		 * order (covering end), counts; a blind one anywhere else would
		 * kill a half-closed connection ten seconds later. */
		if ((s.flags & TCP_FLAG_FIN) && ((__s32)(s.seq - q->end) > 0 || d < 0))
			return 0;

		/* Only a segment that covers end carries it: one anywhere ahead
		 * let a blind attacker set end where it liked (a one-byte
		 * segment every 4w) and then match it with an RST. */
		if ((__s32)(s.seq - q->end) <= 0 && d > 0 && (__u32)d <= w << 2)
			q->end = s.end;
	}
	return 1;
}
