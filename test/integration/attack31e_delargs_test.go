package integration

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAttack31eDelArgsTwoIf (attack31e, hostile probe of names31's DEL
// retry): one container with two attachments on the network (eth0, net1),
// both ADDed with the CNI_ARGS containerd/CRI-O send (IgnoreUnknown, the
// K8S_POD_* keys incl. INFRA_CONTAINER_ID and UID). DEL of net1 with
// CNI_ARGS host-local refuses ("a=b=c": an invalid pair, no IgnoreUnknown)
// makes the plugin ask host-local again without CNI_ARGS; that retry must
// release net1's lease alone: eth0's lease and traffic stay, and
// eth0's own DEL (with the runtime's args) then leaves nothing.
//
//	go test -count=1 -run 'TestAttack31eDelArgsTwoIf$' -v ./test/integration/
func TestAttack31eDelArgsTwoIf(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	pod := e.NewPod()
	id := testenv.RandName("a31e")
	t.Cleanup(func() { _ = e.Del(pod, id, "net1"); _ = e.Del(pod, id, "eth0") })
	crio := "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=" + id + ";K8S_POD_UID=0b9a2d4e-6c1f-4f4e-9d1e-3c2b1a0f9e8d"
	run := func(cmd, ifname, args string) ([]byte, error) {
		envv := pluginEnv(cmd, id, pod, ifname)
		envv["CNI_ARGS"] = args
		return e.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), envv, e.StdinConf(nil))
	}
	ips := map[string][]net.IP{}
	for _, ifname := range []string{"eth0", "net1"} {
		out, err := run("ADD", ifname, crio)
		if err != nil {
			t.Fatalf("ADD %s with the runtime's CNI_ARGS: %v: %s", ifname, err, out)
		}
		var r current.Result
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("ADD %s result: %v: %s", ifname, err, out)
		}
		for _, ipc := range r.IPs {
			ips[ifname] = append(ips[ifname], ipc.Address.IP)
		}
		if len(ips[ifname]) == 0 {
			t.Fatalf("ADD %s: no addresses: %s", ifname, out)
		}
	}
	strs := func(l []net.IP) []string {
		var s []string
		for _, ip := range l {
			s = append(s, ip.String())
		}
		sort.Strings(s)
		return s
	}
	all := append(strs(ips["eth0"]), strs(ips["net1"])...)
	sort.Strings(all)
	if got := e.ReservationsOf(id); strings.Join(got, ",") != strings.Join(all, ",") {
		t.Fatalf("after both ADDs: host-local holds %v for %s, want %v", got, id, all)
	}

	if out, err := run("DEL", "net1", "a=b=c"); err != nil {
		t.Fatalf("DEL net1 with CNI_ARGS host-local refuses: %v: %s", err, out)
	}
	if got, want := e.ReservationsOf(id), strs(ips["eth0"]); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("after DEL net1 (args refused, retried without): host-local holds %v for %s, want eth0's %v alone", got, id, want)
	}
	e.PodReachable(t, pod, ips["eth0"])

	if out, err := run("DEL", "eth0", crio); err != nil {
		t.Fatalf("DEL eth0: %v: %s", err, out)
	}
	if got := e.ReservationsOf(id); len(got) > 0 {
		t.Errorf("after both DELs: host-local still holds %v for %s", got, id)
	}
	e.AssertClean()
}

// TestAttack31eDelArgsTwoNets (attack31e): one container on two networks
// (Multus: the default one's eth0, a second's net1) whose host-local IPAMs
// share one dataDir, as on a node (/var/lib/cni/networks). DEL of net1's
// attachment with CNI_ARGS host-local refuses is retried without CNI_ARGS;
// the retry must release the second network's lease alone, the first
// network's eth0 keeps its lease and traffic.
//
//	go test -count=1 -run 'TestAttack31eDelArgsTwoNets$' -v ./test/integration/
func TestAttack31eDelArgsTwoNets(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	s := e.Sibling(t)
	s.IPAM["dataDir"] = e.DataDir
	s.DataDir = e.DataDir
	pod := e.NewPod()
	id := testenv.RandName("a31e")
	t.Cleanup(func() { _ = s.Del(pod, id, "net1"); _ = e.Del(pod, id, "eth0") })
	multus := "IgnoreUnknown=true;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=" + id + ";K8S_POD_UID=0b9a2d4e-6c1f-4f4e-9d1e-3c2b1a0f9e8d"
	run := func(env *testenv.Env, cmd, ifname, args string) ([]byte, error) {
		envv := pluginEnv(cmd, id, pod, ifname)
		envv["CNI_ARGS"] = args
		return env.RunPlugin(filepath.Join(testenv.BinDir, "ebpf-cni"), envv, env.StdinConf(nil))
	}
	add := func(env *testenv.Env, ifname string) []net.IP {
		out, err := run(env, "ADD", ifname, multus)
		if err != nil {
			t.Fatalf("ADD %s on %s: %v: %s", ifname, env.Name, err, out)
		}
		var r current.Result
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("ADD %s result: %v: %s", ifname, err, out)
		}
		var ips []net.IP
		for _, ipc := range r.IPs {
			ips = append(ips, ipc.Address.IP)
		}
		return ips
	}
	eth0 := add(e, "eth0")
	add(s, "net1")
	if len(e.ReservationsOf(id)) == 0 || len(s.ReservationsOf(id)) == 0 {
		t.Fatalf("after both ADDs: leases %v on %s, %v on %s", e.ReservationsOf(id), e.Name, s.ReservationsOf(id), s.Name)
	}
	before := strings.Join(e.ReservationsOf(id), ",")

	if out, err := run(s, "DEL", "net1", "a=b=c"); err != nil {
		t.Fatalf("DEL net1 with CNI_ARGS host-local refuses: %v: %s", err, out)
	}
	if got := s.ReservationsOf(id); len(got) > 0 {
		t.Errorf("after DEL net1: %s still holds %v for %s", s.Name, got, id)
	}
	if got := strings.Join(e.ReservationsOf(id), ","); got != before {
		t.Fatalf("after DEL net1 (args refused, retried without): %s holds %q for %s, had %q", e.Name, got, id, before)
	}
	if _, err := os.Stat(s.RecordPath(id, "net1")); err == nil {
		t.Errorf("after DEL net1: the record of %s on %s is left", id, s.Name)
	}
	e.PodReachable(t, pod, eth0)

	if out, err := run(e, "DEL", "eth0", multus); err != nil {
		t.Fatalf("DEL eth0: %v: %s", err, out)
	}
	e.AssertClean()
}
