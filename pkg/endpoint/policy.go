package endpoint

import (
	"errors"
	"net/netip"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// netPolicy is the Feature of networkPolicy (bpf/lib/policy.h): the pod's
// traffic is judged by the NetworkPolicy the agent programs for its
// interface. ADD leaves the interface pending (only the node's traffic
// passes, both ways) before the pod can send or receive anything: fail
// closed until the agent's first write (maps.PolicyWriter).
type netPolicy struct {
	on        bool
	tables    chan error // the interface's flow tables being made (startWithVeth)
	tablesErr error
}

// startWithVeth makes the interface's flow and fragment tables in the
// background as soon as its host veth exists, while IPAM runs: putting
// them into their maps of maps waits out an RCU grace period (5-15 ms),
// which ran after IPAM when Install made them. Nothing reads them before
// Install marks the interface pending and Publish flags it. A failed ADD's
// undo waits for them and drops them with the state (DeleteOf), as it
// dropped Install's; tables that failed left nothing (AddFlowTables), a
// foreign pin met there included (it opens its maps before any change),
// and their undo does nothing, as none was pushed when Install failed so.
func (p *netPolicy) startWithVeth(a *Attachment) {
	if !p.on {
		return
	}
	m, idx := a.DP.Maps, a.Ifindex
	p.tables = make(chan error, 1)
	go func() { p.tables <- maps.Guard(func() error { return m.Policy().AddFlowTables(idx) }) }()
	a.OnUndo(func() error {
		if p.waitTables() != nil {
			return nil
		}
		return m.Policy().DeleteOf(idx)
	})
}

// waitTables waits for the tables startWithVeth started, if any, and
// returns its error.
func (p *netPolicy) waitTables() error {
	if p.tables != nil {
		p.tablesErr = <-p.tables
		p.tables = nil
	}
	return p.tablesErr
}

// NeedsNodeHooks: a pod's packet the stack may translate (a Service) is
// judged again on its way out of the node (to_uplink.c), and node
// addresses (cni_node_ips) are what tells the node's traffic.
func (p *netPolicy) NeedsNodeHooks() bool { return p.on }

func (p *netPolicy) Validate() error { return nil }

// Install marks the interface pending, then flags it (in its endpoint and
// link entries, which Publish writes afterwards): from the first packet the
// programs see, the pod is judged.
func (p *netPolicy) Install(a *Attachment) error {
	if !p.on {
		return nil
	}
	if uplinks, err := a.NodeHooks(); err != nil && !uplinks {
		return Errorf(ErrUnavailable, "networkPolicy uplink hooks at %s: %w", a.Net.PinDir, err)
	}
	m := a.DP.Maps
	if err := m.Policy().Enable(); err != nil {
		return mapError(err)
	}
	if err := p.waitTables(); err != nil {
		var pe *maps.PinError
		if errors.As(err, &pe) {
			return pe // as the verb's own recovery returns it (maps.RecoverPin)
		}
		return mapError(err)
	}
	if err := m.Policy().MarkPending(a.Ifindex); err != nil {
		return mapError(err)
	}
	a.Flags |= maps.EndpointFlagPolicy
	a.Record.Policy = true
	a.Trace.Mark("policy")
	return nil
}

// Check: the endpoint entries carry the flag and the interface has a state.
func (p *netPolicy) Check(a *Attachment) error {
	if !p.on {
		return nil
	}
	for _, ip := range a.PodIPs() {
		if e, err := a.DP.Maps.Endpoints().Lookup(ip); err == nil && e.Flags&maps.EndpointFlagPolicy == 0 {
			return checkError("map cni_endpoints entry of %s lacks the networkPolicy flag", ip)
		}
	}
	if a.Ifindex != 0 {
		if _, ok, err := a.DP.Maps.Policy().StateOf(a.Ifindex); err != nil {
			return checkError("%w", err)
		} else if !ok {
			return checkError("map cni_pol_state has no entry for host veth ifindex %d", a.Ifindex)
		}
	}
	return nil
}

// Teardown forgets the interface's policy state and flows once the veth is
// going (its rule sets are the agent's to sweep), when its record says it
// had some or there is no complete record (a killed ADD's); and, whatever
// its network, other pods' flows with its addresses: the next pod given one
// of them must not inherit them.
func (p *netPolicy) Teardown(t *Teardown) {
	var peers []netip.Addr
	if t.Complete != nil {
		for _, s := range t.Complete.IPs {
			if a, err := netip.ParseAddr(s); err == nil {
				peers = append(peers, a.Unmap())
			}
		}
	}
	if t.Complete != nil && !t.Complete.Policy {
		if len(peers) == 0 {
			return
		}
		t.WithVeth(func() error {
			if on, err := t.DP.Maps.Policy().Enabled(); err != nil || !on {
				return err
			}
			_, err := t.DP.Maps.Policy().DeleteFlowsOf(0, peers...)
			return err
		})
		return
	}
	t.WithVeth(func() error {
		return t.DP.Maps.Policy().DeleteOf(t.Ifindex, peers...)
	})
}
