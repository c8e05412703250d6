//go:build ignore

/*
 * Attached to tcx ingress of the node's uplinks (links holding node
 * addresses; see pkg/datapath/nodehooks.go): traffic from other hosts.
 *
 *   - A reply of a masqueraded flow gets its destination set back to the pod
 *     and goes on to the stack, which delivers it (lib/masq.h).
 *   - An ICMP error about a masqueraded flow likewise; one about a pod's
 *     hostPort reply goes straight into the pod (lib/hostport.h).
 *   - A packet to a node address (or a mapping's hostIP) : hostPort is DNATed
 *     to the pod, its flow recorded in cni_ct for the replies (from_container.c
 *     translates those back), and delivered straight into the pod with
 *     bpf_redirect_peer (lib/hostport.h).
 *
 * A packet for the stack claiming a node address as its source is dropped
 * on nodes with networkPolicy (forged_node_source; a hostPort's is judged
 * by the pod's policy, which knows it came off the wire), and so is any
 * packet claiming the address of a pod of this node (forged_pod_source).
 *
 * A tunnel datagram claiming a node's address as its outer source from a
 * MAC that is not the next hop toward that node is dropped first
 * (drop_tunnel_mac, counted on the uplink; lib/tunnel.h); a genuine one
 * goes on to the stack untouched (a hostPort on the tunnel port never
 * takes it).
 * In tunnel mode, any other packet claiming a pod address of a node
 * reached through the tunnel is dropped next (drop_tunnel_source): those
 * pods' packets arrive only decapsulated. Except to an address of this node
 * that no hostPort maps: the previous build's nodes send those in the
 * clear, and they reach no pod (lib/tunnel.h).
 *
 * Everything else goes on untouched to the next tcx program of the link (the
 * stack when there is none): TCX_NEXT, never TC_ACT_OK, which would end the
 * chain for another tool's programs.
 */
#define CNI_PROG EV_PROG_FROM_UPLINK
#include "lib/masq.h"
#include "lib/tunnel.h"

/*
 * Whether a packet off the wire claims a node address as its source: the
 * node's own traffic to a pod passes its NetworkPolicy (lib/policy.h), and
 * IPv6 has no martian-source check that would drop such a packet before it
 * is forwarded to the pod (IPv4's, unless accept_local, does). Called only
 * on nodes with networkPolicy, whose pods take a node source for the node.
 */
static __noinline int forged_node_source(struct __sk_buff *skb, __u8 family)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	if (family == AF_INET) {
		struct iphdr *ip = data + ETH_HLEN;

		return (void *)(ip + 1) <= data_end && is_node_ip(&ip->saddr, AF_INET);
	}
	struct ipv6hdr *ip6 = data + ETH_HLEN;

	return (void *)(ip6 + 1) <= data_end && is_node_ip(&ip6->saddr, AF_INET6);
}

/*
 * Whether a packet off the wire claims the address of a pod of this node, or
 * any address of this node's own pod CIDRs (cni_self_cidrs), as its
 * source: only the pod's host veth brings that, and the pod's peers'
 * NetworkPolicy trusts it (a hostPort's DNAT redirects straight into the
 * pod, and IPv6 has no reverse-path filter, IPv4's is loose or off). Called
 * only on nodes with networkPolicy; before anything else, so neither the
 * hostPort redirect nor the stack sees such a packet.
 */
static __noinline int forged_pod_source(struct __sk_buff *skb, __u8 family)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct cidr_key k = { .prefixlen = family == AF_INET ? 64 : 160, .family = family };

	if (family == AF_INET) {
		struct iphdr *ip = data + ETH_HLEN;

		if ((void *)(ip + 1) > data_end)
			return 0;
		if (ep_lookup4(ip->saddr) != NULL)
			return 1;
		addr_copy(k.addr, &ip->saddr, AF_INET);
	} else {
		struct ipv6hdr *ip6 = data + ETH_HLEN;

		if ((void *)(ip6 + 1) > data_end)
			return 0;
		if (ep_lookup6(&ip6->saddr) != NULL)
			return 1;
		addr_copy(k.addr, &ip6->saddr, AF_INET6);
	}
	/* An address of this node's own pod CIDRs IPAM has not handed out
	 * (cni_self_cidrs, which only the agent fills). */
	return bpf_map_lookup_elem(&cni_self_cidrs, &k) != NULL;
}

/*
 * Whether a packet to a node address maps to a hostPort (which from_uplink
 * would translate and deliver into the pod): a tunnelled node's pod source
 * in the clear must not reach a pod that way either (tun_clear_peer_source).
 * Only such packets are looked up.
 */
static __noinline int clear_source_to_hostport(struct __sk_buff *skb, __u8 family)
{
	struct flow f = {};

	if (flow_parse(skb, family, &f, 0) || (f.proto != IPPROTO_TCP && f.proto != IPPROTO_UDP))
		return 0;
	return hostport_lookup(f.daddr, family, f.proto, f.dport, 0) != NULL;
}

