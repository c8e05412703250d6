/*
 * Flows the kernel stack delivered to a pod, so that their replies go back
 * through the stack and whatever it translated (kube-proxy's Service DNAT,
 * portmap, a user's rules) is translated back by conntrack.
 *
 *   - host veth tcx egress (to_container.c): a packet the stack hands to a
 *     pod is recorded in cni_stack_flows, keyed as the pod's replies will
 *     look, when its source is a pod of this node (SF_PEER_POD) or a node
 *     address (SF_PEER_NODE, UDP). Plain same-node pod-to-pod traffic never
 *     passes there (bpf_redirect_peer skips the hook), so it is never
 *     recorded. Nothing from outside the node is: a host out there chooses
 *     its source address freely, and a record it made must not steer a
 *     pod's traffic (it once exempted a masquerading pod's UDP "replies"
 *     from masquerade, so forged datagrams switched the pod's egress NAT
 *     off; issue 28).
 *   - host veth tcx ingress (from_container.c): before a packet is redirected
 *     to a pod of this node, a hit on its tuple sends it to the stack instead
 *     (the reply of a flow the stack NATed must meet conntrack), and a TCP
 *     SYN or ICMP echo request (a new direct flow) drops a stale record of
 *     its tuple, so a flow never goes half through the stack and half around
 *     it (kube-proxy drops what conntrack finds INVALID).
 *
 * Entries live in LRU maps: active flows keep theirs (every packet the
 * stack delivers refreshes it, every lookup touches it). A flow a pod of
 * the node sent is recorded in that pod's own table (cni_stack_flow_parts,
 * by its host veth), so no pod can evict another's records however many
 * flows it opens (issue 28); the node's flows (and those of pods attached
 * by older builds, which have no table) share cni_stack_flows. Each entry
 * carries the host veth of the pod it was made for: DEL scans for it, and
 * an entry of an earlier pod with the same address is never used.
 */
#pragma once

#include "endpoint.h"
#include "node.h"

/* sf_val.flags: the record was made by a packet from the sender's own
 * host veth (so it may stand in its table's stead). */
#define SF_SENDER_OWN (1U << 8)

/* What a packet is to this table. */
#define SF_PKT_FLOW 0   /* keyed by its own header */
#define SF_PKT_OPEN 1   /* TCP SYN or ICMP echo request: opens a flow */
#define SF_PKT_ERROR 2  /* ICMP error: keyed by the packet it quotes (f holds that one) */
#define SF_PKT_OPAQUE 3 /* fragment, extension header, quote unreadable: cannot be keyed */

/* Ports of an ICMP(v6) echo: the responder's port is the id. */
static __always_inline void sf_echo_ports(struct flow *f, __be16 id, int request)
{
	f->sport = request ? 0 : id;
	f->dport = request ? id : 0;
}

/* Ports (or echo id) of the L4 header at off, into f (flow_l4, the flow
 * parser's reader). Returns SF_PKT_*. */
static __always_inline int sf_l4(struct __sk_buff *skb, struct flow *f, __u32 off)
{
	struct l4_icmp ic;
	int k = flow_l4(skb, f, off, &ic);

	if (k == L4_SHORT)
		return SF_PKT_OPAQUE;
	if (k == L4_PORTS)
		return f->syn_only ? SF_PKT_OPEN : SF_PKT_FLOW;
	if (k == L4_NONE)
		return SF_PKT_FLOW; /* no ports (GRE, ESP, ...): addresses only */
	__u8 req = f->proto == IPPROTO_ICMP ? 8 : ICMP6_ECHO_REQUEST;
	__u8 rep = f->proto == IPPROTO_ICMP ? 0 : ICMP6_ECHO_REPLY;
	if (ic.type == req || ic.type == rep) {
		sf_echo_ports(f, ic.id, ic.type == req);
		return ic.type == req ? SF_PKT_OPEN : SF_PKT_FLOW;
	}
	if (f->proto == IPPROTO_ICMP ? (ic.type == 3 || ic.type == 11 || ic.type == 12) : (ic.type >= 1 && ic.type <= 4))
		return SF_PKT_ERROR;
	return SF_PKT_FLOW; /* other ICMP: addresses only */
}

/*
 * Parses the packet an ICMP error quotes (at byte off) into f: the packet the
 * pod received, cut short. Returns SF_PKT_ERROR, or SF_PKT_OPAQUE when it
 * cannot be keyed (errors are never sent about errors).
 */
