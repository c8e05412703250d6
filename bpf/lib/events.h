/*
 * Datapath events for the agent (`ebpf-agent observe`): one EV_DROP per
 * dropped packet, and flow events (first packet of a flow, its TCP end)
 * for the endpoints that asked for them. Sent from count() (endpoint.h),
 * the one path every verdict goes through, so a drop reason added later
 * gets its events with no code of its own.
 *
 * Cost: with cni_ev_config's flags clear, one array lookup per packet.
 * Every event passes a per-CPU token bucket first (cni_ev_cpu), so a flood
 * of drops costs the ring and the agent at most the configured rate; what
 * the bucket or a full ring refuses is counted per CPU, never silent.
 */
#pragma once

#include "maps.h"

/* The program an object's count() calls are in (enum ev_prog), for trace
 * events: each program's source defines it before its includes. */
#ifndef CNI_PROG
#define CNI_PROG EV_PROG_NONE
#endif

/* ev_packet_on's dir_reason: what ev_packet packs into it. */
#define EV_PK_TRACE_ONLY (1U << 24) /* a trace point, no verdict: no drop or flow event */

/* Not a drop: counted for a packet handed on or answered. Every other
 * reason, including ones added after this was written, is a drop. */
static __always_inline int reason_is_drop(__u8 reason)
{
	return reason != REASON_FORWARD && reason != REASON_REDIRECT && reason != REASON_NEIGH_REPLY;
}

/* Takes one event's worth of tokens from this CPU's bucket; 0 when the
 * event may not be sent (counted as lost_rate). */
static __always_inline int ev_admit(const struct ev_config *cfg, struct ev_cpu *c)
{
	/* Per-CPU value: no other program touches it while this one runs. */
	__u64 now = bpf_ktime_get_ns();
	__u64 tokens = c->tokens_ns + (now - c->last_ns);

	if (tokens > cfg->burst_ns)
		tokens = cfg->burst_ns;
	c->last_ns = now;
	if (tokens < cfg->cost_ns) {
		c->tokens_ns = tokens;
		c->lost_rate++;
		return 0;
	}
	c->tokens_ns = tokens - cfg->cost_ns;
	return 1;
}

/* Reserves a record in the ring; NULL when it is full (counted). The
 * record is built in place: nothing of it on the stack. */
static __always_inline struct cni_event *ev_reserve(struct ev_cpu *c)
{
	struct cni_event *e = bpf_ringbuf_reserve(&cni_events, sizeof(*e), 0);

	if (!e) {
		c->lost_ring++;
		return NULL;
	}
	__builtin_memset(e, 0, sizeof(*e));
	return e;
}

static __always_inline void ev_submit(struct ev_cpu *c, struct cni_event *e)
{
	bpf_ringbuf_submit(e, 0);
	c->sent++;
}

/*
 * Reads what the event needs from the packet as it is now, with
 * bpf_skb_load_bytes: it works on truncated and malformed packets (what
 * is missing stays zero) and needs no bounds proofs from the caller. No
 * extension header walk: an IPv6 packet with one shows its next header.
 */
static __always_inline void ev_tuple(struct __sk_buff *skb, struct cni_event *e)
{
	__u32 l4;

	/* e is ring memory: headers are loaded into it, not onto the stack
	 * (the events code runs as a subprogram of programs whose own stack
	 * is large, and both count towards the 512 bytes). */
	if (bpf_skb_load_bytes(skb, 12, &e->ethertype, 2))
		return;
	if (e->ethertype == bpf_htons(ETH_P_IP)) {
		__u8 *ip = e->saddr; /* the 20 bytes of the header, then the addresses in place */
		__u16 frag;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, ip, 20))
			return;
		e->family = AF_INET;
		e->proto = ip[9];
		l4 = ETH_HLEN + (ip[0] & 0xf) * 4;
		frag = ((__u16)ip[6] << 8 | ip[7]) & 0x1fff;
		__builtin_memcpy(e->daddr, ip + 16, 4);
		__builtin_memcpy(e->saddr, ip + 12, 4);
		__builtin_memset(e->saddr + 4, 0, 12);
		__builtin_memset(e->daddr + 4, 0, 12);
		if (frag)
			return; /* a later fragment: no L4 header */
	} else if (e->ethertype == bpf_htons(ETH_P_IPV6)) {
		if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, saddr), e->saddr, 32) ||
		    bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, nexthdr), &e->proto, 1))
			return;
		e->family = AF_INET6;
		l4 = ETH_HLEN + sizeof(struct ipv6hdr);
	} else {
		return;
	}
	switch (e->proto) {
	case IPPROTO_TCP:
		if (!bpf_skb_load_bytes(skb, l4, &e->sport, 4))
			bpf_skb_load_bytes(skb, l4 + 13, &e->tcp_flags, 1);
		break;
	case IPPROTO_UDP:
	case IPPROTO_SCTP:
		bpf_skb_load_bytes(skb, l4, &e->sport, 4);
		break;
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		/* type and code, each widened to its port field */
		if (!bpf_skb_load_bytes(skb, l4, (__u8 *)&e->sport + 1, 1))
			bpf_skb_load_bytes(skb, l4 + 1, (__u8 *)&e->dport + 1, 1);
		break;
	}
}

