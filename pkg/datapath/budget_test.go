//go:build pktbudget

package datapath

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestPacketBudget is the per-packet budget of issue 30: BPF_PROG_TEST_RUN
// nanoseconds per run of each program on each path a packet takes (pod to
// pod, node to pod, remote to pod, hostPort, Service through the stack,
// masquerade), on hand-made frames with the maps as ADD and the node hooks
// fill them. Each row checks that the packet took its path (verdict and
// rewrite), then times R rounds of N single runs (one run per syscall: the
// NAT paths rewrite the frame, which a repeated run would then see), the
// kernel's own time of each run; a round's figure is its mean, the row's
// the median of the rounds with their min and max (the spread).
//
// A measurement, built only with -tags pktbudget (make bench-packet, and
// the packet part of make bench), so the suite never skips it:
//
//	go test -tags pktbudget -count=1 -run TestPacketBudget -v ./pkg/datapath/
//
// EBPF_CNI_BUDGET_JSON=<file> also writes the rows as JSON;
// EBPF_CNI_BUDGET_ROUNDS and EBPF_CNI_BUDGET_RUNS change R (15) and N (400).
func TestPacketBudget(t *testing.T) {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err != nil || strings.TrimSpace(string(b)) != "1" {
		t.Fatal("net.ipv4.ip_forward is off in this network namespace: the forwarding paths (bpf_fib_lookup) cannot be timed; " +
			"run it through `go run ./test/bench -parts packet`, which gives it a namespace of its own")
	}
	rounds, runs := envInt(t, "EBPF_CNI_BUDGET_ROUNDS", 15), envInt(t, "EBPF_CNI_BUDGET_RUNS", 400)
	var rows []budgetRow
	add := func(path, prog string, p *ebpf.Program, frame []byte, ingress uint32, check func(ret uint32, out []byte) error) {
		t.Helper()
		ret, _, out := testRun(t, p, frame, ingress)
		if err := check(ret, out); err != nil {
			t.Fatalf("%s, %s: the packet did not take its path: %v", path, prog, err)
		}
		var means []float64
		for r := 0; r < rounds; r++ {
			var sum uint64
			for i := 0; i < runs; i++ {
				got, ns, _ := testRun(t, p, frame, ingress)
				if got != ret {
					t.Fatalf("%s, %s: verdict %d in round %d, %d at the check", path, prog, got, r, ret)
				}
				sum += uint64(ns)
			}
			means = append(means, float64(sum)/float64(runs))
		}
		rounds := append([]float64(nil), means...)
		sort.Float64s(means)
		rows = append(rows, budgetRow{Path: path, Program: prog, Median: means[len(means)/2], Min: means[0], Max: means[len(means)-1],
			Rounds: len(means), Runs: runs, RoundMeans: rounds})
	}

	// A node without hostPorts: the pod behind lo and another one.
	dp := testDatapath(t)
	linkAsADD(t, dp)
	endpointsAsADD(t, dp)
	tcpAck := packet(podMAC, protoTCP, podIP, dstIP, 40000, 80, ackFlag)
	add("pod to pod (same node), TCP", "cni_from_container", dp.FromContainer, tcpAck, 0, verdict(actRedirect))
	add("pod to pod (same node), UDP", "cni_from_container", dp.FromContainer,
		packet(podMAC, protoUDP, podIP, dstIP, 40000, 53, 0), 0, verdict(actRedirect))
	fromNode := packet(hostMAC, protoTCP, gwIP, podIP, 40000, 80, ackFlag)
	copy(fromNode[0:6], podMAC) // the neighbour entry's MAC: no rewrite
	add("node to pod, TCP", "cni_to_container", dp.ToContainer, fromNode, 0, verdict(actOK))

	// A node with hostPorts and its node hooks (hpDatapath): the uplink
	// programs run.
	hp := hpDatapath(t)
	linkAsADD(t, hp)
	up := uplinkProgram(t, hp)
	remote := packet(remoteMAC, protoTCP, clientIP, podIP, 40000, 80, ackFlag)
	add("remote to pod, TCP: uplink", "cni_from_uplink", up, remote, 0, verdict(actNext))
	fromRemote := packet(hostMAC, protoTCP, clientIP, podIP, 40000, 80, ackFlag)
	copy(fromRemote[0:6], podMAC)
	add("remote to pod, TCP: host veth", "cni_to_container", hp.ToContainer, fromRemote, 0, verdict(actOK))

	// hostPort: a remote client's segment of an open flow, DNATed and
	// redirected into the pod; the pod's reply, translated back.
	syn := packet(remoteMAC, protoTCP, clientIP, nodeIP, 40001, 8080, synFlag)
	if ret, _, _ := testRun(t, up, syn, 0); ret != actRedirect {
		t.Fatalf("hostPort SYN: verdict %d, want the redirect into the pod", ret)
	}
	add("hostPort in, TCP (flow open)", "cni_from_uplink", up, packet(remoteMAC, protoTCP, clientIP, nodeIP, 40001, 8080, ackFlag), 0,
		rewrite(actRedirect, func(p parsed) bool { return p.dst.Equal(dstIP) && p.dport == 80 }))
	info := maps.NewEndpointInfo(loIfindex, podMAC, hostMAC)
	info.Flags |= maps.EndpointFlagHostPort
	must(t, budgetMaps{hp.Maps}.PutEndpoint(podIP, info))
	must(t, budgetMaps{hp.Maps}.PutCT(ctFlow(podIP, 70, clientIP, 40002, nodeIP, 7000, loIfindex)))
	reply := packet(podMAC, protoTCP, podIP, clientIP, 70, 40002, ackFlag)
	add("hostPort reply, TCP", "cni_from_container", hp.FromContainer, reply, 0,
		rewrite(anyVerdict, func(p parsed) bool { return p.src.Equal(nodeIP) && p.sport == 7000 }))

	// Service through the stack: the backend pod (behind lo) is delivered
	// a client pod's segment that the stack DNATed (to_container records the
	// flow); its reply meets the record and goes back through the stack
	// instead of being redirected to the client pod.
	dp2 := testDatapath(t)
	linkAsADD(t, dp2)
	endpointsAsADD(t, dp2)
	svcIn := packet(hostMAC, protoTCP, dstIP, podIP, 40003, 80, ackFlag)
	copy(svcIn[0:6], podMAC)
	add("Service (stack) to backend pod, TCP", "cni_to_container", dp2.ToContainer, svcIn, 0, verdict(actOK))
	add("Service (stack) backend's reply, TCP", "cni_from_container", dp2.FromContainer,
		packet(podMAC, protoTCP, podIP, dstIP, 80, 40003, ackFlag), 0, notVerdict(actRedirect))
	// The same with the client pod's segment coming in from its host veth,
	// as the stack forwards it (its record is the client's own).
	svcOwn := packet(hostMAC, protoTCP, dstIP, podIP, 40004, 80, ackFlag)
	copy(svcOwn[0:6], podMAC)
	add("Service (stack) to backend pod, TCP, from the client's veth", "cni_to_container", dp2.ToContainer, svcOwn, dstIfindex, verdict(actOK))
	add("Service (stack) backend's reply, TCP, client's own record", "cni_from_container", dp2.FromContainer,
		packet(podMAC, protoTCP, podIP, dstIP, 80, 40004, ackFlag), 0, notVerdict(actRedirect))

	// Masquerade: the reply of a masqueraded flow, translated back to the pod.
	putSNAT(t, hp, protoTCP, nodeIP, 61234, farIP, 443, podIP, 40000)
	add("masquerade reply in, TCP", "cni_from_uplink", up, packet(remoteMAC, protoTCP, farIP, nodeIP, 443, 61234, ackFlag), 0,
		rewrite(anyVerdict, func(p parsed) bool { return p.dst.Equal(podIP) && p.dport == 40000 }))

	// Masquerade out: the pod's segment of a masqueraded flow (its SYN
	// allocated the mapping), SNATed to the node on the uplink's egress.
	progs, err := loadPrograms(hp.PinRoot, hp.Maps, nodeHookPrograms(), loadMissing)
	must(t, err)
	defer closePrograms(progs)
	mq := maps.NewEndpointInfo(loIfindex, podMAC, hostMAC)
	mq.Flags |= maps.EndpointFlagMasq
	must(t, budgetMaps{hp.Maps}.PutEndpoint(podIP, mq))
	masqOut := func(p parsed) bool { return !p.src.Equal(podIP) && p.dst.Equal(farIP) && p.dport == 443 }
	// The source is what the kernel's FIB picks towards farIP in this
	// netns (masq_source): the machine's, the same for every build.
	ret, out := testRunOut(t, progs["cni_to_uplink"], packet(podMAC, protoTCP, podIP, farIP, 40020, 443, synFlag), loIfindex)
	if err := rewrite(actNext, masqOut)(ret, out); err != nil {
		t.Fatalf("masquerade SYN: %v", err)
	}
	// The peer's SYN-ACK, back to the pod: the flow is established. The
	// FIB's source is a node address, as the node hooks keep them.
	snat := parseOut(out)
	must(t, budgetMaps{hp.Maps}.SyncNodeIPs(map[string]int{nodeIP.String(): 1, nodeIP6.String(): 1, snat.src.String(): 1}))
	ret, out = testRunOut(t, up, packet(remoteMAC, protoTCP, farIP, snat.src, 443, snat.sport, synFlag|ackFlag), 0)
	if err := rewrite(anyVerdict, func(p parsed) bool { return p.dst.Equal(podIP) && p.dport == 40020 })(ret, out); err != nil {
		t.Fatalf("masquerade SYN-ACK: %v", err)
	}
	add("masquerade out, TCP (flow open)", "cni_to_uplink", progs["cni_to_uplink"], packet(podMAC, protoTCP, podIP, farIP, 40020, 443, ackFlag), loIfindex,
		rewrite(actNext, masqOut))
	// Its reply: the flow's sequence tracking reads each of the server's
	// segments (fin21: its ack, for the bound on the pod's end).
	add("masquerade reply in, TCP (flow open)", "cni_from_uplink", up, packet(remoteMAC, protoTCP, farIP, snat.src, 443, snat.sport, ackFlag), 0,
		rewrite(anyVerdict, func(p parsed) bool { return p.dst.Equal(podIP) && p.dport == 40020 }))
	// The same segment on the host veth before it (round 16): the pod's
	// packets to outside pass the hostPort hairpin check on their way to
	// the stack.
	add("masquerade out, TCP: host veth", "cni_from_container", hp.FromContainer,
		packet(podMAC, protoTCP, podIP, farIP, 40020, 443, ackFlag), 0, verdict(actOK))

	// Tunnel mode (issue 24): a plain packet off an uplink is looked up in
	// cni_tun_cidrs (a tunnelled node's pod source is forged). The first
	// row's packet again, with 100 nodes' pod CIDRs (IPv4 and IPv6) routed
	// into the tunnel; its source is none of them. A reference tree older
	// than the tunnel has no such row (budgetMaps.TunnelNodes).
	add("remote to pod, TCP: uplink, tunnel off (again)", "cni_from_uplink", up, remote, 0, verdict(actNext))
	if tunnel, err := (budgetMaps{hp.Maps}).TunnelNodes(100); err != nil {
		t.Fatal(err)
	} else if tunnel {
		add("remote to pod, TCP: uplink, tunnel mode (100 nodes)", "cni_from_uplink", up, remote, 0, verdict(actNext))
	}

	// networkPolicy on the node: from_uplink asks whether the source is a
	// node address or a pod of this node (forged_node_source,
	// forged_pod_source); then with this node's own pod CIDRs known
	// (cni_self_cidrs, attack25), which the remote source misses too: one
	// LPM lookup more. The last rows: the node keeps the tunnel's state.
	if on, err := (budgetMaps{hp.Maps}).PolicyOn(); err != nil {
		t.Fatal(err)
	} else if on {
		add("remote to pod, TCP: uplink, networkPolicy", "cni_from_uplink", up, remote, 0, verdict(actNext))
		if self, err := (budgetMaps{hp.Maps}).SelfCIDRs([]netip.Prefix{netip.MustParsePrefix("10.9.0.0/24"),
			netip.MustParsePrefix("fd00:9::/64")}); err != nil {
			t.Fatal(err)
		} else if self {
			add("remote to pod, TCP: uplink, networkPolicy, own pod CIDRs", "cni_from_uplink", up, remote, 0, verdict(actNext))
		}
	}

	fmt.Printf("\n| path | program | median ns/run | min | max | rounds x runs |\n|---|---|---:|---:|---:|---|\n")
	for _, r := range rows {
		fmt.Printf("| %s | %s | %.0f | %.0f | %.0f | %d x %d |\n", r.Path, r.Program, r.Median, r.Min, r.Max, r.Rounds, r.Runs)
	}
	if f := os.Getenv("EBPF_CNI_BUDGET_JSON"); f != "" {
		b, err := json.MarshalIndent(rows, "", "  ")
		must(t, err)
		must(t, os.WriteFile(f, b, 0o644))
	}
}

