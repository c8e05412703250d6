package endpoint

import (
	"errors"
	"net"
	"os"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
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
// 4: the link entry (which no program creates), before the pod's netns
// lock goes (removeLinkEntry). 5: only now the counters, which a packet in
// flight before 3 would re-create. The features' WithVeth steps (flows and
// state kept for the pod: scans of their maps) run while the veth is being
// deleted.
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
	hostIf       string
	netns        string     // the pod's netns path; "" when unknown, or not ours to touch
	foreign      bool       // the link under the host veth's name is another network's attachment's
	replaced     bool       // the link under that name is another tool's, made since the veth went (replacedLink)
	epIfindex    int        // the veth gone and its ifindex another link's: the recorded addresses' entries still pointing at it go
	handOff      bool       // the agent is alive: it deletes the veth (handoff.go)
	sweep        bool       // the pod's nexthop objects were parked: sweep them after the veth (parkNexthopsOn)
	nodeNL       *rtnl      // the node netns's netlink sockets, kept for the teardown (rtnl.go)
	podNL        *rtnl      // the pod netns's, opened by removePodSide; nil until then
	podLock      *netnsHold // the pod's netns, locked by removePodSide until the veth is gone (lockNetns)
	tr           *Tracer
}

// BeforeEndpoints registers a step that runs before the endpoint entries go.
func (t *Teardown) BeforeEndpoints(f func() error) { t.before = append(t.before, f) }

// WithVeth registers a step that runs while the veth is being deleted.
func (t *Teardown) WithVeth(f func() error) { t.with = append(t.with, f) }

// tearDown removes the attachment id of network n (see Teardown), found by
// its record (rec, nil when none) or its host veth's name, but for the
// record itself (forget). id.Netns "" takes the record's. Every feature's
// teardown runs: it does not depend on how the attachment was configured.
func tearDown(n *Network, id ID, rec *state.Record, tr *Tracer) error {
	// The maps are opened at first use: a bad pin found then ends the step
	// that met it with its error (DEL's, or the sweep's in GC and the
	// agent), and every other step still runs (guarded). The outer guard
	// is a backstop for a step not guarded on its own.
	return maps.Guard(func() error { return tearDownAll(n, id, rec, tr) })
}

// guarded runs each step under its own maps.Guard and joins their errors:
// a foreign pin one step meets does not keep the others from running.
func guarded(steps ...func() error) error {
	var errs error
	for _, f := range steps {
		errs = errors.Join(errs, maps.Guard(f))
	}
	return errs
}

func tearDownAll(n *Network, id ID, rec *state.Record, tr *Tracer) error {
	t := newTeardown(n, id, rec, tr)
	defer func() { t.nodeNL.Close(); t.podNL.Close(); t.unlockNetns() }()
	errs := t.openMaps()
	if t.DP != nil {
		defer t.DP.Close()
	}
	errs = errors.Join(errs, t.runBefore())
	with := t.startWithVeth()
	tr.Mark("before-endpoints")
	errs = errors.Join(errs, guarded(t.removeEndpoints, t.removePodSide))
	tr.Mark("endpoints")
	if t.sweep {
		Crashpoint("del-parked")
	}
	errs = errors.Join(errs, guarded(t.removeVeth))
	Crashpoint("del-veth-removed")
	// The link entry goes before the lock: it is what makes the veth's
	// pod end count as another interface of ours (podSide's isOurs), and a
	// handed-off veth stays in the pod's netns until the agent reaps it.
	errs = errors.Join(errs, guarded(t.removeLinkEntry))
	t.unlockNetns() // the veth is gone (or handed off), and is no attachment: another interface's teardown may look
	Crashpoint("del-unlocked")
	if t.sweep {
		Crashpoint("del-veth")
		errs = errors.Join(errs, sweepPod(t.podNL, t.netns))
		tr.Mark("sweep")
	}
	if with != nil {
		errs = errors.Join(errs, <-with)
		tr.Mark("with-veth")
	}
	errs = errors.Join(errs, t.removeLinkState())
	tr.Mark("pins")
	return errs
}

