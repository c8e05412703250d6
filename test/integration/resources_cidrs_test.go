// The cluster CIDRs table (cni_cluster_cidrs, node-wide): a network's count
// checked up front, a CIDR held by the attachments that use it, a full table
// refusing an ADD, ADDs and DELs at once.

package integration

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// ipv4Only gives e's pods IPv4 addresses only: ipMasq masquerades IPv6
// too, and would want an IPv6 cluster CIDR in every list.
func ipv4Only(e *testenv.Env) {
	e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir,
		"ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4}}}}
}

// cidrs are n distinct /24s starting at 10.(first).0.0.
func cidrs(first, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.%d.%d.0/24", first+i/256, i%256)
	}
	return out
}

func clusterCIDRSet(t *testing.T, m *maps.Maps) map[string]bool {
	t.Helper()
	ps, err := m.Masq().ClusterCIDRs()
	must(t, err)
	out := map[string]bool{}
	for _, p := range ps {
		out[p.String()] = true
	}
	return out
}

// TestResourcesClusterCIDRs: cni_cluster_cidrs (256 entries node-wide) used
// to keep every CIDR any ipMasq ADD brought, forever: an ADD with 300 CIDRs
// failed after inserting 256, and every later ADD with a new CIDR failed for
// good. Now a network's count is checked up front (7, nothing inserted), a
// CIDR is held by the attachments that use it and goes with the last, and a
// full table refuses an ADD (11, naming it and its size) without keeping
// any CIDR that ADD inserted.
func TestResourcesClusterCIDRs(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	ipv4Only(e) // the CIDRs counted are IPv4 ones
	m := func() *maps.Maps { return e.Maps() }
	withCIDRs := func(cs []string) { e.Extra = map[string]any{"ipMasq": true, "clusterCIDRs": cs} }

	p := e.NewPod()
	e.CleanupDel(p, "many")
	withCIDRs(cidrs(0, 300))
	_, err := e.AddV("1.1.0", p, "many", "eth0")
	libcniErr(t, "ADD with 300 clusterCIDRs", err, 7, "clusterCIDRs: 300 entries", fmt.Sprint(maps.MaxClusterCIDRsPerNetwork))
	e.AssertNothingOf("many")

	// Eight pods with 32 CIDRs each of their own fill the table.
	pods := map[string]ns.NetNS{}
	for i := 0; i < 8; i++ {
		id := fmt.Sprintf("p%d", i)
		pods[id] = e.NewPod()
		e.CleanupDel(pods[id], id)
		withCIDRs(cidrs(32*i, 32))
		e.Add(pods[id], id)
	}
	if n := len(clusterCIDRSet(t, m())); n != 256 {
		t.Fatalf("%d cluster CIDRs after 8 pods of 32 each, want 256", n)
	}
	// A ninth pod shares 31 CIDRs with p0 and brings one of its own: no room.
	ninth := append(cidrs(1, 31), "192.168.77.0/24")
	withCIDRs(ninth)
	p9 := e.NewPod()
	e.CleanupDel(p9, "p9")
	_, err = e.AddV("1.1.0", p9, "p9", "eth0")
	libcniErr(t, "ADD with a new CIDR, table full", err, 11, "cni_cluster_cidrs holds at most 256 entries")
	e.AssertNothingOfPod("p9", 8) // the 8 pods' IPv4 entries
	have := clusterCIDRSet(t, m())
	if len(have) != 256 || have["192.168.77.0/24"] {
		t.Errorf("after the refused ADD: %d cluster CIDRs (192.168.77.0/24 there: %v), want the 256 of before", len(have), have["192.168.77.0/24"])
	}
	users, err := m().Masq().ClusterCIDRUsers()
	must(t, err)
	if users[netip.MustParsePrefix("10.0.1.0/24")] != 1 {
		t.Errorf("10.0.1.0/24 has %d users after the refused ADD, want 1 (p0)", users[netip.MustParsePrefix("10.0.1.0/24")])
	}

	// p0 goes: only its CIDR nobody else uses goes with it... and since p9
	// never got in, all of p0's 32 go.
	withCIDRs(cidrs(0, 32))
	e.MustDel(pods["p0"], "p0")
	have = clusterCIDRSet(t, m())
	if len(have) != 224 || have["10.0.0.0/24"] || have["10.0.31.0/24"] {
		t.Errorf("after p0's DEL: %d cluster CIDRs, want 224 without p0's", len(have))
	}
	// Now the ninth fits; it shares 10.0.1.0/24-10.0.31.0/24 with nobody.
	withCIDRs(ninth)
	e.Add(p9, "p9")
	if err := e.Check(p9, "p9", "eth0"); err != nil {
		t.Errorf("CHECK of p9: %v", err)
	}
	// A second pod using the same CIDRs; the first one's DEL keeps them.
	p10 := e.NewPod()
	e.CleanupDel(p10, "p10")
	e.Add(p10, "p10")
	e.MustDel(p9, "p9")
	have = clusterCIDRSet(t, m())
	for _, c := range ninth {
		if !have[c] {
			t.Errorf("%s went with p9's DEL while p10 still uses it", c)
		}
	}
	if err := e.Check(p10, "p10", "eth0"); err != nil {
		t.Errorf("CHECK of p10 after p9's DEL: %v", err)
	}
	// DEL is idempotent: a second DEL of p9 takes nothing of p10's.
	e.MustDel(p9, "p9")
	if err := e.Check(p10, "p10", "eth0"); err != nil {
		t.Errorf("CHECK of p10 after p9's second DEL: %v", err)
	}
	e.MustDel(p10, "p10")
	for i := 1; i < 8; i++ {
		id := fmt.Sprintf("p%d", i)
		withCIDRs(cidrs(32*i, 32))
		e.MustDel(pods[id], id)
	}
	e.AssertClean()
}

