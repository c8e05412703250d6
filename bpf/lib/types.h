/*
 * Every key and value struct of the pinned maps, the enums and flags stored
 * in them, and the constants every program shares. pkg/maps holds the Go
 * twins, generated from this file by bpf2go (see generate.go): change a
 * layout here and bump maps.LayoutVersion so old pins are never reused.
 */
#pragma once

#include <stddef.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in.h>
#include <linux/icmpv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif
#ifndef ETH_P_ARP
#define ETH_P_ARP 0x0806
#endif
#ifndef IPPROTO_ICMP
#define IPPROTO_ICMP 1
#endif
#ifndef IPPROTO_SCTP
#define IPPROTO_SCTP 132
#endif

/* tcx: hand the packet to the next program of the hook (the stack when none
 * follows). TC_ACT_OK would end the chain. Older uapi headers lack it. */
#ifndef TCX_NEXT
#define TCX_NEXT -1
#endif

/* A node feature's "not mine, go on" (hostPort's, masquerade's), which its
 * callers test before returning what it answered. No verdict: equal to
 * TCX_NEXT, a masquerade reply translated and handed to the stack read as
 * "not mine" and was translated again by hostPort, into the wrong pod
 * (attack16). */
#define FEATURE_CONTINUE -2
_Static_assert(FEATURE_CONTINUE != TCX_NEXT && FEATURE_CONTINUE != TC_ACT_OK && FEATURE_CONTINUE != TC_ACT_SHOT &&
		       FEATURE_CONTINUE != TC_ACT_REDIRECT,
	       "FEATURE_CONTINUE must be no verdict");

#define NSEC 1000000000ULL

/* ------------------------------------------------------------- endpoints */

/* Direction, from the pod's point of view (as the CNI bandwidth capability names it). */
enum cni_dir {
	DIR_EGRESS = 0,  /* leaving the pod: host veth tcx ingress */
	DIR_INGRESS = 1, /* entering the pod: host veth tcx egress, or redirected to it */
	__DIR_MAX,
};

/* Why a packet was counted. Every reason but FORWARD, REDIRECT and
 * NEIGH_REPLY is a drop (lib/events.h). Append only: the values are in
 * pinned counters and in the agent's metrics. */
enum cni_reason {
	REASON_FORWARD = 0,       /* handed to the kernel stack */
	REASON_REDIRECT = 1,      /* same-node pod to pod, bpf_redirect_peer */
	REASON_DROP_SPOOF_IP = 2, /* source IP is not one of the pod's */
	REASON_DROP_SPOOF_MAC = 3,/* source MAC is not the pod's */
	REASON_DROP_PROTO = 4,    /* ethertype the pod may not send */
	REASON_DROP_MALFORMED = 5,/* truncated headers */
	REASON_DROP_UNKNOWN = 6,  /* no endpoint record for this interface */
	REASON_NEIGH_REPLY = 7,   /* ARP/NS for the next hop, answered by the program */
	REASON_DROP_BANDWIDTH = 8,/* over the pod's rate limit in this direction */
	REASON_DROP_ROUTER_MSG = 9,/* a router advertisement or redirect (ICMPv6 134, 137; ICMP 5): pods do not configure the node */
	REASON_DROP_POLICY = 10,  /* denied by the pod's NetworkPolicy in this direction (lib/policy.h) */
	REASON_DROP_TUN_NODE = 11,/* decapsulated off the tunnel device, but its outer source is no known node (lib/tunnel.h) */
	REASON_DROP_TUN_SRC = 12, /* decapsulated from a node, but the inner source is neither in that node's pod CIDRs nor its address; or a pod's own tunnel datagram to a node (at its host veth, or after the stack's DNAT at the uplink); or, off an uplink in the clear, a pod source of a node reached through the tunnel */
	REASON_DROP_TUN_MAC = 13, /* a tunnel datagram off an uplink claiming a node's address, from a MAC that is not the next hop toward that node (lib/tunnel.h) */
	REASON_DROP_NAT_EXHAUSTED = 14, /* masquerade: no free node port among the candidates (MASQ_STAT_EXHAUSTED) */
	REASON_DROP_NAT_POD_LIMIT = 15, /* masquerade: the pod at its port limit towards the destination or at its flow quota (MASQ_STAT_POD_LIMIT) */
	REASON_DROP_NO_ROUTE = 16,      /* a translated hostPort packet the FIB has no route for, or whose TTL ran out (HP_STAT_NO_ROUTE) */
	__REASON_MAX,
};

