package maps

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net"
)

// MasqKeysVal is cni_masq_keys' value (bpf/lib/types.h).
type MasqKeysVal = mapsObjMasqKeys

var nameMasqKeys = mapName(&specNames.CniMasqKeys)

// MasqKeys are a network's masquerade keys as configured ("" and 0: the
// defaults). cni_masq_config is node-wide: every network on a pin
// directory masquerades from the same ports, so their keys must agree.
type MasqKeys struct {
	Network   string
	PortRange string // ipMasqPortRange
	PodLimit  int    // ipMasqPodPortLimit
}

func (k MasqKeys) hash() uint64 {
	s := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d", k.PortRange, k.PodLimit))
	return binary.LittleEndian.Uint64(s[:8])
}

// MasqKeysConflict is Masq().ClaimConfig's refusal: another network decided
// the node's masquerade ports with other keys, and pods masquerade with
// them.
type MasqKeysConflict struct {
	Network string // the network that wrote cni_masq_config
	Users   int    // masquerading pod addresses other than the caller's
}

func (e *MasqKeysConflict) Error() string {
	return fmt.Sprintf("network %q decided the node's masquerade ports (cni_masq_config) with other ipMasqPortRange or ipMasqPodPortLimit, and %d masquerading pod addresses use them",
		e.Network, e.Users)
}

// ClaimConfig writes p (computed from k) to cni_masq_config for
// network k.Network, under the map directory's lock. A network whose keys
// differ from those of the network that wrote it last is refused with a
// *MasqKeysConflict while any pod address but self masquerades (ADDs of
// two networks would otherwise overwrite each other's ports, and the
// other's pods would leave from ports it did not configure); with none
// left, or from the same network (its configuration was edited), it takes
// over. Pins of an older build of the layout (no cni_masq_keys): written
// as before.
func (ms Masq) ClaimConfig(k MasqKeys, p MasqPorts, self []net.IP) error {
	mk := ms.m.get(nameMasqKeys)
	if mk == nil {
		return ms.SetConfig(p)
	}
	unlock, err := ms.m.lock()
	if err != nil {
		return err
	}
	defer unlock()
	zero := uint32(0)
	var have MasqKeysVal
	if err := mk.Lookup(&zero, &have); err != nil {
		return fmt.Errorf("read %s: %w", nameMasqKeys, err)
	}
	want := MasqKeysVal{Keys: k.hash()}
	copy(want.Network[:len(want.Network)-1], k.Network)
	if have != (MasqKeysVal{}) && have.Keys != want.Keys && have.Network != want.Network {
		n, err := ms.m.masqUsers(self)
		if err != nil {
			return err
		}
		if n > 0 {
			return &MasqKeysConflict{Network: string(bytes.TrimRight(have.Network[:], "\x00")), Users: n}
		}
	}
	if err := ms.SetConfig(p); err != nil {
		return err
	}
	if have != want {
		if err := mk.Put(&zero, &want); err != nil {
			return fmt.Errorf("write %s: %w", nameMasqKeys, err)
		}
	}
	return nil
}

// masqUsers counts the masquerading pod addresses in cni_endpoints but self.
func (m *Maps) masqUsers(self []net.IP) (int, error) {
	eps, err := m.Endpoints().List()
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", nameEndpoints, err)
	}
	n := 0
next:
	for _, e := range eps {
		if e.Info.Flags&EndpointFlagMasq == 0 {
			continue
		}
		for _, ip := range self {
			if ip.Equal(e.IP) {
				continue next
			}
		}
		n++
	}
	return n, nil
}
