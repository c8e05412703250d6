//go:build ignore

/*
 * cgroup/sock_addr hooks on the cgroup2 root: hostPorts for connections the
 * node's own processes make, to a node address, 127.0.0.0/8 or ::1. The
 * socket's destination is rewritten to the pod at connect (TCP, connected
 * UDP) or per datagram at sendmsg (unconnected UDP): no packet is translated.
 * recvmsg and getpeername show the address the process asked for, remembered
 * per socket in cni_sock_rnat. All of it is in lib/hostport.h.
 */
#include "lib/hostport.h"

SEC("cgroup/connect4")
int cni_sock_connect4(struct bpf_sock_addr *ctx) { return hostport_sock_dnat4(ctx); }

SEC("cgroup/sendmsg4")
int cni_sock_sendmsg4(struct bpf_sock_addr *ctx) { return hostport_sock_dnat4(ctx); }

SEC("cgroup/recvmsg4")
int cni_sock_recvmsg4(struct bpf_sock_addr *ctx) { return hostport_sock_rnat4(ctx); }

SEC("cgroup/getpeername4")
int cni_sock_peer4(struct bpf_sock_addr *ctx) { return hostport_sock_rnat4(ctx); }

SEC("cgroup/connect6")
int cni_sock_connect6(struct bpf_sock_addr *ctx) { return hostport_sock_dnat6(ctx); }

SEC("cgroup/sendmsg6")
int cni_sock_sendmsg6(struct bpf_sock_addr *ctx) { return hostport_sock_dnat6(ctx); }

SEC("cgroup/recvmsg6")
int cni_sock_recvmsg6(struct bpf_sock_addr *ctx) { return hostport_sock_rnat6(ctx); }

SEC("cgroup/getpeername6")
int cni_sock_peer6(struct bpf_sock_addr *ctx) { return hostport_sock_rnat6(ctx); }

char __license[] SEC("license") = "Dual BSD/GPL";
