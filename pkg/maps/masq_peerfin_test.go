package maps

import "testing"

// TestSNATFwdSeenPeerFIN: while a FIN of the peer's waits on a forward TCP
// entry (SNAT_F_PEER_FIN), its seen_ns low word is the FIN's end, not a
// time: dump nat reads the latest time the high word stands for, as the
// datapath does for the entry's expiry (snat_fwd_seen). Other entries, and
// the same bit on UDP (no such FIN), are read as they are.
func TestSNATFwdSeenPeerFIN(t *testing.T) {
	const seen = 0x0000_0123_0456_789a
	for _, c := range []struct {
		proto uint8
		flags uint16
		want  uint64
	}{
		{ProtoTCP, snatPeerFIN, 0x0000_0123_ffff_ffff},
		{ProtoTCP, 0, seen},
		{ProtoUDP, snatPeerFIN, seen},
	} {
		if got := snatFwdSeen(c.proto, SNATVal{Flags: c.flags, SeenNs: seen}); got != c.want {
			t.Errorf("proto %d, flags %#x: %#x, want %#x", c.proto, c.flags, got, c.want)
		}
	}
}