// linkAsADD writes the link entry of the pod behind lo as this build's ADD
// does for a pod without an ingress limit: LI_F_BW_KNOWN (1 << 31, a
// literal so that the test builds at older commits too, whose programs
// ignore the bit).
func linkAsADD(t *testing.T, dp *Datapath) {
	li := maps.NewLinkInfo(podMAC, hostMAC)
	li.Flags = 1 << 31
	must(t, budgetMaps{dp.Maps}.PutLink(loIfindex, li))
}

// endpointsAsADD rewrites the two pods' address entries of testDatapath as
// this build's ADD writes them: EP_F_SF_NONE (1 << 5) until a stack flow
// is recorded, and for the pod behind lo its slot of the pool of
// stack-flow tables in the top 16 bits (slot 1: the maps were made with
// the pool full). The other pod, the Service rows' client, has no table
// of its own (a pod of an older build, or of a full pool): the row of a
// record not of its making measures that fallback, as it did before the
// pool (a pod with a table takes no record of another's making). Literals,
// so that the test builds at older commits too, whose programs ignore the
// bits.
func endpointsAsADD(t *testing.T, dp *Datapath) {
	must(t, budgetMaps{dp.Maps}.PutEndpoint(podIP, maps.NewEndpointInfo(loIfindex, podMAC, hostMAC, 1<<5|1<<16)))
	must(t, budgetMaps{dp.Maps}.PutEndpoint(podIP6, maps.NewEndpointInfo(loIfindex, podMAC, hostMAC, 1<<5|1<<16)))
	must(t, budgetMaps{dp.Maps}.PutEndpoint(dstIP, maps.NewEndpointInfo(dstIfindex, dstMAC, dstHost, 1<<5)))
}

