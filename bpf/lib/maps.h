/*
 * Every pinned map of the datapath, and nothing else: the structs are in
 * types.h, the code that reads and writes them in the feature headers.
 * pkg/maps pins and opens each one (by name), so a map added here is pinned
 * on the next setup; bump maps.LayoutVersion with any change.
 *
 * Maps whose max_entries is SIZED are sized when the datapath is first
 * pinned, from the node's maxPods (pkg/maps/sizing.go holds the rule): the
 * value here is a placeholder the loader replaces. The others are fixed.
 */
#pragma once

#include "types.h"

#define SIZED 0 /* max_entries set at pin time (pkg/maps/sizing.go); 0 fails if forgotten */
#define MAX_NODE_IPS 1024
#define MAX_CLUSTER_CIDRS 256
#define MAX_TUN_NODES 4096 /* node addresses (one per family of each node) */
#define MAX_TUN_CIDRS 4096 /* pod CIDRs of other nodes */
#define MAX_TUN_SELF 16 /* this node's listed addresses */
#define MAX_TUN_HOPS 1024 /* remembered next hops toward nodes (cni_tun_hops) */
#define MAX_SELF_CIDRS 16 /* this node's own pod CIDRs (cni_self_cidrs) */
#define MAX_HP_FRAGS 2048 /* cni_hp_frags, which only the build before reads */
/* hostPort datagrams in fragments at once (cni_hp_frag_notes): what the
 * kernel's own reassembly can hold at its default ipfrag_high_thresh (4 MiB
 * for IPv4 and as much for IPv6) of fragments no smaller than an skb's
 * overhead (~550 bytes: 2 x 4 MiB / 550 = 15252), about 1.8 MiB of notes. */
#define MAX_HP_FRAG_NOTES 16384
#define MAX_AFTER_LINKS 256 /* uplinks and the tunnel device (cni_after_links) */
#define AFTER_LINK_UPLINK 1 /* to_uplink runs on its egress */
#define AFTER_LINK_TUNNEL 2 /* the tunnel device: cni_to_tunnel */

/* ------------------------------------------------------------- endpoints */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SIZED);
	__type(key, struct ep_key);
	__type(value, struct ep_info);
} cni_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SIZED);
	__type(key, __u32);
	__type(value, struct link_info);
} cni_links SEC(".maps");

/* Per-CPU, so not preallocated: an entry costs its value times the CPUs,
 * and only (interface, direction, reason) that saw a packet have one. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, SIZED);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct stats_key);
	__type(value, struct stats_val);
} cni_stats SEC(".maps");

/* ------------------------------------------------------------- bandwidth */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SIZED);
	__type(key, struct bw_key);
	__type(value, struct bw_state);
} cni_bandwidth SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SIZED);
	__type(key, __u64); /* netns cookie */
	__type(value, struct netns_info);
} cni_netns SEC(".maps");

/* ---------------------------------------------- hostPort and node hooks */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SIZED);
	__type(key, struct hostport_key);
	__type(value, struct hostport_val);
} cni_hostports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SIZED);
	__type(key, struct ct_key);
	__type(value, struct ct_val);
} cni_ct SEC(".maps");

/* The notes of the build before cni_hp_frag_notes (2048 entries): no
 * program of this build reads it; it stays in the pin set for a rollback
 * to that build, whose pins are checked for it (its shape never changes). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_HP_FRAGS);
	__type(key, struct hp_frag_key);
	__type(value, struct hp_frag_val);
} cni_hp_frags SEC(".maps");

/* Fragmented UDP datagrams of hostPort flows whose first fragment was
 * translated: its ports, for the later fragments (lib/hostport.h). An
 * entry is needed only until the datagram's last fragment passed (the
 * kernel's reassembly gives up after 30 s): an LRU, whose eviction costs
 * at most a datagram's later fragments. Sized so that evicting a note in
 * flight takes a flood that would fill the kernel's own reassembly memory
 * too (MAX_HP_FRAG_NOTES); a map of its own, not cni_hp_frags resized: a
 * pinned map keeps its shape within a layout (issue 24). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_HP_FRAG_NOTES);
	__type(key, struct hp_frag_key);
	__type(value, struct hp_frag_val);
} cni_hp_frag_notes SEC(".maps");

/* What happened to hostPort fragments, per CPU (enum hp_frag_stat): a map
 * of its own because cni_hp_stats keeps the shape builds of layout 5 pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, __HP_FRAG_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} cni_hp_frag_stats SEC(".maps");

/* The node's own addresses (key as cni_endpoints'); value: ifindex holding it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_NODE_IPS);
	__type(key, struct ep_key);
	__type(value, __u32);
} cni_node_ips SEC(".maps");

/* CLOCK_MONOTONIC ns (bpf_ktime_get_ns): a masquerade mapping of cni_snat
 * made before it may hold a node address the node has lost since, and is
 * checked against cni_node_ips at each packet; one made after it was made
 * from the addresses the node has (issue 30: no per-packet lookup). Set to
 * a second past each removal from cni_node_ips, before it, and when first
 * pinned (pkg/maps/nodeipsgone.go). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} cni_node_ips_gone SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct hp_config);
} cni_hp_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SIZED);
	__type(key, struct sock_rnat_key);
	__type(value, struct sock_rnat_val);
} cni_sock_rnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, __HP_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} cni_hp_stats SEC(".maps");

/* ------------------------------------------------------------ masquerade */

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SIZED); /* two entries per flow */
	__type(key, struct snat_key);
	__type(value, struct snat_val);
} cni_snat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, MAX_CLUSTER_CIDRS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cidr_key);
	__type(value, __u32);
} cni_cluster_cidrs SEC(".maps");

