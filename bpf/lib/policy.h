/*
 * Kubernetes NetworkPolicy, as the agent compiled it for each pod interface
 * (pkg/policy) and pkg/maps wrote it (pkg/maps/policy.go):
 *
 *   - cni_pol_state[ifindex]: each direction open, isolated or pending, and
 *     its rule set (one update switches both directions to new sets);
 *   - cni_pol_addrs: LPM trie {set, family, peer address} -> every port, or
 *     a port set; cni_pol_ports: LPM trie {port set, protocol, port} (an
 *     endPort range is stored as its prefixes);
 *   - cni_pol_ct_parts: flows allowed so far, as the pod sees them, so
 *     replies pass both ways without a rule, and so do ICMP errors quoting
 *     them. Timeouts are the translated flows' (flowlife.h). Each pod
 *     interface has two LRU tables of its own, the flows it opened and the
 *     flows its peers opened: when one is full its own oldest flows go,
 *     never another pod's, and nothing a peer opens evicts what the pod
 *     opened;
 *   - cni_pol_frag_parts: datagrams whose first fragment passed, so their
 *     later fragments (no ports) pass too; a table per pod interface.
 *
 * A packet costs at most: the state (one hash lookup), the flow (a table
 * and an entry lookup, two of each when pol_ct_first guesses its opener
 * wrong or the flow is new), and for a new flow of an isolated pod its
 * source among the node's addresses and one lookup in each trie: nothing
 * grows with the number of policies or peers. Pods of a network without
 * networkPolicy carry no EP_F_POLICY and cost nothing here.
 *
 * Where packets are judged:
 *   - egress, from_container.c, as the pod sent them (before hostPort,
 *     masquerade and redirect). A packet the stack may still translate
 *     (kube-proxy's Service DNAT: its destination is no pod of the node)
 *     that the rules deny is not dropped there but judged again once the
 *     stack translated it: in to_container.c (a pod of this node) and
 *     to_uplink.c (leaving the node), with the destination the stack
 *     chose. Its flow entry (POL_CT_F_DEFER) then only lets replies in,
 *     which the stack translates back to the address the pod dialled,
 *     and only once that judgement confirmed it (POL_CT_F_PENDING,
 *     pol_confirm_deferred): one that never comes opens nothing, but
 *     for a request the stack delivered to a socket of the node, whose
 *     answer is judged (pol_pending_local). A hostPort on a node address
 *     is judged on its backend only, after our own DNAT: a denial as sent
 *     goes to hostport_from_pod (HP_F_DEFER), which delivers nothing but
 *     that DNAT's packet once its backend is allowed (lib/hostport.h);
 *   - ingress, wherever a packet enters a pod: redirect_to_endpoint (same
 *     node pod to pod, hostPort from the uplink or hairpin) and
 *     to_container.c (whatever the stack delivers: other nodes, Services,
 *     NodePorts, the node itself), after every translation.
 *   - what the stack masqueraded (kube-proxy's SNAT at POSTROUTING) is
 *     judged by its sender before the SNAT, read from its conntrack entry
 *     (lib/nfct.h, pol_fwd): the receiver's ingress by that source, the
 *     sending pod's egress (policy_after_snat) on its own packets.
 *
 * The node's own traffic to a pod (kubelet's probes) always passes: a
 * packet the node sends (no ingress interface) or whose source is a node
 * address (cni_node_ips; on the redirect paths and forwarded by the stack
 * only when it came from a pod's host veth: off a wire such a source is
 * forged, pol_node_link; to_container.c drops a local pod's source that
 * did not come in by its host veth). Neighbour
 * discovery and ICMPv6 to multicast groups never leave the link and are not
 * judged; other IPv6 multicast and link-local IPv6 are (the node's passes
 * as the node's, see above). A pod's packet the node delivers to itself
 * (broadcast, multicast, link-local, a local route) is judged at once,
 * never deferred. A pod interface whose state is missing is pending (fail
 * closed).
 */
#pragma once

#include "maps.h"
#include "pkt.h"
#include "node.h"
#include "flowlife.h"
#include "icmp.h" /* icmp_is_error */
#include "nfct.h"
#include "tcpseq.h"

#define POL_ALLOW 0
#define POL_DENY 1
#define POL_ALLOW_NEW 2 /* policy_judge, after the stack: allowed, a new flow recorded (policy_judge_after confirms its deferral) */

#define POL_EXT_HEADERS 4 /* IPv6 extension headers read to the transport header; more: denied */

/* Whether a packet is a fragment of a datagram (pol_work.frag). */
#define POL_FRAG_NONE 0
#define POL_FRAG_FIRST 1 /* the first fragment: it has the ports, it is judged */
#define POL_FRAG_LATER 2 /* a later one: no ports, it passes if its first fragment did */
#define POL_FRAG_TIMEOUT (30 * NSEC) /* as the kernel's reassembly (ipfrag_time) */

/* What a packet is to policy. */
#define POL_PKT_FLOW 0  /* judged by its own header */
#define POL_PKT_ERROR 1 /* an ICMP error: allowed with the flow it quotes */
#define POL_PKT_LOCAL 2 /* link scope (ND, ICMPv6 to a group): never judged */
#define POL_PKT_BAD 3   /* headers do not fit */

/* A new deferral's entry waits for the judgement after the stack to
 * confirm it (pol_confirm_deferred), which reads conntrack: where that
 * cannot be read (the compat build, a kernel without conntrack in its BTF)
 * the entry lets replies in at once, as it did before
 * (docs/networkpolicy.md). A constant once relocated. */
#define POL_CT_F_DEFER_NEW (nfct_readable() ? POL_CT_F_PENDING : 0)

/* How a packet is judged (policy_judge's how). */
#define POL_J_DEFER 1  /* from_container, to the stack: a denial is judged again after the stack's translation */
#define POL_J_AFTER 2  /* the judgement after the stack's translation of a deferred packet */
#define POL_J_EGRESS 4 /* the pod sends it (else it enters the pod) */
#define POL_J_NODE 8   /* it comes from the node (ingress) */
#define POL_J_WIRE 16  /* it may have come off the wire (a hostPort's DNAT): a node source address is one only if it came from a pod's host veth */
#define POL_J_FWD 32   /* the stack forwarded it, after POSTROUTING: a source it translated is read from conntrack (lib/nfct.h) */

/* What pol_fwd found (pol_work.snat). */
#define POL_SNAT_NONE 0
#define POL_SNAT_PEER 1      /* ingress: the peer is w->nf.addr, the source before the stack's SNAT */
#define POL_SNAT_NOT_OURS 2  /* egress: not the pod's own packet: allowed, no flow recorded */

/* policy_judge's variables, in cni_pol_scratch: a tc program runs to its
 * end on its CPU without another tc run in between. */
