package maps

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// TestSyncTunnelSelf: cni_tun_self holds exactly the last addresses given
// and is in force (HP_CFG_TUN_SELF) only while it holds them all: none,
// or more than fit (a full map), takes it out of force, so the tunnel
// device never drops a genuine node's datagram for a list cut short. The
// node hooks' Enable keeps the tunnel's bits; Tunnel().SetMode(false) clears them
// and the list.
func TestSyncTunnelSelf(t *testing.T) {
	needRoot(t)
	self, err := ebpf.NewMap(&ebpf.MapSpec{Name: "tun_self_t", Type: ebpf.Hash, KeySize: 20, ValueSize: 4, MaxEntries: 4})
	if err != nil {
		t.Fatalf("create a hash map (needs root): %v", err)
	}
	defer self.Close()
	cfg, err := ebpf.NewMap(&ebpf.MapSpec{Name: "hp_config_t", Type: ebpf.Array, KeySize: 4, ValueSize: 16, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cfg.Close()
	m := &Maps{byName: map[string]*ebpf.Map{nameTunSelf: self, nameHPConfig: cfg}}
	state := func() (n int, inForce, tunnel, macCheck bool) {
		var k EndpointKey
		var v uint32
		for it := self.Iterate(); it.Next(&k, &v); {
			n++
		}
		c, err := m.Node().Config()
		if err != nil {
			t.Fatal(err)
		}
		tunnel, inForce, macCheck = c.Tunnel()
		return n, inForce, tunnel, macCheck
	}
	addrs := func(n int) []netip.Addr {
		var out []netip.Addr
		for i := 0; i < n; i++ {
			out = append(out, netip.MustParseAddr(fmt.Sprintf("10.0.0.%d", i+1)))
		}
		return out
	}
	if err := m.Tunnel().SetMode(true, false); err != nil {
		t.Fatal(err)
	}
	if err := m.Tunnel().SyncSelf(append(addrs(2), netip.MustParseAddr("fd00::1"))); err != nil {
		t.Fatal(err)
	}
	if n, on, tun, mac := state(); n != 3 || !on || !tun || mac {
		t.Fatalf("3 addresses: %d entries, in force %v, tunnel %v, MAC check %v", n, on, tun, mac)
	}
	// The node hooks set up again: the tunnel's bits stay.
	if err := m.Node().Enable(1, 2, false); err != nil {
		t.Fatal(err)
	}
	if _, on, tun, mac := state(); !on || !tun || mac {
		t.Fatalf("after Enable: in force %v, tunnel %v, MAC check %v", on, tun, mac)
	}
	if err := m.Tunnel().SyncSelf(addrs(1)); err != nil {
		t.Fatal(err)
	}
	if n, on, _, _ := state(); n != 1 || !on {
		t.Fatalf("1 address: %d entries, in force %v", n, on)
	}
	err = m.Tunnel().SyncSelf(addrs(5))
	if !IsFull(err) {
		t.Fatalf("5 addresses in a map of 4: %v, want ErrFull", err)
	}
	if _, on, _, _ := state(); on {
		t.Fatal("a list cut short is in force")
	}
	if err := m.Tunnel().SyncSelf(addrs(2)); err != nil {
		t.Fatal(err)
	}
	if err := m.Tunnel().SetMode(false, true); err != nil {
		t.Fatal(err)
	}
	if n, on, tun, mac := state(); n != 0 || on || tun || !mac {
		t.Fatalf("tunnel off: %d entries, in force %v, tunnel %v, MAC check %v", n, on, tun, mac)
	}
	// A pin set without the map (an older build): nothing written, no error.
	old := &Maps{byName: map[string]*ebpf.Map{nameHPConfig: cfg}}
	if err := old.Tunnel().SyncSelf(addrs(1)); err != nil {
		t.Fatal(err)
	}
}
