package mapstest

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestEncodings holds this package's encodings to the product's: what it
// deletes is what the product wrote, what it writes the product reads back
// as written, IPv4 and IPv6.
func TestEncodings(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root; CI runs as root")
		}
		t.Skip("needs root (creates BPF maps)")
	}
	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("ebpf-cni-unit-mapstest-%d", os.Getpid()))
	os.RemoveAll(dir)
	t.Cleanup(func() { os.RemoveAll(dir) })
	m, err := maps.Create(dir, maps.Sizing{MaxPods: 1, HostPortsPerPod: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	cidrs := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("fd00:1::/64")}
	must(m.Masq().AcquireClusterCIDRs(1, cidrs))
	for _, p := range cidrs {
		if err := DeleteClusterCIDR(m, p); err != nil {
			t.Errorf("delete %s the product put: %v", p, err)
		}
	}
	if got, err := m.Masq().ClusterCIDRs(); err != nil || len(got) != 0 {
		t.Fatalf("cluster CIDRs after deleting them: %v %v", got, err)
	}
	for _, p := range cidrs {
		must(PutClusterCIDR(m, p))
	}
	got, err := m.Masq().ClusterCIDRs()
	must(err)
	slices.SortFunc(got, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	if !slices.Equal(got, cidrs) {
		t.Errorf("the product reads %v back, want %v", got, cidrs)
	}

	for _, s := range []uint32{1, 2, 255} {
		if got := SlotOfFlags(maps.EndpointFlagsOfSlot(s) | maps.EndpointFlagMasq | maps.EndpointFlagPolicy); got != s {
			t.Errorf("SlotOfFlags of slot %d's flags: %d", s, got)
		}
	}

	slot, err := m.StackFlows().TakeSlot(7, func(int) bool { return true })
	must(err)
	var k maps.StackFlowKey
	k.Family, k.Proto, k.Port, k.PeerPort = afInet6, 6, 0x3412, 0x5000 // ports 0x1234 and 80, network order
	k.Addr[15], k.PeerAddr[15] = 1, 2
	k.Addr[0], k.PeerAddr[0] = 0xfd, 0xfd
	must(PutSlotRecord(m, slot, k, maps.StackFlowVal{Ifindex: 7, Flags: maps.StackFlowPeerPod}))
	mine, err := SlotRecords(m, slot)
	must(err)
	theirs, err := m.StackFlows().List()
	must(err)
	if len(mine) != 1 || len(theirs) != 1 {
		t.Fatalf("records: %v here, %v by the product; want one each", mine, theirs)
	}
	theirs[0].Idle = 0
	if mine[0] != theirs[0] || mine[0].Pod.Port() != 0x1234 || mine[0].Peer.Port() != 80 || mine[0].Ifindex != 7 {
		t.Errorf("record read back %+v, the product reads %+v", mine[0], theirs[0])
	}
}