struct pol_work {
	struct flow f;
	__u8 h[16]; /* header bytes being read */
	struct pol_ct_key k;
	union {
		struct {
			struct flow q; /* the packet an ICMP error quotes */
			struct pol_ct_key ek;
		};
		struct bpf_fib_lookup fib; /* pol_unjudged_after's, after any use of q and ek */
		struct nfct_work nf;       /* POL_J_FWD's conntrack read, after any use of q and ek */
		struct nfct_orig no;       /* pol_confirm_deferred's conntrack read, after any use of the others */
		struct tcp_seg seg;        /* tcp_seg_scratch (lib/tcpseq.h), after any use of the others */
	};
	struct pol_ct_val nv;
	struct pol_ct_part_key tk; /* a cni_pol_ct_parts key */
	__u32 ct_opener;           /* the table pol_ct_find found the flow in */
	__u64 now;                 /* pol_ct_find's time */
	__u32 ifindex;             /* the pod's host veth, for pol_error_related and pol_fwd */
	__u32 egress;              /* the pod sends the packet, for pol_error_related and pol_fwd */
	struct pol_addr_key ak;
	struct pol_port_key pk;
	struct ep_key nk;
	__u32 link; /* a cni_links key */
	struct pol_frag_key fk;
	__u64 frag_seen; /* a cni_pol_frag_parts table's value being written */
	__u32 frag_id; /* the fragment's datagram: IPv4 identification or IPv6 fragment header id */
	__u8 frag;     /* POL_FRAG_* */
	__u8 snat;     /* POL_SNAT_*: what pol_fwd found */
	__u8 fwd;      /* how & (POL_J_FWD | POL_J_AFTER): for pol_allows, and POL_ALLOW_NEW */
	__u8 deferred; /* the packet's denial is deferred: its fragments' note says so (pol_frag_note) */
	__u8 recorded; /* after the stack, a new flow was recorded: POL_ALLOW_NEW */
	__u8 kept;     /* pol_ct_find passed over a replied entry for a SYN */
	/* The pod (host veth) whose packet from_container last deferred to a
	 * pending entry, on this CPU: the stack forwards it on the CPU it
	 * came in on, so the judgement after the stack confirms the entry
	 * (pol_confirm_deferred) even when it finds the translated flow known
	 * already: that entry may outlive the pending one (evicted, or
	 * expired while the peer was silent), which the pod's next packet
	 * makes again. Set only while the entry is pending, so confirmed flows
	 * pay no conntrack read; a stale hint costs one read, never a verdict
	 * (the confirmation needs the stack's DNAT of the allowed packet).
	 * policy_judge never resets it. */
	__u32 pending_hint;
};
_Static_assert(sizeof(struct pol_work) <= sizeof(struct pol_scratch), "struct pol_scratch is too small for struct pol_work");
_Static_assert(__builtin_offsetof(struct pol_work, seg) == TCP_SEG_SCRATCH_OFF,
	       "tcp_seg_scratch (lib/tcpseq.h) is not pol_work.seg");

/* is_node_ip, its key in the scratch. */
static __always_inline int pol_is_node(struct pol_work *w, const __u8 *addr, __u8 family)
{
	__builtin_memset(&w->nk, 0, sizeof(w->nk));
	w->nk.family = family;
	addr_copy(w->nk.addr, addr, family);
	return bpf_map_lookup_elem(&cni_node_ips, &w->nk) != NULL;
}

/*
 * Whether a node source address on the packet is the node's: it came from
 * a pod's host veth (a pod hairpinned to its own hostPort, a hostPort's
 * translated reply), not off a wire. POL_J_WIRE (the redirect paths):
 * the link is skb->ifindex, where the packet came in; forwarded by the
 * stack (POL_J_FWD, called with an ingress interface): its ingress
 * interface. Any other link (an uplink, whose from_uplink drops such a
 * packet anyway, or one no program of ours sees: a link without a node
 * address, the tunnel) brings only forgeries; the stack's IPv4 martian
 * check may drop them, IPv6 has none. A source the stack masqueraded to
 * a node address is judged by the one before (pol_fwd).
 */
static __always_inline int pol_node_link(struct __sk_buff *skb, struct pol_work *w, __u32 how)
{
	__u32 at = skb->ifindex, in = skb->ingress_ifindex;

	/* Both read: the verifier refuses a context offset chosen at run time. */
	asm volatile("" : "+r"(at), "+r"(in));
	w->link = (how & POL_J_WIRE) ? at : in;
	return bpf_map_lookup_elem(&cni_links, &w->link) != NULL;
}

/*
 * Whether the packet in w->f comes from the node: its source is a node
 * address. Nothing but the node itself, or a pod hairpinned to its own
 * hostPort, has one; off a wire (POL_J_WIRE, POL_J_FWD: see
 * pol_node_link) it is forged, and the rules judge it as any peer. Not
 * inlined: policy_judge's frame is what from_container's leaves of the
 * stack.
 */
static __noinline int pol_node_source(struct __sk_buff *skb, struct pol_work *w, __u8 family, __u32 how)
{
	if (!pol_is_node(w, w->f.saddr, family))
		return 0;
	if (!(how & (POL_J_WIRE | POL_J_FWD)))
		return 1;
	return pol_node_link(skb, w, how);
}

/* Whether the peer of the packet in w is the node: POL_J_NODE, or (a
 * packet entering the pod) a node source (pol_node_source). Asked only
 * when a verdict needs it, after the flow lookup: a packet of a known flow
 * (most) pays no cni_node_ips lookup. */
static __always_inline int pol_peer_is_node(struct __sk_buff *skb, struct pol_work *w, __u8 family, __u32 how)
{
	if (how & POL_J_NODE)
		return 1;
	return !(how & POL_J_EGRESS) && pol_node_source(skb, w, family, how);
}

/* The fragment key of the datagram in w (w->frag_id) at the pod behind ifindex. */
static __always_inline struct pol_frag_key *pol_frag_key_of(struct pol_work *w, __u32 ifindex)
{
	struct pol_frag_key *k = &w->fk;

	__builtin_memset(k, 0, sizeof(*k));
	k->ifindex = ifindex;
	k->id = w->frag_id;
	k->family = w->f.family;
	k->proto = w->f.proto;
	addr_copy(k->saddr, w->f.saddr, w->f.family);
	addr_copy(k->daddr, w->f.daddr, w->f.family);
	return k;
}

/* The low bit of a cni_pol_frag_parts value: the first fragment's denial
 * was deferred (w->deferred), not allowed. A nanosecond less of the time
 * costs nothing; a bit of the value keeps its layout. */
#define POL_FRAG_DEFERRED 1ULL

/* Records that the first fragment of w's datagram passed, allowed or
 * deferred (w->deferred), so the later ones (which carry no ports) follow
 * it. Not inlined: policy_judge's frame. */
static __noinline void pol_frag_note(struct pol_work *w, __u32 ifindex)
{
	struct pol_frag_key *k = pol_frag_key_of(w, ifindex);
	void *t = bpf_map_lookup_elem(&cni_pol_frag_parts, &k->ifindex);

	if (!t)
		return; /* no table: its later fragments are denied (closed) */
	w->frag_seen = (bpf_ktime_get_ns() & ~POL_FRAG_DEFERRED) | (w->deferred ? POL_FRAG_DEFERRED : 0);
	bpf_map_update_elem(t, k, &w->frag_seen, BPF_ANY);
}

