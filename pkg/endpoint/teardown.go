package endpoint

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// Teardown is the removal of one attachment: everything ADD made on the
// node except the IPAM reservation (the caller releases that) — map
// entries, counters, link pins, the veth, the pod's rules and the record.
// It needs neither the netns nor the veth to exist, and is idempotent.
//
// Order matters. 1: what leads new flows to the pod (features'
// BeforeEndpoints steps: hostPort mappings). 2: the endpoint entries, so no
// other pod redirects into this one any more. 3: the veth goes, which
// detaches the programs; once it returns no program runs for this ifindex.
// 4: only now the link entry and counters, which a packet in flight before
// 3 would re-create. The features' WithVeth steps (flows and state kept
// for the pod: scans of their maps) run while the veth is being deleted.
type Teardown struct {
	Net *Network
	// ContainerID and IfName identify the attachment (CNI_CONTAINERID, CNI_IFNAME).
	ContainerID, IfName string
	// Record is the attachment's record; nil when there is none (lost, or
	// never written). Complete is Record unless it is provisional (an ADD
	// killed part way): then the addresses and mappings are found by the
	// host veth's ifindex instead.
	Record, Complete *state.Record
	Ifindex          int                // the host veth's, 0 when unknown
	DP               *datapath.Datapath // nil when the datapath was never set up

	before, with []func() error
}

// BeforeEndpoints registers a step that runs before the endpoint entries go.
func (t *Teardown) BeforeEndpoints(f func() error) { t.before = append(t.before, f) }

// WithVeth registers a step that runs while the veth is being deleted.
func (t *Teardown) WithVeth(f func() error) { t.with = append(t.with, f) }

