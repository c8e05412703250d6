package agent

import (
	"encoding/binary"
	"net"
	"testing"

	"github.com/vishvananda/netlink/nl"
)

// The outer UDP checksum is asked for over IPv6 only (docs/tunnel.md):
// the receiving VXLAN socket drops IPv6 datagrams without one.
func TestTunnelEncapFlags(t *testing.T) {
	for _, c := range []struct {
		dst  string
		typ  int
		want uint16
	}{{"10.77.2.1", nl.LWTUNNEL_ENCAP_IP, tunnelDontFragment}, {"fd77:2::1", nl.LWTUNNEL_ENCAP_IP6, tunnelDontFragment | tunnelCsum}} {
		e := &tunnelEncap{Dst: net.ParseIP(c.dst)}
		if e.Type() != c.typ {
			t.Errorf("%s: type %d, want %d", c.dst, e.Type(), c.typ)
		}
		b, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		var flags *uint16
		for len(b) >= 4 {
			l, typ := int(nl.NativeEndian().Uint16(b)), nl.NativeEndian().Uint16(b[2:])
			if l < 4 || l > len(b) {
				t.Fatalf("%s: bad attribute length %d", c.dst, l)
			}
			if typ == lwtIPFlags && l == 6 {
				f := binary.BigEndian.Uint16(b[4:])
				flags = &f
			}
			b = b[(l+3)&^3:]
		}
		if flags == nil || *flags != c.want {
			t.Errorf("%s: flags %v, want %#04x", c.dst, flags, c.want)
		}
	}
}
