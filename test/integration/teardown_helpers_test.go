// Helpers of the teardown tests that pin a foreign map (a map of another
// layout in ours) and check what a DEL or GC leaves of a masquerading pod.

package integration

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// masqPod is a pod added with live masqueraded UDP flows (addMasqPod).
type masqPod struct {
	pod     ns.NetNS
	id, hif string
	ifindex int
	ips     []net.IP
}

// addMasqPod adds pod id and opens a UDP flow of each family from it to
// the outside echo server on port (a15MasqFlows).
func addMasqPod(t *testing.T, a *testenv.Env, id string, port int) masqPod {
	t.Helper()
	p := masqPod{pod: a.NewPod(), id: id}
	a.CleanupDel(p.pod, id)
	r := a.Add(p.pod, id)
	ip4, ip6 := testenv.PodIPs(t, r)
	p.ips = []net.IP{ip4, ip6}
	p.hif, p.ifindex = a.HostVeth(id)
	if err := a15MasqFlows(p.pod, port); err != nil {
		t.Errorf("%s: its flows: %v", id, err)
	}
	return p
}

// attachmentLeft lists what is left of the attachment id (host veth hostIf,
// addresses ips, ifindex): link, routes, link pins, record, IPAM,
// endpoint entries, masquerade flows, shares and quota rows; without
// record only what a teardown that met a foreign pin must still remove
// (link, routes, link pins, IPAM).
func attachmentLeft(t *testing.T, a *testenv.Env, id, hostIf string, ifindex int, ips []net.IP, record bool) []string {
	t.Helper()
	var left []string
	if a.NodeLinkExists(hostIf) {
		left = append(left, "host veth "+hostIf)
	}
	for _, ip := range ips {
		if rs := a.HostRoutesTo(ip); len(rs) > 0 {
			left = append(left, "route to "+ip.String())
		}
	}
	for _, d := range []string{"ingress", "egress"} {
		if _, err := os.Stat(datapath.LinkPinPath(a.PinDir, hostIf, d)); err == nil {
			left = append(left, d+" link pin")
		}
	}
	if res := a.ReservationsOf(id); len(res) > 0 {
		left = append(left, fmt.Sprint("IPAM ", res))
	}
	if !record {
		return left
	}
	if _, err := os.Stat(a.RecordPath(id, "eth0")); err == nil {
		left = append(left, "record")
	}
	if m, err := datapath.OpenMapsLean(a.PinDir); err == nil {
		eps, _ := m.Maps.Endpoints().List()
		for _, ep := range eps {
			for _, ip := range ips {
				if ep.IP.Equal(ip) {
					left = append(left, "endpoint "+ip.String())
				}
			}
		}
		m.Close()
	}
	return append(left, a15NatOf(t, a, ifindex)...)
}

// is50Naming: err is CNI error 50 (the datapath unavailable) naming p.
func is50Naming(err error, p string) bool {
	var te *types.Error
	return errors.As(err, &te) && te.Code == codePluginNotAvailable && strings.Contains(te.Msg, p)
}

// forEachMapPin calls fn for each map pin in dir (its name and path), those
// every verb opens first (cni_endpoints, cni_hostports, cni_links,
// cni_stats) ahead of the others, until budget has passed: always those
// four, then as many others as fit.
func forEachMapPin(t *testing.T, dir string, budget time.Duration, fn func(i int, name, p string)) {
	t.Helper()
	names := mapPinsEagerFirst(t, dir)
	deadline := time.Now().Add(budget)
	for i, name := range names {
		if time.Now().After(deadline) {
			t.Logf("time's up after %d of %d pins", i, len(names))
			return
		}
		fn(i, name, filepath.Join(dir, name))
	}
}

// mapPinsEagerFirst lists the map pins in dir, the four every verb opens
// first ahead of the others.
func mapPinsEagerFirst(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	eager := map[string]bool{"cni_endpoints": true, "cni_hostports": true, "cni_links": true, "cni_stats": true}
	var first, rest []string
	for _, en := range ents {
		switch {
		case en.IsDir():
		case eager[en.Name()]:
			first = append(first, en.Name())
		default:
			rest = append(rest, en.Name())
		}
	}
	if len(first) != len(eager) {
		t.Fatalf("%s holds %v of the maps every verb opens, want all of %v", dir, first, eager)
	}
	return append(first, rest...)
}
