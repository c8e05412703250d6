// Helpers several feature files share: counters, pods, plugin errors.

package integration

import (
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// counter returns one counter of a host veth (zero when absent).
func counter(t *testing.T, m *maps.Maps, ifindex int, dir maps.Dir, reason maps.Reason) maps.Counter {
	t.Helper()
	cs, err := m.Stats().Counters(ifindex)
	if err != nil {
		t.Fatalf("read counters of ifindex %d: %v", ifindex, err)
	}
	return cs[maps.CounterKey{Dir: dir, Reason: reason}]
}

// dumpCounters renders every counter of a host veth for failure messages.
func dumpCounters(m *maps.Maps, ifindex int) string {
	cs, err := m.Stats().Counters(ifindex)
	if err != nil {
		return err.Error()
	}
	var parts []string
	for k, c := range cs {
		parts = append(parts, fmt.Sprintf("%s/%s=%dp,%dB", k.Dir, k.Reason, c.Packets, c.Bytes))
	}
	return strings.Join(parts, " ")
}

// podAddrAdd adds an extra address to eth0 inside a pod, as a malicious
// workload with CAP_NET_ADMIN in its netns could.
func podAddrAdd(t *testing.T, pod ns.NetNS, cidr string) {
	t.Helper()
	err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		a, err := netlink.ParseAddr(cidr)
		if err != nil {
			return err
		}
		a.Flags = unix.IFA_F_NODAD | unix.IFA_F_NOPREFIXROUTE
		return netlink.AddrAdd(l, a)
	})
	if err != nil {
		t.Fatalf("add %s to pod eth0: %v", cidr, err)
	}
}

// udpSocket opens a UDP socket in netns bound to ip (port 0).
func udpSocket(t *testing.T, netns ns.NetNS, ip net.IP) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := netns.Do(func(ns.NetNS) error {
		var err error
		c, err = net.ListenUDP("udp", &net.UDPAddr{IP: ip})
		return err
	})
	if err != nil {
		t.Fatalf("UDP socket on %s: %v", ip, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// udpReceived reads from ln until a datagram carrying marker arrives (or the
// deadline passes), then drains stragglers briefly, and returns the payloads
// seen. Datagrams sent before the marker over the same path are queued ahead
// of it, so waiting for the marker bounds the wait without a long sleep.
func udpReceived(ln *net.UDPConn, marker string) (got []string, sawMarker bool) {
	buf := make([]byte, 2048)
	ln.SetReadDeadline(time.Now().Add(3 * time.Second))
	for !sawMarker {
		n, _, err := ln.ReadFromUDP(buf)
		if err != nil {
			return got, false
		}
		got = append(got, string(buf[:n]))
		sawMarker = string(buf[:n]) == marker
	}
	ln.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	for {
		n, _, err := ln.ReadFromUDP(buf)
		if err != nil {
			return got, sawMarker
		}
		got = append(got, string(buf[:n]))
	}
}

// resultIPs returns the IPv4 and IPv6 addresses of a result; either may be nil.
func resultIPs(r *current.Result) (v4, v6 net.IP) {
	for _, ipc := range r.IPs {
		if ipc.Address.IP.To4() != nil {
			v4 = ipc.Address.IP
		} else {
			v6 = ipc.Address.IP
		}
	}
	return v4, v6
}

// podLink runs f on the pod's eth0.
func podLink(t *testing.T, pod ns.NetNS, f func(l netlink.Link) error) {
	t.Helper()
	err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return f(l)
	})
	if err != nil {
		t.Fatalf("pod eth0: %v", err)
	}
}

// podNeighs returns the neighbour entries of the pod's eth0, both families.
func podNeighs(t *testing.T, pod ns.NetNS) []netlink.Neigh {
	t.Helper()
	var out []netlink.Neigh
	podLink(t, pod, func(l netlink.Link) error {
		var err error
		out, err = netlink.NeighList(l.Attrs().Index, netlink.FAMILY_ALL)
		return err
	})
	return out
}

// neighState names a neighbour state for failure messages.
func neighState(s int) string {
	switch s {
	case netlink.NUD_INCOMPLETE:
		return "INCOMPLETE"
	case netlink.NUD_REACHABLE:
		return "REACHABLE"
	case netlink.NUD_STALE:
		return "STALE"
	case netlink.NUD_FAILED:
		return "FAILED"
	case netlink.NUD_NOARP:
		return "NOARP"
	case netlink.NUD_PERMANENT:
		return "PERMANENT"
	}
	return fmt.Sprintf("state%#x", s)
}