/* Key of cni_endpoints: one entry per pod IP. Also the key of cni_node_ips. */
struct ep_key {
	__u8 addr[16]; /* IPv4 in the first 4 bytes, rest zero */
	__u8 family;   /* AF_INET or AF_INET6 */
	__u8 pad[3];
};

/* ep_info.flags: the pod's capabilities, so the per-packet path looks up
 * only what applies to it. */
#define EP_F_BW_EGRESS (1U << 0)  /* the pod has an egress limit: see bandwidth.h */
#define EP_F_BW_INGRESS (1U << 1) /* the pod has an ingress limit */
#define EP_F_HOSTPORT (1U << 2)   /* the pod has hostPort mappings: see hostport.h */
#define EP_F_MASQ (1U << 3)       /* ipMasq: traffic leaving the cluster CIDRs is SNATed, see masq.h */
#define EP_F_POLICY (1U << 4)     /* networkPolicy: the pod's traffic is judged (cni_pol_state), see policy.h */
/* Set by ADD, cleared (for good) by to_container before it records the
 * first stack flow delivered to this address (lib/stackflow.h): while set,
 * no record can hold a flow of this address, and from_container's same-node
 * fast path looks none up (issue 30). Entries of older builds lack it and
 * are looked up, as before. */
#define EP_F_SF_NONE (1U << 5)
/* The pod's slot in cni_sf_pool plus one (its own stack-flow table, taken
 * at ADD from the node's pool: issue 30), in the top 16 bits of
 * ep_info.flags; 0: none (then cni_stack_flow_parts by ifindex, as ADDs
 * before the pool). */
#define EP_SF_SLOT_SHIFT 16
/* link_info.flags: written by a build whose ADD also sets EP_F_BW_INGRESS
 * there iff the pod has an ingress limit, so to_container skips the
 * cni_bandwidth lookup of the others (issue 30); entries of older builds
 * lack it and are looked up. */
#define LI_F_BW_KNOWN (1U << 31)

/* Value of cni_endpoints. */
struct ep_info {
	__u32 ifindex;     /* host-side veth */
	__u8 mac[6];       /* pod's MAC */
	__u8 host_mac[6];  /* host veth's MAC, the pod's next hop */
	__u32 flags;
};

/* Value of cni_links, keyed by host veth ifindex: what an interface's pod may send as. */
struct link_info {
	__u8 mac[6];      /* pod's MAC */
	__u8 host_mac[6]; /* host veth's MAC */
	__u32 flags;      /* EP_F_POLICY, EP_F_BW_INGRESS with LI_F_BW_KNOWN (the other EP_F_* live in the address entries) */
};

struct stats_key {
	__u32 ifindex; /* host veth */
	__u8 dir;      /* enum cni_dir */
	__u8 reason;   /* enum cni_reason */
	__u16 pad;
};

struct stats_val {
	__u64 packets;
	__u64 bytes;
};

/* ------------------------------------------------------------- bandwidth */

struct bw_key {
	__u32 ifindex; /* host veth */
	__u32 dir;     /* enum cni_dir */
};

struct bw_state {
	struct bpf_spin_lock lock;
	__u32 pad;
	__u64 ns_per_byte; /* 16.16 fixed point: (1e9 << 16) / bytes per second */
	__u64 burst_ns;    /* bucket depth, in ns at the rate */
	__s64 tokens_ns;   /* current fill; negative while paying off a packet */
	__u64 last_ns;     /* bpf_ktime_get_ns() of the last refill */
	__u64 rate_bps;    /* configured rate, bits per second (for dumps and CHECK) */
	__u64 burst_bits;  /* effective burst, bits (for dumps and CHECK) */
	__u64 queue_ns;    /* the ingress queue's capacity (backlog admitted into it); 0: no queue */
	__u64 mark_ns;     /* backlog above which packets entering the queue are marked CE if ECN-capable */
};

#define NETNS_F_NODE (1U << 0) /* the node's own netns (pods are reached from it) */

/* Value of cni_netns, keyed by netns cookie. */
struct netns_info {
	__u64 egress_rate; /* bytes per second the netns' pod may send; 0: none */
	__u32 flags;
	__u32 rcv_wnd; /* receive window clamp of the pod's TCP sockets (ingress limit), bytes; 0: none */
};

/* ------------------------------------------------------ translated flows */

/*
 * State of a translated flow (ct_val.flags, snat_val.flags), from the
 * packets seen: what decides when it expires (lib/flowlife.h). The
 * originator is the client for cni_ct, the pod for cni_snat.
 */
