package main

// The packet part: the per-packet budget of issue 30. pkg/datapath's
// TestPacketBudget (built with -tags pktbudget) times every program on
// each path with BPF_PROG_TEST_RUN; this part builds it twice, from this
// tree and from the reference commit (-packet-ref, a git worktree with
// this tree's budget_test.go copied in), and runs the two alternately
// (-packet-runs each), so both see the same machine. A row's samples are
// the rounds' means of every run; its ratio compares the medians.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

type budgetRow struct {
	Path       string    `json:"path"`
	Program    string    `json:"program"`
	RoundMeans []float64 `json:"roundMeansNs"`
}

// packetBudget is what runPacket measured: rows in the test's order.
type packetBudget struct {
	order   []string
	samples map[string][]float64 // by build ("this", ref) + "\x00" + path + program
	prog    map[string]string
	load    []string
}

func runPacket(ctx context.Context, o *options, root string) ([]testenv.Row, error) {
	mod, err := testenv.ModuleRoot()
	if err != nil {
		return nil, err
	}
	bins := map[string]string{"this": filepath.Join(root, "budget-this.test")}
	builds := []string{"this"}
	if err := goTestC(ctx, mod, bins["this"]); err != nil {
		return nil, err
	}
	if o.packetRef != "" {
		// Without the reference (a shallow clone, a test that no longer
		// builds there) the rows still come, unrated.
		if err := buildRef(ctx, mod, root, o.packetRef, filepath.Join(root, "budget-ref.test")); err != nil {
			logf("packet: no comparison with %s: %v", o.packetRef, err)
			o.packetRef = ""
		} else {
			bins[o.packetRef] = filepath.Join(root, "budget-ref.test")
			builds = append(builds, o.packetRef)
		}
	}
	pb := &packetBudget{samples: map[string][]float64{}, prog: map[string]string{}}
	for i := 0; i < o.packetRuns; i++ {
		for _, b := range builds {
			pb.load = append(pb.load, testenv.Loadavg())
			js := filepath.Join(root, fmt.Sprintf("budget-%d.json", i))
			cmd := exec.CommandContext(ctx, "unshare", "-n", "sh", "-c", budgetNetns, "sh", bins[b], "-test.run", "^TestPacketBudget$", "-test.count", "1")
			cmd.Env = append(os.Environ(), "EBPF_CNI_BUDGET_JSON="+js)
			if out, err := cmd.CombinedOutput(); err != nil {
				return nil, fmt.Errorf("TestPacketBudget of %s: %v\n%s", b, err, testenv.Tail(string(out)))
			}
			raw, err := os.ReadFile(js)
			if err != nil {
				return nil, err
			}
			var rows []budgetRow
			if err := json.Unmarshal(raw, &rows); err != nil {
				return nil, fmt.Errorf("%s: %w", js, err)
			}
			for _, r := range rows {
				k := r.Path + "\x00" + r.Program
				if _, ok := pb.prog[k]; !ok {
					pb.prog[k] = r.Program
					pb.order = append(pb.order, k)
				}
				pb.samples[b+"\x00"+k] = append(pb.samples[b+"\x00"+k], r.RoundMeans...)
			}
			logf("packet: %s run %d of %d done", b, i+1, o.packetRuns)
		}
	}
	load := loadRange(pb.load)
	var out []testenv.Row
	for _, k := range pb.order {
		path, prog, _ := strings.Cut(k, "\x00")
		this := testenv.NewRow("per-packet budget", "ebpf-cni "+prog, "ns per run (BPF_PROG_TEST_RUN)", path, "ns", pb.samples["this\x00"+k])
		this.Samples = nil
		this.Load = load
		if o.packetRef != "" {
			if ref := pb.samples[o.packetRef+"\x00"+k]; len(ref) > 0 {
				this.Against(o.packetRef, testenv.Median(ref))
				// Round means of one build spread by a few percent
				// between runs on a quiet machine: 5% is the least a
				// run can tell apart.
				this.Goal("no path slower than "+o.packetRef+" (≤ 1.05×)", this.Ratio <= 1.05)
				r := testenv.NewRow("per-packet budget", o.packetRef+" "+prog, "ns per run (BPF_PROG_TEST_RUN)", path, "ns", ref)
				r.Samples = nil
				out = append(out, this, r)
				continue
			}
			this.Condition += " (no such path at " + o.packetRef + ")"
		}
		out = append(out, this)
	}
	return out, nil
}