/*
 * The flow of a packet handed on, by direct packet access (no helper
 * calls on every packet): 0 when it has none (not IP) or its headers are
 * not all in the linear data or IPv4 has options; such packets are left
 * out of flow tracking (a TCP handshake's and end's packets are small:
 * linear).
 */
static __always_inline int ev_flow_tuple(struct __sk_buff *skb, struct ev_flow_key *k, __u8 *tcp_flags)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	void *l4;

	if ((void *)(eth + 1) > end)
		return 0;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end || ip->ihl != 5)
			return 0;
		k->family = AF_INET;
		k->proto = ip->protocol;
		*(__be32 *)k->saddr = ip->saddr;
		*(__be32 *)k->daddr = ip->daddr;
		if (ip->frag_off & bpf_htons(0x1fff))
			return 1;
		l4 = ip + 1;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > end)
			return 0;
		k->family = AF_INET6;
		k->proto = ip6->nexthdr;
		__builtin_memcpy(k->saddr, &ip6->saddr, 16);
		__builtin_memcpy(k->daddr, &ip6->daddr, 16);
		l4 = ip6 + 1;
	} else {
		return 0;
	}
	switch (k->proto) {
	case IPPROTO_TCP: {
		struct tcphdr *t = l4;

		if ((void *)(t + 1) > end)
			return 0;
		k->sport = t->source;
		k->dport = t->dest;
		*tcp_flags = ((__u8 *)t)[13];
		break;
	}
	case IPPROTO_UDP:
	case IPPROTO_SCTP: {
		__be16 *p = l4;

		if ((void *)(p + 2) > end)
			return 0;
		k->sport = p[0];
		k->dport = p[1];
		break;
	}
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6: {
		__u8 *tc = l4;

		if ((void *)(tc + 2) > end)
			return 0;
		k->sport = bpf_htons(tc[0]);
		k->dport = bpf_htons(tc[1]);
		break;
	}
	}
	return 1;
}

#define TCP_FL_FIN 0x01
#define TCP_FL_SYN 0x02
#define TCP_FL_RST 0x04
#define TCP_FL_ACK 0x10

/*
 * How long a CPU trusts that a flow it found in cni_ev_flows is still
 * there (struct ev_flow_hot): 100 jiffies, at most 1 s at any HZ from 100.
 * Within it the flow's packets skip the table, seen_ns included; the first
 * packet after it refreshes both, so seen_ns lags a busy flow by at most
 * 2 s, far below the agent's idle sweep (30 s).
 */
#define EV_HOT_JIFFIES 100

/* The hot slot of a flow: a multiplicative hash of what tells this CPU's
 * few busy flows apart (the two directions of a connection differ in port
 * order and endpoint; pings to different hosts only in addresses). */
static __always_inline __u32 ev_hot_slot(const struct ev_flow_key *k)
{
	const __u32 *s = (const void *)k->saddr, *d = (const void *)k->daddr;
	__u32 h = k->ifindex ^ ((__u32)k->sport << 16 | k->dport) ^ (__u32)k->dir << 8;

	h ^= s[0] ^ s[3] ^ d[0] ^ d[3];
	return (h * 0x9e3779b1U) >> (32 - EV_HOT_BITS);
}

static __always_inline int ev_key_eq(const struct ev_flow_key *a, const struct ev_flow_key *b)
{
	/* Both 8-aligned in cni_ev_cpu's value: 44 bytes as 5 words and one half. */
	const __u64 *x = (const void *)a, *y = (const void *)b;

	return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3]) | (x[4] ^ y[4]) |
		(__u64)(*(const __u32 *)(x + 5) ^ *(const __u32 *)(y + 5))) == 0;
}