static __always_inline int from_uplink(struct __sk_buff *skb, __u8 family)
{
	struct flow f = {};
	__u8 proto, ttl;
	int rc;
	/* Parsed once for both features (issue 30): with echo replies, which
	 * only the masquerade has; hostPort maps TCP and UDP alone. */
	int parsed = !flow_parse(skb, family, &f, FLOW_ECHO_REPLY);

	/* Replies of masqueraded flows first: their ports were allocated
	 * around the node's hostPorts. Over IPv6 also behind extension
	 * headers, which a peer's reply may carry (a destination options
	 * header): untranslated, it would go to the node's stack. ext: f holds
	 * such a whole datagram, walked once for both features. */
	int ext = !parsed && family == AF_INET6 && !flow_parse6_ext(skb, &f, FLOW_ECHO_REPLY);
	if (parsed || ext) {
		rc = masq_reverse(skb, &f, family);
		if (rc != MASQ_CONTINUE)
			return rc;
	}

	if (family == AF_INET) {
		struct iphdr *ip = pkt_ip4(skb);

		if (!ip)
			return TCX_NEXT;
		proto = ip->protocol;
		ttl = ip->ttl;
	} else {
		struct ipv6hdr *ip6 = pkt_ip6(skb);

		if (!ip6)
			return TCX_NEXT;
		proto = ip6->nexthdr;
		ttl = ip6->hop_limit;
	}
	if (proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6) {
		struct icmp_err e = {};

		if (icmp_err_parse(skb, family, &e))
			return TCX_NEXT;
		rc = masq_icmp_error_in(skb, &e);
		if (rc != MASQ_CONTINUE)
			return rc;
		/* TTL 1: not ours to forward; the stack answers. */
		if (ttl <= 1)
			return TCX_NEXT;
		rc = hostport_icmp_error_in(skb, &e);
		return rc == HP_CONTINUE ? TCX_NEXT : rc;
	}
	if (ttl <= 1)
		return TCX_NEXT;
	/* A fragment of a hostPort's UDP datagram (lib/hostport.h); a whole one
	 * behind IPv6 extension headers is in f already (ext: hostPort takes
	 * UDP alone there, as hp_frag_flow does). */
	long frag_id = 0;
	if (ext && f.proto != IPPROTO_UDP)
		return TCX_NEXT;
	if (!parsed && !ext && (frag_id = hp_frag_flow(skb, family, &f)) < 0)
		return TCX_NEXT;
	if (f.proto != IPPROTO_TCP && f.proto != IPPROTO_UDP)
		return TCX_NEXT;
	return hostport_from_uplink(skb, &f, frag_id);
}

/* A forged source off the wire: counted on the uplink (cni_stats keyed by
 * its ifindex, no pod's), with an event, as the tunnel's drops are. */
#define forged_drop() drop_dir(skb->ifindex, DIR_INGRESS, REASON_DROP_SPOOF_IP)

SEC("tc")
int cni_from_uplink(struct __sk_buff *skb)
{
	int rc;

	/* Before anything else, hooks or not: the tunnel's outer source,
	 * which the trust rule on the tunnel device cannot see; a genuine
	 * node's datagram goes to the stack untouched (lib/tunnel.h). Only
	 * UDP can be one (tun_dgram): TCP, the bulk, skips the call; a header
	 * out of the linear data does not. */
	rc = TUN_HOP_NONE;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = pkt_ip4(skb);

		if (!ip || ip->protocol == IPPROTO_UDP)
			rc = tun_hop_check(skb, AF_INET);
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = pkt_ip6(skb);

		if (!ip6 || ip6->nexthdr != IPPROTO_TCP)
			rc = tun_hop_check(skb, AF_INET6);
	}
	if (rc == TUN_HOP_BAD) {
		count(skb->ifindex, DIR_INGRESS, REASON_DROP_TUN_MAC, skb->len);
		return TC_ACT_SHOT;
	}
	if (rc == TUN_HOP_OK)
		return TCX_NEXT;
	/* One read of the node config for the tunnel and the hooks. */
	struct hp_config *c = node_config();
	__u32 flags = c ? c->flags : 0;

	/* A tunnelled node's pod source in the clear (lib/tunnel.h): to a
	 * node address of this node with no hostPort, on to the stack as the
	 * host's own traffic (nothing below applies to it); else dropped. */
	if (flags & HP_CFG_TUNNEL) {
		__u8 fam = skb->protocol == bpf_htons(ETH_P_IP) ? AF_INET :
			   skb->protocol == bpf_htons(ETH_P_IPV6) ? AF_INET6 : 0;

		rc = tun_clear_peer_source(skb, fam); /* TUN_CLEAR_NONE for neither */
		if (rc == TUN_CLEAR_NODE && !((flags & HP_CFG_ENABLED) && clear_source_to_hostport(skb, fam)))
			return TCX_NEXT;
		if (rc != TUN_CLEAR_NONE)
			return drop_dir(skb->ifindex, DIR_INGRESS, REASON_DROP_TUN_SRC);
	}
	if (!(flags & HP_CFG_ENABLED))
		return TCX_NEXT;
	/* A forged node source going on to the stack is dropped like the
	 * kernel's IPv4 martians. Constant families: each call inlines one
	 * family's code. The policy switch is read once: a node without
	 * networkPolicy calls neither check (issue 30). */
	int pol = policy_on_node();

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		if (pol && forged_pod_source(skb, AF_INET))
			return forged_drop();
		rc = from_uplink(skb, AF_INET);
		return rc == TCX_NEXT && pol && forged_node_source(skb, AF_INET) ? forged_drop() : rc;
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		if (pol && forged_pod_source(skb, AF_INET6))
			return forged_drop();
		rc = from_uplink(skb, AF_INET6);
		return rc == TCX_NEXT && pol && forged_node_source(skb, AF_INET6) ? forged_drop() : rc;
	}
	return TCX_NEXT;
}

char __license[] SEC("license") = "Dual BSD/GPL";