// forget removes the attachment's record once its teardown succeeded
// (errs nil): while anything failed it stays, so a retry or GC can finish.
func forget(n *Network, id ID, errs error) error {
	if errs != nil {
		return errs
	}
	return n.Store().Remove(id.ContainerID, id.IfName)
}

// newTeardown finds the attachment's host veth: its ifindex, whether it is
// another network's, whether the agent takes it over.
func newTeardown(n *Network, id ID, rec *state.Record, tr *Tracer) *Teardown {
	t := &Teardown{Net: n, ContainerID: id.ContainerID, IfName: id.IfName, Record: rec, Complete: rec,
		hostIf: state.HostIfName(id.ContainerID, id.IfName), netns: id.Netns, nodeNL: openRTNLOrEach(), tr: tr}
	if rec != nil && rec.Provisional {
		t.Complete = nil
	}
	if rec != nil && t.netns == "" {
		t.netns = rec.Netns
	}
	// The veth of another network's attachment of the same container and
	// interface name (its ADD refused ours, and the runtime DELs ours):
	// neither it, nor its pins, entries or pod rules are ours to remove.
	// Nor is a link another tool made under the name once the veth went
	// (replacedLink): the veth's own state is found by the record's
	// ifindex.
	l, err := t.nodeNL.LinkByName(t.hostIf)
	if err == nil {
		// An alias naming another attachment on the veth our record names
		// (its ifindex, its peer in the pod's netns) was set by someone
		// else: the record decides (recordedVeth).
		t.foreign = foreignLink(l, n.Name, id.ContainerID, id.IfName) && !recordedVeth(t.nodeNL, l, rec)
		t.replaced = replacedLink(l, rec, n.Name, id.ContainerID, id.IfName)
		if !t.foreign && !t.replaced {
			t.Ifindex = l.Attrs().Index
			// With the agent alive the veth is handed off to it (handoff.go).
			t.handOff = datapath.AgentAlive(n.PinDir)
		}
	}
	if t.Ifindex == 0 && rec != nil && rec.HostIfindex != 0 {
		var named netlink.Link
		if err == nil {
			named = l
		}
		t.findByRecord(named, n.Name, id)
	}
	if t.foreign {
		t.netns = "" // the pod's interface of that name is the other network's
	}
	tr.Mark("lookup")
	return t
}

// findByRecord looks for the veth at the record's ifindex when it is not
// under its name (gone, or renamed: renamedVeth, or recordedVeth when its
// alias changed too; deleted by its index and not handed off) or the link
// under its name is not ours (named). The old index is ours unless another
// link took it, whose state keyed by the index is left: only the recorded
// addresses' entries still pointing at it go (epIfindex, removeEndpoints).
func (t *Teardown) findByRecord(named netlink.Link, network string, id ID) {
	idx := t.Record.HostIfindex
	if named != nil && named.Attrs().Index == idx {
		// Another tool's link under the name took the index, or one with
		// an alias naming another attachment that is not the veth the
		// record names (recordedVeth: its MAC, its peer's netns; attack28):
		// our addresses' entries still pointing at the index go.
		if t.replaced || t.foreign {
			t.epIfindex = idx
		}
		return
	}
	switch l, err := t.nodeNL.LinkByIndex(idx); {
	case err != nil || l.Attrs().Name == t.hostIf || renamedHostVeth(t.nodeNL, l, t.Record, network):
		// renamed, and maybe re-aliased too: the record decides, as
		// CHECK judges it (renamedHost)
		t.Ifindex = idx
	default:
		t.epIfindex = idx
	}
}

