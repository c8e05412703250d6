/*
 * hostPort (the CNI portMappings capability), all of it: the lookups, the
 * NAT of the host-veth and uplink programs, and the socket hooks. No
 * iptables, no kernel conntrack. Paths:
 *
 *   - uplink tcx ingress (from_uplink.c, hostport_from_uplink): a remote
 *     client dials a node address (or the mapping's hostIP) : hostPort ->
 *     DNAT to podIP:containerPort, remember the flow in cni_ct,
 *     bpf_redirect_peer into the pod (through the host veth's egress and
 *     its ingress queue for a pod with an ingress limit: deliver_to_pod);
 *   - host veth tcx ingress (from_container.c, hostport_from_pod): the
 *     pod's replies are found in cni_ct and their source translated back to
 *     what the client dialled; a pod dialling a node address : hostPort
 *     (hairpin) is DNATed like a remote client, and SNATed to the dialled
 *     address when it reaches itself; a translated reply leaves through the
 *     device the FIB picks (fib_redirect);
 *   - cgroup sock_addr hooks (sock.c, hostport_sock_*): processes of the
 *     node's own netns dialling a node address, 127.0.0.0/8 or ::1 get their
 *     socket's destination rewritten at connect/sendmsg, and the peer
 *     address they see translated back at recvmsg/getpeername
 *     (cni_sock_rnat).
 *
 * A pod with mappings carries EP_F_HOSTPORT, so only its replies are looked
 * up in cni_ct. Each flow keeps its state and a timer (flowlife.h): closed
 * and idle flows leave cni_ct by themselves. ICMP errors about a flow are
 * translated both ways (icmp.h): from outside about the pod's replies
 * (hostport_icmp_error_in), and the pod's about a client's packets
 * (hostport_icmp_error_out).
 */
#pragma once

#include "endpoint.h"
#include "node.h"
#include "stackflow.h"
#include "flowlife.h"
#include "icmp.h"
#include "tunnel.h"
#include "tcpseq.h"

static __always_inline void hp_count(__u32 what)
{
	__u64 *c = bpf_map_lookup_elem(&cni_hp_stats, &what);

	if (c)
		*c += 1;
}

/*
 * The mapping for (addr, proto, port): the one for exactly addr, else the
 * wildcard one when addr is a node address (or, with loopback_ok, a loopback
 * address: only the node's own sockets can dial those).
 */
static __always_inline struct hostport_val *hostport_lookup(const void *addr, __u8 family, __u8 proto,
							    __be16 port, int is_loopback)
{
	struct hostport_key k = { .family = family, .proto = proto, .port = port };
	struct hostport_val *v;

	addr_copy(k.addr, addr, family);
	v = bpf_map_lookup_elem(&cni_hostports, &k);
	if (v)
		return v;
	__builtin_memset(k.addr, 0, sizeof(k.addr));
	v = bpf_map_lookup_elem(&cni_hostports, &k);
	if (!v)
		return NULL;
	if (!is_loopback && !is_node_ip(addr, family))
		return NULL;
	return v;
}

/* ------------------------------------------------------------ fragments
 *
 * A UDP datagram larger than the path leaves its sender in fragments: the
 * hostPort pod's reply once it learned a smaller path MTU, a client's
 * large request. Only the first fragment carries the ports a flow is known
 * by. When it is translated, its ports are noted in cni_hp_frags under
 * what every fragment of the datagram carries (addresses, protocol, IP
 * identification) and the link it came in by; each later fragment finds
 * them there and gets the same translation, of its addresses only. The
 * flow itself is still looked up (cni_ct, the mapping) as for any packet:
 * a later fragment opens nothing (hostport_dnat), and one whose first
 * fragment was never translated, or forged with a guessed identification
 * on another link, goes on untouched. The kernel's reassembly would come
 * too late: a hostPort is translated at tc, before netfilter's defrag, and
 * a node address's fragments are reassembled only for the node's sockets.
 * Subprograms: from_container's frame is at the 512-byte limit. Only UDP:
 * TCP segments fit the path (its MSS and PMTU discovery).
 */
#define HP_FRAG_TIMEOUT (30 * NSEC) /* as the kernel's reassembly (ipfrag_time) */
#define HP_SUBPROG static __noinline __attribute__((unused))

static __always_inline void hp_frag_count(__u32 what)
{
	__u64 *c = bpf_map_lookup_elem(&cni_hp_frag_stats, &what);

	if (c)
		*c += 1;
}

/* An IPv6 packet's extension headers as hostPort needs them: the shared
 * walk (pkt.h ip6_ext_chain, which an ICMPv6 error's quote walks too) from
 * the packet's own first extension header. */
static __always_inline long hp_ip6_chain(struct __sk_buff *skb, __u8 nexthdr, __u32 *id)
{
	return ip6_ext_chain(skb, nexthdr, ETH_HLEN + sizeof(struct ipv6hdr), id);
}

/* The notes' key of a fragment's flow as hp_frag_flow filled it in (its
 * addresses as the fragment came in, before any translation) with its
 * identification id: one builder for the note and its lookup. */
static __always_inline void hp_frag_key_of(struct hp_frag_key *k, __u32 ifindex, const struct flow *f, __u32 id)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->ifindex = ifindex;
	k->id = id;
	k->family = f->family;
	k->proto = IPPROTO_UDP;
	addr_copy(k->saddr, f->saddr, f->family);
	addr_copy(k->daddr, f->daddr, f->family);
}