/*
 * Flow events of a packet handed on: EV_FLOW_START for the first packet of
 * (endpoint, direction, 5-tuple), EV_FLOW_END at its TCP FIN or RST (a SYN
 * after that starts it again). The agent ends flows idle too long
 * (pkg/maps/events.go). Only the first packet and the end write the
 * table; the others refresh seen_ns at most once a second.
 *
 * Only a packet whose flow is not in the table, or a SYN, FIN or RST, can
 * send an event: any other packet of a flow this CPU found in the table
 * less than EV_HOT_JIFFIES ago is done after a compare with its hot slot
 * (no table lookup, no clock read). A flow the LRU evicts meanwhile is
 * announced again at its first packet after that window, not at once.
 */
static __always_inline void ev_flow(struct __sk_buff *skb, const struct ev_config *cfg, struct ev_cpu *c,
				    __u32 ifindex, __u8 dir, __u8 reason, __u32 len)
{
	struct ev_flow_key *k = &c->key; /* per-CPU scratch, see struct ev_cpu */
	__u8 flags = 0, type;

	__builtin_memset(k, 0, sizeof(*k));
	k->ifindex = ifindex;
	k->dir = dir;
	if (!ev_flow_tuple(skb, k, &flags))
		return;
	__u32 zero = 0;
	struct ev_hot *hs = bpf_map_lookup_elem(&cni_ev_hot, &zero);
	struct ev_flow_hot *hot = hs ? &hs->slot[ev_hot_slot(k)] : NULL;
	/* Inlined by the verifier (a load of jiffies): no helper call. */
	__u32 now_j = bpf_jiffies64();
	int fresh = 0, mine = 0;

	if (hot) {
		fresh = now_j - hot->stamp_j < EV_HOT_JIFFIES;
		mine = fresh && ev_key_eq(&hot->key, k);
	}
	if (mine && !(flags & (TCP_FL_SYN | TCP_FL_FIN | TCP_FL_RST)))
		return;
	/* Whatever follows leaves the flow in the table, open or closed, but
	 * for a failed insert (below). The slot is taken only when stale (or
	 * the flow's own): a flow busy in it keeps it, and another flow that
	 * shares it only pays the table lookup, as without slots, rather than
	 * both missing by turns. Written before the helper calls: the slot
	 * and the time need not outlive them (a smaller frame). */
	if (hot && (!fresh || mine)) {
		__builtin_memcpy(&hot->key, k, sizeof(*k));
		hot->stamp_j = now_j;
	}

	__u64 now = bpf_ktime_get_ns();
	struct ev_flow_val *f = bpf_map_lookup_elem(&cni_ev_flows, k);
	__u8 tcp = k->proto == IPPROTO_TCP;

	if (!f) {
		struct ev_flow_val *nv = &c->val;

		__builtin_memset(nv, 0, sizeof(*nv));
		nv->first_ns = now;
		nv->seen_ns = now;
		nv->reason = reason;
		/* Two CPUs may see a first packet at once: the one that inserts
		 * announces it. */
		if (bpf_map_update_elem(&cni_ev_flows, k, nv, BPF_NOEXIST)) {
			/* Inserted by another CPU meanwhile, or not at all (no
			 * memory): the next packet looks again. */
			struct ev_hot *hh = bpf_map_lookup_elem(&cni_ev_hot, &zero);

			if (hh && ev_key_eq(&hh->slot[ev_hot_slot(k)].key, k))
				hh->slot[ev_hot_slot(k)].key.ifindex = 0;
			return;
		}
		type = EV_FLOW_START;
	} else if (!(f->flags & EV_FLOW_CLOSED) && tcp && (flags & (TCP_FL_FIN | TCP_FL_RST))) {
		f->flags |= EV_FLOW_CLOSED;
		f->seen_ns = now;
		type = EV_FLOW_END;
	} else if ((f->flags & EV_FLOW_CLOSED) && tcp && (flags & (TCP_FL_SYN | TCP_FL_ACK)) == TCP_FL_SYN) {
		f->flags &= ~EV_FLOW_CLOSED;
		f->first_ns = now;
		f->seen_ns = now;
		f->reason = reason;
		type = EV_FLOW_START;
	} else {
		if (now - f->seen_ns > NSEC)
			f->seen_ns = now;
		return;
	}
	if (!ev_admit(cfg, c))
		return;
	struct cni_event *e = ev_reserve(c);
	if (!e)
		return;
	e->ts_ns = now;
	e->ifindex = ifindex;
	e->len = len;
	e->type = type;
	e->dir = dir;
	e->reason = reason;
	e->family = k->family;
	e->proto = k->proto;
	e->tcp_flags = flags;
	e->ethertype = k->family == AF_INET6 ? bpf_htons(ETH_P_IPV6) : bpf_htons(ETH_P_IP);
	e->sport = k->sport;
	e->dport = k->dport;
	__builtin_memcpy(e->saddr, k->saddr, 16);
	__builtin_memcpy(e->daddr, k->daddr, 16);
	ev_submit(c, e);
}

