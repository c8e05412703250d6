/*
 * What the programs know of the node itself: whether its hooks are set up
 * (cni_hp_config, written when the uplink and socket hooks are attached)
 * and its own addresses (cni_node_ips, kept current by ADD and the agent).
 */
#pragma once

#include "maps.h"
#include "pkt.h"

static __always_inline struct hp_config *node_config(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cni_hp_config, &zero);
}

/* Whether the node hooks (uplinks, socket hooks) are set up: hostPort and
 * masquerade work only then. */
static __always_inline int node_hooks_enabled(void)
{
	struct hp_config *c = node_config();

	return c && (c->flags & HP_CFG_ENABLED);
}

/* Whether the node tunnel is on (HP_CFG_TUNNEL, written with the device). */
static __always_inline int node_tunnel_on(void)
{
	struct hp_config *c = node_config();

	return c && (c->flags & HP_CFG_TUNNEL);
}

/* Mappings made up to this time may hold a lost node address (maps.h). */
static __always_inline __u64 node_ips_gone(void)
{
	__u32 zero = 0;
	__u64 *t = bpf_map_lookup_elem(&cni_node_ips_gone, &zero);

	return t ? *t : ~0ULL;
}

static __always_inline int is_node_ip(const void *addr, __u8 family)
{
	struct ep_key k = { .family = family };

	addr_copy(k.addr, addr, family);
	return bpf_map_lookup_elem(&cni_node_ips, &k) != NULL;
}