/*
 * f for a UDP packet that flow_parse refused: a first fragment (offset 0,
 * more to come) with its ports, FLOW_FRAG_FIRST; a later one with the
 * ports of its datagram's translated first fragment, FLOW_FRAG_LATER and
 * no L4 header (l4off 0); over IPv6, a whole datagram behind extension
 * headers (FLOW_FRAG_NONE), which flow_parse6 does not walk (hp_ip6_chain).
 * Returns the datagram's identification (what hp_frag_note keys the note
 * by: returned, so that the note reads nothing again), or -1 when the
 * packet is none of these: it goes on untouched.
 */
HP_SUBPROG long hp_frag_flow(struct __sk_buff *skb, __u8 family, struct flow *f)
{
	__u32 id = 0;
	int later, more;

	if (family == AF_INET) {
		struct iphdr *ip = pkt_ip4(skb);

		if (!ip || ip->protocol != IPPROTO_UDP || ip->ihl < 5 || !(ip->frag_off & bpf_htons(0x3fff)))
			return -1;
		later = (ip->frag_off & bpf_htons(0x1fff)) != 0;
		more = 1;
		id = ip->id;
		f->l4off = ETH_HLEN + ip->ihl * 4;
		*(__be32 *)f->saddr = ip->saddr;
		*(__be32 *)f->daddr = ip->daddr;
	} else {
		struct ipv6hdr *ip6 = pkt_ip6(skb);

		if (!ip6)
			return -1;
		__builtin_memcpy(f->saddr, &ip6->saddr, 16);
		__builtin_memcpy(f->daddr, &ip6->daddr, 16);
		long c = hp_ip6_chain(skb, ip6->nexthdr, &id);
		if (c < 0)
			return -1;
		later = IP6X_FRAG(c) == FLOW_FRAG_LATER;
		if (!later && IP6X_PROTO(c) != IPPROTO_UDP)
			return -1;
		more = IP6X_FRAG(c) == FLOW_FRAG_FIRST;
		f->l4off = IP6X_L4OFF(c);
	}
	f->family = family;
	f->proto = IPPROTO_UDP;
	if (!later) {
		if (flow_load_l4(skb, f, FLOW_NO_ECHO))
			return -1;
		f->frag = more ? FLOW_FRAG_FIRST : FLOW_FRAG_NONE;
		return id;
	}

	struct hp_frag_key k;

	hp_frag_key_of(&k, skb->ifindex, f, id);
	struct hp_frag_val *v = bpf_map_lookup_elem(&cni_hp_frag_notes, &k);
	if (!v || bpf_ktime_get_ns() - v->seen_ns >= HP_FRAG_TIMEOUT) {
		/* Overtaken, evicted, or no hostPort's: made visible, to a node
		 * address only (a pod's fragments to elsewhere are no concern). */
		if (is_node_ip(f->daddr, family))
			hp_frag_count(HP_FRAG_NO_NOTE);
		return -1;
	}
	f->sport = v->sport;
	f->dport = v->dport;
	f->syn_only = 0;
	f->frag = FLOW_FRAG_LATER;
	f->l4off = 0;
	hp_frag_count(HP_FRAG_LATER);
	return id;
}

/* Notes the ports of the first fragment in f, about to be translated, for
 * its datagram's later fragments (hp_frag_flow). Its identification id is
 * the one hp_frag_flow returned: the packet is not read again (over IPv6,
 * its header chain not walked again). */
HP_SUBPROG void hp_frag_note(struct __sk_buff *skb, const struct flow *f, __u32 id)
{
	struct hp_frag_key k;
	struct hp_frag_val v = { .sport = f->sport, .dport = f->dport, .seen_ns = bpf_ktime_get_ns() };

	hp_frag_key_of(&k, skb->ifindex, f, id);
	if (!bpf_map_update_elem(&cni_hp_frag_notes, &k, &v, BPF_ANY))
		hp_frag_count(HP_FRAG_NOTED);
}

/* -------------------------------------------------------- packet NAT */

#ifndef BPF_TCP_ESTABLISHED
#define BPF_TCP_ESTABLISHED 1
#endif

/*
 * Whether a connected UDP socket of the node owns this exact flow: a node
 * process talking from a port that happens to be a UDP hostPort (say, a
 * resolver's ephemeral port) keeps its replies. Sockets merely bound to the
 * port do not count: a hostPort wins over them, as portmap's DNAT does.
 * TCP needs no such check: only SYNs open a translated flow.
 */
static __always_inline int node_owns_udp_flow(struct __sk_buff *skb, const struct flow *f)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	__u32 len;

	if (f->family == AF_INET) {
		t.ipv4.saddr = *(const __be32 *)f->saddr;
		t.ipv4.daddr = *(const __be32 *)f->daddr;
		t.ipv4.sport = f->sport;
		t.ipv4.dport = f->dport;
		len = sizeof(t.ipv4);
	} else {
		__builtin_memcpy(t.ipv6.saddr, f->saddr, 16);
		__builtin_memcpy(t.ipv6.daddr, f->daddr, 16);
		t.ipv6.sport = f->sport;
		t.ipv6.dport = f->dport;
		len = sizeof(t.ipv6);
	}
	sk = bpf_sk_lookup_udp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	int owned = sk->state == BPF_TCP_ESTABLISHED;
	bpf_sk_release(sk);
	return owned;
}