#define FLOW_F_REPLIED (1U << 1)   /* a packet of the reply direction was seen */
#define FLOW_F_ASSURED (1U << 2)   /* TCP: the originator answered the reply (the handshake completed) */
#define FLOW_F_STREAM (1U << 3)    /* UDP: replied, and still in use 2 s after it began */
#define FLOW_F_FIN_ORIG (1U << 4)  /* TCP FIN from the originator */
#define FLOW_F_FIN_REPLY (1U << 5) /* TCP FIN from the other side */
#define FLOW_F_CLOSING (1U << 6)   /* TCP RST, or a FIN each way */
#define FLOW_F_FIN_BOTH (FLOW_F_FIN_ORIG | FLOW_F_FIN_REPLY)
/* cni_snat only (masq.h's snat_next): the peer's FIN came before the pod's,
 * so the peer holds TIME_WAIT for the translated tuple. */
#define FLOW_F_PEER_FIRST (1U << 7)

/* -------------------------------------------------------------- hostPort */

/*
 * Key of cni_hostports. addr all zero means "any node address" (the node's
 * addresses are in cni_node_ips; the socket hooks add 127.0.0.0/8 and ::1).
 * A key with a specific addr wins over the wildcard of the same port.
 */
struct hostport_key {
	__u8 addr[16]; /* hostIP; IPv4 in the first 4 bytes; zero = any */
	__u8 family;   /* AF_INET or AF_INET6 */
	__u8 proto;    /* IPPROTO_TCP or IPPROTO_UDP */
	__be16 port;   /* hostPort, network order */
};

/* Value of cni_hostports: where the mapping leads. */
struct hostport_val {
	__u8 pod_addr[16]; /* pod IP, same family as the key */
	__be16 pod_port;   /* containerPort, network order */
	__u16 pad;
	__u32 ifindex; /* host veth of the pod: CT entries carry it */
};

/*
 * Key of cni_ct: a translated flow as the pod sends its replies, i.e. the
 * pod's address and port first, then the peer the pod sees (the client, or
 * for a pod reaching its own hostPort the dialled address it was SNATed to).
 */
struct ct_key {
	__u8 pod_addr[16];
	__u8 peer_addr[16];
	__be16 pod_port;
	__be16 peer_port;
	__u8 family;
	__u8 proto;
	__u16 pad;
};

#define CT_F_SNAT 1 /* the client's source was rewritten too (hairpin to itself) */

/* Value of cni_ct: how to translate a reply back. */
struct ct_val {
	__u8 orig_addr[16];   /* what the client dialled: the reply's source */
	__u8 client_addr[16]; /* the client: the reply's destination */
	__be16 orig_port;     /* the hostPort */
	__be16 client_port;
	__u32 ifindex; /* host veth of the pod the flow was translated for */
	__u32 flags;   /* CT_F_SNAT, FLOW_F_* (the client is the originator) */
	__u32 pad;
	__u64 created_ns; /* bpf_ktime_get_ns() at creation */
	__u64 seen_ns;    /* last packet, refreshed at most once a second and at every state change */
	struct bpf_timer timer; /* deletes the entry once it expired (flowlife.h) */
};

/* Key of cni_hp_frags: a UDP datagram of a hostPort flow that arrives in
 * fragments, as its fragments carry it before any translation, and the
 * link they came in by (the pod's host veth, an uplink, the tunnel device):
 * a later fragment must follow its first one's way. */
struct hp_frag_key {
	__u32 ifindex;
	__u32 id; /* IPv4 identification (network order, in the low 16 bits) or the IPv6 fragment header's */
	__u8 family;
	__u8 proto;
	__u16 pad;
	__u8 saddr[16];
	__u8 daddr[16];
};

/* Value of cni_hp_frags: the ports of the datagram's first fragment, which
 * was translated; the later ones carry none (lib/hostport.h hp_frag_flow). */
struct hp_frag_val {
	__be16 sport;
	__be16 dport;
	__u32 pad;
	__u64 seen_ns; /* bpf_ktime_get_ns() of the first fragment */
};

/* Value of cni_hp_config[0]: the node hooks (hostPort and masquerade). */
struct hp_config {
	__u64 netns_cookie; /* the node's netns: socket hooks act only there */
	__u32 flags;        /* HP_CFG_* */
	__u32 hooks_id;     /* which build attached the node hooks (for a fast check) */
};

