package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestLoadPeers(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "peers.json")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ps, err := LoadPeers(write(`[{"nodeIP": "10.0.0.2", "nodeIPs": ["fd00::2"], "podCIDRs": ["10.244.1.0/24", "fd00:10:244:1::/64"]},
		{"nodeIPs": ["fd00::3"], "podCIDRs": ["fd00:10:244:3::/64"]}]`))
	if err != nil {
		t.Fatal(err)
	}
	if got := ps[0].ips(); !reflect.DeepEqual(got, []string{"10.0.0.2", "fd00::2"}) {
		t.Fatalf("ips of the dual-stack peer: %v", got)
	}
	if got := ps[1].ips(); !reflect.DeepEqual(got, []string{"fd00::3"}) {
		t.Fatalf("ips of the IPv6 peer: %v", got)
	}
	for in, want := range map[string]string{
		`[{"podCIDRs": ["10.244.1.0/24"]}]`:                             "[0]: nodeIP missing",
		`[{"nodeIP": "x", "podCIDRs": []}]`:                             `[0].nodeIP: "x" is not an IP address`,
		`[{"nodeIP": "10.0.0.2", "nodeIPs": ["y"], "podCIDRs": []}]`:    `[0].nodeIPs[0]: "y" is not an IP address`,
		`[{"nodeIP": "10.0.0.2", "podCIDRs": ["10.244.1.0/33"]}]`:       `[0].podCIDRs[0]: "10.244.1.0/33" is not a CIDR`,
		`{"nodeIP": "10.0.0.2"}`:                                        "cannot unmarshal",
		`[{"nodeIP": "10.0.0.2", "podCIDRs": ["0.0.0.0/0"]}]`:           `[0].podCIDRs[0]: "0.0.0.0/0" is a default route`,
		`[{"nodeIP": "10.0.0.2", "podCIDRs": ["10.1.0.0/16", "::/0"]}]`: `[0].podCIDRs[1]: "::/0" is a default route`,
		`[{"nodeIP": "10.0.0.2", "podCIDRs": ["10.244.0.0/16"]}, {"nodeIP": "10.0.0.3", "podCIDRs": ["fd00::/64", "10.244.3.0/24"]}]`:  `[1].podCIDRs[1]: "10.244.3.0/24" overlaps [0].podCIDRs[0] "10.244.0.0/16"`,
		`[{"nodeIP": "10.0.0.2", "podCIDRs": ["10.244.2.0/24"]}, {"nodeIP": "203.0.113.3", "podCIDRs": ["0.0.0.0/1", "128.0.0.0/1"]}]`: `[1].podCIDRs[0]: "0.0.0.0/1" holds node address 10.0.0.2 of [0]`,
		`[{"nodeIP": "10.0.0.2", "podCIDRs": ["10.0.0.0/8"]}]`:                                                                         `[0].podCIDRs[0]: "10.0.0.0/8" holds node address 10.0.0.2 of [0]`,
		`[{"nodeIP": "10.0.0.2", "nodeIPs": ["fd00::2"], "podCIDRs": ["fd00::/16"]}]`:                                                  `"fd00::/16" holds node address fd00::2`,
		`[{"nodeIP": "10.0.0.2", "podCIDRs": ["::ffff:0.0.0.0/96"]}]`:                                                                  `"::ffff:0.0.0.0/96" is an IPv4-mapped IPv6 prefix`,
	} {
		if _, err := LoadPeers(write(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err %v, want it to say %q", in, err, want)
		}
	}
}

// TestPeersView: a peers file is the cluster as the Node objects give it
// (follower.nodeClusterCIDRs): every entry, this node's included, with its
// addresses (nodeIP then nodeIPs, IPv4-mapped ones unmapped) and its pod
// CIDRs masked.
func TestPeersView(t *testing.T) {
	v := peersView([]Peer{
		{NodeIP: "10.0.0.1", NodeIPs: []string{"fd00::1"}, PodCIDRs: []string{"10.244.0.0/24", "fd00:10:244::/64"}},
		{NodeIPs: []string{"::ffff:10.0.0.2"}, PodCIDRs: []string{"10.244.1.7/24"}},
	})
	if len(v.Nodes) != 2 || v.Self != nil {
		t.Fatalf("view %+v, want two nodes and no self", v)
	}
	got := fmt.Sprint(v.Nodes[0].InternalIPs, v.Nodes[0].PodCIDRs, v.Nodes[1].InternalIPs, v.Nodes[1].PodCIDRs)
	if want := "[10.0.0.1 fd00::1] [10.244.0.0/24 fd00:10:244::/64] [10.0.0.2] [10.244.1.0/24]"; got != want {
		t.Errorf("view %s, want %s", got, want)
	}
}