#ifndef EBPF_CNI_COMPAT
/* A flow's timer ran out: the entry goes unless a packet came meanwhile. */
static int ct_expire(void *map, struct ct_key *k, struct ct_val *v)
{
	__u64 left = flow_time_left(v->flags, k->proto, v->seen_ns, bpf_ktime_get_ns());

	if (left) {
		bpf_timer_start(&v->timer, left, 0);
		return 0;
	}
	bpf_map_delete_elem(map, k);
	hp_count(HP_STAT_EXPIRED);
	return 0;
}

/* (Re)starts the timer of a cni_ct entry to run in ns (an update of an
 * entry replaces it, timer and all: arm it after every write). */
static __always_inline void ct_arm(struct ct_val *v, __u64 ns)
{
	bpf_timer_init(&v->timer, &cni_ct, CLOCK_MONOTONIC); /* -EBUSY when done already */
	bpf_timer_set_callback(&v->timer, ct_expire);
	bpf_timer_start(&v->timer, ns, 0);
}
#else
/* The compat build (kernels without bpf_timer, see flowlife.h): an entry
 * past its timeout is treated as absent, and the LRU reclaims it. */
static __always_inline void ct_arm(struct ct_val *v, __u64 ns) {}
#endif

/* A TCP entry's sequence tracking (tcpseq.h: the client's RSTs must hit
 * its next sequence number) lives in created_ns, as the masquerade's. */
#define CT_SEQ_BASE 8 /* its bits in ct_val.flags: above CT_F_SNAT and FLOW_F_* */
#define CT_F_SEQ (TSEQ_F_SEQ << CT_SEQ_BASE)

static __always_inline struct snat_seq *ct_seq_of(struct ct_val *v)
{
	return (struct snat_seq *)&v->created_ns;
}

/* Records packet f (reply: the pod's) in its flow's entry: the state, the
 * last use at most once a second; a flow that closes expires in seconds.
 * A client's TCP segment moves the tracking first: an RST outside the
 * pod's window changes nothing (the pod's TCP ignores it too, RFC 5961);
 * the pod's segments raise the window when the entry is written anyway. */
static __always_inline void ct_track(struct __sk_buff *skb, struct ct_val *v, const struct flow *f, int reply,
				     __u64 now)
{
	if (f->proto == IPPROTO_TCP && !reply && !tcp_seq_remote(skb, f, ct_seq_of(v), &v->flags, CT_SEQ_BASE, NULL))
		return;
	__u32 cur = v->flags;
	__u32 n = flow_next(cur, f, reply, v->created_ns, now);

	/* The pod's SYN-ACK always reaches the tracking: it re-seeds a
	 * tuple the client reused with a new ISN (tcpseq.h). */
	if (n == cur && now - v->seen_ns < NSEC && !(reply && (f->tcp_flags & TCP_FLAG_SYN)))
		return;
	v->flags = n;
	v->seen_ns = now;
	if (f->proto == IPPROTO_TCP && reply)
		tcp_seq_local(skb, f, ct_seq_of(v), &v->flags, CT_SEQ_BASE, tcp_seg_scratch());
	if ((n & FLOW_F_CLOSING) && !(cur & FLOW_F_CLOSING))
		ct_arm(v, FLOW_TIMEOUT_CLOSING);
}

/*
 * DNATs a packet that matched hostport v to the pod, remembering the flow
 * in cni_ct. snat_to_dialled rewrites the source to the dialled address too
 * (a pod reaching its own hostPort: its reply must come back through the
 * host veth). TCP packets other than a SYN are translated only while their
 * flow is known, and a UDP flow only if no connected node socket owns it,
 * so a node's own connection that happens to use a hostPort number as its
 * local port never has its return traffic stolen.
 * Returns 0 when translated, 1 when the packet must go on untouched, -1 on
 * error.
 */
