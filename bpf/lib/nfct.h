/*
 * What netfilter did to a packet, read from its conntrack entry
 * (skb->_nfct), for NetworkPolicy after the stack (lib/policy.h).
 *
 * A packet the stack forwards reaches the tc egress hooks (to_container,
 * to_uplink, cni_to_tunnel) after POSTROUTING, so after kube-proxy's
 * masquerade (masqueradeAll, hairpin, NodePorts of externalTrafficPolicy
 * Cluster): its source is a node address, no longer the pod or client that
 * sent it. Its conntrack entry still names that sender: the ORIGINAL
 * tuple's source, when the packet goes the way its connection was opened
 * (ctinfo NEW or ESTABLISHED, not a reply, not RELATED) and the entry says
 * its source was translated (IPS_SRC_NAT).
 *
 * The entry is read with bpf_probe_read_kernel (sched_cls has it with
 * CAP_PERFMON or CAP_SYS_ADMIN, the loader's; not under lockdown
 * "confidentiality") at offsets CO-RE relocates against the running
 * kernel's BTF: vmlinux, or nf_conntrack's module BTF if that module was
 * loaded when the programs were. A kernel without conntrack in its BTF then
 * relocates the read away (nothing to read: no NAT either). The compat
 * build (docs/compat.md) has no read at all: the probe that chooses it
 * includes bpf_probe_read_kernel in sched_cls (pkg/datapath/features.go).
 * All temporaries live in the caller's scratch: the callers' stack is spent.
 */
#pragma once

#include "pkt.h"

/* CO-RE mirrors: only the fields read. The ___nfct suffix is a flavour:
 * relocation matches the kernel's types by the name before it. */
struct sk_buff___nfct {
	unsigned long _nfct;
} __attribute__((preserve_access_index));

union nf_inet_addr___nfct {
	__u32 all[4];
} __attribute__((preserve_access_index));

union nf_conntrack_man_proto___nfct {
	__be16 all;
} __attribute__((preserve_access_index));

struct nf_conntrack_man___nfct {
	union nf_inet_addr___nfct u3;
	union nf_conntrack_man_proto___nfct u;
} __attribute__((preserve_access_index));

struct nf_conntrack_tuple___nfct {
	struct nf_conntrack_man___nfct src;
	struct {
		union nf_inet_addr___nfct u3;
		union nf_conntrack_man_proto___nfct u;
	} dst;
} __attribute__((preserve_access_index));

struct nf_conntrack_tuple_hash___nfct {
	struct nf_conntrack_tuple___nfct tuple;
} __attribute__((preserve_access_index));

struct nf_conn___nfct {
	struct nf_conntrack_tuple_hash___nfct tuplehash[2];
	unsigned long status;
} __attribute__((preserve_access_index));

#define NFCT_INFOMASK 7UL        /* the low bits of skb->_nfct: enum ip_conntrack_info */
#define NFCT_ESTABLISHED 0       /* IP_CT_ESTABLISHED */
#define NFCT_NEW 2               /* IP_CT_NEW; 1 is RELATED, 3 and up replies, 7 untracked */
#define NFCT_IPS_SRC_NAT 0x10UL  /* IPS_SRC_NAT */
#define NFCT_IPS_DST_NAT 0x20UL  /* IPS_DST_NAT */
#define NFCT_FIELD_EXISTS 2      /* BPF_FIELD_EXISTS of __builtin_preserve_field_info */
#define NFCT_TYPE_EXISTS 0       /* BPF_TYPE_EXISTS of __builtin_preserve_type_info */

/* Whether the conntrack entry can be read at all (a constant once CO-RE
 * relocated the programs): not in the compat build, nor on a kernel
 * without conntrack in its BTF. */
static __always_inline int nfct_readable(void)
{
#ifdef EBPF_CNI_COMPAT
	return 0;
#else
	struct sk_buff___nfct *kskb = 0;

	return __builtin_preserve_field_info(kskb->_nfct, NFCT_FIELD_EXISTS) &&
	       __builtin_preserve_type_info(*(struct nf_conn___nfct *)0, NFCT_TYPE_EXISTS);
#endif
}

/* Where nfct_snat_source works: in the caller's scratch. */
struct nfct_work {
	__u64 nfct;   /* skb->_nfct */
	__u64 status; /* nf_conn.status */
	__u8 addr[16]; /* the source before the SNAT */
	__be16 port;   /* its port (ICMP echo: the id) */
	__u16 pad;
};

/* Where nfct_dnat_original works: in the caller's scratch. */
struct nfct_orig {
	__u64 nfct;
	__u64 status;
	__u8 saddr[16]; /* the ORIGINAL tuple: as the sender sent its first packet */
	__u8 daddr[16];
	__be16 sport;
	__be16 dport; /* ICMP: type and code, not a port */
};

#define NFCT_ESTABLISHED_REPLY 3 /* IP_CT_ESTABLISHED_REPLY */

