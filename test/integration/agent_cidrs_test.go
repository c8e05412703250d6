package integration

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// TestAgentClusterCIDRs: the agent's cluster CIDRs (--cluster-cidrs here;
// every Node's pod CIDRs with Kubernetes) make it one user of them in
// cni_cidr_refs beside the attachments whose ipMasq ADD brought theirs: a
// CIDR both hold survives the attachment's DEL while the agent wants it,
// and the agent's release (a run with another set, or none) while an
// attachment uses it; it goes with its last user.
func TestAgentClusterCIDRs(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	ipv4Only(e)
	const a, b = "10.50.0.0/16", "10.60.0.0/16"
	state := func() string {
		t.Helper()
		users, err := e.Maps().Masq().ClusterCIDRUsers()
		must(t, err)
		var s []string
		for c, have := range clusterCIDRSet(t, e.Maps()) {
			if have {
				s = append(s, fmt.Sprintf("%s:%d", c, users[netip.MustParsePrefix(c)]))
			}
		}
		sort.Strings(s)
		return fmt.Sprint(s)
	}
	expect := func(when, want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for got := state(); got != want; got = state() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: cluster CIDRs:users %s, want %s", when, got, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	conf := e.WriteConfDir()
	agent := func(cidrs string) *testenv.AgentProc {
		args := []string{"--metrics-addr", ""}
		if cidrs != "" {
			args = append(args, "--cluster-cidrs", cidrs)
		}
		return e.StartAgent(conf, args...)
	}

	p1 := e.NewPod()
	e.CleanupDel(p1, "p1")
	e.Extra = map[string]any{"ipMasq": true, "clusterCIDRs": []string{a}}
	e.Add(p1, "p1")
	expect("p1 added", "["+a+":1]")

	ag := agent(a + "," + b)
	expect("agent with --cluster-cidrs "+a+","+b, "["+a+":2 "+b+":1]")
	if !logSays(ag, "the agent holds: added ["+a+" "+b+"]") {
		t.Errorf("agent log lacks what it acquired:\n%s", ag.Logs())
	}
	e.MustDel(p1, "p1")
	expect("p1 deleted, the agent still holds "+a, "["+a+":1 "+b+":1]")
	ag.Stop()

	// A pod holding b; the agent's next run wants b only, its last none.
	p2 := e.NewPod()
	e.CleanupDel(p2, "p2")
	e.Extra = map[string]any{"ipMasq": true, "clusterCIDRs": []string{b}}
	e.Add(p2, "p2")
	expect("p2 added", "["+a+":1 "+b+":2]")
	ag = agent(b)
	expect("agent with --cluster-cidrs "+b, "["+b+":2]")
	if !logSays(ag, "released ["+a+"]") {
		t.Errorf("agent log lacks what it released:\n%s", ag.Logs())
	}
	ag.Stop()
	agent("")
	expect("agent without --cluster-cidrs: p2 still holds "+b, "["+b+":1]")
	e.MustDel(p2, "p2")
	expect("p2 deleted", "[]")
}

// logSays waits (a few seconds at most) for the agent to log want: the
// follower logs what it changed after writing the map the test polls, and
// the log reaches the test through a pipe.
func logSays(ag *testenv.AgentProc, want string) bool {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if strings.Contains(ag.Logs(), want) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