static __always_inline int hostport_dnat(struct __sk_buff *skb, struct flow *f, const struct hostport_val *v,
					 int snat_to_dialled, __u32 frag_id)
{
	struct ct_key k = { .family = f->family, .proto = f->proto, .pod_port = v->pod_port };
	struct ct_val nv = { .orig_port = f->dport, .client_port = f->sport, .ifindex = v->ifindex };
	struct ct_val *cur;
	__u8 dialled[16];
	__u64 now = bpf_ktime_get_ns();

	addr_copy(k.pod_addr, v->pod_addr, f->family);
	addr_copy(nv.orig_addr, f->daddr, f->family);
	addr_copy(nv.client_addr, f->saddr, f->family);
	addr_copy(dialled, f->daddr, f->family);
	if (snat_to_dialled) {
		addr_copy(k.peer_addr, f->daddr, f->family);
		nv.flags = CT_F_SNAT;
	} else {
		addr_copy(k.peer_addr, f->saddr, f->family);
	}
	k.peer_port = f->sport;

	cur = bpf_map_lookup_elem(&cni_ct, &k);
	if (cur && cur->ifindex == v->ifindex && cur->orig_port == nv.orig_port &&
	    (cur->flags & CT_F_SNAT) == nv.flags && addr_equal(cur->orig_addr, nv.orig_addr, f->family) &&
	    addr_equal(cur->client_addr, nv.client_addr, f->family) &&
	    !flow_expired(cur->flags, f->proto, cur->seen_ns, now)) {
		ct_track(skb, cur, f, 0, now);
	} else if ((f->proto == IPPROTO_TCP && !f->syn_only) || flow_frag(f) == FLOW_FRAG_LATER) {
		hp_count(HP_STAT_NO_FLOW);
		return 1;
	} else if (f->proto == IPPROTO_UDP && node_owns_udp_flow(skb, f)) {
		hp_count(HP_STAT_NO_FLOW);
		return 1;
	} else {
		nv.created_ns = now;
		nv.seen_ns = now;
		nv.flags |= flow_next(0, f, 0, now, now);
		if (f->proto == IPPROTO_TCP)
			tcp_seq_remote(skb, f, ct_seq_of(&nv), &nv.flags, CT_SEQ_BASE, NULL); /* the client's SYN */
		if (bpf_map_update_elem(&cni_ct, &k, &nv, BPF_ANY))
			return -1;
		cur = bpf_map_lookup_elem(&cni_ct, &k);
		if (cur)
			ct_arm(cur, flow_timeout(nv.flags, f->proto));
		hp_count(HP_STAT_CT_NEW);
	}

	if (flow_frag(f) == FLOW_FRAG_FIRST)
		hp_frag_note(skb, f, frag_id);
	if (pkt_rewrite(skb, f, 0, v->pod_addr, v->pod_port))
		return -1;
	if (snat_to_dialled && pkt_rewrite(skb, f, 1, dialled, f->sport))
		return -1;
	return 0;
}

/* Forgets the translated flow of packet f (as rewritten: client -> pod)
 * that its sender's egress denied after the DNAT: its replies must not
 * come back as the node's. Out of line: from_container's frame. */
HP_SUBPROG void hp_ct_forget(const struct flow *f)
{
	struct ct_key k = { .family = f->family, .proto = f->proto, .pod_port = f->dport, .peer_port = f->sport };

	addr_copy(k.pod_addr, f->daddr, f->family);
	addr_copy(k.peer_addr, f->saddr, f->family);
	bpf_map_delete_elem(&cni_ct, &k);
}

/*
 * A packet from the pod behind ifindex: if it is the reply of a translated
 * flow, rewrite it back to what the client dialled. Returns 1 when
 * translated (its destination untouched), HP_REV_SNAT when translated with
 * its destination set back to the client (a pod that reached its own
 * hostPort), 0 when not a translated flow, HP_REV_TOO_BIG when a reply
 * into the tunnel exceeds its path (untouched, for the stack to answer),
 * -1 on error.
 */
#define HP_REV_TOO_BIG 2
#define HP_REV_SNAT 3
static __always_inline int hostport_reverse(struct __sk_buff *skb, struct flow *f, __u32 ifindex, __u32 frag_id)
{
	struct ct_key k = { .family = f->family, .proto = f->proto, .pod_port = f->sport, .peer_port = f->dport };
	struct ct_val *ct;

	addr_copy(k.pod_addr, f->saddr, f->family);
	addr_copy(k.peer_addr, f->daddr, f->family);
	ct = bpf_map_lookup_elem(&cni_ct, &k);
	if (!ct)
		return 0;
	if (ct->ifindex != ifindex) {
		/* Left by an earlier pod that had this address: never applies. */
		bpf_map_delete_elem(&cni_ct, &k);
		return 0;
	}
	__u64 now = bpf_ktime_get_ns();
	if (flow_expired(ct->flags, f->proto, ct->seen_ns, now))
		return 0;
#ifndef EBPF_CNI_COMPAT
	/* Too large for the tunnel's path: the stack tells the pod (before
	 * ct_track, which this packet never reaches the client to update). */
	if (!(ct->flags & CT_F_SNAT) && node_tunnel_on() && tun_reply_too_big(skb, f))
		return HP_REV_TOO_BIG;
#endif
	ct_track(skb, ct, f, 1, now);
	if (flow_frag(f) == FLOW_FRAG_FIRST)
		hp_frag_note(skb, f, frag_id);
	/* Copy before rewriting: the entry may be evicted meanwhile. */
	__u8 orig[16], client[16];
	__be16 orig_port = ct->orig_port, client_port = ct->client_port;
	__u32 flags = ct->flags;
	__builtin_memcpy(orig, ct->orig_addr, 16);
	__builtin_memcpy(client, ct->client_addr, 16);
	if (pkt_rewrite(skb, f, 1, orig, orig_port))
		return -1;
	if (!(flags & CT_F_SNAT))
		return 1;
	if (pkt_rewrite(skb, f, 0, client, client_port))
		return -1;
	return HP_REV_SNAT;
}

/*
 * Sends a translated reply (its source is now a node address, which the
 * stack would drop as martian if handed in from the veth) straight out of
 * the egress device the FIB picks, as the stack would forward it. A drop
 * is the pod's (skb->ifindex is its host veth, as ifindex), counted out of
 * line: from_container's frame is near its limit.
 */
