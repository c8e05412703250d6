package maps

import (
	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/bpfname"
)

// specNames is never filled: the addresses of its fields name the maps, by
// the C names bpf2go recorded for them (a map renamed in bpf/lib/maps.h is
// then a compile error here, not a pin nobody opens).
var specNames mapsObjMapSpecs

// mapName is the C name of the map of a field of specNames.
func mapName(field **ebpf.MapSpec) string { return bpfname.Of(&specNames, field) }