static __always_inline void ev_drop(struct __sk_buff *skb, const struct ev_config *cfg, struct ev_cpu *c,
				    __u32 ifindex, __u8 dir, __u8 reason, __u32 len, __u32 aux)
{
	if (!ev_admit(cfg, c))
		return;
	struct cni_event *e = ev_reserve(c);
	if (!e)
		return;
	e->ifindex = ifindex;
	e->len = len;
	e->aux = aux;
	e->type = EV_DROP;
	e->dir = dir;
	e->reason = reason;
	ev_tuple(skb, e);
	e->ts_ns = bpf_ktime_get_ns();
	ev_submit(c, e);
}

/*
 * A traced endpoint's packet at one program's decision: which program
 * (prog), what it decided (reason, dir) and the map entry it used (entry,
 * see enum ev_prog), with the packet's tuple as it is now.
 */
static __always_inline void ev_trace(struct __sk_buff *skb, const struct ev_config *cfg, struct ev_cpu *c,
				     __u32 ifindex, __u8 prog, __u8 dir, __u8 reason, __u32 len, __u32 entry)
{
	if (!ev_admit(cfg, c))
		return;
	struct cni_event *e = ev_reserve(c);
	if (!e)
		return;
	e->ifindex = ifindex;
	e->len = len;
	e->aux = EV_TRACE_AUX(prog, entry);
	e->type = EV_TRACE;
	e->dir = dir;
	e->reason = reason;
	ev_tuple(skb, e);
	e->ts_ns = bpf_ktime_get_ns();
	ev_submit(c, e);
}

/* A traced endpoint's packet at a program's decision, if it is traced now. */
static __always_inline void ev_trace_if(struct __sk_buff *skb, const struct ev_config *cfg, struct ev_cpu *c,
					const __u32 *pod, __u32 ifindex, __u8 prog, __u8 dir, __u8 reason, __u32 len,
					__u32 aux)
{
	if ((cfg->flags & EV_CFG_TRACE) && pod && EV_POD_TRACE_UNTIL(*pod)) {
		__u64 now_s = bpf_ktime_get_ns() / NSEC;

		if (now_s < EV_POD_TRACE_UNTIL(*pod))
			ev_trace(skb, cfg, c, ifindex, prog, dir, reason, len, aux);
	}
}

/*
 * What events a dropped packet (or a trace point) sends, out of line: one
 * copy of the code per program, verified once, rather than one per count()
 * call site. Only called while events are on (ev_packet). Its frame is
 * small: the node hooks call it from subprograms of their own (drop_slow),
 * on top of frames at the 512-byte limit.
 */
__attribute__((noinline)) int ev_packet_on(struct __sk_buff *skb, __u32 ifindex, __u32 dir_reason, __u32 len,
					   __u32 aux)
{
	/* BPF calls take 5 arguments: direction, reason, program and
	 * EV_PK_TRACE_ONLY come packed. */
	__u8 dir = dir_reason >> 8, reason = dir_reason, prog = dir_reason >> 16;
	__u32 zero = 0;
	const struct ev_config *cfg = bpf_map_lookup_elem(&cni_ev_config, &zero);
	struct ev_cpu *c = bpf_map_lookup_elem(&cni_ev_cpu, &zero);
	const __u32 *pod = NULL;

	if (!skb || !cfg || !c)
		return 0;
	if (cfg->flags & EV_CFG_TRACE)
		pod = bpf_map_lookup_elem(&cni_ev_pods, &ifindex);
	ev_trace_if(skb, cfg, c, pod, ifindex, prog, dir, reason, len, aux);
	if (!(dir_reason & EV_PK_TRACE_ONLY) && reason_is_drop(reason) && (cfg->flags & EV_CFG_DROPS))
		ev_drop(skb, cfg, c, ifindex, dir, reason, len, aux);
	return 0;
}

/*
 * What events a packet handed on sends (its trace event, its flow
 * events), out of line as ev_packet_on, apart from it: the flow code's
 * frame is larger, and only the programs' own frames call it (count() of a
 * packet handed on), never the subprograms that call ev_packet_on.
 */