static __always_inline int fib_redirect(struct __sk_buff *skb, __u32 ifindex)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct bpf_fib_lookup p = {};
	int rc;

	if ((void *)(eth + 1) > data_end)
		return drop_dir(skb->ifindex, DIR_EGRESS, REASON_DROP_MALFORMED);
	p.ifindex = ifindex;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > data_end)
			return drop_dir(skb->ifindex, DIR_EGRESS, REASON_DROP_MALFORMED);
		if (ip->ttl <= 1)
			goto no_route;
		p.family = AF_INET;
		p.tos = ip->tos;
		p.l4_protocol = ip->protocol;
		p.ipv4_src = ip->saddr;
		p.ipv4_dst = ip->daddr;
	} else {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return drop_dir(skb->ifindex, DIR_EGRESS, REASON_DROP_MALFORMED);
		if (ip6->hop_limit <= 1)
			goto no_route;
		p.family = AF_INET6;
		p.l4_protocol = ip6->nexthdr;
		__builtin_memcpy(p.ipv6_src, &ip6->saddr, 16);
		__builtin_memcpy(p.ipv6_dst, &ip6->daddr, 16);
	}
	/* tot_len 0: the helper checks the skb (GSO aware) against the MTU. */
	rc = bpf_fib_lookup(skb, &p, sizeof(p), 0);
#ifndef EBPF_CNI_COMPAT
	/* A route into the tunnel device (another node's pod CIDR). */
	if (rc == BPF_FIB_LKUP_RET_UNSUPP_LWT) {
		rc = tun_redirect(skb, &p);
		if (rc >= 0)
			return rc;
		goto no_route;
	}
#endif
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		goto no_route;

	eth = pkt_forward(skb, p.family);
	if (!eth)
		return drop_dir(skb->ifindex, DIR_EGRESS, REASON_DROP_MALFORMED);
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		struct bpf_redir_neigh nh = { .nh_family = p.family };

		if (p.family == AF_INET)
			nh.ipv4_nh = p.ipv4_dst;
		else
			__builtin_memcpy(nh.ipv6_nh, p.ipv6_dst, 16);
		return bpf_redirect_neigh(p.ifindex, &nh, sizeof(nh), 0);
	}
	/* p.dmac is only 2-byte aligned on the stack: no mac_copy. */
	__builtin_memcpy(eth->h_dest, p.dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, p.smac, ETH_ALEN);
	return bpf_redirect(p.ifindex, 0);
no_route:
	hp_count(HP_STAT_NO_ROUTE);
	return drop_dir(skb->ifindex, DIR_EGRESS, REASON_DROP_NO_ROUTE);
}

#define HP_CONTINUE FEATURE_CONTINUE

/* hostport_from_pod's src_flags, beside the pod's EP_F_*: its egress denied
 * the packet as sent (to a node address), which stands unless the packet is
 * a hairpin to a hostPort, judged on its backend instead (as Calico and
 * Cilium judge after their translation). Only that DNAT may deliver it: a
 * reply, an ICMP error, a packet left untouched is dropped as the egress
 * drop it was (hp_untranslated), never handed on to the node's stack. A
 * flag bit, not a variable: from_container's frame is at the limit. */
#define HP_F_DEFER (1U << 31)

/* hostport_from_pod leaves the packet alone: the normal path's, unless its
 * denial stands (HP_F_DEFER). */
#define hp_untranslated(src_flags, ifindex)                                                            \
	(((src_flags) & HP_F_DEFER) ? drop_dir(ifindex, DIR_EGRESS, REASON_DROP_POLICY) : HP_CONTINUE)

/*
 * Delivers a packet the hostPort path translated, from the pod behind
 * ifindex, to daddr: a pod of this node gets it directly; anything else
 * leaves through the FIB's device (its source is a node address now, which
 * the stack would take for a martian coming in from a veth). not_pod: the
 * caller knows daddr is no pod's (from_container looked it up), so it is
 * not looked up again.
 */
static __always_inline int hostport_deliver(struct __sk_buff *skb, __u8 family, const __u8 *daddr, __u32 ifindex,
					    int not_pod)
{
	struct ep_info *dst = not_pod ? NULL : ep_lookup_addr(daddr, family);

	if (!dst) {
		__u32 len = skb->len;
		int rc = fib_redirect(skb, ifindex);

		if (rc != TC_ACT_SHOT)
			count(ifindex, DIR_EGRESS, REASON_FORWARD, len);
		return rc;
	}
	struct ethhdr *eth = pkt_forward(skb, family);
	if (!eth) {
		hp_count(HP_STAT_ERROR);
		return drop(ifindex, REASON_DROP_MALFORMED, skb->len);
	}
	count(ifindex, DIR_EGRESS, REASON_REDIRECT, skb->len);
	return deliver_to_pod(skb, eth, dst);
}

/*
 * An ICMP error the pod behind ifindex sends about a packet of a hostPort
 * flow (a port unreachable, say): the packet it quotes went client ->
 * pod, so the quote's destination goes back to what the client dialled
 * (and its source to the client, for a pod that reached its own hostPort),
 * as does the error's source. Returns the verdict, or HP_CONTINUE when the
 * packet is no such error.
 */