/* Who holds each entry of cni_cluster_cidrs (userspace only): one entry per
 * (CIDR, attachment), so a CIDR goes with its last user, whichever process
 * adds or deletes (pkg/maps/masq.go, under a lock on the map directory). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SIZED);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cidr_ref_key);
	__type(value, __u32);
} cni_cidr_refs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, __MASQ_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} cni_masq_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct masq_config);
} cni_masq_config SEC(".maps");

/* Ports each pod holds towards each destination (the pod limit's count). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SIZED); /* one entry per (pod, destination) of cni_snat flows at most */
	__type(key, struct masq_share_key);
	__type(value, __u32);
} cni_masq_share SEC(".maps");

/* Flows each pod holds in cni_snat, and the node's total (key 0). Added
 * within layout 3: a build that lacks it never opens it, Create pins it
 * where an older build of the layout left none. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SIZED); /* one per attachment, and the total */
	__type(key, __u32);
	__type(value, struct masq_pod_val);
} cni_masq_pods SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct masq_quota);
} cni_masq_quota SEC(".maps");

/* Userspace only (added within layout 3, as the two above). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct masq_keys);
} cni_masq_keys SEC(".maps");

/* ----------------------------------------------------------- stack flows */

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SIZED);
	__type(key, struct sf_key);
	__type(value, struct sf_val);
} cni_stack_flows SEC(".maps");

/*
 * The stack-flow records of flows a pod of this node sent (SF_PEER_POD),
 * one LRU per sending pod, keyed by its host veth's ifindex: a pod opening
 * flows at any rate evicts only its own records, never another pod's (issue
 * 28; the node-wide cni_stack_flows above could be flushed by one pod).
 * ADD creates the pod's table, DEL drops it (pkg/maps/stackflow.go).
 * cni_stack_flows keeps the records whose sender is the node (SF_PEER_NODE)
 * and those of pods attached by older builds.
 */
#define SF_PART_ENTRIES 256

struct sf_part {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SF_PART_ENTRIES);
	__type(key, struct sf_key);
	__type(value, struct sf_val);
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, SIZED);
	__type(key, __u32);
	__array(values, struct sf_part);
} cni_stack_flow_parts SEC(".maps");

/*
 * The node's pool of those tables (issue 30): made and put once per node
 * (one batched update, one RCU grace period) when the maps are created,
 * each pod taking a free slot at ADD through cni_sf_slots, a plain hash
 * whose writes wait for nothing. A pod's address entries carry its slot
 * (EP_SF_SLOT_SHIFT). A taken table is emptied
 * before its slot is published (pkg/maps/sfpool.go).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, SIZED);
	__type(key, __u32);
	__array(values, struct sf_part);
} cni_sf_pool SEC(".maps");

/* Userspace only: the slot of cni_sf_pool each host veth ifindex holds. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SIZED);
	__type(key, __u32);
	__type(value, __u32);
} cni_sf_slots SEC(".maps");
/* ---------------------------------------------------------------- events */

#define EV_RING_BYTES (1 << 18) /* about 3600 events of 72 bytes (record and header) */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, EV_RING_BYTES);
} cni_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ev_config);
} cni_ev_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ev_cpu);
} cni_ev_cpu SEC(".maps");

