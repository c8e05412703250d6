//go:build ignore

/*
 * Attached once per node to the cgroup2 root as a sock_ops program: when a TCP
 * connection is established in a pod with an egress limit, or towards a pod
 * with an ingress limit, cap the socket's pacing rate at that limit; when a
 * pod with an ingress limit connects to, or accepts from, a peer this node does
 * not pace, clamp its receive window. A pod dialling a hostPort of this node
 * is paced at the mapped pod's ingress limit. See lib/bandwidth.h for why.
 */
#include "lib/hostport.h"

#ifndef SOL_SOCKET
#define SOL_SOCKET 1
#endif
#ifndef SO_MAX_PACING_RATE
#define SO_MAX_PACING_RATE 47
#endif
#ifndef SOL_TCP
#define SOL_TCP 6
#endif
#ifndef TCP_WINDOW_CLAMP
#define TCP_WINDOW_CLAMP 10
#endif

static __always_inline void clamp_window(struct bpf_sock_ops *skops, int bytes)
{
	bpf_setsockopt(skops, SOL_TCP, TCP_WINDOW_CLAMP, &bytes, sizeof(bytes));
}

/* The connection's addresses, read field by field: the verifier only allows
 * context loads at constant offsets. */
struct conn {
	__u32 family;
	__u32 remote[4];
	__u32 local[4];
};

/* A context load clang cannot sink, merge or rebase: the verifier only allows
 * loads at constant offsets from the context pointer itself. */
#define ctx_barrier(p) asm volatile("" : "+r"(p))
#define CTX_LOAD(ctx, field) ({ ctx_barrier(ctx); *(volatile __u32 *)&(ctx)->field; })

static __always_inline void read_conn(struct bpf_sock_ops *skops, struct conn *c)
{
	c->family = CTX_LOAD(skops, family);
	c->remote[0] = CTX_LOAD(skops, remote_ip4);
	c->local[0] = CTX_LOAD(skops, local_ip4);
	if (c->family == AF_INET)
		return;
	c->remote[0] = CTX_LOAD(skops, remote_ip6[0]);
	c->remote[1] = CTX_LOAD(skops, remote_ip6[1]);
	c->remote[2] = CTX_LOAD(skops, remote_ip6[2]);
	c->remote[3] = CTX_LOAD(skops, remote_ip6[3]);
	c->local[0] = CTX_LOAD(skops, local_ip6[0]);
	c->local[1] = CTX_LOAD(skops, local_ip6[1]);
	c->local[2] = CTX_LOAD(skops, local_ip6[2]);
	c->local[3] = CTX_LOAD(skops, local_ip6[3]);
}

/* Traffic that never leaves the netns (loopback, or to its own address) is not limited. */
static __always_inline int is_local(const struct conn *c)
{
	if (c->family == AF_INET)
		return (bpf_ntohl(c->remote[0]) >> 24) == 127 || c->remote[0] == c->local[0];
	if (c->remote[0] == 0 && c->remote[1] == 0 && c->remote[2] == 0 && c->remote[3] == bpf_htonl(1))
		return 1;
	return c->remote[0] == c->local[0] && c->remote[1] == c->local[1] && c->remote[2] == c->local[2] &&
	       c->remote[3] == c->local[3];
}

/* A pod dialling a node address : hostPort (hairpin) reaches the mapped
 * pod through its ingress queue, not paced by bw_pacing_rate (the remote is
 * a node address): the mapped pod's ingress limit, as for a direct
 * connection. 0: none. */
static __always_inline __u64 hostport_ingress_rate(const struct conn *c, __u32 remote_port)
{
	/* remote_port holds the port in network order in its upper half (on
	 * little endian): ntohl gives it in host order. */
	__be16 port = bpf_htons((__u16)bpf_ntohl(remote_port));
	struct hostport_val *v = hostport_lookup(c->remote, c->family, IPPROTO_TCP, port, 0);

	return v ? bw_ingress_rate(c->family, (const __u32 *)v->pod_addr) : 0;
}

SEC("sockops")
int cni_sock_ops(struct bpf_sock_ops *skops)
{
	__u32 op = skops->op;

	if (op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB &&
	    op != BPF_SOCK_OPS_RWND_INIT && op != BPF_SOCK_OPS_HDR_OPT_LEN_CB)
		return 1;

	__u64 cookie = bpf_get_netns_cookie(skops);
	struct netns_info *ns = bpf_map_lookup_elem(&cni_netns, &cookie);
	if (!ns)
		return 1;
	/* The kernel lifts a window clamp again: to the receive buffer's size
	 * when the received segment size changes (the first full segment, at
	 * least), and with the buffer when it autotunes it. So the clamp is
	 * put back on every segment the socket sends (it has this callback only
	 * while clamped, and the kernel does nothing when the clamp is already
	 * in place): the window field is filled in after this callback. */
	if (op == BPF_SOCK_OPS_HDR_OPT_LEN_CB) {
		if (ns->rcv_wnd)
			clamp_window(skops, ns->rcv_wnd);
		return 1;
	}
	struct conn c = {};
	read_conn(skops, &c);
	if (is_local(&c))
		return 1;
	/* No clamp towards pods of this node: this program paces them and their
	 * packets skip the ingress queue. The window of the SYN or SYN-ACK
	 * (whose right edge the kernel never takes back) is as small, in full
	 * segments: unlike a clamp on the listener it leaves the window scale
	 * alone. */
	int unpaced = ns->rcv_wnd && !bw_pod_at(c.family, c.remote);
	if (op == BPF_SOCK_OPS_RWND_INIT) {
		if (unpaced)
			skops->reply = ns->rcv_wnd / 1460 > 2 ? ns->rcv_wnd / 1460 : 2;
		return 1;
	}
	if (unpaced) {
		clamp_window(skops, ns->rcv_wnd);
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
	}

	__u64 rate = bw_pacing_rate(ns, c.family, c.remote);
	if (op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && !(ns->flags & NETNS_F_NODE) && node_hooks_enabled()) {
		__u64 in = hostport_ingress_rate(&c, skops->remote_port);

		if (in && (!rate || in < rate))
			rate = in;
	}
	if (rate) {
		/* The kernel takes an int here: bytes per second, ~0U meaning none. */
		__u32 r = rate < 0xfffffffeULL ? (__u32)rate : 0xfffffffe;
		bpf_setsockopt(skops, SOL_SOCKET, SO_MAX_PACING_RATE, &r, sizeof(r));
	}
	return 1;
}

char __license[] SEC("license") = "Dual BSD/GPL";
