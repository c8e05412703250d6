// Round 12 mend: ebpf-agent status on a healthy node (docs/agent.md's
// sample, regenerated, showed the warning below).

package integration

import (
	"strings"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestStatusPoolOfTablesNotFull: on a node with one pod, nothing near any
// limit, status warns of nothing and the metrics give cni_sf_pool no fill.
// cni_sf_pool is an array of maps, every slot holding a table from the
// node's setup on (the pool; cni_sf_slots holds which are taken): like an
// array, its slots always exist. Red before (mend12, 7aa7159): its slots
// were counted as keys, 220 of 220, and every healthy node's status warned
// "map cni_sf_pool is 100% full (220 of 220 entries): ADDs or flows that
// need another entry fail", the metric ebpf_cni_map_fill_ratio at 1 for it.
func TestStatusPoolOfTablesNotFull(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := e.NewPod()
	e.CleanupDel(p, "pool")
	e.Add(p, "pool")
	st := status(t, e)
	if len(st.Warnings) > 0 {
		t.Errorf("status of a node with one pod warns: %q", st.Warnings)
	}
	if u := usageOf(t, st, "cni_sf_pool"); u.Fill() != 0 || u.Entries >= 0 {
		t.Errorf("cni_sf_pool: %d entries of %d, fill %.2f; want an array's (-1, no fill)", u.Entries, u.MaxEntries, u.Fill())
	}
	if u := usageOf(t, st, "cni_sf_slots"); u.Entries != 1 {
		t.Errorf("cni_sf_slots: %d entries, want the pod's slot", u.Entries)
	}
	e.StartAgent(e.WriteConfDir(), "--metrics-addr", "127.0.0.1:9967")
	body := scrape(t, e, "127.0.0.1:9967")
	if strings.Contains(body, `ebpf_cni_map_fill_ratio{map="cni_sf_pool"}`) {
		t.Errorf("the metrics give cni_sf_pool a fill ratio (an array's slots always exist)")
	}
	if !strings.Contains(body, `ebpf_cni_map_fill_ratio{map="cni_sf_slots"}`) {
		t.Errorf("the metrics give cni_sf_slots, the pool's taken slots, no fill ratio")
	}
}