/* Each CPU's hot flow slots (struct ev_hot, lib/events.h ev_flow). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ev_hot);
} cni_ev_hot SEC(".maps");

/* Endpoints (host veth ifindex) with flow events (EV_POD_FLOWS, sent while
 * EV_CFG_FLOWS_PODS) or trace events (EV_POD_TRACE, while EV_CFG_TRACE) on. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SIZED);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, __u32);
} cni_ev_pods SEC(".maps");

/* Flows seen, to know a flow's first packet. LRU: an evicted flow is
 * announced again on its next packet. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SIZED);
	__type(key, struct ev_flow_key);
	__type(value, struct ev_flow_val);
} cni_ev_flows SEC(".maps");

/* --------------------------------------------------------- NetworkPolicy */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SIZED);
	__type(key, __u32); /* host veth ifindex */
	__type(value, struct pol_state);
} cni_pol_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, SIZED);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct pol_addr_key);
	__type(value, struct pol_addr_val);
} cni_pol_addrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, SIZED);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct pol_port_key);
	__type(value, __u32);
} cni_pol_ports SEC(".maps");

/*
 * The flows a pod's policy allowed, in tables of the pod's own (issue 23:
 * one node-wide LRU let any pod, or any host a pod admits, evict every
 * other pod's flows, whose replies the rules then denied). Two per pod
 * interface, keyed {host veth ifindex, opener}: the flows the pod opened,
 * and those its peers opened. ADD creates them, DEL drops them
 * (pkg/maps/policy.go); an interface without them records no flow (its
 * replies are judged by the rules: closed, never open).
 */
#define POL_CT_PART_ENTRIES 128

struct pol_ct_part {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, POL_CT_PART_ENTRIES);
	__type(key, struct pol_ct_key);
	__type(value, struct pol_ct_val);
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, SIZED);
	__type(key, struct pol_ct_part_key);
	__array(values, struct pol_ct_part);
} cni_pol_ct_parts SEC(".maps");

/* Datagrams whose first fragment passed, in a table per pod interface
 * (keyed by its host veth's ifindex; created and dropped with its flow
 * tables): no pod's fragments evict another's. */
#define POL_FRAG_PART_ENTRIES 16

struct pol_frag_part {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, POL_FRAG_PART_ENTRIES);
	__type(key, struct pol_frag_key);
	__type(value, __u64);
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, SIZED);
	__type(key, __u32);
	__array(values, struct pol_frag_part);
} cni_pol_frag_parts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pol_config);
} cni_pol_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pol_scratch);
} cni_pol_scratch SEC(".maps");

/* ---------------------------------------------------------------- tunnel */

/* Every other node's addresses (key as cni_endpoints'), value its id: who
 * may send through the tunnel (lib/tunnel.h). Written by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_TUN_NODES);
	__type(key, struct ep_key);
	__type(value, __u32);
} cni_tun_nodes SEC(".maps");

/* Every other node's pod CIDRs: where to encapsulate to, and whose pods
 * may claim an address of them. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, MAX_TUN_CIDRS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cidr_key);
	__type(value, struct tun_peer);
} cni_tun_cidrs SEC(".maps");

/* The addresses this node is known by (its own entry of the peer list or
 * its Node object; key as cni_endpoints', value unused): the only outer
 * destinations the tunnel device accepts, once HP_CFG_TUN_SELF says the
 * agent wrote them. Written by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_TUN_SELF);
	__type(key, struct ep_key);
	__type(value, __u32);
} cni_tun_self SEC(".maps");

/* The outer-MAC check's recent answers (lib/tunnel.h, tun_hop_check): the
 * MAC bpf_fib_lookup found as next hop toward a node, by the uplink and
 * the addresses asked, kept TUN_HOP_TTL_NS. Written by the programs; an
 * LRU of fixed size (an eviction costs one FIB lookup). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_TUN_HOPS);
	__type(key, struct tun_hop_key);
	__type(value, struct tun_hop_val);
} cni_tun_hops SEC(".maps");

/* This node's own pod CIDRs (its Node object's spec.podCIDRs, or its entry
 * of the peer list; value unused): no packet off the wire may claim an
 * address of them (from_uplink's forged_pod_source). Written by the agent
 * alone, which knows them; empty without it, as the conflist's IPAM range
 * may span nodes. An optional map of layout 5. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, MAX_SELF_CIDRS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cidr_key);
	__type(value, __u32);
} cni_self_cidrs SEC(".maps");

/* ------------------------------------------------- judged after the stack */

/* The links whose egress program judges a pod's deferred egress after the
 * stack (lib/policy.h): key ifindex, value AFTER_LINK_* bits. The uplinks
 * (to_uplink.c) and the tunnel device (tunnel.c); host veths are
 * cni_links'. Written by whoever attaches those programs. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_AFTER_LINKS);
	__type(key, __u32);
	__type(value, __u32);
} cni_after_links SEC(".maps");
