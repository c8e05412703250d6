// Masquerade ports on a node whose own ephemeral range covers (nearly)
// every port (issue 28, defect 7).

package integration

import (
	"encoding/json"
	"net"
	"os"
	"strings"
	"testing"

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