/*
 * The conntrack entry of the packet, when it goes the way its connection
 * was opened (ctinfo NEW or ESTABLISHED) or, with reply, is a reply
 * (ESTABLISHED_REPLY), and the entry's status has flag; NULL otherwise,
 * and in the compat build, on a kernel without conntrack, for untracked
 * packets. Two reads of kernel memory, into the caller's *nfct and *status.
 */
static __always_inline struct nf_conn___nfct *nfct_entry(struct __sk_buff *skb, __u64 *nfct, __u64 *status,
							  int reply, __u64 flag)
{
#ifdef EBPF_CNI_COMPAT
	return 0;
#else
	struct sk_buff___nfct *kskb = (void *)skb;
	struct nf_conn___nfct *ct;

	if (!nfct_readable())
		return 0;
	/* The context is the kernel's sk_buff: __sk_buff only renames it. */
	if (bpf_probe_read_kernel(nfct, sizeof(*nfct), __builtin_preserve_access_index(&kskb->_nfct)))
		return 0;
	if (reply ? (*nfct & NFCT_INFOMASK) != NFCT_ESTABLISHED_REPLY :
		    (*nfct & NFCT_INFOMASK) != NFCT_NEW && (*nfct & NFCT_INFOMASK) != NFCT_ESTABLISHED)
		return 0;
	ct = (void *)(*nfct & ~NFCT_INFOMASK);
	if (!ct)
		return 0;
	if (bpf_probe_read_kernel(status, sizeof(*status), __builtin_preserve_access_index(&ct->status)) ||
	    !(*status & flag))
		return 0;
	return ct;
#endif
}

/*
 * Whether the packet goes the way its connection was opened and netfilter
 * translated its source; then n->addr and n->port hold the source before
 * the translation. 0 where nfct_entry is NULL. Four reads of kernel memory.
 */
static __noinline int nfct_snat_source(struct __sk_buff *skb, struct nfct_work *n)
{
	struct nf_conn___nfct *ct = nfct_entry(skb, &n->nfct, &n->status, 0, NFCT_IPS_SRC_NAT);

	if (!ct)
		return 0;
	if (bpf_probe_read_kernel(n->addr, sizeof(n->addr), __builtin_preserve_access_index(&ct->tuplehash[0].tuple.src.u3)) ||
	    bpf_probe_read_kernel(&n->port, sizeof(n->port), __builtin_preserve_access_index(&ct->tuplehash[0].tuple.src.u.all)))
		return 0;
	return 1;
}

/*
 * Whether the packet goes the way its connection was opened and netfilter
 * translated its destination (kube-proxy's Service DNAT); then o holds the
 * connection's ORIGINAL tuple, the packet as its sender sent it. 0 where
 * nfct_entry is NULL. Six reads of kernel memory: policy_judge asks
 * once per deferred flow (pol_confirm_deferred).
 */
static __noinline int nfct_dnat_original(struct __sk_buff *skb, struct nfct_orig *o)
{
	struct nf_conn___nfct *ct = nfct_entry(skb, &o->nfct, &o->status, 0, NFCT_IPS_DST_NAT);

	if (!ct)
		return 0;
	if (bpf_probe_read_kernel(o->saddr, sizeof(o->saddr), __builtin_preserve_access_index(&ct->tuplehash[0].tuple.src.u3)) ||
	    bpf_probe_read_kernel(&o->sport, sizeof(o->sport), __builtin_preserve_access_index(&ct->tuplehash[0].tuple.src.u.all)) ||
	    bpf_probe_read_kernel(o->daddr, sizeof(o->daddr), __builtin_preserve_access_index(&ct->tuplehash[0].tuple.dst.u3)) ||
	    bpf_probe_read_kernel(&o->dport, sizeof(o->dport), __builtin_preserve_access_index(&ct->tuplehash[0].tuple.dst.u.all)))
		return 0;
	return 1;
}

/*
 * Whether the packet is a reply of a connection whose destination netfilter
 * translated (kube-proxy's Service DNAT); then o->daddr and o->dport hold
 * the REPLY tuple's source: the address and port the stack delivered the
 * connection's packets to, before translating the reply back (o's other
 * fields are not written). 0 where nfct_entry is NULL. Four reads of
 * kernel memory: policy_judge asks once per pending flow a node socket
 * answers (pol_pending_local).
 */
static __noinline int nfct_dnat_reply(struct __sk_buff *skb, struct nfct_orig *o)
{
	struct nf_conn___nfct *ct = nfct_entry(skb, &o->nfct, &o->status, 1, NFCT_IPS_DST_NAT);

	if (!ct)
		return 0;
	if (bpf_probe_read_kernel(o->daddr, sizeof(o->daddr), __builtin_preserve_access_index(&ct->tuplehash[1].tuple.src.u3)) ||
	    bpf_probe_read_kernel(&o->dport, sizeof(o->dport), __builtin_preserve_access_index(&ct->tuplehash[1].tuple.src.u.all)))
		return 0;
	return 1;
}
