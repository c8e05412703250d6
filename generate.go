// Package ebpfcni is the module root; it exists to hold the go:generate
// directives that compile bpf/ with bpf2go. Run `make generate`: it sets the
// compiler and its flags once for every object (BPF2GO_CC, BPF2GO_CFLAGS:
// the vendored headers of bpf/include and nothing of the machine's
// /usr/include), so the output is the same on every machine with that clang.
package ebpfcni

// Map specs of bpf/lib/maps.h and Go twins of the C structs in bpf/lib/types.h.
//go:generate go tool bpf2go -go-package maps -output-dir pkg/maps -output-stem maps -target bpfel -type ep_key -type ep_info -type link_info -type stats_key -type stats_val -type bw_key -type bw_state -type netns_info -type hostport_key -type hostport_val -type ct_key -type ct_val -type hp_config -type sock_rnat_key -type sock_rnat_val -type cidr_key -type cidr_ref_key -type snat_key -type snat_val -type masq_config -type masq_share_key -type masq_pod_val -type masq_quota -type masq_keys -type sf_key -type sf_val -type ev_config -type ev_cpu -type ev_flow_key -type ev_flow_val -type tun_peer -type hp_frag_key -type hp_frag_val -type tun_hop_key -type tun_hop_val mapsObj bpf/maps.c

// One object per attach point.
//go:generate go tool bpf2go -go-package datapath -output-dir pkg/datapath -output-stem from_container -target bpfel -no-global-types fromContainer bpf/from_container.c
//go:generate go tool bpf2go -go-package datapath -output-dir pkg/datapath -output-stem to_container -target bpfel -no-global-types toContainer bpf/to_container.c
//go:generate go tool bpf2go -go-package datapath -output-dir pkg/datapath -output-stem sock_ops -target bpfel -no-global-types sockOps bpf/sock_ops.c

// Node hooks (hostPort and masquerade): uplink tcx ingress and egress, and the cgroup sock_addr hooks for the node's own sockets.
//go:generate go tool bpf2go -go-package datapath -output-dir pkg/datapath -output-stem from_uplink -target bpfel -no-global-types fromUplink bpf/from_uplink.c
//go:generate go tool bpf2go -go-package datapath -output-dir pkg/datapath -output-stem to_uplink -target bpfel -no-global-types toUplink bpf/to_uplink.c
//go:generate go tool bpf2go -go-package datapath -output-dir pkg/datapath -output-stem sock -target bpfel -no-global-types sock bpf/sock.c

// The node tunnel device (docs/tunnel.md): tcx ingress (the trust rule) and egress (the destination node).
//go:generate go tool bpf2go -go-package datapath -output-dir pkg/datapath -output-stem tunnel -target bpfel -no-global-types tunnel bpf/tunnel.c

// The compat build of the same programs for kernels without bpf_timer (5.15) or bpf_loop (5.17),
// or with those forced off (docs/compat.md): EBPF_CNI_COMPAT arms no flow timers and walks the
// masquerade port probes in a bounded loop.
//go:generate go tool bpf2go -go-package datapath -output-dir pkg/datapath -output-stem from_container_compat -target bpfel -no-global-types fromContainerCompat bpf/from_container.c -- -DEBPF_CNI_COMPAT
//go:generate go tool bpf2go -go-package datapath -output-dir pkg/datapath -output-stem to_container_compat -target bpfel -no-global-types toContainerCompat bpf/to_container.c -- -DEBPF_CNI_COMPAT
//go:generate go tool bpf2go -go-package datapath -output-dir pkg/datapath -output-stem from_uplink_compat -target bpfel -no-global-types fromUplinkCompat bpf/from_uplink.c -- -DEBPF_CNI_COMPAT
//go:generate go tool bpf2go -go-package datapath -output-dir pkg/datapath -output-stem to_uplink_compat -target bpfel -no-global-types toUplinkCompat bpf/to_uplink.c -- -DEBPF_CNI_COMPAT
//go:generate go tool bpf2go -go-package datapath -output-dir pkg/datapath -output-stem sock_compat -target bpfel -no-global-types sockCompat bpf/sock.c -- -DEBPF_CNI_COMPAT

// The pin-name hash of each object above (pkg/datapath/objhash_bpfel.go): after them.
//go:generate go run ./pkg/datapath/internal/objhashgen
