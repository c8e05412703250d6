/*
 * Egress masquerade (the ptp/bridge "ipMasq"), IPv4: a pod flagged
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
 *     (forward entry), or allocates a port: the pod's own port, or a hash of
 *     the flow, is the first candidate in [MASQ_PORT_MIN, MASQ_PORT_MAX], up
 *     to MASQ_PROBES candidates are tried with a BPF_NOEXIST insert of the
 *     reverse entry (the translated tuple: that insert is what makes a port
 *     ours, so two pods racing for one never both get it), and rewrites the
 *     source address and port.
 *   - uplink tcx ingress (from_uplink.c): masq_reverse() finds the reverse
 *     entry of a reply and rewrites its destination back to the pod; the
 *     stack then delivers it, so conntrack sees both directions of the flow
 *     (kube-proxy drops what it finds INVALID) and reverses its own
 *     translations (a Service whose endpoint is outside the cluster).
 *
 * Entries live in an LRU map and carry the last time they were used: an
 * entry idle for longer than its protocol's timeout (10 s once a TCP RST or
 * a FIN each way was seen) is treated as absent (and its port reused). DEL
 * scans cni_snat for the pod's host veth.
 */
#pragma once

#include "hostport.h"

#define ICMP_ECHOREPLY_T 0
#define ICMP_ECHO_T 8

#define MASQ_PORT_MIN 61000 /* above the default ip_local_port_range (32768-60999) */
#define MASQ_PORT_MAX 65535
#define MASQ_PROBES 32 /* more makes the verifier walk too many states */

#define MASQ_TIMEOUT_TCP (3600 * NSEC)
#define MASQ_TIMEOUT_UDP (120 * NSEC)
#define MASQ_TIMEOUT_ICMP (30 * NSEC)
#define MASQ_TIMEOUT_CLOSING (10 * NSEC)
#define MASQ_REUSE_CLOSED (NSEC / 2) /* a closed flow quiet this long gives its port up */

static __always_inline void masq_count(__u32 what)
{
	__u64 *c = bpf_map_lookup_elem(&cni_masq_stats, &what);

	if (c)
		*c += 1;
}

static __always_inline __u64 masq_timeout(__u8 proto)
{
	if (proto == IPPROTO_TCP)
		return MASQ_TIMEOUT_TCP;
	if (proto == IPPROTO_UDP)
		return MASQ_TIMEOUT_UDP;
	return MASQ_TIMEOUT_ICMP;
}

static __always_inline int snat_expired(const struct snat_val *v, __u8 proto, __u64 now)
{
	__u64 timeout = (v->flags & SNAT_F_CLOSING) ? MASQ_TIMEOUT_CLOSING : masq_timeout(proto);

	return now > v->seen_ns && now - v->seen_ns > timeout;
}

/*
 * Whether this packet changes the flow's state: a TCP RST, or the second
 * direction's FIN, marks it closing (short timeout, so a closed connection's
 * port is free again in seconds, not after the established timeout; a
 * half-closed connection keeps the long one), a SYN opens it again. fin_bit
 * is SNAT_F_FIN_OUT or SNAT_F_FIN_IN, the packet's direction. Returns
 * whether the flags change, and the new ones in *next.
 */
static __always_inline int snat_state(const struct flow *f, __u16 cur, __u16 *next, __u16 fin_bit)
{
	__u16 n = cur;

	if (f->proto != IPPROTO_TCP)
		return 0;
	if (f->tcp_flags & TCP_FLAG_RST)
		n |= SNAT_F_CLOSING;
	else if (f->tcp_flags & TCP_FLAG_FIN)
		n |= fin_bit;
	else if (f->syn_only)
		n = 0;
	if ((n & SNAT_F_FIN_OUT) && (n & SNAT_F_FIN_IN))
		n |= SNAT_F_CLOSING;
	*next = n;
	return n != cur;
}

static __always_inline int in_cluster4(__be32 addr)
{
	struct cidr_key k = { .prefixlen = 64, .family = AF_INET };

	*(__be32 *)k.addr = addr;
	return bpf_map_lookup_elem(&cni_cluster_cidrs, &k) != NULL;
}

/*
 * Fills f from an IPv4 packet for masquerade: TCP and UDP as flow_parse4, and
 * ICMP echo of type icmp_type, whose id goes in sport (requests from the pod)
 * or dport (replies to the node), the other port 0. Returns 0 or -1.
 */
