package maps

import (
	"errors"
	"net"

	"github.com/cilium/ebpf"
)

// Helpers only the tests use (kept out of the product code).

// IsFull tells whether err is a write refused by a full map.
func IsFull(err error) bool { return errors.Is(err, ErrFull) }

// refs is the cluster CIDRs' reference map.
func (m *Maps) refs() *ebpf.Map { return m.byName[nameClusterRefs] }

// Put records that ip lives behind the host veth in info, replacing
// whatever entry it had (ADD uses Insert).
func (e Endpoints) Put(ip net.IP, info EndpointInfo) error {
	k, err := KeyFor(ip)
	if err != nil {
		return err
	}
	if err := e.m.endpoints.Put(&k, &info); err != nil {
		return writeErr(e.m.endpoints, nameEndpoints, "endpoint "+ip.String(), err)
	}
	return nil
}