/* Whether the first fragment of w's datagram passed lately: allowed, or,
 * when deferred counts (from_container, to the stack), deferred. A later
 * fragment of a deferred datagram goes to the stack as its first did, and
 * the judgement after the stack passes it only if that judgement allowed
 * the first (which notes the datagram allowed): never on the deferral. */
static __noinline int pol_frag_known(struct pol_work *w, __u32 ifindex, int deferred_counts)
{
	struct pol_frag_key *k = pol_frag_key_of(w, ifindex);
	void *t = bpf_map_lookup_elem(&cni_pol_frag_parts, &k->ifindex);
	__u64 *seen = t ? bpf_map_lookup_elem(t, k) : NULL;

	if (!seen || ((*seen & POL_FRAG_DEFERRED) && !deferred_counts))
		return 0;
	return bpf_ktime_get_ns() - *seen < POL_FRAG_TIMEOUT;
}

/*
 * Whether no judgement after the stack's will come for the pod's packet in
 * w->f (arrived on its host veth, ifindex), so a denial cannot be deferred:
 *   - the stack delivers it to the node itself rather than forwarding it:
 *     broadcast (limited, or a node subnet's), multicast, IPv6 link-local,
 *     or any destination the node's routes call local (to_container and
 *     to_uplink see only what is forwarded);
 *   - the route leaves by a link no egress program of ours judges: not a
 *     pod's host veth (cni_links), an uplink or the tunnel device
 *     (cni_after_links), e.g. a WireGuard link or one without an address
 *     (fail closed). A route with a lightweight tunnel (the tunnel's
 *     "encap ip" routes) is not followed by bpf_fib_lookup
 *     (UNSUPP_LWT): deferred, for the tunnel device judges it; another
 *     device's encap route is not told apart (docs/networkpolicy.md).
 * The route is the one to the address the pod dialled: a Service address
 * the stack DNATs is judged wherever its translation leaves (the same
 * links). Only a new deferral asks (once per flow): one FIB lookup and
 * one or two hash lookups. Not inlined: policy_judge's frame.
 */
static __noinline int pol_unjudged_after(struct pol_work *w, struct __sk_buff *skb, __u32 ifindex)
{
	const struct flow *f = &w->f;
	struct bpf_fib_lookup *p = &w->fib;

	if (f->family == AF_INET) {
		__u8 d0 = f->daddr[0];

		if ((d0 & 0xf0) == 0xe0 || *(const __u32 *)f->daddr == 0xffffffff)
			return 1;
	} else if (f->daddr[0] == 0xff || is_link_local6((const struct in6_addr *)f->daddr)) {
		return 1;
	}
	__builtin_memset(p, 0, sizeof(*p));
	p->family = f->family;
	p->ifindex = ifindex;
	p->l4_protocol = f->proto;
	p->sport = f->sport;
	p->dport = f->dport;
	if (f->family == AF_INET) {
		p->ipv4_src = *(const __be32 *)f->saddr;
		p->ipv4_dst = *(const __be32 *)f->daddr;
	} else {
		__builtin_memcpy(p->ipv6_src, f->saddr, 16);
		__builtin_memcpy(p->ipv6_dst, f->daddr, 16);
	}
	int rc = bpf_fib_lookup(skb, p, sizeof(*p), 0);
	/* Not unicast (local, broadcast), or nothing is forwarded at all. */
	if (rc == BPF_FIB_LKUP_RET_NOT_FWDED || rc == BPF_FIB_LKUP_RET_FWD_DISABLED)
		return 1;
	/* Forwarded: p->ifindex is the link it leaves by (set before the
	 * neighbour lookup). Other results (no route, blackhole, UNSUPP_LWT)
	 * leave it the host veth's: the stack drops those or they go into
	 * the tunnel. */
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return 0;
	__u32 out = p->ifindex;
	return !bpf_map_lookup_elem(&cni_after_links, &out) && !bpf_map_lookup_elem(&cni_links, &out);
}

/* Whether some interface of the node has networkPolicy (POL_CFG_ON). */
static __always_inline int policy_on_node(void)
{
	__u32 zero = 0;
	struct pol_config *c = bpf_map_lookup_elem(&cni_pol_config, &zero);

	return c && (c->flags & POL_CFG_ON);
}

/*
 * Parses the packet (IP header at ETH_HLEN) into w->f: addresses, protocol,
 * ports (an ICMP echo's id: the requester's port, 0 the responder's), TCP
 * flags, and w->frag, w->frag_id for a fragment (IPv4, or an IPv6 fragment
 * header among the extension headers, which are walked to the transport
 * header). A later fragment has no ports (0): it passes if its first
 * fragment did (cni_pol_frag_parts). Returns POL_PKT_*.
 */
