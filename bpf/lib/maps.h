/*
 * Every pinned map of the datapath and the structs stored in them.
 * pkg/maps holds the Go twins, generated from this file by bpf2go (see generate.go);
 * change a layout here and bump maps.LayoutVersion so old pins are never reused.
 */
#pragma once

#include "common.h"

/* Direction, from the pod's point of view (as the CNI bandwidth capability names it). */
enum cni_dir {
	DIR_EGRESS = 0,  /* leaving the pod: host veth tcx ingress */
	DIR_INGRESS = 1, /* entering the pod: host veth tcx egress, or redirected to it */
	__DIR_MAX,
};

/* Why a packet was counted. Drops: REASON_DROP_SPOOF_IP..REASON_DROP_UNKNOWN, REASON_DROP_BANDWIDTH and REASON_DROP_ROUTER_MSG. */
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
	__REASON_MAX,
};

/* Key of cni_endpoints: one entry per pod IP. */
struct ep_key {
	__u8 addr[16]; /* IPv4 in the first 4 bytes, rest zero */
	__u8 family;   /* AF_INET or AF_INET6 */
	__u8 pad[3];
};

/* ep_info.flags */
#define EP_F_BW_EGRESS (1U << 0)  /* the pod has an egress limit: see bandwidth.h */
#define EP_F_BW_INGRESS (1U << 1) /* the pod has an ingress limit */
#define EP_F_HOSTPORT (1U << 2)   /* the pod has hostPort mappings: see hostport.h */
#define EP_F_MASQ (1U << 3)       /* ipMasq: IPv4 leaving the cluster CIDRs is SNATed, see masq.h */

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
	__u32 flags;
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

#define MAX_ENDPOINTS 65536

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ENDPOINTS);
	__type(key, struct ep_key);
	__type(value, struct ep_info);
} cni_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ENDPOINTS);
	__type(key, __u32);
	__type(value, struct link_info);
} cni_links SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, MAX_ENDPOINTS * 4);
	__type(key, struct stats_key);
	__type(value, struct stats_val);
} cni_stats SEC(".maps");

static __always_inline void count(__u32 ifindex, __u8 dir, __u8 reason, __u32 len)
{
	struct stats_key k = { .ifindex = ifindex, .dir = dir, .reason = reason };
	struct stats_val *v = bpf_map_lookup_elem(&cni_stats, &k);

	if (v) {
		/* Per-CPU value: no atomics needed. */
		v->packets++;
		v->bytes += len;
		return;
	}
	struct stats_val nv = { .packets = 1, .bytes = len };
	bpf_map_update_elem(&cni_stats, &k, &nv, BPF_NOEXIST);
}
