package testenv

import (
	"net"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
)

// Map access only tests need (kept out of pkg/maps' API).

// PutEndpoint records that ip lives behind the host veth in info, over
// whatever entry it had (an ADD uses Endpoints().Insert).
func PutEndpoint(m *maps.Maps, ip net.IP, info maps.EndpointInfo) error {
	k, err := maps.KeyFor(ip)
	if err != nil {
		return err
	}
	return mapstest.Map(m, "cni_endpoints").Put(&k, &info)
}

// LookupNetns returns the cni_netns entry of a netns (by cookie); the
// error wraps ebpf.ErrKeyNotExist when it has none.
func LookupNetns(m *maps.Maps, cookie uint64) (maps.NetnsInfo, error) {
	var v maps.NetnsInfo
	err := mapstest.Map(m, "cni_netns").Lookup(&cookie, &v)
	return v, err
}
