module github.com/ebpf-cni/ebpf-cni

go 1.26.8

require (
	github.com/cilium/ebpf v0.22.0
	github.com/containernetworking/cni v1.3.0
	github.com/containernetworking/plugins v1.9.1
	github.com/prometheus/client_golang v1.25.0
	github.com/vishvananda/netlink v1.3.1
	golang.org/x/sys v0.49.0
)

require (
	github.com/alexflint/go-filemutex v1.3.0 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/coreos/go-iptables v0.8.0 // indirect
	github.com/mattn/go-shellwords v1.0.12 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/safchain/ethtool v0.6.2 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	sigs.k8s.io/knftables v0.0.18 // indirect
)

tool (
	github.com/cilium/ebpf/cmd/bpf2go
	github.com/containernetworking/cni/cnitool
	github.com/containernetworking/plugins/plugins/ipam/host-local
	github.com/containernetworking/plugins/plugins/ipam/static
	github.com/containernetworking/plugins/plugins/main/loopback
	github.com/containernetworking/plugins/plugins/main/ptp
	github.com/containernetworking/plugins/plugins/meta/bandwidth
	github.com/containernetworking/plugins/plugins/meta/portmap
	github.com/containernetworking/plugins/plugins/meta/tuning
)
