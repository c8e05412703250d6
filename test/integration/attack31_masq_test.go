package integration

import (
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps/mapstest"
)

// a31RevEntry is the reverse entry of the masqueraded flow node:nodePort
// <- server:port: its flags and its tracked end (the server's next
// sequence number, snat_seq.end in the low word of created_ns).
func a31RevEntry(t *testing.T, m *maps.Maps, nodePort, port int) (flags uint16, end uint32) {
	t.Helper()
	var k maps.SNATKey
	var v maps.SNATVal
	n := 0
	it := mapstest.Map(m, "cni_snat").Iterate()
	for it.Next(&k, &v) {
		if k.Dir == 1 && k.Port == htons(uint16(nodePort)) && k.PeerPort == htons(uint16(port)) {
			flags, end = v.Flags, uint32(v.CreatedNs)
			n++
		}
	}
	must(t, it.Err())
	if n != 1 {
		t.Fatalf("%d reverse entries for node port %d <- %d, want 1", n, nodePort, port)
	}
	return flags, end
}

// TestAttack31MasqForgedFINOvertakenByDataTCP: real TCP through the lab's
// masquerade. The pod half-closes its connection (its FIN acknowledged by
// the server); a FIN forged from outside (a random ack, as a blind forger
// sends) lands ahead of the tracked end, one before the end of the
// server's next segment; the server then sends that segment (100 bytes,
// one write), which covers the forged FIN's number; the pod's TCP drops
// the forged FIN and acknowledges the data, whose end is the forged FIN's.
// The flow must not be taken for closed: 12 s later (past a closed
// flow's 10 s) the server's next bytes still reach the pod.
//
// Red before attack31's fix: that ack counted the forged FIN, the flow
// was closed (a FIN each way) and expired while the server was sending.
func TestAttack31MasqForgedFINOvertakenByDataTCP(t *testing.T) {
	t.Parallel()
	lab, pod, brMAC, upMAC := masqLabPod(t)
	a := lab.a
	m := a.Maps()
	const port = 7431
	cli, sc, nodePort := masqIdleConn(t, lab, pod, outsideIP, labNodeA, port)
	if err := cli.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	sc.SetReadDeadline(time.Now().Add(3 * time.Second))
	if n, err := sc.Read(make([]byte, 8)); n != 0 || err == nil {
		t.Fatalf("the server read %d, %v; want the pod's FIN", n, err)
	}
	time.Sleep(100 * time.Millisecond) // the server's ACK of the pod's FIN through the node
	fl, end := a31RevEntry(t, m, nodePort, port)
	if fl&(1<<4) == 0 || fl&(1<<5|1<<6) != 0 {
		t.Fatalf("after the pod's half-close: flags %#x, want the pod's FIN only", fl)
	}
	const n = 100
	sendFrames(t, lab.out, "br0", [][]byte{tcpFrame(brMAC, upMAC, outsideIP, port, labNodeA, nodePort, end+n-1, rand.Uint32(), tcpFIN|tcpACK, 512)})
	if _, err := sc.Write([]byte(strings.Repeat("x", n))); err != nil {
		t.Fatal(err)
	}
	cli.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 2*n)
	got := 0
	for got < n {
		k, err := cli.Read(buf[got:])
		if err != nil {
			t.Fatalf("the pod read %d of the server's %d bytes: %v", got, n, err)
		}
		got += k
	}
	time.Sleep(200 * time.Millisecond) // the pod's (delayed) ACK through the node
	fl, _ = a31RevEntry(t, m, nodePort, port)
	if fl&(1<<5|1<<6) != 0 {
		t.Errorf("a FIN forged at the server's end + %d - 1, the server's %d bytes, the pod's ACK of them: flags %#x, want no FIN of the server's", n, n, fl)
	}
	time.Sleep(12 * time.Second) // longer than a closed flow's 10 s
	if _, err := sc.Write([]byte("pong\n")); err != nil {
		t.Fatal(err)
	}
	cli.SetReadDeadline(time.Now().Add(3 * time.Second))
	if k, err := cli.Read(buf); err != nil || string(buf[:k]) != "pong\n" {
		t.Fatalf("the pod's half-closed connection 12 s after the forged FIN the data overtook: read %q, %v; want pong", buf[:k], err)
	}
}