// TestResourcesClusterCIDRsConcurrent: plugin processes adding and deleting
// masquerading pods at once, in two groups sharing one CIDR and each with
// one of its own: whenever a pod is up, its CIDRs are in the table (a DEL
// racing an ADD never takes a CIDR the ADD relies on), and when the last
// pod is gone, so is every CIDR.
func TestResourcesClusterCIDRsConcurrent(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	ipv4Only(e)
	const rounds, width = 6, 6
	groups := [][]string{{"10.200.0.0/16", "10.201.0.0/16"}, {"10.200.0.0/16", "10.202.0.0/16"}}
	conf := func(g int) []byte {
		return e.StdinConf(func(c map[string]any) { c["ipMasq"] = true; c["clusterCIDRs"] = groups[g] })
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []string
	)
	fail := func(f string, a ...any) {
		mu.Lock()
		errs = append(errs, fmt.Sprintf(f, a...))
		mu.Unlock()
	}
	must(t, e.Status()) // STATUS sets the datapath up
	m := e.Maps()
	for w := 0; w < width; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			g := w % 2
			for r := 0; r < rounds; r++ {
				id := fmt.Sprintf("w%dr%d", w, r)
				pod, err := testutils.NewNS()
				if err != nil {
					fail("%s: netns: %v", id, err)
					return
				}
				out, err := e.RunPlugin(testenv.BinDir+"/ebpf-cni", pluginEnv("ADD", id, pod, "eth0"), conf(g))
				if err != nil {
					fail("%s: ADD: %v: %s", id, err, out)
				} else if ps, err := m.Masq().ClusterCIDRs(); err != nil {
					fail("%s: read cni_cluster_cidrs: %v", id, err)
				} else {
					for _, c := range groups[g] {
						if !slices.Contains(ps, netip.MustParsePrefix(c)) {
							fail("%s is up and masquerading but its cluster CIDR %s is gone", id, c)
						}
					}
				}
				if out, err := e.RunPlugin(testenv.BinDir+"/ebpf-cni", pluginEnv("DEL", id, pod, "eth0"), conf(g)); err != nil {
					fail("%s: DEL: %v: %s", id, err, out)
				}
				if err := testenv.RemoveNS(pod); err != nil {
					fail("%s: %v", id, err)
				}
			}
		}(w)
	}
	wg.Wait()
	for _, s := range errs {
		t.Error(s)
	}
	e.AssertClean()
}