// hasToken reports whether mark occurs in s not followed by another digit or
// address character ("ifindex 3" must not match "ifindex 30", nor 10.0.0.1 10.0.0.12).
func hasToken(s, mark string) bool {
	for i := 0; ; {
		j := strings.Index(s[i:], mark)
		if j < 0 {
			return false
		}
		end := i + j + len(mark)
		if end == len(s) || !strings.ContainsRune("0123456789abcdef:.", rune(s[end])) {
			return true
		}
		i = i + j + 1
	}
}

// CNI error codes of the spec (SPEC.md, "Error"), as the types package names them.
const (
	codeIncompatibleVersion = types.ErrIncompatibleCNIVersion      // 1
	codeInvalidEnv          = types.ErrInvalidEnvironmentVariables // 4
	codeDecoding            = types.ErrDecodingFailure             // 6
	codeInvalidConfig       = types.ErrInvalidNetworkConfig        // 7
	codePluginNotAvailable  = uint(50)
)

// destroyPod closes and unmounts a pod netns, so the kernel destroys it and
// the pod end of the veth (and with it the host end) goes away.
func destroyPod(t *testing.T, pod ns.NetNS) {
	t.Helper()
	if err := testenv.RemoveNS(pod); err != nil {
		t.Fatalf("remove pod netns: %v", err)
	}
}

// wantErrContains fails unless err is non-nil and its message contains every
// substring (case-insensitive).
func wantErrContains(t *testing.T, what string, err error, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: succeeded, want an error", what)
	}
	msg := strings.ToLower(err.Error())
	for _, s := range subs {
		if !strings.Contains(msg, strings.ToLower(s)) {
			t.Errorf("%s: error %q does not mention %q", what, err, s)
		}
	}
}

