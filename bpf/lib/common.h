/* Shared includes and small helpers for every ebpf-cni program. */
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in.h>
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

/* tcx: hand the packet to the next program of the hook (the stack when none
 * follows). TC_ACT_OK would end the chain. Older uapi headers lack it. */
#ifndef TCX_NEXT
#define TCX_NEXT -1
#endif

static __always_inline int mac_equal(const __u8 *a, const __u8 *b)
{
	/* 4+2 byte compares instead of a loop: the verifier sees straight-line code. */
	return *(const __u32 *)a == *(const __u32 *)b &&
	       *(const __u16 *)(a + 4) == *(const __u16 *)(b + 4);
}

static __always_inline void mac_copy(__u8 *dst, const __u8 *src)
{
	*(__u32 *)dst = *(const __u32 *)src;
	*(__u16 *)(dst + 4) = *(const __u16 *)(src + 4);
}