static __always_inline int sf_parse_quote(struct __sk_buff *skb, struct flow *f, __u8 family, __u32 off)
{
	int kind;

	if (family == AF_INET) {
		struct iphdr ip;

		/* A quoted first fragment has ports; a later one has none. */
		if (bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)) || ip.ihl < 5 || (ip.frag_off & bpf_htons(0x1fff)))
			return SF_PKT_OPAQUE;
		f->proto = ip.protocol;
		*(__be32 *)f->saddr = ip.saddr;
		*(__be32 *)f->daddr = ip.daddr;
		kind = sf_l4(skb, f, off + ip.ihl * 4);
	} else {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, off, &ip6, sizeof(ip6)))
			return SF_PKT_OPAQUE;
		f->proto = ip6.nexthdr;
		if (f->proto != IPPROTO_TCP && f->proto != IPPROTO_UDP && f->proto != IPPROTO_SCTP &&
		    f->proto != IPPROTO_ICMPV6)
			return SF_PKT_OPAQUE;
		__builtin_memcpy(f->saddr, &ip6.saddr, 16);
		__builtin_memcpy(f->daddr, &ip6.daddr, 16);
		kind = sf_l4(skb, f, off + sizeof(ip6));
	}
	return kind == SF_PKT_OPAQUE || kind == SF_PKT_ERROR ? SF_PKT_OPAQUE : SF_PKT_ERROR;
}

/*
 * Parses a packet (IP header at ETH_HLEN) for this table into f; for an ICMP
 * error, f is the quoted packet. Returns SF_PKT_*.
 */
static __always_inline int sf_parse(struct __sk_buff *skb, struct flow *f, __u8 family)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u32 l4;

	f->family = family;
	if (family == AF_INET) {
		struct iphdr *ip = data + ETH_HLEN;

		if ((void *)(ip + 1) > data_end || ip->ihl < 5 || (ip->frag_off & bpf_htons(0x3fff)))
			return SF_PKT_OPAQUE; /* a fragment: only the first has ports */
		f->proto = ip->protocol;
		*(__be32 *)f->saddr = ip->saddr;
		*(__be32 *)f->daddr = ip->daddr;
		l4 = ETH_HLEN + ip->ihl * 4;
	} else {
		struct ipv6hdr *ip6 = data + ETH_HLEN;

		if ((void *)(ip6 + 1) > data_end)
			return SF_PKT_OPAQUE;
		f->proto = ip6->nexthdr;
		/* An extension header (a fragment one, say) first: not keyed. */
		if (f->proto != IPPROTO_TCP && f->proto != IPPROTO_UDP && f->proto != IPPROTO_SCTP &&
		    f->proto != IPPROTO_ICMPV6)
			return SF_PKT_OPAQUE;
		__builtin_memcpy(f->saddr, &ip6->saddr, 16);
		__builtin_memcpy(f->daddr, &ip6->daddr, 16);
		l4 = ETH_HLEN + sizeof(*ip6);
	}
	int kind = sf_l4(skb, f, l4);
	if (kind != SF_PKT_ERROR)
		return kind;
	return sf_parse_quote(skb, f, family, l4 + 8);
}

/* Key of a packet the stack delivers to a pod (pod = destination). */
static __always_inline void sf_key_delivered(struct sf_key *k, const struct flow *f)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->family = f->family;
	k->proto = f->proto;
	addr_copy(k->addr, f->daddr, f->family);
	addr_copy(k->peer_addr, f->saddr, f->family);
	k->port = f->dport;
	k->peer_port = f->sport;
}

/* Key of a packet a pod sends (pod = source). */
static __always_inline void sf_key_sent(struct sf_key *k, const struct flow *f)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->family = f->family;
	k->proto = f->proto;
	addr_copy(k->addr, f->saddr, f->family);
	addr_copy(k->peer_addr, f->daddr, f->family);
	k->port = f->sport;
	k->peer_port = f->dport;
}

/*
 * The table of the records of flows sent by the pod behind the host veth
 * sender (0: the node), and the shared cni_stack_flows: a record is put in
 * both and found in either. The pod's own table (256) keeps its records
 * whatever others send; the shared one (28160 at the default maxPods) keeps
 * them whatever the pod itself opens (its DNS lookups through a Service
 * would otherwise evict, from its own table, its idle connections'
 * records). Only a pod churning its own table while others flood the
 * shared one loses a record.
 */
