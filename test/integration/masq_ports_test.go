// Masquerade ports on a node whose own ephemeral range covers (nearly)
// every port (issue 28, defect 7).
// Two networks with ipMasq on one pin directory (issue 28 remainder 2):
// the masquerade ports (cni_masq_config) are node-wide, so the networks
// must agree on them.

package integration

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

const (
	portRangeSysctl = "/proc/sys/net/ipv4/ip_local_port_range"
	reservedSysctl  = "/proc/sys/net/ipv4/ip_local_reserved_ports"
)

// nodeSysctl writes value to path in the node's netns and reads it back.
func nodeSysctl(t *testing.T, e *testenv.Env, path, value string) string {
	t.Helper()
	if err := e.InNode(func() error { return os.WriteFile(path, []byte(value), 0o644) }); err != nil {
		t.Fatalf("%s = %q: %v", path, value, err)
	}
	return readNodeSysctl(t, e, path)
}

func readNodeSysctl(t *testing.T, e *testenv.Env, path string) string {
	t.Helper()
	var got []byte
	if err := e.InNode(func() (err error) { got, err = os.ReadFile(path); return }); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(got))
}

// masqStatusReport is what the test reads of `status -o json`.
type masqStatusReport struct {
	Masq *struct {
		Ports   string `json:"ports"`
		Overlap int    `json:"overlap"`
	} `json:"masq"`
	Warnings []string `json:"warnings"`
}

func masqStatus(t *testing.T, e *testenv.Env) *masqStatusReport {
	t.Helper()
	js, err := e.MasqAgent("status", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var st masqStatusReport
	if err := json.Unmarshal(js, &st); err != nil {
		t.Fatalf("status -o json: %v\n%s", err, js)
	}
	return &st
}

// TestMasqWideEphemeralRange: on a node whose ip_local_port_range is
// 1024-65535 an ipMasq pod starts (before: every ADD was refused with 7),
// its flows leave from 61000-65535, which ADD reserved
// (ip_local_reserved_ports) so the node's own connections never take one:
// 2000 node sockets bound to port 0 get none of them. Status and metrics
// show no overlap; dropping the reservation (as widening the range on a
// node of the default configuration would) makes both warn.
func TestMasqWideEphemeralRange(t *testing.T) {
	t.Parallel()
	lab := newMasqLab(t)
	a := lab.a
	if got := nodeSysctl(t, a, portRangeSysctl, "1024 65535"); got != "1024\t65535" && got != "1024 65535" {
		t.Fatalf("ip_local_port_range is %q", got)
	}
	nodeSysctl(t, a, reservedSysctl, "\n") // an empty write is ignored
	pod := a.NewPod()
	a.CleanupDel(pod, "p")
	a.Add(pod, "p")
	serve(t, lab.out, 7000, "outside")

	if got := readNodeSysctl(t, a, reservedSysctl); got != "61000-65535" {
		t.Errorf("ip_local_reserved_ports after ADD: %q, want 61000-65535", got)
	}
	// A second pod and CHECK find the same ports: nothing is written twice.
	pod2 := a.NewPod()
	a.CleanupDel(pod2, "p2")
	a.Add(pod2, "p2")
	if got := readNodeSysctl(t, a, reservedSysctl); got != "61000-65535" {
		t.Errorf("ip_local_reserved_ports after a second ADD: %q, want 61000-65535", got)
	}
	if err := a.Check(pod, "p", "eth0"); err != nil {
		t.Errorf("CHECK on the wide-range node: %v", err)
	}
	for _, proto := range []string{"tcp", "udp"} {
		for _, c := range []struct {
			srv, node net.IP
		}{{outsideIP, labNodeA}, {outsideIP6, labNodeA6}} {
			if p := mustAsk(t, pod, proto, hp(c.srv, 7000), 0, "outside", c.node); p < 61000 || p > 65535 {
				t.Errorf("%s to %s left from port %d, want 61000-65535", proto, c.srv, p)
			}
		}
	}
	err := a.InNode(func() error {
		var socks []net.PacketConn
		defer func() {
			for _, s := range socks {
				s.Close()
			}
		}()
		for i := 0; i < 2000; i++ {
			s, err := net.ListenPacket("udp4", ":0")
			if err != nil {
				return err
			}
			socks = append(socks, s)
			if p := s.LocalAddr().(*net.UDPAddr).Port; p >= 61000 {
				t.Errorf("a node socket got port %d, reserved for masquerade", p)
				return nil
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	st := masqStatus(t, a)
	if st.Masq == nil || st.Masq.Ports != "61000-65535" || st.Masq.Overlap != 0 {
		t.Errorf("status masq %+v, want ports 61000-65535 and no overlap", st.Masq)
	}
	for _, w := range st.Warnings {
		if strings.Contains(w, "masquerade ports") {
			t.Errorf("status warns: %s", w)
		}
	}

	// The reservation dropped: every masquerade port is one the kernel may
	// pick for the node's connections.
	nodeSysctl(t, a, reservedSysctl, "\n") // an empty write is ignored
	st = masqStatus(t, a)
	if st.Masq == nil || st.Masq.Overlap != 4536 {
		t.Errorf("status masq %+v, want an overlap of 4536 ports", st.Masq)
	}
	warned := false
	for _, w := range st.Warnings {
		warned = warned || strings.Contains(w, "masquerade ports 61000-65535 overlap the node's ip_local_port_range 1024-65535 in 4536 ports")
	}
	if !warned {
		t.Errorf("status does not warn of the overlap: %q", st.Warnings)
	}
	a.StartAgent(a.WriteConfDir(), "--metrics-addr", "127.0.0.1:9965")
	if body := scrape(t, a, "127.0.0.1:9965"); !strings.Contains(body, "ebpf_cni_masq_ephemeral_overlap_ports 4536") {
		t.Errorf("metrics lack ebpf_cni_masq_ephemeral_overlap_ports 4536:\n%s", grepLines(body, "masq"))
	}
}

func grepLines(s, word string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

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
