//go:build review_repro

// Attack26's attack that still works (red): an alias naming another
// attachment, set on our veth by someone with CAP_NET_ADMIN on the node,
// makes it that attachment's to the teardown. Run:
//
//	go test -count=1 -tags review_repro -run 'TestAttack26AliasChangedDel' -v ./test/integration/

package integration

import (
	"testing"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack26AliasChangedDel: someone gives our veth (its name, the
// record's ifindex) the alias of an attachment that does not exist
// (`ebpf-cni:<net>/someone-else/eth0`); DEL must delete it all.
//
// DEFECT: DEL succeeds and releases record and lease but leaves the veth,
// its endpoint entries and links entry (half torn down, as above): anyone
// able to set an alias turns a DEL into a lease leak the other way round.
func TestAttack26AliasChangedDel(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	p := a26Add(t, e, "a26chg")
	a26SetAlias(t, e, p.idx, "ebpf-cni:"+e.Name+"/someone-else/eth0")
	a26Teardown(t, e, p, "del")
	a26AssertOursGone(t, e, p, "DEL")
	a26AssertRecordLease(t, e, p, "DEL")
	a26AssertEntries(t, e, p, "DEL")
}
