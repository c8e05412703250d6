package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestPolicyTablesForeignPinAdd: a networkPolicy pod's flow and fragment
// tables are made while IPAM runs (issue 30, round 20), in a goroutine of
// the ADD. With either outer map's pin another layout's map, the ADD must
// still fail as any verb meeting a foreign pin does (50 naming the pin,
// not a crash of the plugin) and leave nothing: veth, IPAM reservation,
// record, policy state, the other outer map's tables. With the pin back,
// the retried ADD works: its interface pending, its tables in place; its
// DEL leaves nothing.
func TestPolicyTablesForeignPinAdd(t *testing.T) {
	t.Parallel()
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	warm := h.NewPod()
	h.Add(warm, "ptfwarm") // the datapath and its pins exist
	h.CleanupDel(warm, "ptfwarm")
	_, warmIdx := h.HostVeth("ptfwarm")
	m := h.Maps()
	for i, name := range []string{"cni_pol_ct_parts", "cni_pol_frag_parts"} {
		id := fmt.Sprintf("ptf%d", i)
		pod := h.NewPod()
		h.CleanupDel(pod, id)
		p := filepath.Join(datapath.MapsDir(h.PinDir), name)
		back, ok := swapForeignPin(t, p)
		if !ok {
			t.Fatalf("%s: no foreign map of its sizes", name)
		}
		_, err := h.AddV("1.0.0", pod, id, "eth0")
		if err == nil || !is50Naming(err, p) {
			t.Errorf("ADD with a foreign %s: %v (code %d), want 50 naming it", name, err, testenv.ErrCode(err))
		}
		left := attachmentLeft(t, h.Env, id, state.HostIfName(id, "eth0"), 0, nil, false)
		if _, err := os.Stat(h.RecordPath(id, "eth0")); err == nil {
			left = append(left, "record")
		}
		if res := h.ReservationsOf(id); len(res) > 0 {
			left = append(left, fmt.Sprintf("IPAM reservations %v", res))
		}
		back()
		if st, err := m.Policy().States(); err != nil || len(st) != 1 || st[warmIdx] == (maps.PolicyState{}) {
			left = append(left, fmt.Sprintf("policy states %v (%v), want the warm pod's only", st, err))
		}
		if idxs, err := m.Policy().FlowTables(); err != nil || !slices.Equal(idxs, []int{warmIdx}) {
			left = append(left, fmt.Sprintf("flow tables of ifindexes %v (%v), want the warm pod's %d only", idxs, err, warmIdx))
		}
		if len(left) > 0 {
			t.Errorf("the ADD refused with a foreign %s left %v", name, left)
		}
		if _, err := h.AddV("1.0.0", pod, id, "eth0"); err != nil {
			t.Fatalf("ADD with the %s pin back: %v", name, err)
		}
		_, idx := h.HostVeth(id)
		if st, ok, err := m.Policy().StateOf(idx); err != nil || !ok || st.Mode != [2]uint8{maps.PolicyPending, maps.PolicyPending} {
			t.Errorf("after the retried ADD (a foreign %s before): state %+v %v %v, want pending both ways", name, st, ok, err)
		}
		if idxs, err := m.Policy().FlowTables(); err != nil || !slices.Contains(idxs, idx) {
			t.Errorf("after the retried ADD (a foreign %s before): flow tables of %v (%v), want its %d among them", name, idxs, err, idx)
		}
		must(t, h.Del(pod, id, "eth0"))
	}
	must(t, h.Del(warm, "ptfwarm", "eth0"))
	h.AssertClean()
}