#define HP_CFG_ENABLED 1 /* the node hooks were set up on this node */
#define HP_CFG_FIB_NO_SRC 2 /* masquerade picks its source without BPF_FIB_LOOKUP_SRC (masq.h uplink_source) */
#define HP_CFG_TUNNEL 4 /* the node tunnel is on: no pod's tunnel datagram leaves with a node address (lib/tunnel.h) */
#define HP_CFG_TUN_SELF 8 /* cni_tun_self holds the addresses this node is known by: the tunnel accepts only datagrams to them */
#define HP_CFG_TUN_NO_MAC 16 /* the tunnel's outer-MAC check is off (ECMP/VRRP underlays, --tunnel-mac-check=false) */
/* cni_stack_flow_parts holds no table: a pod without a pool slot has no
 * table of its own, and its flows' lookups skip that map (issue 30). Set
 * only under the tables' lock after a scan found the map empty; cleared
 * under that lock before any table is put there (pkg/maps/stackflow.go).
 * A build before it never sets it: its nodes look up as before. */
#define HP_CFG_SF_NO_PARTS 32

/* cni_node_ips also holds, per uplink and family, the address masquerade
 * takes where BPF_FIB_LOOKUP_SRC is missing: key family | NODE_IP_UPLINK_SRC,
 * addr[0..3] the uplink's ifindex, addr[4] which 4 bytes of the address the
 * value holds (0 for IPv4, 0-3 for IPv6). No address has such a family. */
#define NODE_IP_UPLINK_SRC 0x80

/* Key of cni_sock_rnat: a socket and the pod address it was sent to. */
struct sock_rnat_key {
	__u64 cookie; /* bpf_get_socket_cookie */
	__u8 addr[16];
	__be16 port;
	__u8 family; /* family of the hook (v4-mapped stays AF_INET6) */
	__u8 pad;
	__u32 pad2;
};

/* Value of cni_sock_rnat: what the socket asked for. */
struct sock_rnat_val {
	__u8 addr[16];
	__be16 port;
	__u16 pad;
	__u32 ifindex; /* host veth of the pod, so DEL finds the entries */
};

/* Index of cni_hp_stats: what the hostPort programs did, per CPU. */
enum hp_stat {
	HP_STAT_DNAT_UPLINK = 0,  /* remote client -> pod (uplink ingress) */
	HP_STAT_DNAT_HAIRPIN = 1, /* pod -> node address:hostPort (host veth ingress) */
	HP_STAT_REPLY = 2,        /* reply translated back (host veth ingress) */
	HP_STAT_SOCK = 3,         /* node socket's destination rewritten (connect/sendmsg) */
	HP_STAT_CT_NEW = 4,       /* flow recorded in cni_ct */
	HP_STAT_NO_FLOW = 5,      /* to a hostPort but not ours: TCP non-SYN of no known flow, or a node socket's UDP flow */
	HP_STAT_NO_ROUTE = 6,     /* translated reply with no FIB route: dropped */
	HP_STAT_ERROR = 7,        /* a rewrite or map update failed: dropped */
	HP_STAT_ICMP_ERR_IN = 8,  /* an ICMP error about a pod's reply (quoting node:hostPort) translated into the pod */
	HP_STAT_ICMP_ERR_OUT = 9, /* the pod's ICMP error about a client's packet translated back to the dialled address */
	HP_STAT_EXPIRED = 10,     /* a flow deleted by its timer (closed, or idle past its timeout) */
	__HP_STAT_MAX,
};

/* Index of cni_hp_frag_stats: hostPort UDP fragments (lib/hostport.h). */
enum hp_frag_stat {
	HP_FRAG_NOTED = 0,    /* a first fragment translated: its ports noted for the later ones */
	HP_FRAG_LATER = 1,    /* a later fragment that found its first fragment's ports (translated unless its flow went) */
	HP_FRAG_NO_NOTE = 2,  /* a later UDP fragment to a node address that found no note (its first one not seen yet: overtaken; evicted; or never a hostPort's): on to the stack untranslated */
	__HP_FRAG_STAT_MAX,
};

/* ------------------------------------------------------------ masquerade */

/* Key of cni_cluster_cidrs (LPM trie): prefixlen counts the family byte and
 * its padding (32 bits) plus the CIDR's bits. */