/* The own table of the pod sender (NULL: the node): its pool slot's, else
 * (a pod an ADD before the pool attached, or a full pool) the one keyed by
 * its host veth. The slot is read from the entry the caller already holds:
 * an array-of-maps lookup, no hash (issue 30). */
static __always_inline void *sf_table(const struct ep_info *sender)
{
	if (!sender)
		return NULL;
	__u32 slot = sender->flags >> EP_SF_SLOT_SHIFT;
	if (slot) {
		slot--; /* 0 stands for none: slot n is the pool's index n-1 */
		return bpf_map_lookup_elem(&cni_sf_pool, &slot);
	}
	/* No pod has a table there (an array read, inlined): a pod of a
	 * build before issue 28's tables, whose lookup would only fail. */
	struct hp_config *c = node_config();
	if (c && (c->flags & HP_CFG_SF_NO_PARTS))
		return NULL;
	__u32 idx = sender->ifindex;
	return bpf_map_lookup_elem(&cni_stack_flow_parts, &idx);
}

static __always_inline struct sf_val *sf_get(struct sf_key *k, const struct ep_info *sender)
{
	/* The shared table first: a record the sender's own packets made
	 * (SF_SENDER_OWN, every record of a pod with a table) stands as it is
	 * there, with one lookup; the pod's table only when the shared one
	 * lost it or holds one of another's making (issue 30). */
	struct sf_val *v = bpf_map_lookup_elem(&cni_stack_flows, k);

	if (!sender || (v && (v->flags & SF_SENDER_OWN)))
		return v;
	void *t = sf_table(sender);
	if (!t)
		return v;
	/* For a pod's flow, only a record its own packets made (one a packet
	 * with its address from elsewhere made is not its). */
	return bpf_map_lookup_elem(t, k);
}

static __always_inline void sf_del(struct sf_key *k, const struct ep_info *sender)
{
	void *t = sf_table(sender);

	if (t)
		bpf_map_delete_elem(t, k);
	bpf_map_delete_elem(&cni_stack_flows, k);
}

static __always_inline void sf_put(struct sf_key *k, struct sf_val *v, const struct ep_info *sender)
{
	void *t = sf_table(sender);

	if (t)
		bpf_map_update_elem(t, k, v, BPF_ANY);
	bpf_map_update_elem(&cni_stack_flows, k, v, BPF_ANY);
}

/* The record of k (a flow sender sent) if it was made for the pod behind
 * ifindex (one of another pod, left by an earlier owner of the address, is
 * deleted). */
static __always_inline struct sf_val *sf_lookup(struct sf_key *k, __u32 ifindex, const struct ep_info *sender)
{
	struct sf_val *v = sf_get(k, sender);

	if (v && v->ifindex != ifindex) {
		sf_del(k, sender);
		return NULL;
	}
	return v;
}

static __always_inline void sf_forget(struct sf_key *k, const struct ep_info *sender)
{
	if (sf_get(k, sender))
		sf_del(k, sender);
}

/*
 * stack_flow_reply of the bulk (issue 30): an IPv4 TCP segment of an open
 * connection or a UDP datagram, no options, no fragment, its L4 header in
 * the linear data. Its key is built straight from the headers, without the
 * flow parser's struct and the copy out of it. Returns what
 * stack_flow_reply does, or -1 for anything else (sf_parse judges it).
 */