static __always_inline int pol_parse(struct __sk_buff *skb, __u8 family, struct pol_work *w)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct flow *f = &w->f;
	__u8 *h = w->h;
	int mcast6 = 0;

	w->frag = POL_FRAG_NONE;
	f->family = family;
	if (family == AF_INET) {
		struct iphdr *ip = data + ETH_HLEN;

		if ((void *)(ip + 1) > data_end || ip->ihl < 5)
			return POL_PKT_BAD;
		f->proto = ip->protocol;
		*(__be32 *)f->saddr = ip->saddr;
		*(__be32 *)f->daddr = ip->daddr;
		f->l4off = ETH_HLEN + ip->ihl * 4;
		if (ip->frag_off & bpf_htons(0x3fff)) { /* MF or an offset */
			w->frag_id = ip->id;
			w->frag = (ip->frag_off & bpf_htons(0x1fff)) ? POL_FRAG_LATER : POL_FRAG_FIRST;
			if (w->frag == POL_FRAG_LATER)
				return POL_PKT_FLOW;
		}
	} else {
		struct ipv6hdr *ip6 = data + ETH_HLEN;

		if ((void *)(ip6 + 1) > data_end)
			return POL_PKT_BAD;
		/* ICMPv6 to a multicast group (neighbour discovery, MLD) stays on
		 * the link; other multicast reaches the node's sockets and is
		 * judged. A link-local source does not make unicast link scope: a
		 * host on an uplink's link reaches a hostPort from one (the
		 * redirect skips the stack's scope check). */
		mcast6 = ip6->daddr.in6_u.u6_addr8[0] == 0xff;
		f->proto = ip6->nexthdr;
		__builtin_memcpy(f->saddr, &ip6->saddr, 16);
		__builtin_memcpy(f->daddr, &ip6->daddr, 16);
		f->l4off = ETH_HLEN + sizeof(*ip6);
		/* Extension headers: the transport header behind them is judged,
		 * never an extension header's number (a flow of "destination
		 * options" would let every such packet of the peer in). */
#pragma unroll
		for (int i = 0; i < POL_EXT_HEADERS; i++) {
			if (f->proto == IPPROTO_HOPOPTS || f->proto == IPPROTO_ROUTING || f->proto == IPPROTO_DSTOPTS) {
				if (bpf_skb_load_bytes(skb, f->l4off, h, 2))
					return POL_PKT_BAD;
				f->proto = h[0];
				f->l4off += ((__u32)h[1] + 1) * 8;
			} else if (f->proto == IPPROTO_FRAGMENT) {
				/* next header, reserved, offset (13 bits) and M, id */
				if (bpf_skb_load_bytes(skb, f->l4off, h, 8))
					return POL_PKT_BAD;
				f->proto = h[0];
				f->l4off += 8;
				w->frag_id = *(__u32 *)&h[4];
				if ((h[2] << 5) | (h[3] >> 3))
					w->frag = POL_FRAG_LATER;
				else if (h[3] & 1)
					w->frag = POL_FRAG_FIRST;
				/* else an atomic fragment: the whole datagram */
				if (w->frag == POL_FRAG_LATER)
					return POL_PKT_FLOW;
			} else {
				break;
			}
		}
		if (f->proto == IPPROTO_HOPOPTS || f->proto == IPPROTO_ROUTING || f->proto == IPPROTO_DSTOPTS ||
		    f->proto == IPPROTO_FRAGMENT)
			return POL_PKT_BAD; /* more than any pod needs: not left unread */
	}
	switch (f->proto) {
	case IPPROTO_TCP:
		if (bpf_skb_load_bytes(skb, f->l4off, h, 14))
			return POL_PKT_BAD;
		f->sport = *(__be16 *)&h[0];
		f->dport = *(__be16 *)&h[2];
		f->tcp_flags = h[13];
		f->syn_only = (h[13] & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
		return POL_PKT_FLOW;
	case IPPROTO_UDP:
	case IPPROTO_SCTP:
		if (bpf_skb_load_bytes(skb, f->l4off, h, 4))
			return POL_PKT_BAD;
		f->sport = *(__be16 *)&h[0];
		f->dport = *(__be16 *)&h[2];
		return POL_PKT_FLOW;
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6: {
		if (bpf_skb_load_bytes(skb, f->l4off, h, 8))
			return POL_PKT_BAD;
		int v4 = f->proto == IPPROTO_ICMP;
		if (v4 != (family == AF_INET))
			return POL_PKT_FLOW;
		if (!v4 && (mcast6 || (h[0] >= 133 && h[0] <= 136)))
			return POL_PKT_LOCAL; /* router and neighbour discovery, MLD */
		if (icmp_is_error(family, h[0]))
			return POL_PKT_ERROR;
		if (h[0] == (v4 ? ICMP_ECHO_T : ICMP6_ECHO_REQUEST))
			f->sport = *(__be16 *)&h[4];
		else if (h[0] == (v4 ? ICMP_ECHOREPLY_T : ICMP6_ECHO_REPLY))
			f->dport = *(__be16 *)&h[4];
		return POL_PKT_FLOW;
	}
	}
	return POL_PKT_FLOW;
}

/* The flow entry key of packet f for the pod behind ifindex, which sends
 * it (egress) or receives it. */
static __always_inline void pol_ct_key_of(struct pol_ct_key *k, __u32 ifindex, const struct flow *f, int egress)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->ifindex = ifindex;
	k->family = f->family;
	k->proto = f->proto;
	if (egress) {
		addr_copy(k->pod_addr, f->saddr, f->family);
		addr_copy(k->peer_addr, f->daddr, f->family);
		k->pod_port = f->sport;
		k->peer_port = f->dport;
	} else {
		addr_copy(k->pod_addr, f->daddr, f->family);
		addr_copy(k->peer_addr, f->saddr, f->family);
		k->pod_port = f->dport;
		k->peer_port = f->sport;
	}
}

/* The pod's table of the flows opened by opener (DIR_EGRESS: the pod,
 * DIR_INGRESS: its peers); NULL when it has none. */
static __always_inline void *pol_ct_table(struct pol_work *w, __u32 ifindex, __u32 opener)
{
	w->tk.ifindex = ifindex;
	w->tk.opener = opener;
	return bpf_map_lookup_elem(&cni_pol_ct_parts, &w->tk);
}

/*
 * The table pol_ct_find looks in first for flow k: the one its opener
 * likely is, so that most packets, either way, cost one table and one
 * entry lookup. The end with the lower port is taken for the server (a
 * client's port is ephemeral, 32768 and up; an echo's requester has the
 * id, its responder 0), so the other end opened it; equal ports: the
 * packet's direction. A wrong guess costs a miss, never a verdict: both
 * tables are looked at. Before, the packet's direction alone chose, and
 * every reply missed first (issue 23's request/response cost).
 */
static __always_inline __u32 pol_ct_first(const struct pol_ct_key *k, int egress)
{
	__u16 pod = bpf_ntohs(k->pod_port), peer = bpf_ntohs(k->peer_port);

	if (pod == peer)
		return egress ? DIR_EGRESS : DIR_INGRESS;
	return peer < pod ? DIR_EGRESS : DIR_INGRESS;
}

/*
 * The live entry of flow k in its pod's tables, NULL when none: first in
 * the table pol_ct_first guesses, then in the other. An entry expired at
 * w->now is as good as absent, and so is a closed one that a SYN meets
 * (expired by it) or a replied one (left as it is: w->kept). w->ct_opener names the table it was found in. Not inlined: policy_judge's frame (and this one has none: it takes
 * its time from w).
 */
static __noinline struct pol_ct_val *pol_ct_find(struct pol_work *w, const struct pol_ct_key *k, int egress)
{
	/* The table tried, kept in w rather than a register: this frame
	 * stays empty. */
	w->ct_opener = pol_ct_first(k, egress);
	w->kept = 0;

#pragma unroll
	for (__u32 i = 0; i < 2; i++) {
		if (i)
			w->ct_opener ^= 1;
		void *t = pol_ct_table(w, k->ifindex, w->ct_opener);
		if (!t)
			continue;
		struct pol_ct_val *ct = bpf_map_lookup_elem(t, k);
		if (!ct || flow_expired(ct->flags, k->proto, ct->seen_ns, w->now))
			continue;
		/* A SYN (w->f) on a closed flow's tuple opens a new connection:
		 * the closed entry expires now (the LRU reuses it) and the rules
		 * judge the SYN as a new flow, as conntrack kills a closed entry
		 * a SYN meets; else a new connection got in by it, whatever the
		 * rules now say. A store, not a delete: this frame stays empty
		 * (policy_judge's chain is at the verifier's limit). */
		if (w->f.syn_only && (ct->flags & FLOW_F_CLOSING)) {
			ct->seen_ns = 0;
			continue;
		}
		/* So is a SYN on a flow past its handshake (replied): its
		 * close may have gone unseen (reordered data before the RST or
		 * FIN: tcpseq.h moves only in order), and the SYN is a new
		 * connection the rules judge. The entry stays as it is when
		 * they allow it (w->kept): a forged SYN cuts no live flow, and
		 * a real new connection's SYN-ACK re-seeds its tracking. */
		if (w->f.syn_only && (ct->flags & FLOW_F_REPLIED)) {
			w->kept = 1;
			continue;
		}
		return ct;
	}
	return NULL;
}