struct cidr_key {
	__u32 prefixlen;
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

/* Key of cni_cidr_refs: a CIDR of cni_cluster_cidrs and one of its users
 * (an attachment, by a hash of its identity; 0: inherited from an older
 * layout, never released). */
struct cidr_ref_key {
	struct cidr_key cidr;
	__u64 owner;
};

#define SNAT_DIR_FWD 0 /* pod's view: addr/port = pod, peer = destination */
#define SNAT_DIR_REV 1 /* wire view of replies: addr/port = node, peer = destination */

/* Key of cni_snat. ICMP echo: port is the echo id, peer_port 0. */
struct snat_key {
	__u8 addr[16];
	__u8 peer_addr[16];
	__be16 port;
	__be16 peer_port;
	__u8 family;
	__u8 proto;
	__u8 dir; /* SNAT_DIR_* */
	__u8 pad;
};

/* Value of cni_snat: the other side of the translation. */
struct snat_val {
	__u8 addr[16]; /* forward: node address; reverse: pod address */
	__be16 port;   /* forward: allocated port; reverse: pod's port */
	__u16 flags;   /* FLOW_F_* (the pod is the originator); bit 0 and bits 8-15: masq.h's and tcpseq.h's */
	__u32 ifindex;    /* host veth of the pod */
	__u64 created_ns; /* bpf_ktime_get_ns(); a reverse TCP entry with SNAT_F_SEQ: its sequence tracking (tcpseq.h) */
	__u64 seen_ns;    /* last use, refreshed at most once a second and at every state change */
	struct bpf_timer timer; /* reverse entries: deletes the flow (both entries) once it expired */
};

#define MASQ_RANGES 4 /* port ranges of masq_config */

/* Value of cni_masq_config[0]: the node's masquerade ports (written at ADD). */
struct masq_config {
	__u16 lo[MASQ_RANGES];  /* first port of each range */
	__u16 len[MASQ_RANGES]; /* ports in each range; 0: unused */
	__u32 total;            /* ports in all ranges; 0: not configured (61000-65535) */
	__u32 pod_limit;        /* most ports one pod holds towards one destination; 0: no limit */
};

/* Key of cni_masq_share: one pod and one destination (address, port or 0, protocol). */
struct masq_share_key {
	__u8 peer_addr[16];
	__be16 peer_port;
	__u8 family;
	__u8 proto;
	__u32 ifindex; /* host veth of the pod */
};

/*
 * Value of cni_masq_pods: the flows (reverse entries of cni_snat) one pod
 * holds, keyed by its host veth's ifindex; key 0 holds the node's total.
 * The quota (cni_masq_quota) is checked against them when a flow is opened,
 * so no pod (nor a host outside making a pod answer) can fill cni_snat to
 * where its LRU evicts another pod's flows (issue 28).
 */
struct masq_pod_val {
	__u32 flows; /* flows held */
	__u32 drops; /* new flows refused for the quota */
};

/* Value of cni_masq_quota[0], written once when the maps are pinned
 * (pkg/maps/masqquota.go derives it from cni_snat's size, maxPods and the
 * CPUs): the flows of all pods stay under pool + attachments x reserve,
 * which leaves the LRU the free entries it needs never to evict. */
struct masq_quota {
	__u32 reserve; /* flows a pod may always open, whatever the others hold */
	__u32 pool;    /* node total past which only pods under reserve open flows */
	__u32 pod_max; /* most flows one pod holds */
	__u32 pad;
};

/* Value of cni_masq_keys[0] (userspace only): the network whose keys
 * decided cni_masq_config. Networks sharing a pin directory share the
 * ports, so an ADD of another network whose keys differ is refused while
 * masquerading pods use them (pkg/maps/masqkeys.go). */
struct masq_keys {
	__u64 keys;        /* hash of ipMasqPortRange and ipMasqPodPortLimit as configured */
	__u8 network[56];  /* the network's name, truncated */
};

/* Index of cni_masq_stats. */
enum masq_stat {
	MASQ_STAT_SNAT = 0,      /* pod -> outside, translated */
	MASQ_STAT_REVERSE = 1,   /* reply translated back to the pod */
	MASQ_STAT_NEW = 2,       /* port allocated, entries created */
	MASQ_STAT_EXHAUSTED = 3, /* no free port among the candidates: dropped */
	MASQ_STAT_NOT_NEW = 4,   /* TCP non-SYN of no known flow: passed untranslated */
	MASQ_STAT_ERROR = 5,     /* rewrite or map update failed: dropped */
	MASQ_STAT_ICMP_ERR_IN = 6,  /* an ICMP error about a masqueraded flow translated to the pod */
	MASQ_STAT_ICMP_ERR_OUT = 7, /* an ICMP error (the pod's, or the node's) about a reply translated to the node's address */
	MASQ_STAT_RECYCLED = 8,  /* a pod at its limit towards a destination took one of its own ports back */
	MASQ_STAT_POD_LIMIT = 9, /* a pod at its limit had none of its own ports among the candidates: dropped */
	MASQ_STAT_EXPIRED = 10,  /* a flow deleted by its timer (closed, or idle past its timeout) */
	__MASQ_STAT_MAX,
};

/* ----------------------------------------------------------- stack flows */

#define SF_PEER_POD 1  /* the peer is a pod of this node */
#define SF_PEER_NODE 2 /* the peer is a node address (UDP): the pod's replies are no hostPort hairpin */
#define SF_INBOUND 4   /* written by older programs only (a host outside reached a masquerading pod directly); never read */

/* Key of cni_stack_flows: the flow as the pod sends its replies. ICMP echo:
 * port is the echo id, peer_port 0. Protocols without ports: both 0. */
struct sf_key {
	__u8 addr[16];      /* the pod the stack delivered to */
	__u8 peer_addr[16]; /* the source it came from */
	__be16 port;
	__be16 peer_port;
	__u8 family;
	__u8 proto;
	__u16 pad;
};

struct sf_val {
	__u32 ifindex; /* host veth of the pod */
	__u32 flags;   /* SF_* */
	__u64 seen_ns; /* last packet the stack delivered, refreshed at most once a second */
};

/* ---------------------------------------------------------------- events */

/* Events the host veth programs send to the agent through cni_events (lib/events.h). */
enum ev_type {
	EV_DROP = 1,       /* a packet dropped: one per drop, every drop reason */
	EV_FLOW_START = 2, /* first packet of a flow (endpoint, direction, 5-tuple) handed on */
	EV_FLOW_END = 3,   /* TCP FIN or RST of a flow; idle flows are ended by the agent */
	EV_TRACE = 4,      /* a traced endpoint's packet: one per program's decision (aux: EV_TRACE_AUX) */
};

/* Which program decided, in an EV_TRACE's aux (its top byte; the low 24
 * bits are the map entry it used: the destination endpoint's ifindex of a
 * redirect, the masquerade's port, a policy drop's rule). */
enum ev_prog {
	EV_PROG_NONE = 0,
	EV_PROG_FROM_CONTAINER = 1, /* host veth tcx ingress: from the pod */
	EV_PROG_TO_CONTAINER = 2,   /* host veth tcx egress: to the pod, from the stack */
	EV_PROG_FROM_UPLINK = 3,    /* uplink tcx ingress */
	EV_PROG_TO_UPLINK = 4,      /* uplink tcx egress */
	EV_PROG_TUNNEL = 5,         /* the tunnel device, either way */
};
#define EV_TRACE_AUX(prog, entry) ((__u32)(prog) << 24 | ((entry) & 0xffffff))

/* ev_config.flags. All clear: no events, and the per-packet cost is the
 * one lookup of cni_ev_config. */
#define EV_CFG_DROPS (1U << 0)     /* an EV_DROP per drop */
#define EV_CFG_FLOWS_ALL (1U << 1) /* flow events for every endpoint of the node */
#define EV_CFG_FLOWS_PODS (1U << 2) /* flow events for the endpoints in cni_ev_pods */
#define EV_CFG_TRACE (1U << 3)      /* trace events, until trace_until_s, for the endpoints traced in cni_ev_pods */

/* Value of cni_ev_pods: bit 0 flow events on (an older agent writes 1);
 * the bits above, the monotonic second until which the endpoint is traced
 * (0: not). A trace ends by itself: an observer killed before it turned
 * its trace off leaves nothing running. */
#define EV_POD_FLOWS (1U << 0)
#define EV_POD_TRACE_UNTIL(v) ((v) >> 1)

/* Value of cni_ev_config[0], written by the agent (pkg/maps/events.go). */
struct ev_config {
	__u32 flags;
	__u32 trace_until_s; /* EV_CFG_TRACE: the monotonic second it ends (the latest endpoint's) */
	__u64 cost_ns;  /* one event's worth of tokens: NSEC / events per second, per CPU */
	__u64 burst_ns; /* bucket depth: cost_ns times the burst */
};

/* One record of cni_events. ICMP: sport is the type, dport the code. Not IP:
 * family 0, ethertype says what it was. */
struct cni_event {
	__u64 ts_ns;   /* bpf_ktime_get_ns() */
	__u32 ifindex; /* host veth of the endpoint */
	__u32 len;     /* packet length */
	__u32 aux;     /* REASON_DROP_POLICY: the policy rule that dropped it; else 0 */
	__u8 type;     /* enum ev_type */
	__u8 dir;      /* enum cni_dir */
	__u8 reason;   /* enum cni_reason */
	__u8 family;   /* AF_INET, AF_INET6, 0 */
	__u8 proto;
	__u8 tcp_flags;
	__be16 ethertype;
	__be16 sport;
	__be16 dport;
	__u8 saddr[16];
	__u8 daddr[16];
};

/* Key of cni_ev_flows: a flow as one endpoint sees it in one direction. */
struct ev_flow_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u32 ifindex;
	__u8 family;
	__u8 proto;
	__u8 dir;
	__u8 pad;
};

