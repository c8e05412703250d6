package maps

import (
	"errors"

	"github.com/cilium/ebpf"
)

// Helpers only the tests use (kept out of the product code).

// IsFull tells whether err is a write refused by a full map.
func IsFull(err error) bool { return errors.Is(err, ErrFull) }

// refs is the cluster CIDRs' reference map.
func (m *Maps) refs() *ebpf.Map { return m.byName[nameClusterRefs] }
