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

/* Not a drop: counted for a packet handed on or answered. Every other
 * reason, including ones added after this was written, is a drop. */
static __always_inline int reason_is_drop(__u8 reason)
{
	return reason != REASON_FORWARD && reason != REASON_REDIRECT && reason != REASON_NEIGH_REPLY;
}

/* Takes one event's worth of tokens from this CPU's bucket; NULL when the
 * event may not be sent (counted as lost_rate). */
static __always_inline struct ev_cpu *ev_admit(const struct ev_config *cfg)
{
	__u32 zero = 0;
	struct ev_cpu *c = bpf_map_lookup_elem(&cni_ev_cpu, &zero);

	if (!c)
		return NULL;
	/* Per-CPU value: no other program touches it while this one runs. */
	__u64 now = bpf_ktime_get_ns();
	__u64 tokens = c->tokens_ns + (now - c->last_ns);

	if (tokens > cfg->burst_ns)
		tokens = cfg->burst_ns;
	c->last_ns = now;
	if (tokens < cfg->cost_ns) {
		c->tokens_ns = tokens;
		c->lost_rate++;
		return NULL;
	}
	c->tokens_ns = tokens - cfg->cost_ns;
	return c;
}

static __always_inline void ev_send(struct ev_cpu *c, struct cni_event *e)
{
	if (bpf_ringbuf_output(&cni_events, e, sizeof(*e), 0))
		c->lost_ring++;
	else
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

	if (bpf_skb_load_bytes(skb, 12, &e->ethertype, 2))
		return;
	if (e->ethertype == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)))
			return;
		e->family = AF_INET;
		e->proto = ip.protocol;
		*(__be32 *)e->saddr = ip.saddr;
		*(__be32 *)e->daddr = ip.daddr;
		if (ip.frag_off & bpf_htons(0x1fff))
			return; /* a later fragment: no L4 header */
		l4 = ETH_HLEN + ip.ihl * 4;
	} else if (e->ethertype == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)))
			return;
		e->family = AF_INET6;
		e->proto = ip6.nexthdr;
		__builtin_memcpy(e->saddr, &ip6.saddr, 16);
		__builtin_memcpy(e->daddr, &ip6.daddr, 16);
		l4 = ETH_HLEN + sizeof(ip6);
	} else {
		return;
	}
	switch (e->proto) {
	case IPPROTO_TCP: {
		__u8 h[14]; /* ports, seq, ack, offset, flags */

		if (bpf_skb_load_bytes(skb, l4, h, sizeof(h)))
			return;
		__builtin_memcpy(&e->sport, h, 4);
		e->tcp_flags = h[13];
		break;
	}
	case IPPROTO_UDP:
	case IPPROTO_SCTP:
		bpf_skb_load_bytes(skb, l4, &e->sport, 4);
		break;
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6: {
		__u8 tc[2];

		if (bpf_skb_load_bytes(skb, l4, tc, 2))
			return;
		e->sport = bpf_htons(tc[0]);
		e->dport = bpf_htons(tc[1]);
		break;
	}
	}
}

#define TCP_FL_FIN 0x01
#define TCP_FL_SYN 0x02
#define TCP_FL_RST 0x04
#define TCP_FL_ACK 0x10

/*
 * Flow events of a packet handed on: EV_FLOW_START for the first packet of
 * (endpoint, direction, 5-tuple), EV_FLOW_END at its TCP FIN or RST (a SYN
 * after that starts it again). The agent ends flows idle too long
 * (pkg/maps/events.go). Only the first packet and the end write the
 * table; the others refresh seen_ns at most once a second.
 */
static __always_inline void ev_flow(struct __sk_buff *skb, const struct ev_config *cfg, __u32 ifindex,
				    __u8 dir, __u8 reason, __u32 len)
{
	struct cni_event e = {};

	ev_tuple(skb, &e);
	if (!e.family)
		return; /* ARP and friends: not flows */

	struct ev_flow_key k = { .ifindex = ifindex, .family = e.family, .proto = e.proto, .dir = dir,
				 .sport = e.sport, .dport = e.dport };
	__builtin_memcpy(k.saddr, e.saddr, 16);
	__builtin_memcpy(k.daddr, e.daddr, 16);
	__u64 now = bpf_ktime_get_ns();
	struct ev_flow_val *f = bpf_map_lookup_elem(&cni_ev_flows, &k);
	__u8 fin = e.proto == IPPROTO_TCP && (e.tcp_flags & (TCP_FL_FIN | TCP_FL_RST));

	if (!f) {
		struct ev_flow_val nv = { .first_ns = now, .seen_ns = now, .reason = reason };

		/* Two CPUs may see a first packet at once: the one that inserts
		 * announces it. */
		if (bpf_map_update_elem(&cni_ev_flows, &k, &nv, BPF_NOEXIST))
			return;
		e.type = EV_FLOW_START;
	} else if (!(f->flags & EV_FLOW_CLOSED) && fin) {
		f->flags |= EV_FLOW_CLOSED;
		f->seen_ns = now;
		e.type = EV_FLOW_END;
	} else if ((f->flags & EV_FLOW_CLOSED) && e.proto == IPPROTO_TCP &&
		   (e.tcp_flags & (TCP_FL_SYN | TCP_FL_ACK)) == TCP_FL_SYN) {
		f->flags &= ~EV_FLOW_CLOSED;
		f->first_ns = now;
		f->seen_ns = now;
		f->reason = reason;
		e.type = EV_FLOW_START;
	} else {
		if (now - f->seen_ns > NSEC)
			f->seen_ns = now;
		return;
	}
	struct ev_cpu *c = ev_admit(cfg);
	if (!c)
		return;
	e.ts_ns = now;
	e.ifindex = ifindex;
	e.len = len;
	e.dir = dir;
	e.reason = reason;
	ev_send(c, &e);
}

static __always_inline void ev_drop(struct __sk_buff *skb, const struct ev_config *cfg, __u32 ifindex,
				    __u8 dir, __u8 reason, __u32 len, __u32 aux)
{
	struct ev_cpu *c = ev_admit(cfg);

	if (!c)
		return;
	struct cni_event e = { .ifindex = ifindex, .len = len, .aux = aux, .type = EV_DROP,
			       .dir = dir, .reason = reason };
	ev_tuple(skb, &e);
	e.ts_ns = bpf_ktime_get_ns();
	ev_send(c, &e);
}

/* The events of one counted packet (see count() in endpoint.h). */
static __always_inline void ev_packet(struct __sk_buff *skb, __u32 ifindex, __u8 dir, __u8 reason,
				      __u32 len, __u32 aux)
{
	__u32 zero = 0;
	const struct ev_config *cfg = bpf_map_lookup_elem(&cni_ev_config, &zero);

	if (!cfg || !cfg->flags)
		return;
	if (reason_is_drop(reason)) {
		if (cfg->flags & EV_CFG_DROPS)
			ev_drop(skb, cfg, ifindex, dir, reason, len, aux);
		return;
	}
	if (reason == REASON_NEIGH_REPLY)
		return;
	if ((cfg->flags & EV_CFG_FLOWS_ALL) ||
	    ((cfg->flags & EV_CFG_FLOWS_PODS) && bpf_map_lookup_elem(&cni_ev_pods, &ifindex)))
		ev_flow(skb, cfg, ifindex, dir, reason, len);
}