// openMaps opens the node's maps into t.DP (left nil when the datapath was
// never set up). Teardown needs the maps only, whichever build of this
// layout pinned the programs (an upgrade's first verb may be this DEL).
func (t *Teardown) openMaps() error {
	var errs error
	dp, err := datapath.OpenMapsLean(t.Net.PinDir)
	switch {
	case !errors.Is(err, os.ErrNotExist):
	case datapath.HasOlderLayout(t.Net.PinDir):
		// An older build's maps: move the node to this layout first, so
		// the attachment's entries go from the maps its programs use.
		dp, err = datapath.Ensure(t.Net.PinDir, t.Net.Sizing())
	default:
		// A map pin removed while the programs use the map: pinned
		// again from them, the attachment's entries are found there.
		if rerr := datapath.Readopt(t.Net.PinDir); rerr != nil {
			errs = errors.Join(errs, rerr)
		} else {
			dp, err = datapath.OpenMapsLean(t.Net.PinDir)
		}
	}
	if err == nil {
		t.DP = dp
	}
	return errors.Join(errs, OpenError(t.Net.PinDir, err))
}

// runBefore registers every feature's steps and runs those that go before
// the endpoint entries.
func (t *Teardown) runBefore() error {
	if t.DP == nil {
		return nil
	}
	// Any pod may have flows the stack delivered to it (a Service's
	// backend). Handed off, the agent drops them when it deletes the veth
	// (Reap): dropping the pod's table waits out an RCU grace period, and
	// the ifindex stays the veth's until then.
	if !t.handOff {
		// Looked at before the entries go (removeEndpoints runs beside the
		// veth's steps): a pod never delivered a flow through the stack
		// has records in no other pod's table and none in the shared one.
		own := t.DP.Maps.StackFlows().NeverDelivered(t.Ifindex, t.recordedIPs())
		t.WithVeth(func() error { return t.dropStackFlows(own) })
	}
	for _, f := range AllFeatures() {
		f.Teardown(t)
	}
	return guarded(t.before...)
}

// dropStackFlows drops the pod's flows the stack delivered to it; own:
// it was never delivered one, only its own table goes.
func (t *Teardown) dropStackFlows(own bool) error {
	if own {
		return t.DP.Maps.StackFlows().DeleteOwn(t.Ifindex)
	}
	_, err := t.DP.Maps.StackFlows().DeleteOf(t.Ifindex)
	return err
}

// recordedIPs are the addresses of the attachment's complete record (none
// without one).
func (t *Teardown) recordedIPs() []net.IP {
	var ips []net.IP
	if t.Complete != nil {
		for _, s := range t.Complete.IPs {
			if ip := net.ParseIP(s); ip != nil {
				ips = append(ips, ip)
			}
		}
	}
	return ips
}

// startWithVeth runs the WithVeth steps in the background; nil when there
// is nothing to run them on.
func (t *Teardown) startWithVeth() chan error {
	if t.DP == nil || t.Ifindex == 0 {
		return nil
	}
	with := make(chan error, 1)
	go func() { with <- guarded(t.with...) }()
	return with
}

// removePodSide removes the interface's rules inside the pod, and the pod's
// netns entry unless another interface of the pod still uses it.
func (t *Teardown) removePodSide() error {
	var (
		recCookie uint64
		table     int
	)
	if t.Record != nil {
		recCookie, table = t.Record.NetnsCookie, t.Record.PodTable
	}
	isOurs := func(idx int) bool {
		if t.DP == nil {
			return false
		}
		_, err := t.DP.Maps.Links().Lookup(idx)
		return err == nil
	}
	cookie, sweep, podNL, held := podSide(t.Net.PinDir, t.netns, t.IfName, recCookie, t.Ifindex, table, isOurs, t.handOff)
	t.sweep, t.podNL, t.podLock = sweep, podNL, held
	Crashpoint("del-look") // looked at the pod's other interfaces, under the netns lock
	if cookie != 0 && t.DP != nil {
		return t.DP.Maps.Bandwidth().DeleteNetns(cookie)
	}
	return nil
}

// unlockNetns releases the lock of the pod's netns (removePodSide).
func (t *Teardown) unlockNetns() {
	if t.podLock != nil {
		t.podLock.Close()
		t.podLock = nil
	}
}

