package datapath

import (
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// TestAttachTCXKeepsOtherDevicesPin: a host veth's tcx links pinned under
// its attachment's name, the veth then renamed (an operator; its pins stay
// under that name, orphanPin) and a new veth attached under the same name:
// the attach is refused, and the renamed veth keeps both programs (its pins
// are their last references). The new veth's undo (RemoveLinkPinsOn)
// leaves them too (asserted after the refused attach too, but a removed
// pin's link is released from a work queue: the check after the undo is
// the one that saw the old code's detach). Once the renamed veth is gone its pins are stale and the
// attach replaces them; the undo then removes the new veth's.
//
// Red before twodel30: the attach removed the pins and pinned its own,
// which detached the renamed veth's programs (0 on each hook).
func TestAttachTCXKeepsOtherDevicesPin(t *testing.T) {
	dp := testDatapath(t)
	if haveTCX() != nil {
		t.Fatalf("tcx links are not available on this kernel: %v", haveTCX())
	}
	inNodeNetns(t) // the veths live in a netns of the test's own
	const name = "ebpfpintest"
	must(t, mkdirFor(LinkPinPath(dp.PinRoot, name, DirIngress)))
	progs := map[string]*ebpf.Program{}
	for _, p := range hostVethPrograms {
		prog, err := dp.program(p)
		must(t, err)
		progs[p.Link] = prog
	}
	a := newTestVeth(t, "tpa")
	for _, p := range hostVethPrograms {
		must(t, attachTCXProg(dp.PinRoot, a, name, p, progs[p.Link]))
	}
	la, err := netlink.LinkByIndex(a)
	must(t, err)
	must(t, netlink.LinkSetName(la, "tpa-renamed"))
	b := newTestVeth(t, "tpb")
	for _, p := range hostVethPrograms {
		err := attachTCXProg(dp.PinRoot, b, name, p, progs[p.Link])
		if err == nil || !strings.Contains(err.Error(), "attached to another device") {
			t.Errorf("attach %s to ifindex %d over the pin of ifindex %d's link: %v, want refused", p.Link, b, a, err)
		}
	}
	assertTCXProgs(t, "the renamed veth, after the refused attach", a, progs, 1)
	assertTCXProgs(t, "the new veth, refused", b, progs, 0)
	must(t, RemoveLinkPinsOn(dp.PinRoot, name, b))
	assertTCXProgs(t, "the renamed veth, after the new veth's undo", a, progs, 1)

	must(t, netlink.LinkDel(la)) // its links are attached to no device now: stale pins
	for _, p := range hostVethPrograms {
		must(t, attachTCXProg(dp.PinRoot, b, name, p, progs[p.Link]))
	}
	assertTCXProgs(t, "the new veth, the old pins stale", b, progs, 1)
	must(t, RemoveLinkPinsOn(dp.PinRoot, name, b))
	// A pin's removal releases its link from a work queue (bpf_link_put):
	// the detach follows shortly.
	for deadline := time.Now().Add(2 * time.Second); tcxProgCount(b) != 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	assertTCXProgs(t, "the new veth, after its undo", b, progs, 0)
}

// tcxProgCount is how many programs the host veth hooks of ifindex run
// (-1: a query failed).
func tcxProgCount(ifindex int) int {
	n := 0
	for _, p := range hostVethPrograms {
		res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: p.Attach})
		if err != nil {
			return -1
		}
		n += len(res.Programs)
	}
	return n
}

// newTestVeth adds a veth pair name/name+"p" in the calling thread's netns
// and returns name's ifindex.
func newTestVeth(t *testing.T, name string) int {
	t.Helper()
	must(t, netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}))
	l, err := netlink.LinkByName(name)
	must(t, err)
	return l.Attrs().Index
}

// assertTCXProgs checks that each host veth hook of ifindex runs want
// programs (the kernel's tcx list), and when 1, ours of that hook.
func assertTCXProgs(t *testing.T, what string, ifindex int, progs map[string]*ebpf.Program, want int) {
	t.Helper()
	for _, p := range hostVethPrograms {
		res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: p.Attach})
		if err != nil {
			t.Errorf("%s: query tcx %s of ifindex %d: %v", what, p.Link, ifindex, err)
			continue
		}
		if len(res.Programs) != want {
			t.Errorf("%s: tcx %s of ifindex %d runs %d programs, want %d", what, p.Link, ifindex, len(res.Programs), want)
			continue
		}
		if want == 1 {
			info, err := progs[p.Link].Info()
			must(t, err)
			id, _ := info.ID()
			if res.Programs[0].ID != id {
				t.Errorf("%s: tcx %s of ifindex %d runs program %d, want ours %d", what, p.Link, ifindex, res.Programs[0].ID, id)
			}
		}
	}
}