static __always_inline int masq_parse4(struct __sk_buff *skb, const struct iphdr *ip, struct flow *f, __u8 icmp_type)
{
	if (ip->protocol != IPPROTO_ICMP)
		return flow_parse4(skb, ip, f);

	__u32 ihl = ip->ihl * 4;
	__u8 hdr[8];

	if (ihl < sizeof(*ip) || (ip->frag_off & bpf_htons(0x3fff)))
		return -1;
	f->family = AF_INET;
	f->proto = IPPROTO_ICMP;
	f->l4off = ETH_HLEN + ihl;
	*(__be32 *)f->saddr = ip->saddr;
	*(__be32 *)f->daddr = ip->daddr;
	if (bpf_skb_load_bytes(skb, f->l4off, hdr, sizeof(hdr)) || hdr[0] != icmp_type || hdr[1] != 0)
		return -1;
	__be16 id = *(__be16 *)&hdr[4];
	if (icmp_type == ICMP_ECHO_T) {
		f->sport = id;
		f->dport = 0;
	} else {
		f->sport = 0;
		f->dport = id;
	}
	f->syn_only = 0;
	return 0;
}

/* Rewrites the IPv4 source (is_src) or destination address and port (ICMP:
 * the echo id) with incremental checksum updates, and updates f. */