// Remove tears down the attachment containerID/ifname of network n, found
// by its record (rec, nil when none) or its host veth's name. netnsPath ""
// takes the record's. features are every capability (see Capabilities):
// teardown does not depend on how the attachment was configured.
func Remove(n *Network, containerID, ifname, netnsPath string, rec *state.Record, features []Feature, tr *Tracer) error {
	t := &Teardown{Net: n, ContainerID: containerID, IfName: ifname, Record: rec, Complete: rec}
	if rec != nil && rec.Provisional {
		t.Complete = nil
	}
	hostIf := state.HostIfName(containerID, ifname)
	// The veth of another network's attachment of the same container and
	// interface name (its ADD refused ours, and the runtime DELs ours):
	// neither it, nor its pins, entries or pod rules are ours to remove.
	foreign := false
	handOff := false
	if l, err := netlinksafe.LinkByName(hostIf); err == nil {
		foreign = foreignLink(l, n.Name, containerID, ifname)
		if !foreign {
			t.Ifindex = l.Attrs().Index
			// With the agent alive the veth is handed off to it (handoff.go).
			handOff = datapath.AgentAlive(n.PinDir)
		}
	} else if rec != nil && rec.HostIfindex != 0 {
		// The veth is gone; its old index is ours unless a new link took it.
		if l, err := netlink.LinkByIndex(rec.HostIfindex); err != nil || l.Attrs().Name == hostIf {
			t.Ifindex = rec.HostIfindex
		}
	}
	tr.Mark("lookup")

	var errs error
	// Teardown needs the maps only, whichever build of this layout pinned
	// the programs (an upgrade's first verb may be this DEL).
	dp, err := datapath.OpenMapsLean(n.PinDir)
	switch {
	case !errors.Is(err, os.ErrNotExist):
	case datapath.HasOlderLayout(n.PinDir):
		// An older build's maps: move the node to this layout first, so
		// the attachment's entries go from the maps its programs use.
		dp, err = datapath.Ensure(n.PinDir, n.Sizing())
	default:
		// A map pin removed while the programs use the map: pinned
		// again from them, the attachment's entries are found there.
		if rerr := datapath.Readopt(n.PinDir); rerr != nil {
			errs = errors.Join(errs, rerr)
		} else {
			dp, err = datapath.OpenMapsLean(n.PinDir)
		}
	}
	switch {
	case err == nil:
		defer dp.Close()
		t.DP = dp
	case errors.Is(err, os.ErrNotExist):
		// never set up: nothing in maps
	default:
		errs = errors.Join(errs, fmt.Errorf("open datapath at %s: %w", n.PinDir, err))
	}

	dropStackFlows := func() error {
		_, err := t.DP.Maps.DeleteStackFlowsOf(t.Ifindex)
		return err
	}
	if t.DP != nil {
		// Any pod may have flows the stack delivered to it (a Service's
		// backend). Handed off, the agent drops them when it deletes the
		// veth (Reap): dropping the pod's table waits out an RCU grace
		// period, and the ifindex stays the veth's until then.
		if !handOff {
			t.WithVeth(dropStackFlows)
		}
		for _, f := range features {
			f.Teardown(t)
		}
		for _, f := range t.before {
			errs = errors.Join(errs, f())
		}
	}
	var with chan error
	if t.DP != nil && t.Ifindex != 0 {
		with = make(chan error, 1)
		go func() {
			var err error
			for _, f := range t.with {
				err = errors.Join(err, f())
			}
			with <- err
		}()
	}
	tr.Mark("before-endpoints")
	errs = errors.Join(errs, t.removeEndpoints())

	// Inside the pod: the interface's rules go; the pod's netns entry goes
	// unless another interface of the pod still uses it.
	var recCookie uint64
	table := 0
	if rec != nil {
		recCookie, table = rec.NetnsCookie, rec.PodTable
		if netnsPath == "" {
			netnsPath = rec.Netns
		}
	}
	isOurs := func(idx int) bool {
		if t.DP == nil {
			return false
		}
		_, err := t.DP.Maps.LookupLink(idx)
		return err == nil
	}
	if foreign {
		netnsPath = "" // the pod's interface of that name is the other network's
	}
	if cookie := podTeardown(netnsPath, ifname, recCookie, t.Ifindex, table, isOurs, handOff); cookie != 0 && t.DP != nil {
		errs = errors.Join(errs, t.DP.Maps.DeleteNetns(cookie))
	}
	tr.Mark("endpoints")
	// Deleting the veth before dropping the link pins also saves time:
	// unregistering the device detaches both tcx hooks, and releasing an
	// already detached link is free, whereas releasing an attached one waits
	// out an RCU grace period per hook. Handed off, the agent deletes it.
	switch {
	case foreign:
	case handOff:
		if err := handOffHost(n.PinDir, hostIf, t.Ifindex); err != nil {
			// Not handed off: delete it here after all.
			errs = errors.Join(errs, deleteLink(hostIf), datapath.RemoveLinkPins(n.PinDir, state.HandedOffName(t.Ifindex)))
			if t.DP != nil {
				errs = errors.Join(errs, dropStackFlows())
			}
		}
		tr.Mark("hand-off")
	default:
		errs = errors.Join(errs, deleteLink(hostIf))
		tr.Mark("veth")
	}
	if with != nil {
		errs = errors.Join(errs, <-with)
		tr.Mark("with-veth")
	}
	if t.DP != nil && t.Ifindex != 0 {
		// The flow events switch goes too: the next pod given this
		// ifindex has not asked for them. (Its flows age out: LRU, idle sweep.)
		errs = errors.Join(errs, t.DP.Maps.DeleteLink(t.Ifindex), t.DP.Maps.ResetStats(t.Ifindex),
			t.DP.Maps.SetFlowEvents(uint32(t.Ifindex), false))
	}
	if !foreign {
		errs = errors.Join(errs, datapath.RemoveLinkPins(n.PinDir, hostIf))
	}
	tr.Mark("pins")
	if errs == nil {
		// Keep the record while anything failed, so a retry or GC can finish.
		errs = n.Store().Remove(containerID, ifname)
	}
	return errs
}

// removeEndpoints deletes the pod's endpoint entries: its recorded
// addresses, or (no complete record: ADD died before writing it) the
// entries pointing at its host veth.
func (t *Teardown) removeEndpoints() error {
	if t.DP == nil || t.Ifindex == 0 {
		return nil
	}
	var (
		ips  []net.IP
		errs error
	)
	if t.Complete != nil {
		for _, s := range t.Complete.IPs {
			if ip := net.ParseIP(s); ip != nil {
				ips = append(ips, ip)
			}
		}
	} else {
		eps, err := t.DP.Maps.ListEndpoints()
		errs = errors.Join(errs, err)
		for _, e := range eps {
			if int(e.Info.Ifindex) == t.Ifindex {
				ips = append(ips, e.IP)
			}
		}
	}
	for _, ip := range ips {
		errs = errors.Join(errs, t.DP.Maps.DeleteEndpoint(ip, t.Ifindex))
	}
	return errs
}
