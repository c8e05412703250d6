package datapath

import (
	"net"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
)

// Map writes only tests make (kept out of pkg/maps' API): the programs'
// inputs set up directly, where a verb would go through its checks.

// putEndpoint records that ip lives behind the host veth in info, over
// whatever entry it had (an ADD uses Endpoints().Insert).
func putEndpoint(m *maps.Maps, ip net.IP, info maps.EndpointInfo) error {
	k, err := maps.KeyFor(ip)
	if err != nil {
		return err
	}
	return mapstest.Map(m, "cni_endpoints").Put(&k, &info)
}

// putCT writes a hostPort flow entry (the programs create them). One
// without times is taken as created and last used now (the programs treat
// one idle past its timeout as absent).
func putCT(m *maps.Maps, k maps.CTKey, v maps.CTVal) error {
	if v.SeenNs == 0 {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			return err
		}
		v.SeenNs = uint64(ts.Nano())
	}
	if v.CreatedNs == 0 {
		v.CreatedNs = v.SeenNs
	}
	return mapstest.Map(m, "cni_ct").Put(&k, &v)
}
