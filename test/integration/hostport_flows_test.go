// hostPort flows: DEL purges the pod's flows and node sockets, the node's own
// flows on a hostPort number are kept.

package integration

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// udpFlood sends a datagram every 20 ms from a fixed source in netns to addr
// until stopped, and counts the answers by server.
type udpFlood struct {
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	answers map[string]int
}

func startUDPFlood(t *testing.T, netns ns.NetNS, src *net.UDPAddr, addr string) *udpFlood {
	t.Helper()
	f := &udpFlood{stop: make(chan struct{}), done: make(chan struct{}), answers: map[string]int{}}
	var c *net.UDPConn
	err := netns.Do(func(ns.NetNS) error {
		var err error
		c, err = net.ListenUDP("udp", src)
		return err
	})
	if err != nil {
		t.Fatalf("UDP flood socket: %v", err)
	}
	raddr, _ := net.ResolveUDPAddr("udp", addr)
	go func() {
		buf := make([]byte, 512)
		for {
			n, _, err := c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			if a, err := parseAnswer(string(buf[:n])); err == nil {
				f.mu.Lock()
				f.answers[a.server]++
				f.mu.Unlock()
			}
		}
	}()
	go func() {
		defer close(f.done)
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-f.stop:
				c.Close()
				return
			case <-tk.C:
				c.WriteToUDP([]byte("flood"), raddr)
			}
		}
	}()
	stop := func() {
		select {
		case <-f.stop:
		default:
			close(f.stop)
			<-f.done
		}
	}
	t.Cleanup(stop)
	return f
}

func (f *udpFlood) count(server string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.answers[server]
}