// buildRef builds the budget test of commit ref, with this tree's
// budget_test.go and frame runner, into out; the worktree is removed before it returns.
func buildRef(ctx context.Context, mod, root, ref, out string) error {
	wt := filepath.Join(root, "packet-ref")
	if b, err := exec.CommandContext(ctx, "git", "-C", mod, "worktree", "add", "--detach", wt, ref).CombinedOutput(); err != nil {
		return fmt.Errorf("git worktree add %s: %v\n%s", ref, err, b)
	}
	defer exec.Command("git", "-C", mod, "worktree", "remove", "--force", wt).Run()
	// The budget test and its frame runner come from this tree; its map
	// writes go through refBudgetAPI, in the reference's older API.
	for _, name := range []string{"budget_test.go", "testrun_test.go"} {
		src, err := os.ReadFile(filepath.Join(mod, "pkg/datapath", name))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(wt, "pkg/datapath", name), src, 0o644); err != nil {
			return err
		}
	}
	// A reference with pkg/maps' families has its own budget_api_test.go,
	// in its API; only older ones get refBudgetAPI.
	api := filepath.Join(wt, "pkg/datapath/budget_api_test.go")
	if _, err := os.Stat(api); errors.Is(err, fs.ErrNotExist) {
		if err := os.WriteFile(api, []byte(refBudgetAPI), 0o644); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	return goTestC(ctx, wt, out)
}

// refBudgetAPI is pkg/datapath/budget_api_test.go for a reference tree from
// before pkg/maps' families (41b58f6, de8c97a): the same writes as
// methods of Maps.
// budgetNetns runs "$@" in a network namespace of its own shaped like a
// node's (an uplink with addresses and a default route each family,
// forwarding on, as ADD leaves a node): the budget's paths ask
// bpf_fib_lookup, which answers "forwarding disabled" in a root namespace
// that has it off (a fresh machine), and the hostPort reply row failed so.
const budgetNetns = `set -e
ip link set lo up
ip link add eth0 type veth peer name eth0p
ip link set eth0p up
ip link set eth0 up
ip addr add 192.0.2.2/24 dev eth0
ip -6 addr add fd00::2/64 dev eth0 nodad
ip route add default via 192.0.2.1 dev eth0
ip -6 route add default via fd00::1 dev eth0
sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
exec "$@"`

const refBudgetAPI = `//go:build pktbudget

package datapath

import (
	"net"
	"net/netip"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

type budgetMaps struct{ m *maps.Maps }

func (b budgetMaps) PutCT(k maps.CTKey, v maps.CTVal) error { return b.m.PutCT(k, v) }

func (b budgetMaps) PutEndpoint(ip net.IP, info maps.EndpointInfo) error { return b.m.PutEndpoint(ip, info) }

func (b budgetMaps) PutLink(ifindex int, li maps.LinkInfo) error { return b.m.PutLink(ifindex, li) }

func (b budgetMaps) SyncNodeIPs(want map[string]int) error { return b.m.SyncNodeIPs(want) }

func (b budgetMaps) TunnelNodes(int) (bool, error) { return false, nil }

func (b budgetMaps) PolicyOn() (bool, error) { return false, nil }

func (b budgetMaps) SelfCIDRs([]netip.Prefix) (bool, error) { return false, nil }
`

// loadRange is the range of the 1-minute load averages seen at each run's start.
func loadRange(avgs []string) string {
	var lo, hi float64
	for i, a := range avgs {
		var l float64
		if _, err := fmt.Sscanf(a, "%g", &l); err != nil {
			continue
		}
		if i == 0 || l < lo {
			lo = l
		}
		if l > hi {
			hi = l
		}
	}
	return fmt.Sprintf("%.1f-%.1f", lo, hi)
}

func goTestC(ctx context.Context, dir, out string) error {
	cmd := exec.CommandContext(ctx, "go", "test", "-c", "-tags", "pktbudget", "-o", out, "./pkg/datapath/")
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go test -c -tags pktbudget in %s: %v\n%s", dir, err, b)
	}
	return nil
}