static __always_inline int masq_rewrite4(struct __sk_buff *skb, struct flow *f, int is_src, __be32 addr, __be16 port)
{
	if (f->proto != IPPROTO_ICMP)
		return pkt_rewrite(skb, f, is_src, (const __u8 *)&addr, port);
	return pkt_rewrite_echo4(skb, f, is_src, addr, port);
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

/* Refreshes the other direction's entry and its state flags. */
static __always_inline void snat_touch(struct snat_key *k, __u64 now, __u16 flags)
{
	struct snat_val *v = bpf_map_lookup_elem(&cni_snat, k);

	if (v) {
		v->seen_ns = now;
		v->flags = flags;
	}
}

/*
 * Allocates a node port for the flow f (pod's view) towards node address
 * node: the first candidate is the pod's own port if it is in the range,
 * else a hash of the flow, then MASQ_PROBES - 1 more, skipping ports held by
 * a live flow to the same destination and the node's hostPorts. Inserts the reverse entry (BPF_NOEXIST: the port is ours
 * only if the insert succeeds) and the forward one. Returns the port (network
 * order) or 0 when every candidate was taken.
 */
static __always_inline __be16 snat_alloc(const struct flow *f, __be32 node, __u32 ifindex, __u64 now)
{
	struct snat_key rk = { .family = AF_INET, .proto = f->proto, .dir = SNAT_DIR_REV, .peer_port = f->dport };
	struct snat_val rv = { .port = f->sport, .ifindex = ifindex, .created_ns = now, .seen_ns = now };
	const __u32 range = MASQ_PORT_MAX - MASQ_PORT_MIN + 1;
	__u32 h = mix32(*(__u32 *)f->saddr ^ mix32(*(__u32 *)f->daddr) ^
			(((__u32)f->sport << 16) | f->dport) ^ f->proto);

	*(__be32 *)rk.addr = node;
	*(__u32 *)rk.peer_addr = *(__u32 *)f->daddr;
	*(__u32 *)rv.addr = *(__u32 *)f->saddr;
	for (__u32 i = 0; i < MASQ_PROBES; i++) {
		/* The pod's own port first when it is in the range (as MASQUERADE
		 * keeps ports where it can), then a stride coprime with the range
		 * from the hash walks distinct ports. */
		__u16 port = MASQ_PORT_MIN + (h + i * 2053) % range;
		if (i == 0 && bpf_ntohs(f->sport) >= MASQ_PORT_MIN)
			port = bpf_ntohs(f->sport);

		rk.port = bpf_htons(port);
		struct snat_val *cur = bpf_map_lookup_elem(&cni_snat, &rk);
		if (cur) {
			/* Free: an expired flow, or (as conntrack reuses TIME_WAIT and
			 * CLOSE tuples) a closed TCP flow quiet for MASQ_REUSE_CLOSED. */
			if (!snat_expired(cur, f->proto, now) &&
			    !((cur->flags & SNAT_F_CLOSING) && now - cur->seen_ns > MASQ_REUSE_CLOSED))
				continue;
			/* The old flow's forward entry goes too, if it still maps here. */
			struct snat_key ok = { .family = AF_INET, .proto = f->proto, .dir = SNAT_DIR_FWD,
					       .port = cur->port, .peer_port = f->dport };
			*(__u32 *)ok.addr = *(__u32 *)cur->addr;
			*(__u32 *)ok.peer_addr = *(__u32 *)f->daddr;
			struct snat_val *ov = bpf_map_lookup_elem(&cni_snat, &ok);
			if (ov && ov->port == rk.port && *(__be32 *)ov->addr == node)
				bpf_map_delete_elem(&cni_snat, &ok);
			bpf_map_delete_elem(&cni_snat, &rk);
		}
		if (f->proto != IPPROTO_ICMP && hostport_lookup(&node, AF_INET, f->proto, rk.port, 0))
			continue;
		if (bpf_map_update_elem(&cni_snat, &rk, &rv, BPF_NOEXIST))
			continue; /* another CPU took it just now */

		struct snat_key fk = { .family = AF_INET, .proto = f->proto, .dir = SNAT_DIR_FWD,
				       .port = f->sport, .peer_port = f->dport };
		struct snat_val fv = { .port = rk.port, .ifindex = ifindex, .created_ns = now, .seen_ns = now };

		*(__u32 *)fk.addr = *(__u32 *)f->saddr;
		*(__u32 *)fk.peer_addr = *(__u32 *)f->daddr;
		*(__be32 *)fv.addr = node;
		if (bpf_map_update_elem(&cni_snat, &fk, &fv, BPF_ANY)) {
			bpf_map_delete_elem(&cni_snat, &rk);
			return 0;
		}
		return rk.port;
	}
	return 0;
}

#define MASQ_CONTINUE -1

/*
 * Whether the pod's UDP packet f answers a host that reached the pod
 * directly (its flow came in through the stack, SF_INBOUND): such replies
 * leave with the pod's address, as they would without masquerade.
 */
static __always_inline int masq_inbound_reply(const struct flow *f, __u32 ifindex, __u64 now)
{
	struct sf_key k;

	if (f->proto != IPPROTO_UDP)
		return 0;
	sf_key_sent(&k, f);
	struct sf_val *v = bpf_map_lookup_elem(&cni_stack_flows, &k);
	if (!v || v->ifindex != ifindex || !(v->flags & SF_INBOUND) ||
	    (now > v->seen_ns && now - v->seen_ns > MASQ_TIMEOUT_UDP))
		return 0;
	if (now - v->seen_ns > NSEC)
		v->seen_ns = now;
	return 1;
}

/*
 * A packet leaving the node through an uplink, forwarded from the host veth
 * of the masquerading pod ep with the pod's address as its source (the
 * caller checked). Returns MASQ_CONTINUE after translating it or leaving it
 * alone (destinations in the cluster CIDRs, what is not TCP/UDP/ICMP echo, a
 * TCP segment of no known flow, a UDP reply to a host that came in
 * directly), or TC_ACT_SHOT.
 */
static __always_inline int masq_egress(struct __sk_buff *skb, const struct ep_info *ep)
{
	struct iphdr *ip = pkt_ip4(skb);
	struct flow f = {};
	__be32 node;
	__be16 port;

	if (!ip)
		return MASQ_CONTINUE;
	if (in_cluster4(ip->daddr))
		return MASQ_CONTINUE;
	if (masq_parse4(skb, ip, &f, ICMP_ECHO_T))
		return MASQ_CONTINUE;

	__u64 now = bpf_ktime_get_ns();
	struct snat_key fk = { .family = AF_INET, .proto = f.proto, .dir = SNAT_DIR_FWD,
			       .port = f.sport, .peer_port = f.dport };
	*(__u32 *)fk.addr = *(__u32 *)f.saddr;
	*(__u32 *)fk.peer_addr = *(__u32 *)f.daddr;
	struct snat_val *fv = bpf_map_lookup_elem(&cni_snat, &fk);
	/* A known flow keeps its node address while the node has it. */
	if (fv && fv->ifindex == ep->ifindex && !snat_expired(fv, f.proto, now) && is_node_ip(fv->addr, AF_INET)) {
		__u16 fl = fv->flags;
		int changed = snat_state(&f, fv->flags, &fl, SNAT_F_FIN_OUT);

		node = *(__be32 *)fv->addr;
		port = fv->port;
		if (changed || now - fv->seen_ns > NSEC) {
			fv->seen_ns = now;
			fv->flags = fl;
			struct snat_key rk = { .family = AF_INET, .proto = f.proto, .dir = SNAT_DIR_REV,
					       .port = port, .peer_port = f.dport };
			*(__be32 *)rk.addr = node;
			*(__u32 *)rk.peer_addr = *(__u32 *)f.daddr;
			snat_touch(&rk, now, fl);
		}
	} else {
		/* Only what opens a flow allocates: a pod answering a client that
		 * reached it directly (host-gw, routes to the pod) is not rewritten. */
		if ((f.proto == IPPROTO_TCP && !f.syn_only) || masq_inbound_reply(&f, ep->ifindex, now)) {
			masq_count(MASQ_STAT_NOT_NEW);
			return MASQ_CONTINUE;
		}
		/* BPF_FIB_LOOKUP_SRC: the source the node would pick for this
		 * route, as MASQUERADE picks the outgoing link's address. */
		struct bpf_fib_lookup p = {
			.family = AF_INET,
			.ifindex = ep->ifindex,
			.tos = ip->tos,
			.l4_protocol = ip->protocol,
			.ipv4_src = ip->saddr,
			.ipv4_dst = ip->daddr,
		};
		int rc = bpf_fib_lookup(skb, &p, sizeof(p), BPF_FIB_LOOKUP_SRC);
		if ((rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) || !p.ipv4_src)
			return MASQ_CONTINUE;
		node = p.ipv4_src;
		port = snat_alloc(&f, node, ep->ifindex, now);
		if (!port) {
			masq_count(MASQ_STAT_EXHAUSTED);
			return TC_ACT_SHOT;
		}
		masq_count(MASQ_STAT_NEW);
	}

	if (masq_rewrite4(skb, &f, 1, node, port)) {
		masq_count(MASQ_STAT_ERROR);
		return TC_ACT_SHOT;
	}
	masq_count(MASQ_STAT_SNAT);
	return MASQ_CONTINUE;
}

/*
 * A packet arriving on an uplink: if it answers a masqueraded flow, rewrite
 * its destination back to the pod. Returns the verdict (TCX_NEXT: on to the
 * stack), or MASQ_CONTINUE when it is not ours.
 */
static __always_inline int masq_reverse(struct __sk_buff *skb)
{
	struct iphdr *ip = pkt_ip4(skb);
	struct flow f = {};

	if (!ip)
		return MASQ_CONTINUE;
	if (masq_parse4(skb, ip, &f, ICMP_ECHOREPLY_T))
		return MASQ_CONTINUE;

	struct snat_key rk = { .family = AF_INET, .proto = f.proto, .dir = SNAT_DIR_REV,
			       .port = f.dport, .peer_port = f.sport };
	*(__u32 *)rk.addr = *(__u32 *)f.daddr;
	*(__u32 *)rk.peer_addr = *(__u32 *)f.saddr;
	struct snat_val *rv = bpf_map_lookup_elem(&cni_snat, &rk);
	if (!rv)
		return MASQ_CONTINUE;
	__u64 now = bpf_ktime_get_ns();
	if (snat_expired(rv, f.proto, now))
		return MASQ_CONTINUE;
	struct snat_val v = *rv;
	struct ep_info *ep = ep_lookup_addr(v.addr, AF_INET);
	if (!ep || ep->ifindex != v.ifindex)
		return MASQ_CONTINUE; /* the pod is gone */
	__u16 fl = v.flags;
	int changed = snat_state(&f, v.flags, &fl, SNAT_F_FIN_IN);
	if (changed || now - v.seen_ns > NSEC) {
		rv->seen_ns = now;
		rv->flags = fl;
		struct snat_key fk = { .family = AF_INET, .proto = f.proto, .dir = SNAT_DIR_FWD,
				       .port = v.port, .peer_port = f.sport };
		*(__u32 *)fk.addr = *(__u32 *)v.addr;
		*(__u32 *)fk.peer_addr = *(__u32 *)f.saddr;
		snat_touch(&fk, now, fl);
	}

	if (masq_rewrite4(skb, &f, 0, *(__be32 *)v.addr, v.port)) {
		masq_count(MASQ_STAT_ERROR);
		return TC_ACT_SHOT;
	}
	masq_count(MASQ_STAT_REVERSE);
	/* On to the stack, which forwards it to the pod. */
	return TCX_NEXT;
}
