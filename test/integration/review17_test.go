// Review of "ADD flat at 1000 pods" (IPv6 off on host veths of IPv4-only
// networks, arp_notify and forwarding by netlink).

package integration

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// readSysctl reads a /proc/sys file of the netns n.
func readSysctl(t *testing.T, n ns.NetNS, path string) string {
	t.Helper()
	var s string
	n.Do(func(ns.NetNS) error {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
		}
		s = strings.TrimSpace(string(b))
		return nil
	})
	return s
}

// TestReview17IPRangesCapability: host-local takes ranges from the runtime
// too (the "ipRanges" capability, runtimeConfig.ipRanges, prepended to the
// configured ones), so an IPv4-only ipam block does not make an IPv4-only
// network. A runtime giving an IPv6 range gets a working dual-stack pod
// whose host veth carries IPv6, as before the change.
func TestReview17IPRangesCapability(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	e.IPAM = map[string]any{"type": "host-local", "dataDir": e.DataDir, "ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4}}}}
	e.Extra = map[string]any{"capabilities": map[string]bool{"ipRanges": true}}
	pod := e.NewPod()
	e.CleanupDel(pod, "ranges")
	rt := e.RuntimeConf(pod, "ranges", "eth0")
	rt.CapabilityArgs = map[string]any{"ipRanges": [][]map[string]string{{{"subnet": testenv.PodSubnet6}}}}
	var res types.Result
	err := e.InNode(func() error {
		var err error
		res, err = e.CNI.AddNetworkList(context.Background(), e.ConfList("1.1.0"), rt)
		return err
	})
	if err != nil {
		t.Fatalf("ADD with a runtime IPv6 range: %v", err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	v4, v6 := resultIPs(r)
	if v4 == nil || v6 == nil {
		t.Fatalf("result IPs %v, want one of each family", r.IPs)
	}
	hostIf, _ := e.HostVeth("ranges")
	if got := readSysctl(t, e.Node, "/proc/sys/net/ipv6/conf/"+hostIf+"/disable_ipv6"); got != "0" {
		t.Errorf("host veth %s of a dual-stack pod: disable_ipv6 %s", hostIf, got)
	}
	e.PodReachable(t, pod, []net.IP{v4, v6})
	if err := e.InNode(func() error {
		return e.CNI.DelNetworkList(context.Background(), e.ConfList("1.1.0"), rt)
	}); err != nil {
		t.Fatal(err)
	}
	e.AssertClean()
}