/* A TCP flow's sequence tracking (tcpseq.h: a peer's RST must hit its
 * next sequence number to close the flow) lives in created_ns, which TCP
 * entries use for nothing else, and its bits at POL_CT_SEQ_BASE of flags
 * (where the pod's window scale is not read: tcp_seq_local). */
#define POL_CT_SEQ_BASE TSEQ_BASE_NOSCALE

/* Moves the tracking of v (its flags at *fl) with the packet in w: the
 * pod's segments (egress) give its window, the peer's its next sequence
 * number. Returns 0 for a peer's RST outside the pod's window: the pod's
 * TCP ignores it (RFC 5961), and so must the flow's state. */
static __always_inline int pol_ct_seq(struct __sk_buff *skb, struct pol_work *w, struct pol_ct_val *v, __u32 *fl)
{
	struct snat_seq *q = (struct snat_seq *)&v->created_ns;

	if (w->f.proto != IPPROTO_TCP)
		return 1;
	if (w->egress) {
		tcp_seq_local(skb, &w->f, q, fl, POL_CT_SEQ_BASE, &w->seg);
		return 1;
	}
	return tcp_seq_remote(skb, &w->f, q, fl, POL_CT_SEQ_BASE, &w->seg);
}

/* Records w->nv for flow w->k in the table of its opener (egress: the
 * pod). An expired entry of the flow in the other table stays until that
 * table's LRU reuses it: lookups skip it. No table: not recorded, so the
 * flow's replies are judged by the rules (closed, never open). Not
 * inlined, as those below: policy_judge's frame. */
static __noinline void pol_ct_record(struct __sk_buff *skb, struct pol_work *w, __u32 ifindex, int egress)
{
	void *t = pol_ct_table(w, ifindex, egress ? DIR_EGRESS : DIR_INGRESS);

	if (!t)
		return;
	pol_ct_seq(skb, w, &w->nv, &w->nv.flags); /* a SYN starts the tracking */
	bpf_map_update_elem(t, &w->k, &w->nv, BPF_ANY);
}

/* Deletes flow w->k from the table pol_ct_find found it in. */
static __noinline void pol_ct_forget(struct pol_work *w, __u32 ifindex)
{
	void *t = pol_ct_table(w, ifindex, w->ct_opener);

	if (t)
		bpf_map_delete_elem(t, &w->k);
}

/*
 * The judgement after the stack allowed and recorded the pod's new flow:
 * if the stack DNATed it (a Service), the flow's entry as the pod sent it
 * (ORIGINAL tuple) is the deferred one its replies meet, the stack
 * translating them back: confirmed, it now lets them in. Once per flow:
 * the conntrack read and a flow lookup. Reads what policy_judge left in
 * its scratch (w->f, w->ifindex) and clobbers w->k (recorded already).
 * Called by policy_judge_after, not policy_judge: from_container's stack
 * has no room for one more frame under policy_judge's.
 */
static __noinline void pol_confirm_deferred(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct pol_work *w = bpf_map_lookup_elem(&cni_pol_scratch, &zero);
	if (!w || !w->egress)
		return;
	struct nfct_orig *o = &w->no;
	struct pol_ct_key *k = &w->k;
	__u32 ifindex = w->ifindex;

	if (!nfct_dnat_original(skb, o))
		return;
	__builtin_memset(k, 0, sizeof(*k));
	k->ifindex = ifindex;
	k->family = w->f.family;
	k->proto = w->f.proto;
	addr_copy(k->pod_addr, o->saddr, w->f.family);
	addr_copy(k->peer_addr, o->daddr, w->f.family);
	k->pod_port = o->sport;
	/* ICMP echo: the id is the source's (pol_ct_key_of); dst is type and code. */
	if (k->proto != IPPROTO_ICMP && k->proto != IPPROTO_ICMPV6)
		k->peer_port = o->dport;
	struct pol_ct_val *ct = pol_ct_find(w, k, 1);
	if (ct && (ct->flags & POL_CT_F_PENDING))
		ct->flags &= ~POL_CT_F_PENDING;
}

/* Packet w->f (reply: it goes the way the flow's replies go) of the allowed
 * flow ct: its state and time, kept at most once a second but at each
 * change. The peer's TCP segments move the sequence tracking each time
 * (an RST it does not admit changes nothing), the pod's when the entry is
 * written anyway. Not inlined: policy_judge's frame. */
static __noinline void pol_ct_note(struct __sk_buff *skb, struct pol_work *w, struct pol_ct_val *ct, int reply)
{
	__u32 n = flow_next(ct->flags, &w->f, reply, ct->created_ns, w->now);

	if (w->egress) {
		/* The pod's SYN or SYN-ACK always reaches the tracking: it
		 * re-seeds a tuple reused with a new ISN (tcpseq.h). */
		if (n == ct->flags && w->now - ct->seen_ns <= NSEC && !(w->f.tcp_flags & TCP_FLAG_SYN))
			return;
		ct->flags = n;
		ct->seen_ns = w->now;
	}
	/* One call site (its frame is at the verifier's limit under
	 * from_container): the pod's segment, or the peer's first. */
	if (!pol_ct_seq(skb, w, ct, &ct->flags) || w->egress)
		return;
	n = flow_next(ct->flags, &w->f, reply, ct->created_ns, w->now);
	if (n != ct->flags || w->now - ct->seen_ns > NSEC) {
		ct->flags = n;
		ct->seen_ns = w->now;
	}
}

/* Whether the rule set allows peer (destination for egress, source for
 * ingress) with f's protocol and destination port. */
static __noinline int pol_rules_allow(struct pol_work *w, __u32 set, int egress)
{
	const struct flow *f = &w->f;
	struct pol_addr_key *ak = &w->ak;
	struct pol_port_key *pk = &w->pk;

	if (!set)
		return 0;
	__builtin_memset(ak, 0, sizeof(*ak));
	ak->prefixlen = 64 + (f->family == AF_INET ? 32 : 128);
	ak->set = set;
	ak->family = f->family;
	addr_copy(ak->addr, egress ? f->daddr : w->snat == POL_SNAT_PEER ? w->nf.addr : f->saddr, f->family);
	struct pol_addr_val *av = bpf_map_lookup_elem(&cni_pol_addrs, ak);
	if (!av)
		return 0;
	if (av->flags & POL_F_ALL_PORTS)
		return 1;
	if (!av->ports || (f->proto != IPPROTO_TCP && f->proto != IPPROTO_UDP && f->proto != IPPROTO_SCTP))
		return 0;
	__builtin_memset(pk, 0, sizeof(*pk));
	pk->prefixlen = 64;
	pk->set = av->ports;
	pk->proto = f->proto;
	pk->port = f->dport;
	return bpf_map_lookup_elem(&cni_pol_ports, pk) != NULL;
}

