// The uninstall lab: a node with everything ebpf-cni may leave on it (pods
// of every feature, the agent, node hooks), a snapshot of what the node
// holds, and the uninstall command as the tests run it.

package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// uninstallLab is a node with an uplink to a remote host, a private cgroup2
// directory as the socket hooks' root (so the machine's root and other
// tests' hooks stay out of the comparison), a conf dir holding the network's
// conflist as an install would, and a peers file (routes of proto 199).
type uninstallLab struct {
	*hpEnv
	cgroupRoot string
	confDir    string
	peersFile  string
}

func newUninstallLab(t *testing.T) *uninstallLab {
	t.Helper()
	h := newHPEnv(t)
	cg := filepath.Join("/sys/fs/cgroup/unified", testenv.RandName("ebpf-cni-test-"))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatalf("private cgroup root: %v", err)
	}
	t.Cleanup(func() { os.Remove(cg) })
	l := &uninstallLab{hpEnv: h, cgroupRoot: cg, confDir: filepath.Join(t.TempDir(), "net.d")}
	// The state directory does not exist before install (as /var/lib/cni/ebpf-cni).
	h.StateDir = filepath.Join(t.TempDir(), "state")
	h.Extra = map[string]any{
		"capabilities": map[string]bool{"portMappings": true, "bandwidth": true},
		"ipMasq":       true,
		"cgroupRoot":   cg,
	}
	if err := os.MkdirAll(l.confDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// IP forwarding is the node's setting: ADD turns it on (as ptp does)
	// and uninstall leaves it, as another CNI needs it too. A node has it
	// on; so does the lab before its first look. The uplink's link-local
	// address (and its routes) settles first too.
	err := l.InNode(func() error {
		for _, f := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(f, []byte("1"), 0o644); err != nil {
				return err
			}
		}
		up, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			as, _ := netlink.AddrList(up, netlink.FAMILY_V6)
			for _, a := range as {
				if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
					return nil
				}
			}
		}
		return errors.New("uplink0 has no usable link-local address after 10s")
	})
	if err != nil {
		t.Fatal(err)
	}
	l.peersFile = filepath.Join(t.TempDir(), "peers.json")
	// A peer on the uplink's subnet that is not the remote host: the agent
	// holds a listed node's address as a cluster CIDR (never masqueraded),
	// and the lab's remote host must stay outside the cluster.
	b, _ := json.Marshal([]map[string]any{{"nodeIP": "198.51.100.77", "podCIDRs": []string{"10.99.0.0/24"}}})
	if err := os.WriteFile(l.peersFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return l
}

// install writes the conflist into the conf dir, as `make install` or the
// agent's rendering does.
func (l *uninstallLab) install() {
	l.T.Helper()
	b, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": l.Name, "plugins": []any{l.PluginConf()}})
	if err := os.WriteFile(filepath.Join(l.confDir, "10-ebpf-cni.conflist"), b, 0o600); err != nil {
		l.T.Fatal(err)
	}
}

func (l *uninstallLab) startAgent() *testenv.AgentProc {
	return l.StartAgent(l.confDir, "--cgroup-root", l.cgroupRoot, "--peers", l.peersFile)
}

// uninstall runs `ebpf-agent uninstall` in the node and returns stdout,
// stderr and the exit code.
func (l *uninstallLab) uninstall(extra ...string) (string, string, int) {
	l.T.Helper()
	var (
		stdout, stderr strings.Builder
		code           int
	)
	err := l.InNode(func() error {
		args := append([]string{"uninstall", "--pin-dir", l.PinDir, "--state-dir", l.StateDir,
			"--cni-conf-dir", l.confDir, "--cni-bin-dir", testenv.BinDir, "--cgroup-root", l.cgroupRoot}, extra...)
		cmd := exec.Command(filepath.Join(testenv.BinDir, "ebpf-agent"), args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
			return nil
		}
		return err
	})
	if err != nil {
		l.T.Fatal(err)
	}
	return stdout.String(), stderr.String(), code
}

// cgroupAttachTypes are the cgroup hooks the snapshot looks at: the socket
// hooks and pacing of ours, and the skb and socket ones beside them.
var cgroupAttachTypes = []ebpf.AttachType{
	ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupInet6Connect,
	ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCGroupUDP6Sendmsg,
	ebpf.AttachCGroupUDP4Recvmsg, ebpf.AttachCGroupUDP6Recvmsg,
	ebpf.AttachCgroupInet4GetPeername, ebpf.AttachCgroupInet6GetPeername,
	ebpf.AttachCGroupSockOps, ebpf.AttachCGroupInetIngress, ebpf.AttachCGroupInetEgress,
	ebpf.AttachCGroupInetSockCreate,
}

func progName(id ebpf.ProgramID) string {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return fmt.Sprintf("id %d", id)
	}
	defer p.Close()
	if info, err := p.Info(); err == nil {
		return info.Name
	}
	return fmt.Sprintf("id %d", id)
}

