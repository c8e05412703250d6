package maps

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
)

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// Users of cluster CIDRs: a CIDR stays while any user holds it and goes
// with the last; acquiring is idempotent and all or nothing (a trie
// without room for the new CIDRs changes nothing); releasing an owner
// with no uses does nothing; what an older layout left (owner 0) goes only
// once no interface is left on the node.
func TestClusterCIDRUsers(t *testing.T) {
	m := testMaps(t, Sizing{MaxPods: 20, HostPortsPerPod: 1})
	set := func() map[string]bool {
		ps, err := m.Masq().ClusterCIDRs()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, p := range ps {
			out[p.String()] = true
		}
		return out
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(m.Masq().AcquireClusterCIDRs(1, prefixes("10.0.0.0/8", "10.1.2.3/16")))
	must(m.Masq().AcquireClusterCIDRs(1, prefixes("10.0.0.0/8"))) // again
	must(m.Masq().AcquireClusterCIDRs(2, prefixes("10.0.0.0/8", "192.168.0.0/16")))
	if s := set(); len(s) != 3 || !s["10.1.0.0/16"] {
		t.Fatalf("after two users: %v", s)
	}
	if gone, err := m.Masq().ReleaseClusterCIDRs(1); err != nil || len(gone) != 1 || gone[0].String() != "10.1.0.0/16" {
		t.Fatalf("release 1: %v %v, want 10.1.0.0/16 gone", gone, err)
	}
	if gone, err := m.Masq().ReleaseClusterCIDRs(1); err != nil || len(gone) != 0 {
		t.Fatalf("release 1 again: %v %v", gone, err)
	}
	if s := set(); len(s) != 2 || !s["10.0.0.0/8"] {
		t.Fatalf("2 still uses 10.0.0.0/8: %v", s)
	}

	// Fill the trie to one short of full: a user bringing two new CIDRs
	// (and one present) changes nothing.
	var fill []netip.Prefix
	for i := 0; len(set())+len(fill) < MaxClusterCIDRs-1; i++ {
		fill = append(fill, netip.MustParsePrefix(fmt.Sprintf("172.%d.%d.0/24", 16+i/256, i%256)))
	}
	must(m.Masq().AcquireClusterCIDRs(3, fill))
	before := set()
	err := m.Masq().AcquireClusterCIDRs(4, prefixes("10.0.0.0/8", "198.51.100.0/24", "203.0.113.0/24"))
	if err == nil || !IsFull(err) {
		t.Fatalf("acquire beyond the trie: %v, want a full-map error", err)
	}
	if after := set(); len(after) != len(before) {
		t.Errorf("a refused acquire changed the trie: %d CIDRs, before %d", len(after), len(before))
	}
	if mine, _ := m.Masq().ClusterCIDRsOf(4); len(mine) != 0 {
		t.Errorf("a refused acquire left users: %v", mine)
	}
	must(m.Masq().AcquireClusterCIDRs(4, prefixes("10.0.0.0/8", "198.51.100.0/24")))
	if _, err := m.Masq().ReleaseClusterCIDRs(3); err != nil {
		t.Fatal(err)
	}

	// Inherited CIDRs stay while an interface is left, then go.
	must(m.refs().Put(&CIDRRefKey{Cidr: cidrKey(netip.MustParsePrefix("100.64.0.0/10")), Owner: 0}, uint32(1)))
	must(m.byName[nameClusterCIDRs].Put(cidrKey(netip.MustParsePrefix("100.64.0.0/10")), uint32(1)))
	must(m.Links().Put(7, NewLinkInfo(nil, nil)))
	if dropped, err := m.Masq().ReleaseInheritedClusterCIDRs(0); err != nil || dropped {
		t.Fatalf("inherited CIDRs dropped with an interface left: %v %v", dropped, err)
	}
	if dropped, err := m.Masq().ReleaseInheritedClusterCIDRs(7); err != nil || !dropped || set()["100.64.0.0/10"] {
		t.Fatalf("inherited CIDRs kept once the last interface goes: %v %v", dropped, err)
	}
	for _, o := range []uint64{2, 4} {
		if _, err := m.Masq().ReleaseClusterCIDRs(o); err != nil {
			t.Fatal(err)
		}
	}
	if s := set(); len(s) != 0 {
		t.Errorf("every user gone, CIDRs left: %v", s)
	}
}

// Users acquiring and releasing one CIDR at once, each through its own
// handles (as separate processes would): a user never finds its CIDR
// missing while it holds it.
func TestClusterCIDRUsersConcurrent(t *testing.T) {
	m := testMaps(t, Sizing{MaxPods: 4, HostPortsPerPod: 1})
	p := prefixes("10.42.0.0/16")
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := 0; w < 4; w++ {
		mw, err := Open(m.dir)
		if err != nil {
			t.Fatal(err)
		}
		defer mw.Close()
		wg.Add(1)
		go func(owner uint64, m *Maps) {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				if err := m.Masq().AcquireClusterCIDRs(owner, p); err != nil {
					errs <- err
					return
				}
				ps, err := m.Masq().ClusterCIDRs()
				if err != nil || len(ps) != 1 {
					errs <- fmt.Errorf("owner %d holds %s, the trie has %v (%v)", owner, p[0], ps, err)
					return
				}
				if _, err := m.Masq().ReleaseClusterCIDRs(owner); err != nil {
					errs <- err
					return
				}
			}
		}(uint64(w+1), mw)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if ps, _ := m.Masq().ClusterCIDRs(); len(ps) != 0 {
		t.Errorf("every user gone, CIDRs left: %v", ps)
	}
}

// A user whose wishes change (the agent following nodes) sets its CIDRs:
// what it no longer wants goes unless another user holds it, what it newly
// wants comes, and a set that does not fit changes nothing it still wants
// but drops what it no longer wants.
func TestSetClusterCIDRs(t *testing.T) {
	m := testMaps(t, Sizing{MaxPods: 20, HostPortsPerPod: 1})
	const agent, pod = 100, 7
	set := func() string {
		ps, err := m.Masq().ClusterCIDRs()
		if err != nil {
			t.Fatal(err)
		}
		sortPrefixes(ps)
		return fmt.Sprint(ps)
	}
	step := func(want []netip.Prefix, gained, dropped, trie string) {
		t.Helper()
		g, d, err := m.Masq().SetClusterCIDRs(agent, want)
		if err != nil {
			t.Fatalf("set %v: %v", want, err)
		}
		if fmt.Sprint(g) != gained || fmt.Sprint(d) != dropped || set() != trie {
			t.Fatalf("set %v: gained %v dropped %v, trie %s; want gained %s dropped %s, trie %s", want, g, d, set(), gained, dropped, trie)
		}
	}
	if err := m.Masq().AcquireClusterCIDRs(pod, prefixes("10.244.0.0/24")); err != nil {
		t.Fatal(err)
	}
	step(prefixes("10.244.0.0/24", "10.244.1.0/24", "10.244.1.0/24"), "[10.244.0.0/24 10.244.1.0/24]", "[]", "[10.244.0.0/24 10.244.1.0/24]")
	step(prefixes("10.244.1.0/24", "10.244.2.0/24"), "[10.244.2.0/24]", "[10.244.0.0/24]", "[10.244.0.0/24 10.244.1.0/24 10.244.2.0/24]")
	step(prefixes("10.244.1.0/24", "10.244.2.0/24"), "[]", "[]", "[10.244.0.0/24 10.244.1.0/24 10.244.2.0/24]")
	// The pod's CIDR stays the pod's: it goes with the pod's release only.
	step(nil, "[]", "[10.244.1.0/24 10.244.2.0/24]", "[10.244.0.0/24]")
	if gone, err := m.Masq().ReleaseClusterCIDRs(pod); err != nil || fmt.Sprint(gone) != "[10.244.0.0/24]" {
		t.Fatalf("the pod's release: %v %v", gone, err)
	}

	// More than the trie holds: refused, naming the map; what the agent no
	// longer wants is gone all the same, and nothing of the new set came.
	step(prefixes("10.244.3.0/24"), "[10.244.3.0/24]", "[]", "[10.244.3.0/24]")
	var many []netip.Prefix
	for i := 0; i <= MaxClusterCIDRs; i++ {
		many = append(many, netip.MustParsePrefix(fmt.Sprintf("172.%d.%d.0/24", 16+i/256, i%256)))
	}
	_, d, err := m.Masq().SetClusterCIDRs(agent, many)
	if !IsFull(err) || !strings.Contains(err.Error(), "cni_cluster_cidrs holds at most 256") || fmt.Sprint(d) != "[10.244.3.0/24]" {
		t.Fatalf("set beyond the trie: dropped %v, %v; want 10.244.3.0/24 dropped and a full cni_cluster_cidrs", d, err)
	}
	if s := set(); s != "[]" {
		t.Fatalf("a refused set left %s", s)
	}
	if mine, _ := m.Masq().ClusterCIDRsOf(agent); len(mine) != 0 {
		t.Fatalf("a refused set left uses: %v", mine)
	}
}