type budgetRow struct {
	Path    string  `json:"path"`
	Program string  `json:"program"`
	Median  float64 `json:"medianNs"`
	Min     float64 `json:"minNs"`
	Max     float64 `json:"maxNs"`
	Rounds  int     `json:"rounds"`
	Runs    int     `json:"runsPerRound"`
	// RoundMeans are the rounds' figures, in the order measured.
	RoundMeans []float64 `json:"roundMeansNs"`
}

const anyVerdict = ^uint32(0) - 1 // no TC verdict has this value

func verdict(want uint32) func(uint32, []byte) error {
	return func(ret uint32, _ []byte) error {
		if ret != want {
			return fmt.Errorf("verdict %d, want %d", ret, want)
		}
		return nil
	}
}

func notVerdict(not uint32) func(uint32, []byte) error {
	return func(ret uint32, _ []byte) error {
		if ret == not {
			return fmt.Errorf("verdict %d", ret)
		}
		return nil
	}
}

func rewrite(want uint32, ok func(parsed) bool) func(uint32, []byte) error {
	return func(ret uint32, out []byte) error {
		if want != anyVerdict && ret != want {
			return fmt.Errorf("verdict %d, want %d", ret, want)
		}
		if ret == actShot {
			return fmt.Errorf("dropped")
		}
		p := parseOut(out)
		if !ok(p) || !p.l3ok || !p.l4ok {
			return fmt.Errorf("out %s:%d -> %s:%d (checksums %v/%v)", p.src, p.sport, p.dst, p.dport, p.l3ok, p.l4ok)
		}
		return nil
	}
}

// parseOut is parse without a test to fail (the frames are ours: well formed).
func parseOut(f []byte) parsed {
	var t testing.T
	return parse(&t, f)
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}
