package endpoint

import (
	"fmt"
	"strings"
	"testing"
)

func TestMasqPorts(t *testing.T) {
	def := [2]int{32768, 60999}
	for _, c := range []struct {
		configured string
		limit      int
		eph        [2]int
		reserved   string // ip_local_reserved_ports
		want       string // ranges, or an error's words
		wantLimit  uint32
		reserve    string // what ADD must reserve first
	}{
		// The kernel's default ephemeral range: everything from 1024 but it
		// and the NodePort range.
		{"", 0, def, "", "1024-29999,61000-65535", 33512 / 8, ""},
		{"", 0, [2]int{40000, 50000}, "", "1024-29999,32768-39999,50001-65535", (28976 + 7232 + 15535) / 8, ""},
		{"", 100, def, "", "1024-29999,61000-65535", 100, ""},
		// Reserved ports inside the ephemeral range are not taken by default
		// (someone reserved them to bind them).
		{"", 0, def, "50000-50100", "1024-29999,61000-65535", 33512 / 8, ""},
		// An ephemeral range covering (nearly) everything: the fallback,
		// reserved from the kernel's choice unless it is already.
		{"", 0, [2]int{1024, 65535}, "", "61000-65535", 4536 / 8, "61000-65535"},
		{"", 0, [2]int{1024, 65000}, "", "61000-65535", 4536 / 8, "61000-65535"},
		{"", 0, [2]int{1024, 65535}, "30000-32767,61000-65535", "61000-65535", 4536 / 8, ""},
		{"", 0, [2]int{1024, 65535}, "62000-65535", "61000-65535", 4536 / 8, "61000-65535"},
		{"61000-62999", 0, def, "", "61000-62999", 250, ""},
		{"50000-62999", 0, def, "", "overlaps the node's ip_local_port_range 32768-60999 in 11000 ports", 0, ""},
		// A configured range inside the ephemeral range whose ports the node reserved.
		{"50000-62999", 0, def, "50000-60999", "50000-62999", 1625, ""},
		{"61000-61099", 101, def, "", "ipMasqPodPortLimit: 101 is out of range (1-100", 0, ""},
	} {
		m, err := newMasq(true, nil, c.configured, c.limit)
		if err != nil {
			t.Fatalf("%q: %v", c.configured, err)
		}
		res, err := parsePortList(c.reserved)
		if err != nil {
			t.Fatal(err)
		}
		p, toReserve, err := masqPorts(m.portRange, m.podLimit, NodePorts{Ephemeral: c.eph, Reserved: res})
		if err != nil {
			if !strings.Contains(err.Error(), c.want) || c.wantLimit != 0 {
				t.Errorf("%q with %v reserved %q: %v, want %s", c.configured, c.eph, c.reserved, err, c.want)
			}
			continue
		}
		gotReserve := ""
		if toReserve != nil {
			gotReserve = fmt.Sprintf("%d-%d", toReserve[0], toReserve[1])
		}
		if p.String() != c.want || p.PodLimit != c.wantLimit || gotReserve != c.reserve {
			t.Errorf("%q with %v reserved %q: %s limit %d reserve %q, want %s limit %d reserve %q",
				c.configured, c.eph, c.reserved, p, p.PodLimit, gotReserve, c.want, c.wantLimit, c.reserve)
		}
	}
	for _, bad := range []string{"70000-71000", "1000-2000", "5000", "6000-5000", "a-b"} {
		if _, err := newMasq(true, nil, bad, 0); err == nil || !strings.Contains(err.Error(), "ipMasqPortRange") {
			t.Errorf("ipMasqPortRange %q: %v, want an error naming the field", bad, err)
		}
	}
	if _, err := newMasq(true, nil, "", -1); err == nil || !strings.Contains(err.Error(), "ipMasqPodPortLimit") {
		t.Errorf("negative limit: %v", err)
	}
}

func TestNodePortsOverlap(t *testing.T) {
	res, err := parsePortList("30000-32767, 40000,41000-41999\n")
	if err != nil || len(res) != 3 || res[1] != [2]int{40000, 40000} {
		t.Fatalf("parsePortList: %v %v", res, err)
	}
	n := NodePorts{Ephemeral: [2]int{1024, 65535}, Reserved: res}
	if got := n.Unreserved(39990, 42010); got != 2021-1-1000 {
		t.Errorf("Unreserved(39990, 42010) = %d, want 1020", got)
	}
	if _, err := parsePortList("5-3"); err == nil {
		t.Error("parsePortList took 5-3")
	}
}
