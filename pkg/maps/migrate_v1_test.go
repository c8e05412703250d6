package maps

import (
	"encoding/binary"
	"testing"

	"github.com/cilium/ebpf"
)

// Flows of layout 1 (e383872) keep, in this layout, the lifetime layout 1
// gave them and the FINs it saw: its state bits are not this layout's.
// Before, they were copied as they were: an established TCP flow came over
// in the handshake's state (120 s idle, not 1 h), a FIN from the pod as
// "replied", and a UDP flow unreplied (30 s, not 120 s).
func TestMigrateV1FlowStates(t *testing.T) {
	m := testMaps(t, DefaultSizing)
	oldMap := func(key, val any) *ebpf.Map {
		t.Helper()
		om, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: uint32(binary.Size(key)),
			ValueSize: uint32(binary.Size(val)), MaxEntries: 16})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { om.Close() })
		return om
	}

	snat := oldMap(SNATKey{}, snatValV1{})
	flows := []struct {
		proto uint8
		v1    uint16
		want  string
	}{
		{ProtoTCP, 0, "established"},
		{ProtoTCP, snatV1FinOut, "fin-wait"},
		{ProtoTCP, snatV1Closing | snatV1FinOut | snatV1FinIn, "closing"},
		{ProtoUDP, 0, "stream"},
		{1 /* ICMP */, 0, "unreplied"},
	}
	for i, f := range flows {
		k := SNATKey{Proto: f.proto, Family: 2, Port: uint16(1000 + i)}
		if err := snat.Put(&k, &snatValV1{Flags: f.v1, SeenNs: 42}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := copySNATV1(snat, m.byName[nameSNAT], nameSNAT); err != nil || n != len(flows) {
		t.Fatalf("copy: %d, %v", n, err)
	}
	for i, f := range flows {
		k := SNATKey{Proto: f.proto, Family: 2, Port: uint16(1000 + i)}
		var v SNATVal
		if err := m.byName[nameSNAT].Lookup(&k, &v); err != nil {
			t.Fatal(err)
		}
		if got := FlowState(f.proto, uint32(v.Flags)); got != f.want || v.SeenNs != 42 {
			t.Errorf("layout 1 flow, proto %d, flags %#x: state %q (flags %#x), last use %d; want %q, 42", f.proto, f.v1, got, v.Flags, v.SeenNs, f.want)
		}
	}

	ct := oldMap(CTKey{}, ctValV1{})
	for i, p := range []uint8{ProtoTCP, ProtoUDP} {
		k := CTKey{Proto: p, Family: 2, PodPort: uint16(2000 + i)}
		if err := ct.Put(&k, &ctValV1{Flags: 1 /* CT_F_SNAT */}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := copyCTV1(ct, m.byName[nameCT], nameCT); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		proto uint8
		want  string
	}{{ProtoTCP, "established"}, {ProtoUDP, "stream"}} {
		k := CTKey{Proto: c.proto, Family: 2, PodPort: uint16(2000 + i)}
		var v CTVal
		if err := m.byName[nameCT].Lookup(&k, &v); err != nil {
			t.Fatal(err)
		}
		if got := FlowState(c.proto, v.Flags&^1); got != c.want || v.Flags&1 == 0 {
			t.Errorf("layout 1 hostPort flow, proto %d: state %q (flags %#x), want %q with CT_F_SNAT kept", c.proto, got, v.Flags, c.want)
		}
	}
}