#define EV_FLOW_CLOSED 1 /* ev_flow_val.flags: its end was sent (FIN/RST) */

struct ev_flow_val {
	__u64 first_ns;
	__u64 seen_ns; /* refreshed at most once a second */
	__u8 reason;   /* how its first packet was handed on (forward, redirect) */
	__u8 flags;    /* EV_FLOW_* */
	__u16 pad;
	__u32 pad2;
};

/* One slot of cni_ev_hot: a flow this CPU found in cni_ev_flows (open or
 * closed), and when (the low 32 bits of jiffies). A packet of it within
 * EV_HOT_JIFFIES, neither SYN, FIN nor RST, cannot send an event: it skips
 * the table (lib/events.h ev_flow). ifindex 0: an empty slot. */
struct ev_flow_hot {
	struct ev_flow_key key;
	__u32 stamp_j;
};

#define EV_HOT_BITS 4 /* the slot is the top bits of a hash of the key */
#define EV_HOT_SLOTS (1 << EV_HOT_BITS)

/* Value of cni_ev_hot[0]: the flows this CPU saw last. A map of its own,
 * not a field of ev_cpu, so that cni_ev_cpu keeps the shape layout 5
 * first had (a node set up by that build keeps its pins: the map is
 * optional, made when missing). */
struct ev_hot {
	struct ev_flow_hot slot[EV_HOT_SLOTS];
};

