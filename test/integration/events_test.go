package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/events"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// observeJSON runs `ebpf-agent observe -o json` (not following) and
// parses every line.
func observeJSON(t *testing.T, e *testenv.Env, args ...string) []events.Record {
	t.Helper()
	out, err := e.AgentCmd(append([]string{"observe", "-o", "json", "--state-dir", e.StateDir, "--pin-dir", e.PinDir}, args...)...)
	if err != nil {
		t.Fatalf("observe %v: %v\n%s", args, err, out)
	}
	var recs []events.Record
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" || strings.HasPrefix(l, "no kept event") {
			continue
		}
		var r events.Record
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("observe -o json printed a line that is no JSON record: %q: %v", l, err)
		}
		recs = append(recs, r)
	}
	return recs
}

// observeFollow runs `ebpf-agent observe -o json ARGS` (following) and
// returns the first n records, or what came within 10 s (it returns at n:
// the bound is for a loaded node).
func observeFollow(t *testing.T, e *testenv.Env, n int, args ...string) (recs []events.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(testenv.BinDir, "ebpf-agent"),
		append([]string{"observe", "-o", "json", "--state-dir", e.StateDir, "--pin-dir", e.PinDir}, args...)...)
	out, err := cmd.StdoutPipe()
	must(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	must(t, cmd.Start())
	defer func() {
		cancel()
		cmd.Wait()
		if len(recs) < n {
			t.Logf("observe %v: stderr %s", args, stderr.String())
		}
	}()
	sc := bufio.NewScanner(out)
	for len(recs) < n && sc.Scan() {
		var r events.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("observe %v printed %q: %v", args, sc.Text(), err)
		}
		recs = append(recs, r)
	}
	return recs
}