__attribute__((noinline)) int ev_flow_on(struct __sk_buff *skb, __u32 ifindex, __u32 dir_reason, __u32 len,
					 __u32 aux)
{
	__u8 dir = dir_reason >> 8, reason = dir_reason, prog = dir_reason >> 16;
	__u32 zero = 0;
	const struct ev_config *cfg = bpf_map_lookup_elem(&cni_ev_config, &zero);
	struct ev_cpu *c = bpf_map_lookup_elem(&cni_ev_cpu, &zero);
	const __u32 *pod = NULL;

	if (!skb || !cfg || !c)
		return 0;
	/* Per pod, the endpoint is looked up before anything else: the
	 * packets of the pods that did not ask (most, while one pod is
	 * watched) stop here. */
	if (cfg->flags & (EV_CFG_TRACE | EV_CFG_FLOWS_PODS))
		pod = bpf_map_lookup_elem(&cni_ev_pods, &ifindex);
	ev_trace_if(skb, cfg, c, pod, ifindex, prog, dir, reason, len, aux);
	if (reason == REASON_NEIGH_REPLY)
		return 0;
	/* Node-wide, the receiver's side of a same-node redirect is the
	 * sender's flow (see ev_packet). */
	if (((cfg->flags & EV_CFG_FLOWS_ALL) && !(reason == REASON_REDIRECT && dir == DIR_INGRESS)) ||
	    ((cfg->flags & EV_CFG_FLOWS_PODS) && pod && (*pod & EV_POD_FLOWS)))
		ev_flow(skb, cfg, c, ifindex, dir, reason, len);
	return 0;
}

/*
 * The events of one counted packet (see count() in endpoint.h): with events
 * off, the lookup is all. A subprogram is called only for what may send
 * an event: a drop (ev_packet_on), or with flow events or a trace on a
 * packet handed on (ev_flow_on). Node-wide, the destination's side of a
 * same-node redirect is not tracked apart: it is the packet the source's
 * egress side just tracked, and that event names both pods (per pod, each
 * pod that asked sees its own side).
 */
static __always_inline void ev_packet(struct __sk_buff *skb, __u32 ifindex, __u8 dir, __u8 reason,
				      __u32 len, __u32 aux)
{
	__u32 zero = 0;
	const struct ev_config *cfg = bpf_map_lookup_elem(&cni_ev_config, &zero);
	__u32 dir_reason = (__u32)CNI_PROG << 16 | (__u32)dir << 8 | reason;

	if (!cfg || !cfg->flags)
		return;
	if (reason_is_drop(reason)) {
		ev_packet_on(skb, ifindex, dir_reason, len, aux);
		return;
	}
	/* One mask test, whatever is on: a trace switch costs the packets
	 * handed on nothing while it is off. */
	if (!(cfg->flags & (EV_CFG_FLOWS_PODS | EV_CFG_TRACE)) &&
	    (!(cfg->flags & EV_CFG_FLOWS_ALL) || (reason == REASON_REDIRECT && dir == DIR_INGRESS)))
		return;
	ev_flow_on(skb, ifindex, dir_reason, len, aux);
}

/* ev_packet of a packet the caller knows is dropped (a reason it cannot
 * tell the compiler): never calls ev_flow_on, whose frame is larger. */
static __always_inline void ev_packet_drop(struct __sk_buff *skb, __u32 ifindex, __u8 dir, __u8 reason, __u32 len,
					   __u32 aux)
{
	__u32 zero = 0;
	const struct ev_config *cfg = bpf_map_lookup_elem(&cni_ev_config, &zero);

	if (cfg && cfg->flags)
		ev_packet_on(skb, ifindex, (__u32)CNI_PROG << 16 | (__u32)dir << 8 | reason, len, aux);
}

/*
 * A decision that counts nothing (a packet the uplink hooks translated and
 * hand on): a trace event when the endpoint is traced. Off, one array
 * lookup.
 */
static __always_inline void ev_trace_point(struct __sk_buff *skb, __u32 ifindex, __u8 dir, __u8 reason, __u32 entry)
{
	__u32 zero = 0;
	const struct ev_config *cfg = bpf_map_lookup_elem(&cni_ev_config, &zero);

	if (cfg && (cfg->flags & EV_CFG_TRACE))
		ev_packet_on(skb, ifindex, EV_PK_TRACE_ONLY | (__u32)CNI_PROG << 16 | (__u32)dir << 8 | reason, skb->len,
			     entry);
}