// removeVeth deletes the host veth, or hands it off to the agent. Deleting
// the veth before dropping the link pins also saves time: unregistering
// the device detaches both tcx hooks, and releasing an already detached
// link is free, whereas releasing an attached one waits out an RCU grace
// period per hook.
func (t *Teardown) removeVeth() error {
	switch {
	case t.foreign:
		return nil // not ours
	case t.handOff:
		var errs error
		if err := handOffHost(t.nodeNL, t.Net.PinDir, t.hostIf, t.Ifindex); err != nil {
			// Not handed off: delete it here after all.
			errs = errors.Join(deleteLinkIndex(t.nodeNL, t.Ifindex), datapath.RemoveLinkPins(t.Net.PinDir, state.HandedOffName(t.Ifindex)))
			if t.DP != nil {
				errs = errors.Join(errs, t.dropStackFlows(false)) // the entries are gone: no look
			}
		}
		t.tr.Mark("hand-off")
		return errs
	default:
		// The veth identified by newTeardown, by its ifindex (renamed, or
		// not under its name any more: findByRecord): another tool's link
		// made under its name since is not touched.
		err := deleteLinkIndex(t.nodeNL, t.Ifindex)
		t.tr.Mark("veth")
		return err
	}
}

// removeLinkEntry removes the veth's cni_links entry once the veth is gone
// or handed off (down, renamed), before the pod's netns lock is released:
// the programs only look it up and update it in place, never create it,
// so nothing brings it back. Left until later, another interface's
// teardown under the lock saw the handed-off pod end as a live attachment
// of ours and kept the pod's cni_netns entry (twodel30). A DEL killed
// before it leaves the entry to its retry or to the agent's reap of the
// handed-off veth (Reap), as before.
func (t *Teardown) removeLinkEntry() error {
	if t.DP == nil || t.Ifindex == 0 {
		return nil
	}
	return t.DP.Maps.Links().Delete(t.Ifindex)
}

// removeLinkState removes what is keyed by the veth's ifindex, once no
// program runs for it, and its link pins.
func (t *Teardown) removeLinkState() error {
	var errs error
	if t.DP != nil && t.Ifindex != 0 {
		// The flow and trace switches go too: the next pod given this
		// ifindex has not asked for them. (Its flows age out: LRU, idle sweep.)
		// The link entry went before the netns unlock (removeLinkEntry).
		idx := t.Ifindex
		errs = guarded(func() error { return t.DP.Maps.Stats().Reset(idx) },
			func() error { return t.DP.Maps.Events().ForgetEndpoint(uint32(idx)) })
	}
	if !t.foreign {
		// Not those of a link attached to another live device: a veth
		// renamed away from the name keeps its pins under it (orphanPin),
		// and they are its programs' last references (the DEL of another
		// network's refused ADD of the same name: twodel30).
		errs = errors.Join(errs, datapath.RemoveLinkPinsOn(t.Net.PinDir, t.hostIf, t.Ifindex))
	}
	return errs
}

// removeEndpoints deletes the pod's endpoint entries: its recorded
// addresses, or (no complete record: ADD died before writing it) the
// entries pointing at its host veth.
func (t *Teardown) removeEndpoints() error {
	if t.DP != nil && t.Ifindex == 0 && t.epIfindex != 0 && t.Complete != nil {
		var errs error
		for _, ip := range t.recordedIPs() {
			errs = errors.Join(errs, t.DP.Maps.Endpoints().Delete(ip, t.epIfindex))
		}
		return errs
	}
	if t.DP == nil || t.Ifindex == 0 {
		return nil
	}
	var (
		ips  []net.IP
		errs error
	)
	if t.Complete != nil {
		ips = t.recordedIPs()
	} else {
		eps, err := t.DP.Maps.Endpoints().List()
		errs = errors.Join(errs, err)
		for _, e := range eps {
			if int(e.Info.Ifindex) == t.Ifindex {
				ips = append(ips, e.IP)
			}
		}
	}
	for _, ip := range ips {
		errs = errors.Join(errs, t.DP.Maps.Endpoints().Delete(ip, t.Ifindex))
	}
	return errs
}
