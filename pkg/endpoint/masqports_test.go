package endpoint

import (
	"strings"
	"testing"
)

func TestMasqPorts(t *testing.T) {
	for _, c := range []struct {
		configured string
		limit      int
		eph        [2]int
		want       string // ranges, or an error's words
		wantLimit  uint32
	}{
		// The kernel's default ephemeral range: everything from 1024 but it
		// and the NodePort range.
		{"", 0, [2]int{32768, 60999}, "1024-29999,61000-65535", 33512 / 8},
		{"", 0, [2]int{40000, 50000}, "1024-29999,32768-39999,50001-65535", (28976 + 7232 + 15535) / 8},
		{"", 100, [2]int{32768, 60999}, "1024-29999,61000-65535", 100},
		// An ephemeral range covering nearly everything leaves too few.
		{"", 0, [2]int{1024, 65000}, "leaves 535 ports", 0},
		{"61000-62999", 0, [2]int{32768, 60999}, "61000-62999", 250},
		{"50000-62999", 0, [2]int{32768, 60999}, "overlaps the node's ip_local_port_range 32768-60999", 0},
		{"61000-61099", 101, [2]int{32768, 60999}, "ipMasqPodPortLimit: 101 is out of range (1-100", 0},
	} {
		m, err := newMasq(true, nil, c.configured, c.limit)
		if err != nil {
			t.Fatalf("%q: %v", c.configured, err)
		}
		p, err := masqPorts(m.portRange, m.podLimit, c.eph)
		if err != nil {
			if !strings.Contains(err.Error(), c.want) || c.wantLimit != 0 {
				t.Errorf("%q with %v: %v, want %s", c.configured, c.eph, err, c.want)
			}
			continue
		}
		if p.String() != c.want || p.PodLimit != c.wantLimit {
			t.Errorf("%q with %v: %s limit %d, want %s limit %d", c.configured, c.eph, p, p.PodLimit, c.want, c.wantLimit)
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