/* Value of cni_ev_cpu[0]: each CPU's token bucket, what it sent and lost,
 * and the flow path's scratch (the events code runs as a subprogram of
 * programs with a large stack of their own: both share 512 bytes). */
struct ev_cpu {
	__u64 tokens_ns;
	__u64 last_ns;
	__u64 sent;
	__u64 lost_rate; /* over the rate: not sent */
	__u64 lost_ring; /* the ring was full (the reader is behind): not sent */
	struct ev_flow_key key;
	__u32 pad;
	struct ev_flow_val val;
};

/* --------------------------------------------------------- NetworkPolicy */

/* What one direction of a pod interface allows (pol_state.mode). */
#define POL_OPEN 0     /* no policy selects the pod in this direction: everything passes */
#define POL_ISOLATED 1 /* only what the rule set allows (and replies, and the node) */
#define POL_PENDING 2  /* not programmed yet (ADD until the agent's first write): only the node */

/* Value of cni_pol_state, keyed by host veth ifindex. Written whole: one
 * update switches both directions to new rule sets at once. */
struct pol_state {
	__u8 mode[2];  /* POL_*, indexed by enum cni_dir */
	__u16 pad;
	__u32 rules[2]; /* rule set of each direction in cni_pol_addrs (0: none, nothing allowed) */
};

/* Key of cni_pol_addrs (LPM trie): prefixlen counts set, family and pad
 * (64 bits) plus the peer prefix's bits. */
struct pol_addr_key {
	__u32 prefixlen;
	__u32 set;  /* pol_state.rules */
	__u8 family;
	__u8 pad[3];
	__u8 addr[16]; /* IPv4 in the first 4 bytes */
};

#define POL_F_ALL_PORTS 1 /* every protocol and port of the peer prefix */

/* Value of cni_pol_addrs. */
struct pol_addr_val {
	__u32 flags; /* POL_F_* */
	__u32 ports; /* port set in cni_pol_ports when not POL_F_ALL_PORTS */
};

/* Key of cni_pol_ports (LPM trie): prefixlen counts set, proto and pad (48
 * bits) plus the port prefix's bits; a range is stored as its prefixes. */
