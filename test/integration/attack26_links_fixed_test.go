// Attack26, the attacks that worked (red until the fix of round 18): a teardown that goes by the name
// (and the alias) of the host veth rather than by the attachment's record
// and ifindex. Helpers and the guards: attack26_links_test.go,
// attack26_verbs_test.go. Run:
//
//	go test -count=1 -run 'TestAttack26' -v ./test/integration/

package integration

import (
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack26RenamedDel: our veth renamed by an operator (`ip link set
// NAME name a26op0`), a third party's link made under the old name. The
// docs: the teardown identifies the veth by the record's ifindex and
// deletes it.
//
// Was a DEFECT, fixed in round 18 (the record's ifindex, the alias, a veth with its peer in another netns): DEL succeeds, leaves the third party's link (good) and releases
// record and lease, but leaves our renamed veth (the record's ifindex, our
// alias) and the pod's endpoint entries and links entry: the address is
// free in IPAM while the node still routes it to the old pod.
func TestAttack26RenamedDel(t *testing.T) { a26Renamed(t, "del") }

// TestAttack26RenamedGC: as TestAttack26RenamedDel with the plugin's GC.
//
// Was a DEFECT, fixed in round 18 (the record's ifindex, the alias, a veth with its peer in another netns): same as DEL: veth, endpoint and links entries left, lease gone.
func TestAttack26RenamedGC(t *testing.T) { a26Renamed(t, "gc") }

// TestAttack26RenamedReconcile: our veth renamed by an operator (the pod is
// live: its netns and veth are there), a third party's link made under the
// old name. `ebpf-agent reconcile` must leave that link, and either keep
// the pod whole (record, lease, veth, entries) or tear it down whole.
//
// Was a DEFECT, fixed in round 18 (the record's ifindex, the alias, a veth with its peer in another netns): reconcile takes the live pod for gone (it goes by the name:
// the link under it lacks the alias and has another ifindex) and releases
// its record and lease, but leaves its veth and endpoint entries: the pod
// runs on with an address IPAM hands to the next pod.
func TestAttack26RenamedReconcile(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := a26Add(t, e, "a26ren-rc")
	a26Rename(t, e, p, "a26op0")
	fidx := a26Foreign(t, e, p.name, 0, "")
	a26Teardown(t, e, p, "reconcile")
	a26AssertForeign(t, e, fidx, p.name, "", "reconcile")
	ours := a26Link(t, e, p.idx) != nil
	_, recErr := os.Stat(e.RecordPath(p.id, "eth0"))
	lease := len(e.ReservationsOf(p.id)) > 0
	var eps int
	for _, ip := range p.ips {
		if _, err := e.Maps().Endpoints().Lookup(ip); err == nil {
			eps++
		}
	}
	whole := ours && recErr == nil && lease && eps == len(p.ips)
	gone := !ours && recErr != nil && !lease && eps == 0
	if !whole && !gone {
		t.Errorf("reconcile left the live pod half torn down: veth %v, record %v, lease %v, endpoint entries %d of %d",
			ours, recErr == nil, lease, eps, len(p.ips))
	}
}

// TestAttack26ForgedAliasOurName: our veth gone (`ip link del`); a third
// party makes a link under our veth's name carrying our alias (another
// ifindex than the record's). DEL must leave it (the record names another
// ifindex) and remove the pod's endpoint entries.
//
// Was a DEFECT, fixed in round 18 (the record's ifindex, the alias, a veth with its peer in another netns): DEL deletes the third party's link (a forged alias is enough to
// make DEL delete a link of the forger's choosing under that name), and
// leaves the pod's endpoint entries (of the record's ifindex) behind.
func TestAttack26ForgedAliasOurName(t *testing.T) { a26Replaced(t, "a26fo", "", false, true) }

// TestAttack26IfindexReuseOurName: our veth gone; a third party makes a
// link under our name at our veth's old ifindex (`ip link add NAME index N
// type veth`), no alias. DEL must leave it.
//
// Was a DEFECT, fixed in round 18 (the record's ifindex, the alias, a veth with its peer in another netns): DEL deletes it: name and ifindex match the record, and a missing
// alias does not stop it (a veth whose peer is not in the pod's netns is
// not ours either).
func TestAttack26IfindexReuseOurName(t *testing.T) { a26Replaced(t, "a26io", "", true, false) }

// TestAttack26IfindexReuseOtherName: our veth gone; a third party's link
// under another name at our old ifindex. DEL leaves the link (good).
//
// Was a DEFECT, fixed in round 18 (the record's ifindex, the alias, a veth with its peer in another netns): DEL leaves the pod's endpoint entries (its addresses -> the old
// ifindex, now the third party's link) while it releases the lease: the
// node forwards the released addresses to the third party's link.
func TestAttack26IfindexReuseOtherName(t *testing.T) {
	a26Replaced(t, "a26ix", "a26reuse0", true, false)
}

// TestAttack26IfindexReuseForged: as TestAttack26IfindexReuseOtherName, the
// third party's link also carrying our alias.
//
// Was a DEFECT, fixed in round 18 (the record's ifindex, the alias, a veth with its peer in another netns): the same endpoint entries left.
func TestAttack26IfindexReuseForged(t *testing.T) {
	a26Replaced(t, "a26if", "a26reuse1", true, true)
}

// TestAttack26IfindexReuseUninstallForce: as TestAttack26IfindexReuseOurName
// with `ebpf-agent uninstall --force`.
//
// Was a DEFECT, fixed in round 18 (the record's ifindex, the alias, a veth with its peer in another netns): uninstall --force deletes the third party's link (our name, our
// old ifindex, no alias), taking it for the pod's veth.
func TestAttack26IfindexReuseUninstallForce(t *testing.T) {
	a26ReplacedUninstall(t, "a26iuf", false, true)
}

// TestAttack26RenamedDelAddressReused: what TestAttack26RenamedDel's
// leftovers cost: after the DEL, the next pod gets the released addresses
// (a one-address range); the node must route them, and map them, to the
// new pod's veth alone.
//
// Was a DEFECT, fixed in round 18 (the record's ifindex, the alias, a veth with its peer in another netns): the next pod's ADD is refused ("pod address 10.250.0.2 ... is
// already container a26reu ... (host veth a26op0)'s"): the DEL that
// released the lease left the veth holding the address, which nothing
// frees: a second DEL of the old pod does not either.
func TestAttack26RenamedDelAddressReused(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.IPAM = map[string]any{ // one address per family: the next pod gets the released one
		"type": "host-local", "dataDir": e.DataDir,
		"ranges": [][]map[string]string{
			{{"subnet": testenv.PodSubnet4, "rangeStart": "10.250.0.2", "rangeEnd": "10.250.0.2"}},
			{{"subnet": testenv.PodSubnet6, "rangeStart": "fd00:250::2", "rangeEnd": "fd00:250::2"}},
		},
	}
	p := a26Add(t, e, "a26reu")
	a26Rename(t, e, p, "a26op0")
	a26Foreign(t, e, p.name, 0, "")
	a26Teardown(t, e, p, "del")
	pod := e.NewPod()
	e.CleanupDel(pod, "a26reu-next")
	b, err := a26TryAdd(e, pod, "a26reu-next")
	if err != nil {
		t.Errorf("ADD of the next pod: %v", err)
		// does the runtime's repeated DEL of the old pod free the address?
		a26Teardown(t, e, p, "del")
		if b, err = a26TryAdd(e, pod, "a26reu-next"); err != nil {
			t.Fatalf("ADD of the next pod after a second DEL of the old one: %v", err)
		}
		t.Logf("a second DEL of the old pod freed the address")
	}
	for _, ip := range b.IPs {
		for _, old := range p.ips {
			if ip.Equal(old) {
				t.Logf("the next pod got the released %s", ip)
			}
		}
	}
	e.AssertOwns(t, b)
}

// a26TryAdd adds a pod and returns its attachment, or the ADD's error.
func a26TryAdd(e *testenv.Env, pod ns.NetNS, id string) (*testenv.Attachment, error) {
	res, err := e.AddV("1.1.0", pod, id, "eth0")
	if err != nil {
		return nil, err
	}
	a := &testenv.Attachment{Pod: pod, ID: id, IfName: "eth0", HostIf: state.HostIfName(id, "eth0")}
	a.Ifindex = e.HostIfindex(a.HostIf)
	a.IPs = a26ResultIPs(e.T, res)
	return a, nil
}

// TestAttack26RenamedAgentReconcile: the agent running (--reconcile-interval
// 2s), an operator renames a live pod's host veth (`ip link set NAME name
// a26op0`), nothing else (a26AgentAfterRename, attack26_verbs_test.go).
//
// Was a DEFECT, fixed in round 18 (the record's ifindex, the alias, a veth with its peer in another netns): the agent's periodic reconcile takes the live pod for gone (no
// link under its veth's name) and releases its record and lease, leaving
// its veth, address and entries: the address goes to the next pod while
// this one still uses it. (The 2 s reconcile "after an ebpf* veth
// disappears" does not fire on a rename: without the short interval the
// pod is still whole 5 s after; it is the next periodic run that does it.)
func TestAttack26RenamedAgentReconcile(t *testing.T) { a26AgentAfterRename(t, "a26ren-ag", false) }

// TestAttack26RenamedAgentReconcileTaken: the same, a third party's link
// also made under the old name right after the rename.
//
// Was a DEFECT, fixed in round 18 (the record's ifindex, the alias, a veth with its peer in another netns): the same half teardown (record and lease released, veth left).
func TestAttack26RenamedAgentReconcileTaken(t *testing.T) { a26AgentAfterRename(t, "a26ren-agt", true) }

// TestAttack26AliasChangedDel: someone gives our veth (its name, the
// record's ifindex) the alias of an attachment that does not exist
// (`ebpf-cni:<net>/someone-else/eth0`); DEL must delete it all. Red until
// byname26: the alias alone made the veth another attachment's, and DEL
// released record and lease but left the veth, its endpoint entries and
// links entry. The record decides now: its ifindex, with the veth's peer
// in its netns.
func TestAttack26AliasChangedDel(t *testing.T) { a26AliasChanged(t, "a26chg", "del") }

// TestAttack26AliasChangedGC: the same, torn down by GC (the pod gone from
// the runtime's list).
func TestAttack26AliasChangedGC(t *testing.T) { a26AliasChanged(t, "a26chg-gc", "gc") }

func a26AliasChanged(t *testing.T, id, verb string) {
	t.Parallel()
	e := testenv.New(t)
	p := a26Add(t, e, id)
	a26SetAlias(t, e, p.idx, "ebpf-cni:"+e.Name+"/someone-else/eth0")
	a26Teardown(t, e, p, verb)
	a26AssertTornDown(t, e, p, verb)
}
