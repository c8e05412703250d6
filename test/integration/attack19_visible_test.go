// attack19: are the drops of the attacks visible to an operator? The
// policy drops of a pod's egress and of a pod's ingress (fast path and
// from outside through the stack), and a forged source: each must be an
// event `ebpf-agent observe --verdict dropped` shows with its reason,
// direction and addresses, and counted by `ebpf-agent dump policy`.

package integration

import (
	"encoding/json"
	"net"
	"testing"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
	"github.com/ebpf-cni/ebpf-cni/pkg/events"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// TestAttack19DropsVisible: the agent runs (events on, as the DaemonSet
// runs it); a may send nothing, b admits nothing. a dials b, the remote
// host dials b, a forges b's source towards h; IPv4 and IPv6.
func TestAttack19DropsVisible(t *testing.T) {
	t.Parallel()
	p := newPolLab(t, false)
	ip := func(pod string, fam int) net.IP { return p.ip[pod][fam] }
	p.StartAgent(p.WriteConfDir(), "--metrics-addr", "")
	p.apply(t, "h", policy.Endpoint{})
	p.apply(t, "a", policy.Endpoint{Egress: isolated(), Policies: []string{"ns/a-deny-egress"}})
	p.apply(t, "b", policy.Endpoint{Ingress: isolated(), Policies: []string{"ns/b-deny-ingress"}})
	// The agent turns drop events on once it runs: wait for a first one.
	waitUntil(t, "the agent reporting drops", func() bool {
		sendForged(t, p.a, &net.UDPAddr{IP: ip("b", 4), Port: 4443}, &net.UDPAddr{IP: ip("h", 4), Port: 80}, "warm-up")
		return len(observeJSON(t, p.Env, "--verdict", "dropped", "--last", "10")) > 0
	})
	type want struct {
		what, reason, dir, src, dst string
		dport                       uint16
	}
	var wants []want
	for _, fam := range []int{4, 6} {
		blocked(t, p.a, "tcp", ip("b", fam), 8080)
		wants = append(wants, want{"a's egress to b", "drop_policy", "egress", ip("a", fam).String(), ip("b", fam).String(), 8080})
		blocked(t, p.remote, "udp", ip("b", fam), 8080)
		wants = append(wants, want{"the remote host into b", "drop_policy", "ingress", remoteIP[fam].String(), ip("b", fam).String(), 8080})
		sendForged(t, p.a, &net.UDPAddr{IP: ip("b", fam), Port: 4444}, &net.UDPAddr{IP: ip("h", fam), Port: 80}, "forged")
		wants = append(wants, want{"a forging b's source", "drop_spoof_ip", "egress", ip("b", fam).String(), ip("h", fam).String(), 80})
	}
	seen := func(recs []events.Record, w want) bool {
		for _, r := range recs {
			if r.Verdict == "dropped" && r.Reason == w.reason && r.Direction == w.dir && r.Src == w.src && r.Dst == w.dst && r.DstPort == w.dport {
				return true
			}
		}
		return false
	}
	recs := observeUntil(t, p.Env, func(recs []events.Record) bool {
		for _, w := range wants {
			if !seen(recs, w) {
				return false
			}
		}
		return true
	}, "--verdict", "dropped", "--last", "1000")
	for _, w := range wants {
		if !seen(recs, w) {
			t.Errorf("observe shows no %s drop (%s %s %s -> %s:%d)", w.what, w.reason, w.dir, w.src, w.dst, w.dport)
		}
	}
	out, err := p.AgentCmd("dump", "policy", "-o", "json", "--pin-dir", p.PinDir, "--state-dir", p.StateDir)
	if err != nil {
		t.Fatalf("dump policy: %v\n%s", err, out)
	}
	var rows []inspect.PolicyRow
	must(t, json.Unmarshal([]byte(out), &rows))
	for _, c := range []struct{ pod, dir string }{{"a", "egress"}, {"b", "ingress"}} {
		found := false
		for _, r := range rows {
			if r.Ifindex == p.idx[c.pod] {
				found = true
				if r.Dropped[c.dir] == 0 {
					t.Errorf("dump policy: %s's %s drops are 0: %+v", c.pod, c.dir, r)
				}
			}
		}
		if !found {
			t.Errorf("dump policy: no row for %s\n%s", c.pod, out)
		}
	}
}