static __always_inline int sf_reply_fast4(struct __sk_buff *skb, const struct ep_info *src,
					  const struct ep_info *dst)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	__u8 *l4 = (void *)(ip + 1);
	struct sf_key k;

	/* 14 bytes: TCP's flags; a UDP datagram this short takes sf_parse. */
	if ((void *)(l4 + 14) > data_end || ip->ihl != 5 || (ip->frag_off & bpf_htons(0x3fff)))
		return -1;
	if (ip->protocol == IPPROTO_TCP) {
		if ((l4[TCP_FLAGS_OFF] & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
			return -1; /* opens a flow: SF_PKT_OPEN's work */
	} else if (ip->protocol != IPPROTO_UDP) {
		return -1;
	}
	if (src->flags & EP_F_SF_NONE)
		return 0;
	__builtin_memset(&k, 0, sizeof(k));
	*(__be32 *)k.addr = ip->saddr;
	*(__be32 *)k.peer_addr = ip->daddr;
	k.port = *(__be16 *)l4;
	k.peer_port = *(__be16 *)(l4 + 2);
	k.family = AF_INET;
	k.proto = ip->protocol;
	return sf_lookup(&k, src->ifindex, dst) != NULL;
}

/*
 * A packet the pod src sends to another pod of this node, dst: 1 if it
 * must go through the stack (the reply of a flow the stack delivered to
 * the pod, an ICMP error about one, or a packet that cannot be keyed), 0
 * for the fast path. A flow the destination sent is in its table; one this
 * pod sent in this pod's. An address whose entry still has EP_F_SF_NONE
 * was never delivered a recorded flow: nothing of it is looked up.
 */
static __always_inline int stack_flow_reply(struct __sk_buff *skb, __u8 family, const struct ep_info *src,
					    const struct ep_info *dst)
{
	struct flow f = {};
	struct sf_key k;
	__u32 ifindex = src->ifindex;

	if (family == AF_INET) {
		int fast = sf_reply_fast4(skb, src, dst);

		if (fast >= 0)
			return fast;
	}
	int kind = sf_parse(skb, &f, family);

	switch (kind) {
	case SF_PKT_OPAQUE:
		return 1;
	case SF_PKT_ERROR: {
		/* The quoted packet is whatever the pod wrote: a record of
		 * another pod only fails to match, it is never deleted (a pod
		 * would otherwise erase any Service flow's record by quoting
		 * its tuple). Rare: looked up whatever the flags say. */
		sf_key_delivered(&k, &f);
		struct sf_val *v = sf_get(&k, dst);
		return v && v->ifindex == ifindex;
	}
	case SF_PKT_OPEN:
		/* A new direct flow: a record of this tuple is left from an
		 * earlier, translated one. Half of this flow through the stack
		 * would be INVALID to conntrack. */
		if (!(dst->flags & EP_F_SF_NONE)) {
			sf_key_delivered(&k, &f);
			sf_forget(&k, src);
		}
		if (f.proto == IPPROTO_TCP && !(src->flags & EP_F_SF_NONE)) {
			sf_key_sent(&k, &f);
			sf_forget(&k, dst);
		}
		return 0;
	}
	if (src->flags & EP_F_SF_NONE)
		return 0;
	sf_key_sent(&k, &f);
	return sf_lookup(&k, ifindex, dst) != NULL;
}

/*
 * A packet the stack hands to the pod behind skb->ifindex: record its flow
 * (keyed as the pod's replies will look) when its replies must go back
 * through the stack.
 */
static __always_inline void stack_flow_record(struct __sk_buff *skb, __u8 family)
{
	struct flow f = {};
	int kind = sf_parse(skb, &f, family);

	if (kind != SF_PKT_FLOW && kind != SF_PKT_OPEN)
		return;
	/* ICMP: only echo requests open something the pod answers. */
	if ((f.proto == IPPROTO_ICMP || f.proto == IPPROTO_ICMPV6) && kind != SF_PKT_OPEN)
		return;

	__u32 flags = 0;
	const struct ep_info *sender = NULL;
	struct ep_info *src = ep_lookup_addr(f.saddr, family);
	if (src) {
		flags = SF_PEER_POD;
		/* The sender's own table only when the packet came in from its
		 * host veth (from_container checked its source there): a packet
		 * from elsewhere with a pod's address must not fill that pod's. */
		if (src->ifindex == skb->ingress_ifindex)
			sender = src;
	} else if (f.proto == IPPROTO_UDP && node_hooks_enabled() && is_node_ip(f.saddr, family)) {
		flags = SF_PEER_NODE;
	}
	if (!flags)
		return;

	struct sf_key k;
	__u64 now = bpf_ktime_get_ns();

	sf_key_delivered(&k, &f);
	struct sf_val *v = sf_get(&k, sender);
	if (v && v->ifindex == skb->ifindex) {
		if ((v->flags & flags) != flags || now - v->seen_ns > NSEC) {
			v->flags |= flags;
			v->seen_ns = now;
		}
		return;
	}
	/* From here from_container looks this address's flows up (cleared
	 * before the record exists: the pod answers only after this packet). */
	struct ep_info *own = ep_lookup_addr(f.daddr, family);
	if (own && (own->flags & EP_F_SF_NONE))
		own->flags &= ~EP_F_SF_NONE;
	struct sf_val nv = { .ifindex = skb->ifindex, .flags = flags | (sender ? SF_SENDER_OWN : 0), .seen_ns = now };
	sf_put(&k, &nv, sender);
}