static __always_inline int hostport_icmp_error_out(struct __sk_buff *skb, __u8 family, __u32 ifindex)
{
	struct icmp_err e = {};

	if (icmp_err_parse(skb, family, &e) || (e.q.proto != IPPROTO_TCP && e.q.proto != IPPROTO_UDP))
		return HP_CONTINUE;
	struct ct_key k = { .family = family, .proto = e.q.proto, .pod_port = e.q.dport, .peer_port = e.q.sport };
	addr_copy(k.pod_addr, e.q.daddr, family);
	addr_copy(k.peer_addr, e.q.saddr, family);
	struct ct_val *ct = bpf_map_lookup_elem(&cni_ct, &k);
	if (!ct || ct->ifindex != ifindex || flow_expired(ct->flags, k.proto, ct->seen_ns, bpf_ktime_get_ns()))
		return HP_CONTINUE;
	__u8 orig[16], client[16];
	__be16 orig_port = ct->orig_port, client_port = ct->client_port;
	__u32 flags = ct->flags;
	__builtin_memcpy(orig, ct->orig_addr, 16);
	__builtin_memcpy(client, ct->client_addr, 16);
	if (icmp_err_rewrite(skb, &e, 0, orig, orig_port) ||
	    ((flags & CT_F_SNAT) && icmp_err_rewrite(skb, &e, 1, client, client_port))) {
		hp_count(HP_STAT_ERROR);
		return drop(ifindex, REASON_DROP_MALFORMED, skb->len);
	}
	hp_count(HP_STAT_ICMP_ERR_OUT);
	/* An error goes back to the quoted packet's sender. */
	return hostport_deliver(skb, family, e.q.saddr, ifindex, 0);
}

/*
 * hostPort work on a packet whose source checked out: a reply of a translated
 * flow (only pods with mappings have any) gets its source set back to what
 * the client dialled, as does an ICMP error about one of its flows; a packet
 * to a node address:hostPort (hairpin; dst_is_pod rules that out) is DNATed
 * to the mapping's pod. Returns the verdict of a translated packet, or
 * HP_CONTINUE, the packet untouched, for the normal path (with HP_F_DEFER:
 * the drop).
 */
static __always_inline int hostport_from_pod(struct __sk_buff *skb, __u8 family, __u32 src_flags, int dst_is_pod)
{
	__u32 ifindex = skb->ifindex;
	struct flow f = {};
	long frag_id = 0; /* a fragment's identification (hp_frag_flow) */
	int rc = 0;

	if (family == AF_INET) {
		struct iphdr *ip = pkt_ip4(skb);

		if (!ip)
			return hp_untranslated(src_flags, ifindex);
		if (ip->protocol == IPPROTO_ICMP)
			return (src_flags & (EP_F_HOSTPORT | HP_F_DEFER)) == EP_F_HOSTPORT ?
				       hostport_icmp_error_out(skb, AF_INET, ifindex) :
				       hp_untranslated(src_flags, ifindex);
		if (flow_parse4(skb, ip, &f, FLOW_NO_ECHO) && (frag_id = hp_frag_flow(skb, AF_INET, &f)) < 0)
			return hp_untranslated(src_flags, ifindex);
	} else {
		struct ipv6hdr *ip6 = pkt_ip6(skb);

		if (!ip6)
			return hp_untranslated(src_flags, ifindex);
		if (ip6->nexthdr == IPPROTO_ICMPV6)
			return (src_flags & (EP_F_HOSTPORT | HP_F_DEFER)) == EP_F_HOSTPORT ?
				       hostport_icmp_error_out(skb, AF_INET6, ifindex) :
				       hp_untranslated(src_flags, ifindex);
		if (flow_parse6(skb, ip6, &f, FLOW_NO_ECHO) && (frag_id = hp_frag_flow(skb, AF_INET6, &f)) < 0)
			return hp_untranslated(src_flags, ifindex);
	}

	if ((src_flags & (EP_F_HOSTPORT | HP_F_DEFER)) == EP_F_HOSTPORT) {
		rc = hostport_reverse(skb, &f, ifindex, frag_id);
		if (rc < 0)
			goto error;
		if (rc == HP_REV_TOO_BIG)
			return hp_untranslated(src_flags, ifindex);
		if (rc)
			hp_count(HP_STAT_REPLY);
	}
	if (!rc) {
		if (dst_is_pod)
			return hp_untranslated(src_flags, ifindex);
		struct hostport_val *v = hostport_lookup(f.daddr, f.family, f.proto, f.dport, 0);
		if (!v)
			return hp_untranslated(src_flags, ifindex);
		if (f.proto == IPPROTO_UDP) {
			/* The pod answering a node address whose flow the stack
			 * delivered (a node socket, a masqueraded client) on a port
			 * that happens to be a hostPort: not a hairpin. */
			struct sf_key k;

			sf_key_sent(&k, &f);
			if (sf_lookup(&k, ifindex, NULL)) /* the node's flows: the shared table */
				return hp_untranslated(src_flags, ifindex);
		}
		/* Reaching its own hostPort, the pod must not see its own address
		 * as the source: SNAT to the dialled address. */
		int self = v->ifindex == ifindex;

		rc = hostport_dnat(skb, &f, v, self, frag_id);
		if (rc < 0)
			goto error;
		if (rc)
			return hp_untranslated(src_flags, ifindex);
		hp_count(HP_STAT_DNAT_HAIRPIN);
		/* The sender's egress is judged on the backend (the pod and its
		 * containerPort, the packet as now rewritten), as Services are
		 * after kube-proxy's DNAT: an except hole or a rule on the pod
		 * is no way around by its hostPort, and a rule that allows the
		 * pod reaches it by its hostPort too, whatever the node
		 * address's verdict was (HP_F_DEFER). A pod reaching itself is
		 * not judged (upstream ignores a pod's traffic to itself). */
		if ((src_flags & EP_F_POLICY) && !self && policy_judge(skb, family, ifindex, POL_J_EGRESS) == POL_DENY) {
			hp_ct_forget(&f);
			return drop_dir(ifindex, DIR_EGRESS, REASON_DROP_POLICY);
		}
	}
	/* A reply whose destination stayed the one from_container found no
	 * pod at (dst_is_pod) goes out without a second lookup (issue 30). */
	return hostport_deliver(skb, family, f.daddr, ifindex, rc == 1 && !dst_is_pod);
error:
	hp_count(HP_STAT_ERROR);
	return drop(ifindex, REASON_DROP_MALFORMED, skb->len);
}

