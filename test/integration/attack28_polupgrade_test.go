// Attack28, policy26: an upgrade from the previous release (d25ddd5, flow
// tables of 128) to this build (tables sized by possible CPUs and kernel:
// 256 on 6.16+), with pods of both builds isolated and talking. Run:
//
//	go test -count=1 -run 'TestAttack28UpgradePolicyFlows' -v ./test/integration/

package integration

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// a28PrevRelease is main before this round (policy26, byname26, masq).
const a28PrevRelease = "d25ddd5074664d53b5a604fc7f10f772e7bd17d5"

// a28FlowTableSizes maps each interface with flow tables in pinDir to the
// max_entries of its tables (both openers), read from their pins.
func a28FlowTableSizes(t *testing.T, pinDir string) map[uint32][]uint32 {
	t.Helper()
	out := map[uint32][]uint32{}
	err := filepath.Walk(pinDir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() || !strings.Contains(p, "/tables/cni_pol_ct_parts/") {
			return err
		}
		key, err := hex.DecodeString(filepath.Base(p))
		if err != nil || len(key) < 4 {
			return nil
		}
		m, err := ebpf.LoadPinnedMap(p, nil)
		if err != nil {
			return fmt.Errorf("open %s: %w", p, err)
		}
		defer m.Close()
		idx := binary.LittleEndian.Uint32(key[:4])
		out[idx] = append(out[idx], m.MaxEntries())
		return nil
	})
	if err != nil {
		t.Fatalf("flow table pins: %v", err)
	}
	return out
}

// a28Echo sends msg over c and wants it echoed within 3 s.
func a28Echo(c net.Conn, msg string) error {
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return fmt.Errorf("echoed %q, sent %q", buf, msg)
	}
	return nil
}

// a28Dial opens a TCP connection from pod to addr.
func a28Dial(pod ns.NetNS, addr string) (net.Conn, error) {
	var c net.Conn
	err := pod.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 3*time.Second)
		return err
	})
	return c, err
}

// TestAttack28UpgradePolicyFlows: pods a and b attached by the previous
// release (flow tables of 128), b isolated both ways admitting the pod
// subnet on TCP, a isolated for ingress: b's replies and a's received
// segments pass by the flow entries alone. An established connection a->b
// is open when this build takes over and ADDs pod c (tables sized by this
// build). The old connection keeps flowing, new ones from a and c to b
// open, this build's CHECK passes on the old pods, and the old pods keep
// their tables of 128 beside c's larger ones.
func TestAttack28UpgradePolicyFlows(t *testing.T) {
	t.Parallel()
	oldBin := testenv.BuildAt(t, a28PrevRelease)
	e := testenv.New(t)
	if e.Extra == nil {
		e.Extra = map[string]any{}
	}
	e.Extra["networkPolicy"] = true
	newCNI := e.CNI
	e.CNI = libcni.NewCNIConfigWithCacheDir([]string{oldBin}, e.CacheDir, nil)
	ids := map[string]string{"a": "a28up-a", "b": "a28up-b", "c": "a28up-c"}
	pods := map[string]ns.NetNS{}
	ip4 := map[string]net.IP{}
	for _, k := range []string{"a", "b", "c"} {
		pods[k] = e.NewPod()
		e.CleanupDel(pods[k], ids[k])
	}
	apply := func(k string, ep policy.Endpoint) {
		t.Helper()
		_, idx := e.HostVeth(ids[k])
		if err := e.Maps().Policy().Writer().Apply(uint32(idx), ep); err != nil {
			t.Fatalf("apply policy of %s: %v", k, err)
		}
	}
	client := policy.Endpoint{Ingress: isolated()}
	server := policy.Endpoint{Ingress: isolated(allowPorts(prefix(testenv.PodSubnet4), 6, 7, 7)), Egress: isolated()}
	for _, k := range []string{"a", "b"} {
		ip4[k], _ = resultIPs(e.Add(pods[k], ids[k]))
	}
	apply("a", client)
	apply("b", server)
	echoTCP(t, pods["b"], 7)
	bAddr := net.JoinHostPort(ip4["b"].String(), "7")
	old, err := a28Dial(pods["a"], bAddr)
	if err != nil {
		t.Fatalf("a to b before the upgrade: %v", err)
	}
	defer old.Close()
	if err := a28Echo(old, "before"); err != nil {
		t.Fatalf("a to b before the upgrade: %v", err)
	}
	before := a28FlowTableSizes(t, e.PinDir)

	// This build takes over: its first verb is c's ADD.
	e.CNI = newCNI
	ip4["c"], _ = resultIPs(e.Add(pods["c"], ids["c"]))
	apply("c", client)
	after := a28FlowTableSizes(t, e.PinDir)
	t.Logf("flow table sizes by ifindex: before %v, after %v", before, after)
	for _, k := range []string{"a", "b"} {
		_, idx := e.HostVeth(ids[k])
		if got := after[uint32(idx)]; len(got) != 2 || got[0] != 128 || got[1] != 128 {
			t.Errorf("old pod %s's flow tables after the upgrade: %v, want its two of 128 kept", k, got)
		}
	}
	_, cidx := e.HostVeth(ids["c"])
	if got := after[uint32(cidx)]; len(got) != 2 || got[0] <= 128 || got[0] != got[1] {
		t.Errorf("new pod c's flow tables: %v, want two larger than 128", got)
	}

	for i := 0; i < 5; i++ {
		if err := a28Echo(old, fmt.Sprintf("after-%d", i)); err != nil {
			t.Fatalf("the connection a opened before the upgrade, message %d after: %v", i, err)
		}
	}
	for _, k := range []string{"a", "c"} {
		c, err := a28Dial(pods[k], bAddr)
		if err != nil {
			t.Errorf("%s to b after the upgrade: %v", k, err)
			continue
		}
		if err := a28Echo(c, "new-"+k); err != nil {
			t.Errorf("%s to b after the upgrade: %v", k, err)
		}
		c.Close()
	}
	// The rules hold (what passed above passed by the flow entries): b
	// opens nothing to a, whose port 7 answers.
	echoTCP(t, pods["a"], 7)
	blocked(t, pods["b"], "tcp", ip4["a"], 7)
	for _, k := range []string{"a", "b", "c"} {
		if err := e.Check(pods[k], ids[k], "eth0"); err != nil {
			t.Errorf("this build's CHECK of %s: %v", k, err)
		}
	}
}