/*
 * A reply meeting the pending entry of the pod behind w->ifindex (its
 * packet in w, the entry w->k) that a socket of the node sent (skb->sk;
 * a forwarded packet has none, nor does one the node sends for no socket):
 * the answer of a request the stack DNATed to an address of the node
 * (a hostNetwork backend of a Service) and delivered there, where no
 * judgement after the stack runs to confirm the entry. Judged now, as
 * from_container judges a pod's packet to a node address: the pod's
 * egress toward the address and port the stack delivered the request to
 * (the conntrack entry's REPLY source, whose port is the socket's: its
 * address may be a wildcard), with the flow's protocol. Returns whether
 * that egress is allowed (policy_judge then confirms the entry). Once per
 * pending flow a node socket answers: the conntrack read, a state lookup,
 * the rules.
 * Leaves w->f as it found it. Not inlined: policy_judge's frame.
 */
static __noinline int pol_pending_local(struct __sk_buff *skb, struct pol_work *w)
{
	struct flow *f = &w->f;
	struct nfct_orig *o = &w->no;
	struct bpf_sock *sk = skb->sk;

	if (!sk || !nfct_dnat_reply(skb, o))
		return 0;
	/* The socket answers from the port the request was delivered to. */
	if ((f->proto == IPPROTO_TCP || f->proto == IPPROTO_UDP) && sk->src_port != bpf_ntohs(o->dport))
		return 0;
	struct pol_state *st = bpf_map_lookup_elem(&cni_pol_state, &w->ifindex);
	if (!st || st->mode[DIR_EGRESS] == POL_PENDING)
		return 0;
	if (st->mode[DIR_EGRESS] == POL_OPEN)
		return 1;
	__u32 set = st->rules[DIR_EGRESS];
	addr_copy(f->daddr, o->daddr, f->family);
	/* ICMP echo: the requester's packet has no destination port (pol_parse). */
	f->dport = f->proto == IPPROTO_ICMP || f->proto == IPPROTO_ICMPV6 ? 0 : o->dport;
	int allow = pol_rules_allow(w, set, 1);
	addr_copy(f->daddr, w->k.pod_addr, f->family);
	f->dport = w->k.pod_port;
	return allow;
}

/*
 * The peer's packet of a masqueraded flow (POL_CT_F_SNAT), allowed again:
 * its entry's state and time kept as any flow's packet keeps them (the
 * entry is looked up again: policy_judge's frame has no room to keep it).
 * A new flow has no entry yet: policy_judge records it.
 */
static __noinline void pol_ct_keep(struct pol_work *w)
{
	void *t = pol_ct_table(w, w->k.ifindex, DIR_INGRESS);
	struct pol_ct_val *ct = t ? bpf_map_lookup_elem(t, &w->k) : NULL;

	if (!ct || !(ct->flags & POL_CT_F_SNAT))
		return;
	__u32 n = flow_next(ct->flags, &w->f, 0, ct->created_ns, w->now);
	if (n != ct->flags || w->now - ct->seen_ns > NSEC) {
		ct->flags = n;
		ct->seen_ns = w->now;
	}
}

/* pol_fwd: the sender before the stack's SNAT claims an address of the
 * node or of a local pod it cannot have come in with: denied. */
#define POL_FWD_FORGED (-2)

/*
 * A packet the stack forwarded (POL_J_FWD) to or from the pod behind
 * w->ifindex that found no flow of the pod: whether the stack translated
 * its source (lib/nfct.h). Ingress: the source before that is the peer the
 * rules judge (w->snat), not the node address the packet now carries;
 * returns whether that peer is the node (else node_peer, unchanged), or
 * POL_FWD_FORGED.
 * Egress: returns -1 unless the packet is the pod's own (its source before
 * the SNAT is an address of the pod's): a reply the stack translated back
 * was judged when it left the pod. Not inlined: policy_judge's frame.
 */
static __noinline int pol_fwd(struct __sk_buff *skb, struct pol_work *w, int node_peer)
{
	int snat = nfct_snat_source(skb, &w->nf);

	if (!w->egress) {
		if (!snat)
			return node_peer;
		w->snat = POL_SNAT_PEER;
		/* The sender before the SNAT came in by the packet's ingress
		 * interface too: a node's or a local pod's address is forged
		 * unless that is ours (pol_node_link) or the pod's host veth
		 * (to_container checks the packet's own source alike). */
		if (pol_is_node(w, w->nf.addr, w->f.family))
			return pol_node_link(skb, w, POL_J_FWD) ? 1 : POL_FWD_FORGED;
		struct ep_info *ep = bpf_map_lookup_elem(&cni_endpoints, &w->nk);
		return ep && ep->ifindex != skb->ingress_ifindex ? POL_FWD_FORGED : 0;
	}
	if (!snat)
		return -1;
	__builtin_memset(&w->nk, 0, sizeof(w->nk));
	w->nk.family = w->f.family;
	addr_copy(w->nk.addr, w->nf.addr, w->f.family);
	struct ep_info *ep = bpf_map_lookup_elem(&cni_endpoints, &w->nk);
	return ep && ep->ifindex == w->ifindex ? node_peer : -1;
}

/*
 * Whether the rules of set (or being the node's) allow the packet in w, the
 * flow being new to the pod. Forwarded (POL_J_FWD): the stack may have
 * masqueraded it (kube-proxy), so its source hides the sender; the rules
 * judge the real sender (pol_fwd), while the flow is keyed as the packet
 * is (its replies come back that way). A packet pol_fwd leaves alone is
 * allowed (w->snat POL_SNAT_NOT_OURS: no flow recorded). Not inlined:
 * policy_judge's frame.
 */
static __noinline int pol_allows(struct __sk_buff *skb, struct pol_work *w, __u32 set, int node_peer)
{
	if (w->fwd & POL_J_FWD) {
		node_peer = pol_fwd(skb, w, node_peer);
		if (node_peer == POL_FWD_FORGED)
			return 0;
		if (node_peer < 0) {
			w->snat = POL_SNAT_NOT_OURS;
			return 1;
		}
	}
	int allow = node_peer || pol_rules_allow(w, set, w->egress);
	if (allow && w->snat == POL_SNAT_PEER)
		pol_ct_keep(w);
	return allow;
}

/* Whether an ICMP error is about a flow of the pod: the quote is a packet
 * the pod sent (the error enters it) or received (the pod sends the error). */