/*
 * A packet from another host (uplink tcx ingress) parsed into f: DNATed to
 * the pod when it dials a hostPort, and delivered into the pod. Returns the
 * verdict; TCX_NEXT when it is not a hostPort's (the caller checked TTL).
 */
static __always_inline int hostport_from_uplink(struct __sk_buff *skb, struct flow *f, __u32 frag_id)
{
	struct hostport_val *v = hostport_lookup(f->daddr, f->family, f->proto, f->dport, 0);
	if (!v)
		return TCX_NEXT;
	struct ep_info *ep = ep_lookup_addr(v->pod_addr, f->family);
	if (!ep || ep->ifindex != v->ifindex)
		return TCX_NEXT; /* the pod is going away */

	int rc = hostport_dnat(skb, f, v, 0, frag_id);
	if (rc < 0) {
		hp_count(HP_STAT_ERROR);
		return drop_dir(ep->ifindex, DIR_INGRESS, REASON_DROP_MALFORMED);
	}
	if (rc)
		return TCX_NEXT;

	struct ethhdr *eth = pkt_forward(skb, f->family);
	if (!eth)
		return drop_dir(ep->ifindex, DIR_INGRESS, REASON_DROP_MALFORMED);
	hp_count(HP_STAT_DNAT_UPLINK);
	return deliver_to_pod(skb, eth, ep);
}

/*
 * An ICMP error from another host (uplink tcx ingress, parsed into e) about
 * a pod's reply: the quote is node address:hostPort -> client. Its source
 * goes back to the pod's address and port, as does the error's destination,
 * and the error goes into the pod, which learns the path MTU (or that the
 * client is gone) for its connection. Returns the verdict, or HP_CONTINUE
 * when the error is about no hostPort flow (the caller checked TTL).
 */
static __always_inline int hostport_icmp_error_in(struct __sk_buff *skb, struct icmp_err *e)
{
	__u8 family = e->family;

	if (e->q.proto != IPPROTO_TCP && e->q.proto != IPPROTO_UDP)
		return HP_CONTINUE;
	struct hostport_val *v = hostport_lookup(e->q.saddr, family, e->q.proto, e->q.sport, 0);
	if (!v)
		return HP_CONTINUE;
	__u8 pod[16];
	__be16 pod_port = v->pod_port;
	__u32 ifindex = v->ifindex;
	__builtin_memcpy(pod, v->pod_addr, 16);

	struct ct_key k = { .family = family, .proto = e->q.proto, .pod_port = pod_port, .peer_port = e->q.dport };
	addr_copy(k.pod_addr, pod, family);
	addr_copy(k.peer_addr, e->q.daddr, family);
	struct ct_val *ct = bpf_map_lookup_elem(&cni_ct, &k);
	if (!ct || ct->ifindex != ifindex || (ct->flags & CT_F_SNAT) || ct->orig_port != e->q.sport ||
	    !addr_equal(ct->orig_addr, e->q.saddr, family) ||
	    flow_expired(ct->flags, k.proto, ct->seen_ns, bpf_ktime_get_ns()))
		return HP_CONTINUE;
	struct ep_info *ep = ep_lookup_addr(pod, family);
	if (!ep || ep->ifindex != ifindex)
		return HP_CONTINUE;

	if (icmp_err_rewrite(skb, e, 1, pod, pod_port)) {
		hp_count(HP_STAT_ERROR);
		return drop_dir(ifindex, DIR_INGRESS, REASON_DROP_MALFORMED);
	}
	struct ethhdr *eth = pkt_forward(skb, family);
	if (!eth)
		return drop_dir(ifindex, DIR_INGRESS, REASON_DROP_MALFORMED);
	hp_count(HP_STAT_ICMP_ERR_IN);
	return deliver_to_pod(skb, eth, ep);
}

/* ------------------------------------------------------------ socket hooks
 *
 * The node's own processes: their socket's destination is rewritten to the
 * pod at connect (TCP, connected UDP) or per datagram at sendmsg
 * (unconnected UDP), so no packet is translated; recvmsg and getpeername
 * show the address the process asked for. A root cgroup hook runs for every
 * socket of the machine, in every network namespace: each acts only in the
 * node's netns, whose cookie the attaching process stored in cni_hp_config.
 */

#define SOCK_PASS 1

static __always_inline int in_node_netns(struct bpf_sock_addr *ctx)
{
	struct hp_config *c = node_config();

	return c && (c->flags & HP_CFG_ENABLED) && c->netns_cookie == bpf_get_netns_cookie(ctx);
}

static __always_inline int l4_ok(struct bpf_sock_addr *ctx)
{
	__u32 p = ctx->protocol;

	return p == IPPROTO_TCP || p == IPPROTO_UDP;
}