// flood sends UDP datagrams from inside pod to dst as fast as it can until
// the returned stop is called. The socket is created in the pod netns, so the
// packets leave through the pod's veth; send errors (the veth going away, ICMP
// port unreachable) are ignored. It also stops when the test ends.
func flood(t *testing.T, pod ns.NetNS, dst net.IP) (stop func()) {
	t.Helper()
	var conn net.Conn
	err := pod.Do(func(ns.NetNS) error {
		var err error
		conn, err = net.Dial("udp", net.JoinHostPort(dst.String(), "9"))
		return err
	})
	if err != nil {
		t.Fatalf("open flood socket in pod: %v", err)
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		buf := make([]byte, 64)
		for {
			select {
			case <-done:
				return
			default:
			}
			conn.Write(buf)
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(done)
			<-finished
			conn.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}

func maskOnes(n *net.IPNet) (int, int) {
	if n == nil {
		return 0, 0
	}
	return n.Mask.Size()
}

// pluginEnv is the environment a runtime sets for one verb.
func pluginEnv(cmd, containerID string, pod ns.NetNS, ifname string) map[string]string {
	m := map[string]string{
		"CNI_COMMAND": cmd, "CNI_CONTAINERID": containerID, "CNI_IFNAME": ifname, "CNI_PATH": testenv.BinDir,
	}
	if pod != nil {
		m["CNI_NETNS"] = pod.Path()
	}
	return m
}

// wantPluginError fails unless the plugin exited non-zero with a CNI error of
// the given code whose message contains every substring.
func wantPluginError(t *testing.T, what string, out []byte, err error, code uint, subs ...string) *types.Error {
	t.Helper()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("%s: exit %v, want a failure; stdout: %s", what, err, out)
	}
	perr := testenv.PluginError(t, out)
	if perr.Code != code {
		t.Errorf("%s: error code %d (%q), want %d", what, perr.Code, perr.Msg, code)
	}
	for _, s := range subs {
		if !strings.Contains(perr.Msg+" "+perr.Details, s) {
			t.Errorf("%s: error %q does not mention %q", what, perr.Msg, s)
		}
	}
	return perr
}

// libcniErr checks an error libcni returned for a CNI code and substrings.
func libcniErr(t *testing.T, what string, err error, code uint, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: succeeded, want error %d", what, code)
	}
	if got := testenv.ErrCode(err); got != code {
		t.Errorf("%s: error code %d (%v), want %d", what, got, err, code)
	} else {
		t.Logf("%s: %d %v", what, got, err) // the message as a runtime shows it (-v)
	}
	wantErrContains(t, what, err, subs...)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// waitCounter waits up to 10 s for a from-pod counter to reach want.
func waitCounter(t *testing.T, m *maps.Maps, idx int, r maps.Reason, want uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second) // returns at want: a bound for a loaded node
	for {
		got := counter(t, m, idx, maps.DirEgress, r).Packets
		if got >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s of ifindex %d: %d, want >= %d\n  %s", r, idx, got, want, dumpCounters(m, idx))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hostMACOf is the host veth MAC the datapath stored for an ifindex.
func hostMACOf(m *maps.Maps, idx int) net.HardwareAddr {
	v, _ := m.Links().Lookup(idx)
	return append(net.HardwareAddr{}, v.HostMac[:]...)
}

// podMAC returns the MAC of an interface inside a pod.
func podMACOf(t *testing.T, pod ns.NetNS, ifname string) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ifname)
		if err == nil {
			mac = l.Attrs().HardwareAddr
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

func linkNameIn(idx int) string {
	if l, err := netlink.LinkByIndex(idx); err == nil {
		return l.Attrs().Name
	}
	return fmt.Sprint(idx)
}

// udpBlast sends 1400-byte UDP datagrams from one namespace to a listener
// on dst in another for sendFor (paced to offered bit/s, or as fast as
// the sender can with 0) and counts what arrives until readFor has passed
// since the start: bytes sent and received.
func udpBlast(t *testing.T, from, to ns.NetNS, dst net.IP, sendFor, readFor time.Duration, offered float64) (sent, received int64) {
	t.Helper()
	return udpBlastTo(t, from, to, &net.UDPAddr{IP: dst}, nil, sendFor, readFor, offered)
}

// udpBlastTo is udpBlast to a listener on laddr (a link-local one has its
// zone, the interface in to), sent to dial (nil: laddr with its port as
// bound; else dial's address, with the listener's port when it has none).
func udpBlastTo(t *testing.T, from, to ns.NetNS, laddr, dial *net.UDPAddr, sendFor, readFor time.Duration, offered float64) (sent, received int64) {
	t.Helper()
	var ln *net.UDPConn
	if err := to.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.ListenUDP("udp", laddr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	target := ln.LocalAddr().(*net.UDPAddr)
	if dial != nil {
		d := *dial
		if d.Port == 0 {
			d.Port = target.Port
		}
		target = &d
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		var n int64
		buf := make([]byte, 2048)
		ln.SetReadDeadline(time.Now().Add(readFor))
		for {
			k, err := ln.Read(buf)
			if err != nil {
				got <- n
				return
			}
			n += int64(k)
		}
	}()
	if err := from.Do(func(ns.NetNS) error {
		c, err := net.DialUDP("udp", nil, target)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 1400)
		var gap time.Duration
		if offered > 0 {
			gap = time.Duration(float64(len(buf)*8) / offered * float64(time.Second))
		}
		next := time.Now()
		for end := next.Add(sendFor); time.Now().Before(end); {
			if n, err := c.Write(buf); err == nil {
				sent += int64(n)
			}
			if gap > 0 {
				next = next.Add(gap)
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return sent, <-got
}

// waitRoutedToPod waits (up to 10 s) until each IPv6 address of ips routes
// to the pod itself in its netns: what this build's ADD waits for before
// it returns, and builds before it did not. A test that sends to pods an
// earlier build attached waits as this build's ADD would, or its first
// datagram to them can be lost to that defect, fixed since
// (TestFirstIPv6DatagramAfterAdd).
func waitRoutedToPod(t *testing.T, pod ns.NetNS, ips ...net.IP) {
	t.Helper()
	must(t, pod.Do(func(ns.NetNS) error {
		deadline := time.Now().Add(10 * time.Second)
		for _, ip := range ips {
			if ip.To4() != nil {
				continue
			}
			for {
				rs, err := netlink.RouteGet(ip)
				if err == nil && len(rs) > 0 && rs[0].Type == unix.RTN_LOCAL {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("%s does not route to the pod after 10 s: %v %+v", ip, err, rs)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		return nil
	}))
}

// linksUp sets the named links of the calling thread's netns up (a lab
// host's lo and eth0).
func linksUp(names ...string) error {
	for _, n := range names {
		l, err := netlink.LinkByName(n)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
	}
	return nil
}
