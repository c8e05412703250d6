package integration

import (
	"strings"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack22OneFamilyTaken: the ADD now dumps, for another interface's
// default route, only the families it routes by default (round 16). The
// pod's eth0 (another plugin's veth) holds the default route of one family
// only; ADD of net1 (dual-stack) must succeed, take the other family's
// default and leave the taken one alone, and be reached from the node in
// both families; its DEL leaves eth0's default in place.
func TestAttack22OneFamilyTaken(t *testing.T) {
	for _, fam := range []string{"-4", "-6"} {
		t.Run("taken"+fam, func(t *testing.T) {
			e := testenv.New(t)
			pod := podWithLoUp(t, e)
			id := testenv.RandName("a22fam")
			t.Cleanup(func() { _ = e.Del(pod, id, "net1") })
			cmds := []string{"link add eth0 type veth peer name a22fpeer", "link set eth0 up", "link set a22fpeer up"}
			if fam == "-4" {
				cmds = append(cmds, "addr add 10.254.0.2/24 dev eth0", "route add default via 10.254.0.1 dev eth0")
			} else {
				cmds = append(cmds, "addr add fd00:254::2/64 dev eth0 nodad", "route add default via fd00:254::1 dev eth0")
			}
			a22Batch(t, pod, cmds)
			res, err := a22Add(e, pod, id, "net1")
			if err != nil {
				t.Fatalf("ADD net1 beside eth0's %s default: %v", fam, err)
			}
			v4, v6 := podDefaults(t, pod)
			taken, free := strings.TrimSpace(v4), strings.TrimSpace(v6)
			if fam == "-6" {
				taken, free = free, taken
			}
			if taken != "eth0" || free != "net1" {
				t.Errorf("pod defaults after ADD net1: v4 %q, v6 %q; want the %s one eth0's alone, the other net1's", v4, v6, fam)
			}
			p4, p6 := testenv.PodIPs(t, res)
			a18PingAll(t, "node to net1", e.Node, p4, p6)
			other := testenv.NodeIP6
			if fam == "-6" {
				other = testenv.NodeIP4
			}
			a18PingAll(t, "pod to node by net1's default", pod, other)
			if err := e.Del(pod, id, "net1"); err != nil {
				t.Fatalf("DEL net1: %v", err)
			}
			if r := ipInPod(t, pod, fam, "route", "show", "default"); !strings.Contains(r, "dev eth0") {
				t.Errorf("eth0's %s default after net1's DEL: %q", fam, r)
			}
			e.AssertClean()
		})
	}
}

// TestAttack22V4OnlyBesideTaken: an IPv4-only net1 (its pod side dumps
// only the IPv4 table now) beside eth0 (another plugin's, dual-stack, both
// defaults): ADD succeeds, takes neither default, the node reaches net1's
// address, and DEL leaves both of eth0's defaults.
func TestAttack22V4OnlyBesideTaken(t *testing.T) {
	e := testenv.New(t)
	e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir,
		"ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4}}}}
	pod := podWithLoUp(t, e)
	id := testenv.RandName("a22v4")
	t.Cleanup(func() { _ = e.Del(pod, id, "net1") })
	a22Batch(t, pod, []string{"link add eth0 type veth peer name a22fpeer", "link set eth0 up", "link set a22fpeer up",
		"addr add 10.254.0.2/24 dev eth0", "route add default via 10.254.0.1 dev eth0",
		"addr add fd00:254::2/64 dev eth0 nodad", "route add default via fd00:254::1 dev eth0"})
	res, err := a22Add(e, pod, id, "net1")
	if err != nil {
		t.Fatalf("ADD v4-only net1 beside eth0: %v", err)
	}
	if v4, v6 := podDefaults(t, pod); strings.TrimSpace(v4) != "eth0" || strings.TrimSpace(v6) != "eth0" {
		t.Errorf("pod defaults after ADD net1: v4 %q, v6 %q; want eth0's alone", v4, v6)
	}
	if len(res.IPs) != 1 {
		t.Fatalf("v4-only result: %+v", res.IPs)
	}
	a18PingAll(t, "node to net1", e.Node, res.IPs[0].Address.IP)
	if err := e.Del(pod, id, "net1"); err != nil {
		t.Fatalf("DEL net1: %v", err)
	}
	if v4, v6 := podDefaults(t, pod); strings.TrimSpace(v4) != "eth0" || strings.TrimSpace(v6) != "eth0" {
		t.Errorf("pod defaults after DEL net1: v4 %q, v6 %q; want eth0's", v4, v6)
	}
	e.AssertClean()
}