/* Remembers what the socket asked for, once per socket and pod address. */
static __always_inline void rnat_put(struct bpf_sock_addr *ctx, __u8 family, const __u8 *pod_addr, __be16 pod_port,
				     const __u8 *orig_addr, __be16 orig_port, __u32 ifindex)
{
	struct sock_rnat_key k = { .cookie = bpf_get_socket_cookie(ctx), .port = pod_port, .family = family };
	struct sock_rnat_val v = { .port = orig_port, .ifindex = ifindex };
	struct sock_rnat_val *cur;

	addr_copy(k.addr, pod_addr, family);
	addr_copy(v.addr, orig_addr, family);
	cur = bpf_map_lookup_elem(&cni_sock_rnat, &k);
	if (cur && cur->port == v.port && cur->ifindex == v.ifindex) {
		const __u64 *a = (const __u64 *)cur->addr, *b = (const __u64 *)v.addr;
		if (a[0] == b[0] && a[1] == b[1])
			return;
	}
	bpf_map_update_elem(&cni_sock_rnat, &k, &v, BPF_ANY);
}

static __always_inline int hostport_sock_dnat4(struct bpf_sock_addr *ctx)
{
	if (!l4_ok(ctx) || !in_node_netns(ctx))
		return SOCK_PASS;
	__be32 dst = ctx->user_ip4;
	__be16 port = (__be16)ctx->user_port;
	int loopback = (bpf_ntohl(dst) >> 24) == 127;
	struct hostport_val *v = hostport_lookup(&dst, AF_INET, ctx->protocol, port, loopback);
	if (!v)
		return SOCK_PASS;

	rnat_put(ctx, AF_INET, v->pod_addr, v->pod_port, (const __u8 *)&dst, port, v->ifindex);
	ctx->user_ip4 = *(const __u32 *)v->pod_addr;
	ctx->user_port = v->pod_port;
	hp_count(HP_STAT_SOCK);
	return SOCK_PASS;
}

static __always_inline int is_v4mapped(const __u32 *a)
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0xffff);
}

static __always_inline int hostport_sock_dnat6(struct bpf_sock_addr *ctx)
{
	if (!l4_ok(ctx) || !in_node_netns(ctx))
		return SOCK_PASS;
	__u32 a[4], n[4];
	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
	__be16 port = (__be16)ctx->user_port;
	struct hostport_val *v;

	if (is_v4mapped(a)) {
		/* An IPv6 socket dialling an IPv4 address (::ffff:a.b.c.d). */
		__be32 d4 = a[3];
		v = hostport_lookup(&d4, AF_INET, ctx->protocol, port, (bpf_ntohl(d4) >> 24) == 127);
		if (!v)
			return SOCK_PASS;
		n[0] = 0;
		n[1] = 0;
		n[2] = bpf_htonl(0xffff);
		n[3] = *(const __u32 *)v->pod_addr;
	} else {
		int loopback = a[0] == 0 && a[1] == 0 && a[2] == 0 && a[3] == bpf_htonl(1);
		v = hostport_lookup(a, AF_INET6, ctx->protocol, port, loopback);
		if (!v)
			return SOCK_PASS;
		__builtin_memcpy(n, v->pod_addr, 16);
	}
	rnat_put(ctx, AF_INET6, (const __u8 *)n, v->pod_port, (const __u8 *)a, port, v->ifindex);
	ctx->user_ip6[0] = n[0];
	ctx->user_ip6[1] = n[1];
	ctx->user_ip6[2] = n[2];
	ctx->user_ip6[3] = n[3];
	ctx->user_port = v->pod_port;
	hp_count(HP_STAT_SOCK);
	return SOCK_PASS;
}

/* The peer address a process sees: the pod's, back to what it dialled. */
static __always_inline int hostport_sock_rnat4(struct bpf_sock_addr *ctx)
{
	if (!in_node_netns(ctx))
		return SOCK_PASS;
	struct sock_rnat_key k = {
		.cookie = bpf_get_socket_cookie(ctx), .port = (__be16)ctx->user_port, .family = AF_INET,
	};
	*(__u32 *)k.addr = ctx->user_ip4;
	struct sock_rnat_val *v = bpf_map_lookup_elem(&cni_sock_rnat, &k);
	if (!v)
		return SOCK_PASS;
	ctx->user_ip4 = *(const __u32 *)v->addr;
	ctx->user_port = v->port;
	return SOCK_PASS;
}

static __always_inline int hostport_sock_rnat6(struct bpf_sock_addr *ctx)
{
	if (!in_node_netns(ctx))
		return SOCK_PASS;
	struct sock_rnat_key k = {
		.cookie = bpf_get_socket_cookie(ctx), .port = (__be16)ctx->user_port, .family = AF_INET6,
	};
	__u32 *a = (__u32 *)k.addr;
	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
	struct sock_rnat_val *v = bpf_map_lookup_elem(&cni_sock_rnat, &k);
	if (!v)
		return SOCK_PASS;
	const __u32 *o = (const __u32 *)v->addr;
	ctx->user_ip6[0] = o[0];
	ctx->user_ip6[1] = o[1];
	ctx->user_ip6[2] = o[2];
	ctx->user_ip6[3] = o[3];
	ctx->user_port = v->port;
	return SOCK_PASS;
}
