// Two networks with ipMasq on one pin directory (issue 28 remainder 2):
// the masquerade ports (cni_masq_config) are node-wide, so the networks
// must agree on them.

package integration

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestMasqTwoNetworksPorts: network A masquerades from ipMasqPortRange
// 20000-20999; a second network B on the same pin directory asks for
// 21000-21999. B's ADD must be refused (code 7, naming ipMasqPortRange and
// network A) while A has masquerading pods, and A's pod must keep leaving
// from A's ports (a UDP server outside sees the node port, IPv4 and IPv6).
// Once A's pod is gone, B's ADD takes the ports over and B's pod leaves
// from 21000-21999. Failed on a765956: B's ADD succeeded beside A's pod
// and overwrote the node-wide ports, so A's pod's next flow left from
// 21000-21999.
func TestMasqTwoNetworksPorts(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	a.Extra["ipMasqPortRange"] = "20000-20999"
	p := a.NewPod()
	a.CleanupDel(p, "p")
	a.Add(p, "p")

	q := a.NewPod()
	netB := a.NetList(testenv.RandName("netb"), map[string]any{
		"type": "ebpf-cni", "pinDir": a.PinDir, "stateDir": t.TempDir(),
		"ipMasq": true, "clusterCIDRs": []string{labCluster, labCluster6}, "ipMasqPortRange": "21000-21999",
		"ipam": staticIPAM("10.250.7.10/24", "fd00:250:7::10/64"),
	})
	rtB := &libcni.RuntimeConf{ContainerID: "q", NetNS: q.Path(), IfName: "eth0"}
	t.Cleanup(func() { a.DelList(netB, rtB) })
	_, err := a.AddList(netB, rtB)
	var cerr *types.Error
	switch {
	case err == nil:
		t.Errorf("ADD on network B with ipMasqPortRange 21000-21999 succeeded beside network A's 20000-20999")
	case !errors.As(err, &cerr) || cerr.Code != 7 || !strings.Contains(cerr.Msg, "ipMasqPortRange") || !strings.Contains(cerr.Msg, a.Name):
		t.Errorf("ADD on network B: %v; want code 7 naming ipMasqPortRange and network %s", err, a.Name)
	}

	if a.NodeLinkExists(state.HostIfName("q", "eth0")) {
		t.Errorf("the refused ADD left its host veth behind")
	}
	masqSourcePorts(t, lab, p, 7401, 20000, 20999)

	// Once A has no masquerading pod, B takes the node's ports over.
	if err := a.Del(p, "p", "eth0"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AddList(netB, rtB); err != nil {
		t.Fatalf("ADD on network B once network A has no pod: %v", err)
	}
	masqSourcePorts(t, lab, q, 7403, 21000, 21999)
}

// masqSourcePorts sends a datagram from pod to a server outside on port
// (IPv4) and port+1 (IPv6) and fails unless the server sees node A's
// address and a port in lo-hi.
func masqSourcePorts(t *testing.T, lab *masqLab, pod ns.NetNS, port, lo, hi int) {
	t.Helper()
	for i, c := range []struct {
		fam       string
		srv, node net.IP
	}{{"udp4", outsideIP, labNodeA}, {"udp6", outsideIP6, labNodeA6}} {
		var srv net.PacketConn
		port := port + i
		if err := lab.out.Do(func(ns.NetNS) (err error) { srv, err = net.ListenPacket(c.fam, hp(c.srv, port)); return }); err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		var cli net.PacketConn
		if err := pod.Do(func(ns.NetNS) (err error) { cli, err = net.ListenPacket(c.fam, ":0"); return }); err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		if _, err := cli.WriteTo([]byte("x"), &net.UDPAddr{IP: c.srv, Port: port}); err != nil {
			t.Fatal(err)
		}
		srv.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 8)
		_, from, err := srv.ReadFrom(buf)
		if err != nil {
			t.Fatalf("%s: the server got nothing from the pod: %v", c.fam, err)
		}
		u := from.(*net.UDPAddr)
		if !u.IP.Equal(c.node) || u.Port < lo || u.Port > hi {
			t.Errorf("%s: the pod's datagram came from %s, want node A's address and a port of %d-%d", c.fam, u, lo, hi)
		}
	}
}
