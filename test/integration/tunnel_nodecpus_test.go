//go:build tunnelbench

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
)

// tunBenchNodeCPUs is the bench's switch TUNNEL_BENCH_NODE_CPUS=1 (make
// bench-tunnel NODE_CPUS=1): each lab node gets a CPU of its own, node 1
// CPU 0 and node 2 CPU 1. Every device that receives in a node's
// namespaces (its uplink, its pods' host veths, its pods' eth0) and the
// router's port facing it steer their receive there (rps_cpus), and each
// side's iperf3 runs there (-A 0,1). Without it a veth's receiver is
// processed by the CPU that transmitted, so the sending pod's CPU pays the
// receiving node's whole receive path (docs/performance.md, round 13).
func tunBenchNodeCPUs() bool { return os.Getenv("TUNNEL_BENCH_NODE_CPUS") == "1" }

// tunRPS steers the receive of every device of netns n but lo to cpu:
// sysfs shows the devices of the netns that mounted it, so a private
// mount namespace mounts a fresh one there.
func tunRPS(t *testing.T, n ns.NetNS, cpu int) {
	t.Helper()
	script := fmt.Sprintf(`mount -t sysfs sysfs /sys || exit 1
for q in /sys/class/net/*/queues/rx-*/rps_cpus; do
  case $q in /sys/class/net/lo/*) continue;; esac
  echo %x > $q || exit 1
done
grep . /sys/class/net/*/queues/rx-*/rps_cpus`, 1<<cpu)
	out, err := exec.Command("nsenter", "--net="+n.Path(), "unshare", "-m", "sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("rps_cpus in %s: %v\n%s", n.Path(), err, out)
	}
	t.Logf("rps_cpus, CPU %d: %s", cpu, strings.ReplaceAll(strings.TrimSpace(string(out)), "\n", " "))
}

// pinNodes applies the switch to the bench's lab: node i's namespaces
// (the node, its pods) and the router's port n<i+1> to CPU i.
func (b *tunBench) pinNodes() {
	b.iperfArgs = []string{"-A", "0,1"}
	for cpu, nss := range [][]ns.NetNS{{b.n1, b.p1, b.q1}, {b.n2, b.p2, b.q2}} {
		for _, n := range nss {
			tunRPS(b.t, n, cpu)
		}
	}
	// The router's ports: each steered to the CPU of the node that sends
	// into it (the bridge, the wire, is the same in both modes).
	script := `mount -t sysfs sysfs /sys || exit 1
echo 1 > /sys/class/net/n1/queues/rx-0/rps_cpus && echo 2 > /sys/class/net/n2/queues/rx-0/rps_cpus`
	if out, err := exec.Command("nsenter", "--net="+b.router.Path(), "unshare", "-m", "sh", "-c", script).CombinedOutput(); err != nil {
		b.t.Fatalf("router rps_cpus: %v\n%s", err, out)
	}
}