// observeUntil reads the kept events (observe -o json ARGS) until done
// says they hold what the test waits for, or 10 s pass (the agent keeps
// them in the background: a fixed pause before one read raced it on a
// loaded node), and returns the last read.
func observeUntil(t *testing.T, e *testenv.Env, done func([]events.Record) bool, args ...string) []events.Record {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		recs := observeJSON(t, e, args...)
		if done(recs) || time.Now().After(deadline) {
			return recs
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// newEvents waits until the agent keeps events after seq and returns them
// once no more come for 300 ms.
func newEvents(t *testing.T, e *testenv.Env, seq uint64, want int) []events.Record {
	t.Helper()
	var got []events.Record
	deadline := time.Now().Add(10 * time.Second) // ends at want: a bound for a loaded node
	for {
		got = got[:0]
		for _, r := range observeJSON(t, e, "--last", "1000") {
			if r.Seq > seq {
				got = append(got, r)
			}
		}
		if len(got) >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	got = got[:0]
	for _, r := range observeJSON(t, e, "--last", "1000") {
		if r.Seq > seq {
			got = append(got, r)
		}
	}
	return got
}

// settledDrops reads a drop counter and the events kept after seq until the
// two agree (the counter unchanged across the read of the events, and the
// events that match as many as its increase), or 10 s pass (the agent
// keeps events in the background; a loaded node is slow to). The pod's own
// kernel sends MLD reports and neighbour solicitations whenever it likes,
// and those can be dropped too: one snapshot of each, taken at different
// moments, would race them. match must select what the counter counts
// (reason, direction, interface) and nothing narrower, or a drop of
// another packet on the same counter never settles.
func settledDrops(t *testing.T, e *testenv.Env, m *maps.Maps, idx int, dir maps.Dir, r maps.Reason, before, seq uint64, match func(events.Record) bool) (drops uint64, matched int, got []events.Record) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c1 := counter(t, m, idx, dir, r).Packets
		got = got[:0]
		matched = 0
		for _, ev := range observeJSON(t, e, "--last", "1000") {
			if ev.Seq > seq {
				got = append(got, ev)
				if match(ev) {
					matched++
				}
			}
		}
		c2 := counter(t, m, idx, dir, r).Packets
		drops = c2 - before
		if (c1 == c2 && uint64(matched) == drops && drops > 0) || time.Now().After(deadline) {
			return drops, matched, got
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestEventsEachDropReason: every drop reason of the host veth programs,
// provoked with frames a pod sends (AF_PACKET), shows exactly one drop
// event per counter increment, with its reason, direction, pod, interface
// and addresses, through `ebpf-agent observe -o json --last`.
func TestEventsEachDropReason(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	conf := e.WriteConfDir()
	e.StartAgent(conf, "--metrics-addr", "")
	pod := e.NewPod()
	e.CleanupDel(pod, "evd")
	r := e.AddK8s(pod, "evd", "shop", "web-1")
	v4, v6 := testenv.PodIPs(t, r)
	hostIf, idx := e.HostVeth("evd")
	m := e.Maps()
	podMAC := podMACOf(t, pod, "eth0")
	hostMAC := hostMACOf(m, idx)
	group, _ := net.ParseMAC("03:00:00:00:00:cc")
	spoofed := net.ParseIP("10.250.9.99")

	type provoke struct {
		reason   maps.Reason
		frame    []byte
		src, dst string
		proto    string
		setup    func() // makes the state the drop needs
		undo     func()
	}
	cases := []provoke{
		{reason: maps.ReasonDropSpoofIP, frame: ipv4UDPFrame(podMAC, hostMAC, spoofed, testenv.NodeIP4),
			src: spoofed.String(), dst: testenv.NodeIP4.String(), proto: "udp"},
		{reason: maps.ReasonDropSpoofMAC, frame: ipv4UDPFrame(group, hostMAC, v4, testenv.NodeIP4),
			src: v4.String(), dst: testenv.NodeIP4.String(), proto: "udp"},
		{reason: maps.ReasonDropProto, frame: append(ethHeader(podMAC, hostMAC, 0x88cc), make([]byte, 46)...), proto: "ethertype 0x88cc"},
		{reason: maps.ReasonDropMalform, frame: append(ethHeader(podMAC, hostMAC, 0x0806), make([]byte, 10)...), proto: "arp"},
		{reason: maps.ReasonDropRouterMsg, frame: ipv4Frame(podMAC, hostMAC, v4, testenv.NodeIP4, 1,
			icmp4([]byte{5, 1, 0, 0, 10, 250, 0, 99, 0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 192, 0, 2, 1, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0})),
			src: v4.String(), dst: testenv.NodeIP4.String(), proto: "icmp"},
		// No link entry (an ADD killed half way leaves that): link-local
		// IPv6 is checked against it.
		{reason: maps.ReasonDropUnknown, frame: ipv6Frame(podMAC, hostMAC, net.ParseIP("fe80::42"), net.ParseIP("ff02::2"), 255, nil, []byte{128, 0, 0, 0, 0, 1, 0, 1}),
			src: "fe80::42", dst: "ff02::2", proto: "icmpv6"},
	}
	link, err := m.Links().Lookup(idx)
	must(t, err)
	cases[5].setup = func() { must(t, m.Links().Delete(idx)) }
	cases[5].undo = func() { must(t, m.Links().Put(idx, link)) }

	var seq uint64
	if recs := observeJSON(t, e, "--last", "1000"); len(recs) > 0 {
		seq = recs[len(recs)-1].Seq
	}
	for _, c := range cases {
		t.Run(c.reason.String(), func(t *testing.T) {
			if c.setup != nil {
				c.setup()
				defer c.undo()
			}
			before := counter(t, m, idx, maps.DirEgress, c.reason).Packets
			podRaw(t, pod, "eth0", c.frame)
			waitCounter(t, m, idx, c.reason, before+1)
			// The pod's own kernel may add one (an MLD report while its
			// link entry is gone): one event per counter increment, and
			// exactly one is the frame sent.
			drops, n, got := settledDrops(t, e, m, idx, maps.DirEgress, c.reason, before, seq, func(ev events.Record) bool {
				return ev.Reason == c.reason.String() && ev.Direction == "egress" && ev.Ifindex == uint32(idx)
			})
			if len(got) > 0 {
				seq = got[len(got)-1].Seq
			}
			if uint64(n) != drops || len(got) != n {
				t.Fatalf("%d events (%d of them %s egress) for %d %s drops: %+v", len(got), n, c.reason, drops, c.reason, got)
			}
			var ev *events.Record
			for i := range got {
				if got[i].Length == uint32(len(c.frame)) && got[i].Src == c.src {
					if ev != nil {
						t.Fatalf("two events of the one frame sent: %+v", got)
					}
					ev = &got[i]
				}
			}
			if ev == nil {
				t.Fatalf("no event of the frame sent (%d bytes from %q): %+v", len(c.frame), c.src, got)
			}
			if ev.Type != "drop" || ev.Verdict != "dropped" || ev.Reason != c.reason.String() || ev.Direction != "egress" ||
				ev.Pod != "shop/web-1" || ev.Interface != hostIf || ev.Ifindex != uint32(idx) || ev.Protocol != c.proto ||
				ev.Src != c.src || ev.Dst != c.dst {
				t.Errorf("event %+v\nwant drop %s egress pod shop/web-1 on %s (%d), %s %s -> %s", *ev, c.reason, hostIf, idx, c.proto, c.src, c.dst)
			}
			if c.reason == maps.ReasonDropSpoofMAC && ev.SrcPod != "shop/web-1" {
				t.Errorf("the source address is the pod's own: srcPod %q, want shop/web-1", ev.SrcPod)
			}
		})
	}

	// Bandwidth: a pod over its egress limit; every drop is one event.
	bw := e.NewPod()
	e.CleanupDel(bw, "evbw")
	rb, err := e.AddBW(bw, "evbw", map[string]any{"egressRate": 100000, "egressBurst": 12000, "ingressRate": 100000, "ingressBurst": 12000})
	must(t, err)
	bw4, _ := testenv.PodIPs(t, rb)
	_, bwIdx := e.HostVeth("evbw")
	bwMAC, bwHost := podMACOf(t, bw, "eth0"), hostMACOf(m, bwIdx)
	before := counter(t, m, bwIdx, maps.DirEgress, maps.ReasonDropBandwidth).Packets
	for i := 0; i < 10; i++ {
		podRaw(t, bw, "eth0", ipv4Frame(bwMAC, bwHost, bw4, testenv.NodeIP4, 17, append([]byte{0x30, 0x39, 0, 9, 5, 0x80, 0, 0}, make([]byte, 1400)...)))
	}
	waitCounter(t, m, bwIdx, maps.ReasonDropBandwidth, before+1)
	// Every packet the pod sends counts against its limit, its own MLD
	// reports and neighbour solicitations too (issue 28): those drops are
	// events as well, so the count is of every egress drop_bandwidth event of
	// the interface, and the frames sent must be among them.
	drops, n, got := settledDrops(t, e, m, bwIdx, maps.DirEgress, maps.ReasonDropBandwidth, before, seq, func(ev events.Record) bool {
		return ev.Reason == "drop_bandwidth" && ev.Direction == "egress" && ev.Ifindex == uint32(bwIdx)
	})
	udp := 0
	for _, ev := range got {
		if ev.Reason == "drop_bandwidth" && ev.Direction == "egress" && ev.Ifindex == uint32(bwIdx) &&
			ev.Src == bw4.String() && ev.Protocol == "udp" && ev.DstPort == 9 {
			udp++
		}
	}
	if n != int(drops) || len(got) != n || udp == 0 {
		t.Errorf("%d drop_bandwidth counted, %d matching events (%d of the UDP frames sent) of %d new: %+v", drops, n, udp, len(got), got)
	}
	_ = v6
	if len(got) > 0 {
		seq = got[len(got)-1].Seq
	}

	// Ingress: the node's UDP to the limited pod, over its limit.
	beforeIn := counter(t, m, bwIdx, maps.DirIngress, maps.ReasonDropBandwidth).Packets
	must(t, e.InNode(func() error {
		c, err := net.Dial("udp", net.JoinHostPort(bw4.String(), "9"))
		if err != nil {
			return err
		}
		defer c.Close()
		for i := 0; i < 60; i++ {
			c.Write(make([]byte, 1400))
		}
		return nil
	}))
	var dropsIn uint64
	for deadline := time.Now().Add(10 * time.Second); dropsIn == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		dropsIn = counter(t, m, bwIdx, maps.DirIngress, maps.ReasonDropBandwidth).Packets - beforeIn
	}
	if dropsIn == 0 {
		t.Fatalf("60 datagrams of 1400 bytes at once over an ingress limit of 100 kbit/s: no drop counted")
	}
	// The count is of every ingress drop_bandwidth event of the interface,
	// as the counter's: any other packet the node sends the pod meanwhile
	// (neighbour discovery, say) counts against its limit too; one such
	// drop once left the count of UDP events one short of the counter (52
	// counted, 51 matched) and failed the test.
	dropsIn, n, got = settledDrops(t, e, m, bwIdx, maps.DirIngress, maps.ReasonDropBandwidth, beforeIn, seq, func(ev events.Record) bool {
		return ev.Reason == "drop_bandwidth" && ev.Direction == "ingress" && ev.Ifindex == uint32(bwIdx)
	})
	udpIn := 0
	for _, ev := range got {
		if ev.Reason == "drop_bandwidth" && ev.Direction == "ingress" && ev.Ifindex == uint32(bwIdx) &&
			ev.Dst == bw4.String() && ev.Protocol == "udp" && ev.DstPort == 9 {
			udpIn++
		}
	}
	if uint64(n) != dropsIn || udpIn == 0 || udpIn > 60 {
		t.Errorf("%d ingress drop_bandwidth counted, %d matching events (%d of the 60 datagrams sent) of %d new: %+v", dropsIn, n, udpIn, len(got), got)
	}
	t.Logf("ingress: %d drops, %d events, %d of them the datagrams sent", dropsIn, n, udpIn)

	// Filters: --verdict, --protocol, --pod.
	// The pod's own kernel may have sent ICMPv6 of its own while its link
	// entry was gone (a neighbour solicitation of its DAD, an MLD report:
	// once a third event here, 12:43 at load 28): the filter keeps every
	// ICMP event of the pod and only those, the two frames sent among them.
	recs := observeJSON(t, e, "--last", "1000", "--pod", "shop/web-1", "--protocol", "icmp")
	sent := 0
	for _, r := range recs {
		if r.Pod != "shop/web-1" || (r.Protocol != "icmp" && r.Protocol != "icmpv6") {
			t.Errorf("--pod shop/web-1 --protocol icmp let through %+v", r)
		}
		switch {
		case r.Reason == "drop_router_msg" && r.Src == v4.String(), r.Reason == "drop_unknown_endpoint" && r.Src == "fe80::42":
			sent++
		case r.Reason != "drop_unknown_endpoint":
			t.Errorf("--pod shop/web-1 --protocol icmp: an event the test did not provoke nor the pod's kernel could: %+v", r)
		}
	}
	if sent != 2 {
		t.Errorf("--pod shop/web-1 --protocol icmp: %d of the redirect and the IPv6 frame sent, want both: %+v", sent, recs)
	}
	if recs := observeJSON(t, e, "--last", "1000", "--verdict", "forwarded"); len(recs) != 0 {
		t.Errorf("--verdict forwarded with flow events off: %+v", recs)
	}
	// --since: the kept events of the last 10 minutes, then following.
	if recs := observeFollow(t, e, 6, "--since", "10m", "--pod", "shop/web-1"); len(recs) != 6 || recs[0].Reason != "drop_spoof_ip" {
		t.Errorf("--since 10m --pod shop/web-1: %d records, want the 6 drops provoked: %+v", len(recs), recs)
	}
	// The table reads.
	out, err := e.AgentCmd("observe", "--state-dir", e.StateDir, "--last", "3")
	if err != nil || !strings.Contains(out, "VERDICT") || !strings.Contains(out, "DROPPED") {
		t.Errorf("observe table: %v\n%s", err, out)
	}
	t.Logf("observe --last 3:\n%s", out)
	e.MustDel(pod, "evd")
	e.MustDel(bw, "evbw")
}

// TestEventsFlows: with flow events on, a TCP transfer between two pods
// shows its flows (start with both pods named, end at FIN) and
// --verdict forwarded selects them; per pod, only the pod turned on with
// `ebpf-agent events --flows-pod` sends them, and DEL turns it off.
func TestEventsFlows(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	conf := e.WriteConfDir()
	e.StartAgent(conf, "--metrics-addr", "", "--flow-events", "node")
	a, b := e.NewPod(), e.NewPod()
	e.CleanupDel(a, "efa")
	e.CleanupDel(b, "efb")
	e.AddK8s(a, "efa", "ns1", "client")
	rb := e.AddK8s(b, "efb", "ns2", "server")
	b4, _ := testenv.PodIPs(t, rb)
	must(t, testenv.TCPTransferPort(a, b, b4, 8081, 1000))
	var start, end bool
	recs := observeUntil(t, e, func(recs []events.Record) bool {
		start, end = false, false
		for _, r := range recs {
			if r.Pod == "ns1/client" && r.Direction == "egress" && r.DstPort == 8081 && r.SrcPod == "ns1/client" && r.DstPod == "ns2/server" {
				start = start || r.Type == "flow-start"
				end = end || r.Type == "flow-end"
			}
		}
		return start && end
	}, "--last", "1000", "--verdict", "forwarded", "--protocol", "tcp", "--pod", "ns1/client")
	if !start || !end {
		t.Errorf("no flow-start and flow-end of client -> server:8081: %+v", recs)
	}
	// IPv6 too.
	_, b6 := testenv.PodIPs(t, rb)
	must(t, testenv.TCPTransferPort(a, b, b6, 8083, 1000))
	start6 := false
	observeUntil(t, e, func(recs []events.Record) bool {
		for _, r := range recs {
			if r.Type == "flow-start" && r.Family == "ipv6" && r.DstPort == 8083 && r.Dst == b6.String() && r.DstPod == "ns2/server" {
				start6 = true
			}
		}
		return start6
	}, "--last", "1000", "--verdict", "forwarded", "--pod", "ns2/server")
	if !start6 {
		t.Errorf("no IPv6 flow-start to server:8083")
	}

	// Per pod.
	out, err := e.AgentCmd("events", "--state-dir", e.StateDir, "--pin-dir", e.PinDir, "--flows", "pods", "--flows-pod", "ns2/server")
	if err != nil || !strings.Contains(out, "flow events: pods (pods: ns2/server)") {
		t.Fatalf("events --flows-pod: %v\n%s", err, out)
	}
	last := observeJSON(t, e, "--last", "1")
	seq := uint64(0)
	if len(last) > 0 {
		seq = last[0].Seq
	}
	must(t, testenv.TCPTransferPort(a, b, b4, 8082, 1000))
	got := newEvents(t, e, seq, 2)
	for _, r := range got {
		if r.Pod != "ns2/server" {
			t.Errorf("flow event of a pod not turned on: %+v", r)
		}
	}
	if len(got) == 0 {
		t.Errorf("no flow event of the pod turned on")
	}
	_, bIdx := e.HostVeth("efb")
	e.MustDel(b, "efb")
	if ids, err := e.Maps().Events().FlowEndpoints(); err != nil || len(ids) != 0 {
		t.Errorf("flow events switch after DEL: %v %v (server was %d)", ids, err, bIdx)
	}
	e.MustDel(a, "efa")
}

// TestObserveWithoutAgent: with no agent, observe says events are off
// until `ebpf-agent events --drops on`, then reads the ring buffer itself;
// --last needs the agent and says so.
func TestObserveWithoutAgent(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	e.CleanupDel(pod, "evn")
	e.AddK8s(pod, "evn", "solo", "p")
	_, idx := e.HostVeth("evn")
	m := e.Maps()
	podMAC, hostMAC := podMACOf(t, pod, "eth0"), hostMACOf(m, idx)

	out, err := e.AgentCmd("observe", "--state-dir", e.StateDir, "--pin-dir", e.PinDir, "--last", "5")
	if err == nil || !strings.Contains(out, "no agent is running") || !strings.Contains(out, "ebpf-agent run") {
		t.Errorf("observe --last without an agent: %v\n%s", err, out)
	}
	out, err = e.AgentCmd("observe", "--state-dir", e.StateDir, "--pin-dir", e.PinDir)
	if err == nil || !strings.Contains(out, "events are off") {
		t.Errorf("observe without an agent, events off: %v\n%s", err, out)
	}
	if out, err := e.AgentCmd("events", "--state-dir", e.StateDir, "--pin-dir", e.PinDir, "--drops", "on"); err != nil ||
		!strings.Contains(out, "drop events: on") || !strings.Contains(out, "agent: no agent is running") {
		t.Fatalf("events --drops on: %v\n%s", err, out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(testenv.BinDir, "ebpf-agent"), "observe", "-o", "json", "--state-dir", e.StateDir, "--pin-dir", e.PinDir)
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	must(t, cmd.Start())
	time.Sleep(300 * time.Millisecond)
	podRaw(t, pod, "eth0", ipv4UDPFrame(podMAC, hostMAC, net.ParseIP("10.250.8.8"), testenv.NodeIP4))
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line <- sc.Text()
		}
	}()
	select {
	case l := <-line:
		var r events.Record
		if err := json.Unmarshal([]byte(l), &r); err != nil || r.Reason != "drop_spoof_ip" || r.Pod != "solo/p" || r.Src != "10.250.8.8" {
			t.Errorf("observe without an agent printed %q (%v)", l, err)
		}
	case <-time.After(10 * time.Second): // it ends at the line: a bound for a loaded node
		t.Errorf("observe without an agent printed nothing; stderr: %s", stderr.String())
	}
	cancel()
	cmd.Wait() // stderr is complete
	if !strings.Contains(stderr.String(), "reading the datapath's ring buffer directly") {
		t.Errorf("observe without an agent did not say it reads the ring itself: %q", stderr.String())
	}
	e.MustDel(pod, "evn")
}

// TestEventsAgentKilled: an agent killed with SIGKILL leaves its socket;
// observe then finds no agent (and says so), and the next agent replaces
// the socket and serves again, the events sent meanwhile included.
func TestEventsAgentKilled(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	conf := e.WriteConfDir()
	a := e.StartAgent(conf, "--metrics-addr", "")
	pod := e.NewPod()
	e.CleanupDel(pod, "evk")
	e.AddK8s(pod, "evk", "k", "p")
	_, idx := e.HostVeth("evk")
	m := e.Maps()
	podMAC, hostMAC := podMACOf(t, pod, "eth0"), hostMACOf(m, idx)
	observeJSON(t, e, "--last", "1") // the agent answers
	if fi, err := os.Stat(events.SocketPath(e.StateDir)); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("the agent's socket: %v %v, want a socket of mode 0600", fi.Mode(), err)
	}
	a.Cmd.Process.Kill()
	a.Exited(5 * time.Second)
	sock := events.SocketPath(e.StateDir)
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("no socket left by the killed agent (%v): the test proves nothing", err)
	}
	out, err := e.AgentCmd("observe", "--state-dir", e.StateDir, "--pin-dir", e.PinDir, "--last", "1")
	if err == nil || !strings.Contains(out, "no agent is running") {
		t.Errorf("observe --last after the agent was killed: %v\n%s", err, out)
	}
	// A drop while no agent runs waits in the ring for the next one.
	podRaw(t, pod, "eth0", ipv4UDPFrame(podMAC, hostMAC, net.ParseIP("10.250.6.6"), testenv.NodeIP4))
	waitCounter(t, m, idx, maps.ReasonDropSpoofIP, 1)
	e.StartAgent(conf, "--metrics-addr", "")
	got := newEvents(t, e, 0, 1)
	found := false
	for _, r := range got {
		found = found || (r.Src == "10.250.6.6" && r.Pod == "k/p")
	}
	if !found {
		t.Errorf("the next agent did not show the drop sent while none ran: %+v", got)
	}
	e.MustDel(pod, "evk")
}
