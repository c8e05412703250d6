#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#define SOL_SOCKET 1
#define SOL_TCP 6
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 64); __type(key, __u32); __type(value, __s64); } res SEC(".maps");
static __always_inline void put(__u32 i, __s64 v) { bpf_map_update_elem(&res, &i, &v, 0); }
#define TRY(i, lvl, opt, val) do { int v = (val); put(i, bpf_setsockopt(skops, lvl, opt, &v, sizeof(v))); int g = 0; \
	if (bpf_getsockopt(skops, lvl, opt, &g, sizeof(g)) == 0) put(i + 32, g); else put(i+32, -999999); } while (0)
SEC("sockops")
int probe(struct bpf_sock_ops *skops)
{
	__u32 base;
	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_LISTEN_CB: base = 0; break;
	case BPF_SOCK_OPS_TCP_CONNECT_CB: base = 8; break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB: base = 16; break;
	default: return 1;
	}
	if (skops->local_port != 7777 && skops->remote_port != __builtin_bswap16(7777) && skops->remote_port != (__u32)__builtin_bswap16(7777) << 16 && skops->remote_port != 7777) return 1;
	TRY(base + 0, SOL_TCP, 10 /* TCP_WINDOW_CLAMP */, 3000);
	TRY(base + 1, SOL_SOCKET, 8 /* SO_RCVBUF */, 6000);
	TRY(base + 2, SOL_SOCKET, 47 /* SO_MAX_PACING_RATE */, 125000);
	TRY(base + 3, SOL_TCP, 1002 /* TCP_BPF_SNDCWND_CLAMP */, 4);
	TRY(base + 4, SOL_TCP, 2 /* TCP_MAXSEG */, 1000);
	TRY(base + 5, SOL_TCP, 13 /* TCP_CONGESTION */, 0);
	TRY(base + 6, SOL_TCP, 1003 /* TCP_BPF_DELACK_MAX */, 1000);
	TRY(base + 7, SOL_TCP, 1004 /* TCP_BPF_RTO_MIN */, 5000);
	return 1;
}
char _l[] SEC("license") = "GPL";