static __noinline int pol_error_related(struct __sk_buff *skb, struct pol_work *w)
{
	__u8 family = w->f.family;
	struct flow *q = &w->q;
	__u32 off = w->f.l4off + 8; /* the quoted IP header */
	__u8 *h = w->h;

	/* Read field by field into the scratch: the stack has no room for a
	 * header copy (icmp_err_parse's). */
	__builtin_memset(q, 0, sizeof(*q));
	q->family = family;
	if (family == AF_INET) {
		if (bpf_skb_load_bytes(skb, off, h, 10))
			return 0;
		__u32 ihl = (h[0] & 0xf) * 4;
		if ((h[0] >> 4) != 4 || ihl < 20 || ((h[6] & 0x1f) | h[7]))
			return 0; /* a later fragment quoted: no ports */
		q->proto = h[9];
		if (bpf_skb_load_bytes(skb, off + 12, q->saddr, 4) || bpf_skb_load_bytes(skb, off + 16, q->daddr, 4))
			return 0;
		off += ihl;
	} else {
		if (bpf_skb_load_bytes(skb, off + 6, &q->proto, 1) || bpf_skb_load_bytes(skb, off + 8, q->saddr, 16) ||
		    bpf_skb_load_bytes(skb, off + 24, q->daddr, 16))
			return 0;
		/* The quote's extension headers (the pod's own datagrams carry
		 * them, pol_parse judged them behind): the flow is the L4
		 * header's, as icmp_err_parse walks it (with the scratch: no
		 * room in the frame). A later fragment has no ports. */
		long c = ip6_ext_chain_in(skb, q->proto, off + 40, NULL, h);
		if (c < 0 || IP6X_FRAG(c) == FLOW_FRAG_LATER)
			return 0;
		q->proto = IP6X_PROTO(c);
		off = IP6X_L4OFF(c);
	}
	/* An error goes back to the sender of the packet it quotes (so does
	 * Linux conntrack's check of a related error): one to anyone else
	 * would let a pod send a denied peer whatever it appends. */
	if (!addr_equal(w->f.daddr, q->saddr, family))
		return 0;
	if (bpf_skb_load_bytes(skb, off, h, 8))
		return 0;
	if (q->proto == IPPROTO_TCP || q->proto == IPPROTO_UDP || q->proto == IPPROTO_SCTP) {
		q->sport = *(__be16 *)&h[0];
		q->dport = *(__be16 *)&h[2];
	} else if (q->proto == IPPROTO_ICMP || q->proto == IPPROTO_ICMPV6) {
		int v4 = q->proto == IPPROTO_ICMP;
		if (h[0] == (v4 ? ICMP_ECHO_T : ICMP6_ECHO_REQUEST))
			q->sport = *(__be16 *)&h[4];
		else if (h[0] == (v4 ? ICMP_ECHOREPLY_T : ICMP6_ECHO_REPLY))
			q->dport = *(__be16 *)&h[4];
	}
	pol_ct_key_of(&w->ek, w->ifindex, q, !w->egress);
	w->now = bpf_ktime_get_ns();
	struct pol_ct_val *ct = pol_ct_find(w, &w->ek, !w->egress);
	/* Nor about a deferred flow not confirmed yet (policy_judge). */
	return ct && !(ct->flags & POL_CT_F_PENDING);
}


/*
 * Judges the packet (IP header at ETH_HLEN) for the pod behind ifindex, in
 * the direction and way how says (POL_J_*). Returns POL_ALLOW or POL_DENY;
 * an allowed flow is recorded, even with both directions open, so its
 * replies pass, also once a policy isolates the pod. A global function: the verifier checks it once, not at
 * each call site in each state (static, it took from_container from 41k
 * to 182k processed instructions and its load from 0.3 to 1.6 s, which
 * widened the window of a layout migration: TestUpgradeFromLayout1); and
 * the callers' own code keeps its registers.
 */
__noinline int policy_judge(struct __sk_buff *skb, __u8 family, __u32 ifindex, __u32 how)
{
	/* No state: pending (fail closed). */
	struct pol_state *st = bpf_map_lookup_elem(&cni_pol_state, &ifindex);
	int egress = !!(how & POL_J_EGRESS);
	__u8 mode = POL_PENDING;
	__u32 set = 0;

	if (st) {
		mode = egress ? st->mode[DIR_EGRESS] : st->mode[DIR_INGRESS];
		set = egress ? st->rules[DIR_EGRESS] : st->rules[DIR_INGRESS];
	}

	/* A pod open both ways records its flows too: a policy that isolates
	 * it later must not cut them (replies pass by their entry). */
	/* A masqueraded packet of a pod whose egress is open (policy_after_snat):
	 * nothing to judge, and its flow is recorded where it left the pod. */
	if ((how & POL_J_FWD) && egress && mode == POL_OPEN)
		return POL_ALLOW;

	__u32 zero = 0;
	struct pol_work *w = bpf_map_lookup_elem(&cni_pol_scratch, &zero);
	if (!w)
		return POL_DENY;
	struct flow *f = &w->f;
	__builtin_memset(f, 0, sizeof(*f));
	w->snat = POL_SNAT_NONE;
	w->ifindex = ifindex;
	w->egress = egress;
	w->fwd = how & (POL_J_FWD | POL_J_AFTER);
	w->deferred = 0;
	w->recorded = 0;
	int kind = pol_parse(skb, family, w);
	if (kind == POL_PKT_LOCAL)
		return POL_ALLOW;
	if (kind == POL_PKT_BAD)
		return mode == POL_OPEN ? POL_ALLOW : POL_DENY;
	if (w->frag == POL_FRAG_LATER)
		return mode == POL_OPEN || pol_frag_known(w, ifindex, how & POL_J_DEFER) ? POL_ALLOW : POL_DENY;
	if (kind == POL_PKT_ERROR) {
		if (mode == POL_OPEN || pol_peer_is_node(skb, w, family, how) || pol_error_related(skb, w))
			goto allow;
		/* Not about a flow of the pod: an ICMP packet like any other. */
	}

	struct pol_ct_key *k = &w->k;
	__u64 now = bpf_ktime_get_ns();
	w->now = now;
	pol_ct_key_of(k, ifindex, f, egress);
	struct pol_ct_val *ct = pol_ct_find(w, k, egress);
	if (ct) {
		int reply = !(ct->flags & POL_CT_F_EGRESS) != !egress;

		if (reply || !(ct->flags & (POL_CT_F_DEFER | POL_CT_F_SNAT))) {
			/* A reply of a deferred flow the judgement after the
			 * stack has not confirmed (it may never come: the stack
			 * dropped the packet, or delivered it where no program
			 * judges): nothing enters by it. Only a deferral sets the
			 * bit, so the pod's own packets never meet this. */
			if (ct->flags & POL_CT_F_PENDING) {
				/* Unless a node socket answers: the stack delivered
				 * the request to the node (pol_pending_local); or the
				 * pod's egress, which deferred it, is open now (a policy
				 * change since): the flow is allowed. Its state read
				 * again here, on this rare path, rather than kept live
				 * across the calls above (the stack's limit). */
				struct pol_state *cur = bpf_map_lookup_elem(&cni_pol_state, &w->ifindex);

				if (!(cur && cur->mode[DIR_EGRESS] == POL_OPEN) &&
				    (!(how & POL_J_NODE) || !pol_pending_local(skb, w)))
					return POL_DENY;
				ct->flags &= ~POL_CT_F_PENDING;
			}
			pol_ct_note(skb, w, ct, reply);
			/* A known translated flow of a packet deferred to a
			 * pending entry: confirm it too (pending_hint). */
			if ((w->fwd & POL_J_AFTER) && w->pending_hint == ifindex) {
				w->pending_hint = 0;
				w->recorded = POL_J_AFTER;
			}
			goto allow;
		}
		/* The pod's own packet of a deferred flow, or the peer's of a
		 * masqueraded one: judged each time. A masqueraded flow's entry is
		 * keyed by the node address and port the SNAT chose, which outlive
		 * the peer (DEL's scrub of its addresses cannot find the entry) and
		 * which another sender gets once the conntrack entry is gone: the
		 * entry alone proves nothing about who sends now. */
	}
	int allow = mode == POL_OPEN || pol_allows(skb, w, set, pol_peer_is_node(skb, w, family, how));
	if (allow && w->kept)
		goto allow; /* a SYN the rules allow on a live flow: the entry stays */
	__u32 flags = egress ? POL_CT_F_EGRESS : 0;
	if (!allow) {
		if (how & POL_J_AFTER) {
			/* Untranslated after all: its deferred entry lets nothing in. */
			if (ct && (ct->flags & POL_CT_F_DEFER))
				pol_ct_forget(w, ifindex);
			return POL_DENY;
		}
		/* To the node itself nothing translates it: judged now. */
		if (!(how & POL_J_DEFER) || pol_is_node(w, f->daddr, family))
			return POL_DENY;
		if (ct) {
			w->deferred = 1;
			if (ct->flags & POL_CT_F_PENDING)
				w->pending_hint = ifindex;
			goto allow; /* deferred already */
		}
		if (pol_unjudged_after(w, skb, ifindex))
			return POL_DENY;
		flags |= POL_CT_F_DEFER | POL_CT_F_DEFER_NEW;
		if (POL_CT_F_DEFER_NEW)
			w->pending_hint = ifindex;
		w->deferred = 1;
	}
	if (kind == POL_PKT_ERROR || w->snat == POL_SNAT_NOT_OURS || (ct && (ct->flags & POL_CT_F_SNAT)))
		goto allow; /* errors open no flow, nor what pol_fwd leaves alone; a masqueraded flow's stays */
	struct pol_ct_val *nv = &w->nv;
	nv->flags = flags | flow_next(0, f, 0, now, now) | (w->snat == POL_SNAT_PEER ? POL_CT_F_SNAT : 0);
	nv->pad = 0;
	nv->created_ns = now;
	nv->seen_ns = now;
	pol_ct_record(skb, w, ifindex, egress);
	w->recorded = w->fwd & POL_J_AFTER;
allow:
	if (w->frag == POL_FRAG_FIRST)
		pol_frag_note(w, ifindex);
	return w->recorded ? POL_ALLOW_NEW : POL_ALLOW;
}