// snapshot is the node's state as the issue lists it, one line per thing,
// sorted. Link indexes and program IDs are left out where a name says it.
func (l *uninstallLab) snapshot() []string {
	l.T.Helper()
	var out []string
	add := func(f string, a ...any) { out = append(out, fmt.Sprintf(f, a...)) }
	err := l.InNode(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		names := map[int]string{}
		for _, ln := range links {
			a := ln.Attrs()
			names[a.Index] = a.Name
			add("link %s %s alias=%q", a.Name, ln.Type(), a.Alias)
			for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
				if res, err := link.QueryPrograms(link.QueryOptions{Target: a.Index, Attach: at}); err == nil {
					for _, p := range res.Programs {
						add("link %s %s program %s", a.Name, at, progName(p.ID))
					}
				}
			}
			qs, _ := netlink.QdiscList(ln)
			for _, q := range qs {
				add("link %s qdisc %s parent %x", a.Name, q.Type(), q.Attrs().Parent)
			}
			for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
				fs, _ := netlink.FilterList(ln, parent)
				for _, f := range fs {
					name := ""
					if bf, ok := f.(*netlink.BpfFilter); ok {
						name = bf.Name
					}
					add("link %s filter %s %s parent %x", a.Name, f.Type(), name, parent)
				}
			}
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
			if err != nil {
				return err
			}
			for _, r := range rs {
				add("route table %d %v via %v dev %s proto %d", r.Table, r.Dst, r.Gw, names[r.LinkIndex], r.Protocol)
			}
			ns, _ := netlink.NeighList(0, fam)
			for _, n := range ns {
				if n.State&netlink.NUD_PERMANENT != 0 {
					add("neighbour %s dev %s %s", n.IP, names[n.LinkIndex], n.HardwareAddr)
				}
			}
		}
		return nil
	})
	if err != nil {
		l.T.Fatal(err)
	}
	if f, err := os.Open(l.cgroupRoot); err == nil {
		for _, at := range cgroupAttachTypes {
			if res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: at}); err == nil {
				for _, p := range res.Programs {
					add("cgroup root %s program %s", at, progName(p.ID))
				}
			}
		}
		f.Close()
	} else {
		add("cgroup root: %v", err)
	}
	for _, root := range []struct{ what, dir string }{{"bpffs", l.PinDir}, {"state", l.StateDir}, {"conf", l.confDir}} {
		filepath.WalkDir(root.dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil {
				rel, _ := filepath.Rel(root.dir, p)
				add("%s %s", root.what, rel)
			}
			return nil
		})
	}
	sort.Strings(out)
	return out
}

// diff lists the lines only in a and only in b.
func diff(a, b []string) (onlyA, onlyB []string) {
	in := func(s []string) map[string]int {
		m := map[string]int{}
		for _, x := range s {
			m[x]++
		}
		return m
	}
	ma, mb := in(a), in(b)
	for x, n := range ma {
		if mb[x] < n {
			onlyA = append(onlyA, x)
		}
	}
	for x, n := range mb {
		if ma[x] < n {
			onlyB = append(onlyB, x)
		}
	}
	sort.Strings(onlyA)
	sort.Strings(onlyB)
	return
}

// assertAsBefore fails unless the node is as before install; IPAM
// reservations are checked apart (host-local's own files, lock and last
// reserved address, are not ours to remove).
func (l *uninstallLab) assertAsBefore(before []string, when string) {
	l.T.Helper()
	gone, left := diff(before, l.snapshot())
	if len(gone) > 0 || len(left) > 0 {
		l.T.Errorf("%s: the node differs from before install\n  left behind:\n    %s\n  gone:\n    %s", when,
			strings.Join(left, "\n    "), strings.Join(gone, "\n    "))
	}
	ents, _ := os.ReadDir(filepath.Join(l.DataDir, l.Name))
	for _, e := range ents {
		if net.ParseIP(e.Name()) != nil {
			l.T.Errorf("%s: IPAM reservation %s left", when, e.Name())
		}
	}
}

// mustChange fails unless the node differs from before (a test of a
// removal that had nothing to remove would prove nothing).
func (l *uninstallLab) mustChange(before []string, what string) {
	l.T.Helper()
	if _, left := diff(before, l.snapshot()); len(left) == 0 {
		l.T.Fatalf("%s left nothing on the node: the test would prove nothing", what)
	}
}

// podsWithEverything starts a pod with a hostPort and both rate limits on
// the ipMasq network, and a plain one, and proves each with packets: the
// remote host reaches the hostPort, the pod reaches the remote host
// masqueraded behind the uplink's address.
func (l *uninstallLab) podsWithEverything() (ns.NetNS, ns.NetNS) {
	l.T.Helper()
	t := l.T
	a, b := l.NewPod(), l.NewPod()
	var err error
	l.InNode(func() error {
		rt := l.RuntimeConfHP(a, "web", []testenv.PM{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}})
		rt.CapabilityArgs["bandwidth"] = bandwidthArgs(100_000_000, 100_000_000)
		_, err = l.CNI.AddNetworkList(context.Background(), l.ConfList("1.0.0"), rt)
		return nil
	})
	if err != nil {
		t.Fatalf("ADD with hostPort, bandwidth and ipMasq: %v", err)
	}
	l.CleanupDel(a, "web")
	l.CleanupDel(b, "plain")
	if _, err := l.AddHP(b, "plain"); err != nil {
		t.Fatalf("ADD plain: %v", err)
	}
	serve(t, a, 80, "web")
	expectServer(t, l.remote, "tcp", hp(uplinkIP4, 8080), "web")
	serve(t, l.remote, 9090, "remote")
	if ans := expectServer(t, a, "tcp", hp(remoteIP4, 9090), "remote"); !strings.HasPrefix(ans.peer, uplinkIP4.String()+":") {
		t.Errorf("the remote host saw the pod as %s, want it masqueraded behind %s", ans.peer, uplinkIP4)
	}
	if err := testenv.Ping(b, remoteIP4, 3); err != nil {
		t.Errorf("plain pod to the remote host: %v", err)
	}
	return a, b
}