// countUDP counts datagrams arriving on port in netns during d.
func countUDP(t *testing.T, netns ns.NetNS, port int, d time.Duration) int {
	t.Helper()
	var c net.PacketConn
	err := netns.Do(func(ns.NetNS) error {
		var err error
		c, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		t.Fatalf("listen UDP %d: %v", port, err)
	}
	defer c.Close()
	n := 0
	end := time.Now().Add(d)
	buf := make([]byte, 512)
	for time.Now().Before(end) {
		c.SetReadDeadline(end)
		if _, _, err := c.ReadFrom(buf); err == nil {
			n++
		}
	}
	return n
}

// TestHostPortDelPurgesFlows: DEL removes the pod's mappings, every cni_ct
// and socket entry made for it, and aborts node UDP sockets the hook had
// connected to it. A new pod given the same IP receives none of the old
// UDP flows: neither a remote client still sending to the hostPort nor a
// node socket that had connected through it (the portmap failure where
// stale conntrack entries keep delivering to the IP).
func TestHostPortDelPurgesFlows(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	// One address only, so the next pod gets the same one.
	e.IPAM = map[string]any{
		"type": "host-local", "dataDir": e.DataDir,
		"ranges": [][]map[string]string{{{"subnet": testenv.PodSubnet4, "rangeStart": "10.250.0.50", "rangeEnd": "10.250.0.50"}}},
	}
	old := e.NewPod()
	r := e.MustAddHP(old, "old", testenv.PM{HostPort: 6000, ContainerPort: 80, Protocol: "udp"}, testenv.PM{HostPort: 6001, ContainerPort: 81, Protocol: "tcp"})
	podIP, _ := resultIPs(r)
	serve(t, old, 80, "old")
	serve(t, old, 81, "old")
	_, oldIdx := e.HostVeth("old")

	flood := startUDPFlood(t, e.remote, &net.UDPAddr{IP: remoteIP4, Port: 40000}, hp(uplinkIP4, 6000))
	// A node process with a connected UDP socket through the hostPort.
	var nodeSock net.Conn
	err := e.Node.Do(func(ns.NetNS) error {
		var err error
		nodeSock, err = net.Dial("udp", "127.0.0.1:6000")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer nodeSock.Close()
	nodeSock.Write([]byte("hello"))
	nodeSock.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := nodeSock.Read(make([]byte, 256)); err != nil || n == 0 {
		t.Fatalf("node's connected UDP socket got no answer: %v", err)
	}
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 6001), "old")
	deadline := time.Now().Add(10 * time.Second)
	for flood.count("old") < 5 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if flood.count("old") < 5 {
		t.Fatalf("the remote UDP flow got %d answers from the old pod, want some", flood.count("old"))
	}

	m := e.Maps()
	flows := ctOf(t, m, oldIdx)
	found := false
	for _, f := range flows {
		if f.Client.String() == hp(remoteIP4, 40000) && f.Dialled.String() == hp(uplinkIP4, 6000) && f.Pod.String() == hp(podIP, 80) {
			found = true
		}
	}
	if !found {
		t.Fatalf("cni_ct lacks the remote UDP flow %s -> %s -> %s: %+v", hp(remoteIP4, 40000), hp(uplinkIP4, 6000), hp(podIP, 80), flows)
	}
	socks, _ := m.HostPorts().ListSockRNAT()
	if len(socks) == 0 {
		t.Fatalf("cni_sock_rnat has no entry for the node's socket")
	}

	e.MustDel(old, "old")
	if l := ctOf(t, m, oldIdx); len(l) != 0 {
		t.Errorf("DEL left %d cni_ct entries of the pod: %+v", len(l), l)
	}
	e.AssertNoHostPorts()
	// The node socket was aborted.
	nodeSock.SetDeadline(time.Now().Add(time.Second))
	_, werr := nodeSock.Write([]byte("still there?"))
	_, rerr := nodeSock.Read(make([]byte, 64))
	if werr == nil && rerr == nil {
		t.Errorf("the node's UDP socket connected through the hostPort still works after DEL")
	}

	// A new pod with the same IP, no mappings, listening on the same ports.
	fresh := e.NewPod()
	e.CleanupDel(fresh, "fresh")
	rf, err := e.AddHP(fresh, "fresh")
	if err != nil {
		t.Fatal(err)
	}
	if ip, _ := resultIPs(rf); !ip.Equal(podIP) {
		t.Fatalf("new pod got %s, want the old pod's %s", ip, podIP)
	}
	stopNode := make(chan struct{})
	go func() { // the old node socket keeps trying
		for {
			select {
			case <-stopNode:
				return
			case <-time.After(20 * time.Millisecond):
				nodeSock.Write([]byte("stale"))
			}
		}
	}()
	n := countUDP(t, fresh, 80, 1500*time.Millisecond)
	close(stopNode)
	if n != 0 {
		t.Errorf("the new pod with the old pod's IP received %d datagrams of the old flows", n)
	}
	e.MustDel(fresh, "fresh")
	e.AssertClean()
	e.AssertNoHostPorts()
}

// TestHostPortNodeFlowsKept: the node's own connections whose local port
// happens to be a hostPort number keep their return traffic (TCP: only a
// SYN opens a translated flow; UDP: a connected node socket owns its flow),
// while new clients on that port still reach the pod.
func TestHostPortNodeFlowsKept(t *testing.T) {
	t.Parallel()
	e := newHPEnv(t)
	p := e.NewPod()
	e.MustAddHP(p, "web", testenv.PM{HostPort: 7100, ContainerPort: 80, Protocol: "tcp"}, testenv.PM{HostPort: 7100, ContainerPort: 80, Protocol: "udp"})
	serve(t, p, 80, "web")
	serve(t, e.remote, 5000, "remote")

	// TCP from the node's port 7100 to the remote server.
	err := e.Node.Do(func(ns.NetNS) error {
		d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{IP: uplinkIP4, Port: 7100}}
		c, err := d.Dial("tcp", hp(remoteIP4, 5000))
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "remote ") {
			return fmt.Errorf("answer %q, %v", line, err)
		}
		return nil
	})
	if err != nil {
		t.Errorf("node TCP connection from local port 7100 (a hostPort): %v", err)
	}
	// UDP, connected, from the node's port 7100.
	err = e.Node.Do(func(ns.NetNS) error {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: uplinkIP4, Port: 7100}, &net.UDPAddr{IP: remoteIP4, Port: 5000})
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 256)
		for try := 0; try < 3; try++ {
			c.Write([]byte("q"))
			c.SetReadDeadline(time.Now().Add(time.Second))
			n, err := c.Read(buf)
			if err == nil && strings.HasPrefix(string(buf[:n]), "remote ") {
				return nil
			}
		}
		return fmt.Errorf("no answer")
	})
	if err != nil {
		t.Errorf("node connected UDP socket on local port 7100 (a hostPort): %v", err)
	}
	// Everyone else still reaches the pod.
	expectServer(t, e.remote, "tcp", hp(uplinkIP4, 7100), "web")
	expectServer(t, e.remote, "udp", hp(uplinkIP4, 7100), "web")
	e.MustDel(p, "web")
	e.AssertNoHostPorts()
}
