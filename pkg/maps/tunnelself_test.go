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
	m := &Maps{dir: t.TempDir(), byName: map[string]*ebpf.Map{nameTunSelf: self, nameHPConfig: cfg}}
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
	// A full list with one address replaced stays in force: the stale
	// address goes before the new one is written (the review of round 5:
	// the write came first, was refused by the full map, and took the
	// check out of force).
	if err := m.Tunnel().SyncSelf(addrs(4)); err != nil {
		t.Fatal(err)
	}
	if err := m.Tunnel().SyncSelf(append(addrs(3), netip.MustParseAddr("10.0.0.9"))); err != nil {
		t.Fatalf("a full list with one address replaced: %v", err)
	}
	if n, on, _, _ := state(); n != 4 || !on {
		t.Fatalf("a full list with one address replaced: %d entries, in force %v", n, on)
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
	old := &Maps{dir: t.TempDir(), byName: map[string]*ebpf.Map{nameHPConfig: cfg}}
	if err := old.Tunnel().SyncSelf(addrs(1)); err != nil {
		t.Fatal(err)
	}
}

// TestNodeConfigWritersSerialised: the node hooks' Enable (an ADD's) and the
// agent's tunnel writers rewrite the one cni_hp_config value; each reads it,
// changes its bits and writes it back, under the maps directory's lock. A
// write made from a stale read undid the other's: the hooks turned off (a
// cookie and flags of before) or the tunnel's bits lost (the review of
// round 5). Two processes' worth of writers race here; the last of each
// must hold.
func TestNodeConfigWritersSerialised(t *testing.T) {
	needRoot(t)
	cfg, err := ebpf.NewMap(&ebpf.MapSpec{Name: "hp_config_t", Type: ebpf.Array, KeySize: 4, ValueSize: 16, MaxEntries: 1})
	if err != nil {
		t.Fatalf("create an array map (needs root): %v", err)
	}
	defer cfg.Close()
	dir := t.TempDir()
	// Two openings of the same maps, as an ADD and the agent have.
	hooks := &Maps{dir: dir, byName: map[string]*ebpf.Map{nameHPConfig: cfg}}
	agent := &Maps{dir: dir, byName: map[string]*ebpf.Map{nameHPConfig: cfg}}
	const rounds = 10000
	done := make(chan error, 2)
	go func() {
		for i := 1; i <= rounds; i++ {
			if err := hooks.Node().Enable(uint64(i), uint32(i), false); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	go func() {
		for i := 1; i <= rounds; i++ {
			// macCheck alternates, so that every call writes.
			if err := agent.Tunnel().SetMode(true, i%2 == 0); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for i := 0; i < 2; i++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	c, err := hooks.Node().Config()
	if err != nil {
		t.Fatal(err)
	}
	tunnel, _, macCheck := c.Tunnel()
	if !c.Enabled() || c.NetnsCookie != rounds || c.HooksId != rounds || !tunnel || !macCheck {
		t.Fatalf("after both writers: enabled %v cookie %d hooks %d tunnel %v macCheck %v, want true %d %d true true",
			c.Enabled(), c.NetnsCookie, c.HooksId, tunnel, macCheck, rounds, rounds)
	}
}