/* policy_judge after the stack's translation (POL_J_AFTER): a new flow it
 * allowed, or a known one of a packet from_container deferred to a pending
 * entry (pol_work.pending_hint), confirms the deferred entry of
 * the flow as the pod sent it (pol_confirm_deferred). POL_ALLOW or
 * POL_DENY. */
static __always_inline int policy_judge_after(struct __sk_buff *skb, __u8 family, __u32 from, __u32 how)
{
	int v = policy_judge(skb, family, from, how | POL_J_AFTER);

	if (v == POL_ALLOW_NEW) {
		pol_confirm_deferred(skb);
		v = POL_ALLOW;
	}
	return v;
}

/* The verdict on a packet entering the pod behind ifindex, delivered
 * straight into it (redirect_to_endpoint): only pods with EP_F_POLICY. */
static __always_inline int policy_ingress_redirect(struct __sk_buff *skb, __u32 ifindex)
{
	__u8 family = skb->protocol == bpf_htons(ETH_P_IPV6) ? AF_INET6 : AF_INET;

	return policy_judge(skb, family, ifindex, POL_J_WIRE);
}

/* The verdict on a packet the pod behind ifindex sends (from_container.c),
 * as it sent it. dst_is_pod: a pod of this node, which it is redirected to;
 * anything else goes to the stack, which may translate it (see above). */
static __always_inline int policy_egress(struct __sk_buff *skb, __u8 family, __u32 ifindex, int dst_is_pod)
{
	return policy_judge(skb, family, ifindex, POL_J_EGRESS | (!dst_is_pod && node_hooks_enabled() ? POL_J_DEFER : 0));
}

/*
 * A packet the stack forwarded from the host veth from whose source is no
 * pod's: kube-proxy's masquerade (or any SNAT at POSTROUTING) may have
 * replaced the pod's. If from is a pod's with policy, policy_judge reads the
 * packet's conntrack entry and judges the pod's egress if the packet is the
 * pod's own (not a reply the stack translated back). Costs a link lookup,
 * and for a pod whose egress is isolated the state and flow lookups, and
 * for a packet of no flow the conntrack read.
 */
static __always_inline int policy_after_snat(struct __sk_buff *skb, __u8 family, __u32 from)
{
	struct link_info *li = bpf_map_lookup_elem(&cni_links, &from);

	if (!li || !(li->flags & EP_F_POLICY))
		return POL_ALLOW;
	return policy_judge_after(skb, family, from, POL_J_EGRESS | POL_J_FWD);
}

/* The endpoint whose address the packet's source is (NULL: no pod of
 * this node's). */
static __always_inline struct ep_info *policy_source_ep(struct __sk_buff *skb, __u8 family)
{
	struct ep_key k = { .family = family };

	if (family == AF_INET) {
		struct iphdr *ip = pkt_ip4(skb);

		if (!ip)
			return NULL;
		*(__be32 *)k.addr = ip->saddr;
	} else {
		struct ipv6hdr *ip6 = pkt_ip6(skb);

		if (!ip6)
			return NULL;
		__builtin_memcpy(k.addr, &ip6->saddr, 16);
	}
	return bpf_map_lookup_elem(&cni_endpoints, &k);
}

/*
 * A packet the stack forwards from a pod's host veth (from, its ingress
 * interface), seen on its way out (to_container.c, tunnel.c), after the
 * stack's translation: the sender's egress, when the source is still the
 * pod's (a reply the stack translated back, or masqueraded, was judged
 * before). src: policy_source_ep's. Returns the verdict; POL_ALLOW for
 * pods without policy.
 */
static __always_inline int policy_after_stack_src(struct __sk_buff *skb, __u8 family, __u32 from,
						  const struct ep_info *src)
{
	if (!src)
		return policy_after_snat(skb, family, from);
	if (src->ifindex != from || !(src->flags & EP_F_POLICY))
		return POL_ALLOW;
	return policy_judge_after(skb, family, from, POL_J_EGRESS);
}

static __always_inline int policy_after_stack(struct __sk_buff *skb, __u8 family, __u32 from)
{
	return policy_after_stack_src(skb, family, from, policy_source_ep(skb, family));
}