struct pol_port_key {
	__u32 prefixlen;
	__u32 set;   /* pol_addr_val.ports */
	__u8 proto;  /* IPPROTO_TCP, IPPROTO_UDP or IPPROTO_SCTP */
	__u8 pad;
	__be16 port; /* destination port, network order (its high bits are the prefix) */
};

/* Key of a cni_pol_ct_parts table: a flow as the pod behind ifindex sees it (its own
 * address and port first). ICMP echo: the id is the responder's port,
 * 0 the requester's (as cni_stack_flows keys them). */
struct pol_ct_key {
	__u32 ifindex;
	__u8 family;
	__u8 proto;
	__be16 pod_port;
	__be16 peer_port;
	__u16 pad;
	__u8 pod_addr[16];
	__u8 peer_addr[16];
};

/* Key of cni_pol_ct_parts: one flow table of a pod interface. Flows the
 * pod opened and flows its peers opened are kept apart, so neither another
 * pod nor a peer the pod's ingress rules admit can evict the flows the pod
 * opened (and the pod's own flows evict nothing of its peers'). */
struct pol_ct_part_key {
	__u32 ifindex;
	__u32 opener; /* enum cni_dir: DIR_EGRESS the pod opened them, DIR_INGRESS its peers */
};

#define POL_CT_F_EGRESS (1U << 8)  /* the pod opened the flow (else the peer did) */
#define POL_CT_F_DEFER (1U << 9)   /* egress judged after the stack's translation: the entry only lets replies in, once confirmed (POL_CT_F_PENDING) */
#define POL_CT_F_SNAT (1U << 10)   /* the peer reached the pod masqueraded (lib/nfct.h): the entry lets the pod's replies out; each packet of the peer's is judged again */
#define POL_CT_F_PENDING (1U << 11) /* a deferred entry the judgement after the stack has not confirmed yet: it lets nothing in */

/* Value of a cni_pol_ct_parts table: an allowed flow, whose packets either way pass
 * without a rule. */
struct pol_ct_val {
	__u32 flags; /* FLOW_F_* (lib/flowlife.h), POL_CT_F_* */
	__u32 pad;
	__u64 created_ns;
	__u64 seen_ns; /* last packet, refreshed at most once a second and at every state change */
};

/* Key of a cni_pol_frag_parts table: a fragmented datagram at one pod interface, as its
 * packets carry it; value: bpf_ktime_get_ns() when its first fragment passed. */
struct pol_frag_key {
	__u32 ifindex;
	__u32 id; /* IPv4 identification (network order, in the low 16 bits) or the IPv6 fragment header's */
	__u8 family;
	__u8 proto;
	__u16 pad;
	__u8 saddr[16];
	__u8 daddr[16];
};

/* Value of cni_pol_scratch, per CPU: policy_judge's working memory (lib/policy.h
 * lays it out). A program's callers share 512 bytes of stack, and
 * from_container's own frame takes 408. */
struct pol_scratch {
	__u8 data[384];
};

#define POL_CFG_ON 1 /* some interface of this node has networkPolicy: the stack path looks at sources */

/* Value of cni_pol_config[0]. */
struct pol_config {
	__u32 flags; /* POL_CFG_* */
};

/* ---------------------------------------------------------------- tunnel */

/* Value of cni_tun_cidrs (LPM trie keyed by cidr_key): a pod CIDR of
 * another node, the node's id and the address encapsulated packets for
 * the CIDR go to (lib/tunnel.h). Written by the agent. */
struct tun_peer {
	__u32 node;    /* the node's id, as cni_tun_nodes has it; never 0 */
	__u8 family;   /* of addr */
	__u8 flags;    /* TUN_PEER_* */
	__u8 pad[2];
	__u8 addr[16]; /* IPv4 in the first 4 bytes */
};

/* A FIB answer of the outer-MAC check (cni_tun_hops): the next hop's MAC
 * toward saddr (a node) from daddr (this node's address the datagram was
 * sent to), on ifindex, and when it was found. */
struct tun_hop_key {
	__u32 ifindex;
	__u8 family;
	__u8 pad[3];
	__u8 saddr[16];
	__u8 daddr[16];
};

struct tun_hop_val {
	__u64 seen_ns;
	__u8 mac[6];
	__u8 pad[2];
};

/* The agent routes this CIDR into the tunnel (not directly, as hybrid mode
 * does a node of this node's subnet): its addresses arrive only
 * decapsulated, and from_uplink drops one in the clear. Set, not a
 * "direct" bit, so entries an older agent wrote (0) drop nothing. */
#define TUN_PEER_ENCAP 1
