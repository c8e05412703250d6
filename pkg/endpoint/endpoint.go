// Package endpoint owns one attachment of a pod to the node's datapath:
// its setup (ADD), check (CHECK) and teardown (DEL, GC, the agent's
// reconcile). The core is the veth pair, addresses, routes, neighbours and
// the endpoint's map entries; each further capability (bandwidth, hostPort,
// masquerade) is a Feature beside it.
package endpoint

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// ID names an attachment as the runtime passed it.
type ID struct {
	ContainerID string // CNI_CONTAINERID
	IfName      string // CNI_IFNAME, the interface inside the pod
	Netns       string // CNI_NETNS
	Args        string // CNI_ARGS (K8S_POD_NAMESPACE, K8S_POD_NAME, MAC)
}

// Attachment is one pod interface while ADD makes it (or CHECK checks it).
// Features read it and add to it: endpoint flags, the egress rate the pod's
// netns entry carries, their part of the record, their undo steps.
type Attachment struct {
	Net    *Network
	ID     ID
	HostIf string             // the host veth, state.HostIfName
	DP     *datapath.Datapath // the node's datapath, open
	Trace  *Tracer

	// Known once the veth exists and IPAM answered (ADD), or from
	// prevResult (CHECK).
	Ifindex int                 // the host veth's
	IPs     []*current.IPConfig // the pod's addresses

	// Set by the features' Install.
	Flags         uint32        // ep_info flags (maps.Flag*, maps.EndpointFlag*)
	EgressRateBps uint64        // the pod's egress limit: its netns entry paces its TCP
	RcvWnd        uint32        // the pod's receive window clamp (ingress limit): its netns entry
	Record        *state.Record // the record being written; features add their part

	features  []Feature
	netns     ns.NetNS
	cookie    uint64 // the pod netns'
	claim     *os.File
	busy      func()     // releases the busy lock (datapath.MarkBusy)
	agent     bool       // an agent is alive on the node (see Claim)
	deferTCX  bool       // attach cls_bpf marked for tcx: an agent moves it (see Claim)
	sfPart    chan error // the pod's stack-flow table being made (CreateVeth)
	sfErr     error
	sfSlot    uint32 // the pod's slot in the node's pool of stack-flow tables (0: none)
	sfTouched bool   // TakeSlot ran: the undo drops what the pod may own there
	ipam      chan ipamOut
	ipamOut   *ipamOut
	undo      []func() error
	hostLink  netlink.Link
	nodeNL    *rtnl // the node netns's netlink sockets, kept for the ADD (rtnl.go)
	podNL     *rtnl // the pod netns's
	plan      *plan
	res       *current.Result

	hooksOnce  sync.Once
	hooksCh    chan error
	hooksErr   error
	hooksReady bool // the uplink programs are attached, even if the socket hooks are not
}

// Claim starts the ADD of an attachment: it checks the pod's netns and the
// directories and claims the attachment with a provisional record before
// anything is made, so a second ADD of it (a runtime retrying, two ADDs
// racing) is refused and touches nothing of the first, and an ADD killed
// from here on is findable by DEL, GC and the agent. The IPAM plugin can
// start right after (StartIPAM); OpenDatapath follows. Close releases what
// Claim holds.
func Claim(n *Network, id ID, features []Feature, tr *Tracer) (_ *Attachment, err error) {
	a := &Attachment{Net: n, ID: id, HostIf: state.HostIfName(id.ContainerID, id.IfName), Trace: tr, features: features}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	if a.netns, err = OpenNetns(id.Netns); err != nil {
		return nil, err
	}
	if err := n.CheckDirs(); err != nil {
		return nil, err
	}
	// The agent waits with its background work while a verb runs; it also
	// takes the tcx attach off this ADD: a tcx attach waits out an RCU
	// grace period under RTNL (about 20 ms), cls_bpf does not. Without an
	// agent too in attachMode auto (issue 30): the pod runs the same
	// programs from cls_bpf, marked as waiting for tcx, and the first agent
	// that starts on the node moves it (its full pass finds every pending
	// veth). Only an explicit attachMode tcx without an agent attaches tcx
	// here: nobody would move it.
	a.busy = datapath.MarkBusy(n.PinDir)
	a.agent = datapath.AgentAlive(n.PinDir)
	a.deferTCX = n.attachMode != datapath.AttachTCX || a.agent
	if a.nodeNL, err = openRTNL(); err != nil {
		return nil, netlinkError(err)
	}
	if err := a.netns.Do(func(ns.NetNS) (e error) {
		if a.podNL, e = openRTNL(); e != nil {
			return e
		}
		a.cookie, e = datapath.PodNetnsCookie(n.PinDir)
		return e
	}); err != nil {
		return nil, internal("CNI_NETNS %q: %w", id.Netns, err)
	}
	tr.Mark("parse")

	a.Record = &state.Record{
		ContainerID: id.ContainerID, IfName: id.IfName, Netns: id.Netns, HostIf: a.HostIf,
		NetnsCookie: a.cookie, Provisional: true, Pid: os.Getpid(), Created: time.Now().UTC(),
	}
	a.Record.PodNamespace, a.Record.PodName = PodIdentity(id.Args)
	if a.claim, err = claimRecord(n, a.Record); err != nil {
		return nil, err
	}
	tr.Mark("claim")
	Crashpoint("claimed")
	// The veth without our record: this network's record was lost, or
	// another network attached the same container ID and interface name.
	if l, lerr := a.nodeNL.LinkByName(a.HostIf); lerr == nil {
		// The provisional record just written goes too: GC and the agent
		// would take it for a killed ADD and tear down that veth.
		_ = n.Store().Remove(id.ContainerID, id.IfName)
		return nil, Errorf(ErrEnv, "CNI_CONTAINERID %q, CNI_IFNAME %q: the host veth of this attachment exists already, as %s, with no record in %s: DEL it before adding it again",
			id.ContainerID, id.IfName, holderOf(l.Attrs().Index), n.Store().Dir())
	}
	// Checked after the claim: an uninstall takes its lock before its last
	// look at the records, so either it sees this record or this sees it.
	if datapath.Uninstalling(n.PinDir) {
		store := n.Store()
		_ = store.Remove(id.ContainerID, id.IfName)
		store.RemoveDirsIfEmpty()
		return nil, Errorf(ErrTryAgain, "pinDir %s: `ebpf-agent uninstall` is removing ebpf-cni from this node: CNI_CONTAINERID %q, CNI_IFNAME %q not added",
			n.PinDir, id.ContainerID, id.IfName)
	}
	return a, nil
}

type ipamOut struct {
	res types.Result
	err error
}

// StartIPAM runs the IPAM plugin's ADD (add) in the background: it is the
// longest step of a plain ADD, so it starts as soon as the attachment is
// claimed and everything else runs meanwhile. If the ADD fails, Abort waits
// for it and releases what it reserved (del); a failed IPAM ADD reserved
// nothing of ours to release (the runtime's DEL covers a plugin that
// reserved and then failed).
func (a *Attachment) StartIPAM(add func() (types.Result, error), del func() error) {
	a.ipam = make(chan ipamOut, 1)
	go func() {
		r, err := add()
		a.ipam <- ipamOut{r, err}
	}()
	a.OnUndo(func() error {
		if out := a.waitIPAM(); out.err == nil {
			return del()
		}
		return nil
	})
}

// WaitIPAM waits for the IPAM plugin started by StartIPAM.
func (a *Attachment) WaitIPAM() (types.Result, error) {
	out := a.waitIPAM()
	a.Trace.Mark("ipam-wait")
	return out.res, out.err
}

func (a *Attachment) waitIPAM() ipamOut {
	if a.ipamOut == nil {
		out := <-a.ipam
		a.ipamOut = &out
	}
	return *a.ipamOut
}

// OpenDatapath opens the node's datapath (setting it up on first use) and
// starts the node hooks' setup when a feature needs them.
func (a *Attachment) OpenDatapath() (err error) {
	if a.DP, err = a.Net.ensureDatapath(); err != nil {
		return err
	}
	a.DP.Netlink = a.nodeNL.Handle.Handle
	a.Trace.Mark("datapath")
	a.startNodeHooks()
	return nil
}

// startNodeHooks sets up the node hooks, or only refreshes the node
// addresses (the usual case), when a feature needs them: in parallel with
// the veth and IPAM, since the first setup waits out an RCU grace period
// per uplink.
func (a *Attachment) startNodeHooks() {
	need := false
	for _, f := range a.features {
		if u, ok := f.(nodeHooksUser); ok && u.NeedsNodeHooks() {
			need = true
		}
	}
	if !need {
		return
	}
	a.hooksCh = make(chan error, 1)
	go func() {
		var h *datapath.NodeHooks
		err := maps.Guard(func() (err error) { h, err = a.DP.EnsureNodeHooks(a.Net.nodeHookOptions()); return err })
		// Set before the error is sent: the uplink programs are attached
		// even when the error only concerns the socket hooks (no cgroup2
		// visible), which masquerade does not need.
		a.hooksReady = h != nil
		a.hooksCh <- err
	}()
}

// NodeHooks waits for the node hooks started by Claim. uplinks tells
// whether the uplink programs are in place even when err is set (it then
// concerns the socket hooks only).
func (a *Attachment) NodeHooks() (uplinks bool, err error) {
	if a.hooksCh == nil {
		return false, errors.New("no feature asked for the node hooks")
	}
	a.hooksOnce.Do(func() { a.hooksErr = <-a.hooksCh })
	return a.hooksReady, a.hooksErr
}

// OnUndo pushes a step that undoes something this ADD made; Abort runs
// them in reverse order.
func (a *Attachment) OnUndo(f func() error) { a.undo = append(a.undo, f) }

// Abort undoes a failed ADD. The provisional record goes last, and only if
// everything else did: what could not be undone stays findable by DEL and GC.
func (a *Attachment) Abort() {
	if a.hooksCh != nil {
		a.NodeHooks() // never undo beside a node hook setup still at work
	}
	var errs error
	for i := len(a.undo) - 1; i >= 0; i-- {
		// Each step guarded: a foreign pin met by one (a *PinError panic)
		// must not skip the others, the IPAM release among them (attack17).
		errs = errors.Join(errs, maps.Guard(a.undo[i]))
	}
	if errs == nil && a.claim != nil {
		_ = a.Net.Store().Remove(a.ID.ContainerID, a.ID.IfName)
	}
}

// Close releases what the attachment holds: the claim's lock (held until
// the complete record replaced the provisional one), the netns, the
// datapath, the busy lock. It waits for the node hooks first: never exit
// with their setup half done.
func (a *Attachment) Close() {
	if a.hooksCh != nil {
		a.NodeHooks()
		a.Trace.Mark("node-hooks-wait")
	}
	if a.claim != nil {
		a.claim.Close()
	}
	if a.netns != nil {
		a.netns.Close()
	}
	a.nodeNL.Close()
	a.podNL.Close()
	a.waitStackFlowPart() // it uses a.DP
	if a.DP != nil {
		a.DP.Close()
	}
	if a.busy != nil {
		a.busy()
	}
	a.Trace.Mark("close")
}

// claimRecord writes the provisional record of the attachment, or refuses
// the ADD when the attachment has a record already.
func claimRecord(n *Network, rec *state.Record) (*os.File, error) {
	store := n.Store()
	for try := 0; ; try++ {
		f, err := store.Claim(rec)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, state.ErrClaimed) {
			return nil, Errorf(ErrIO, "stateDir: %w", err)
		}
		old, rerr := store.Read(rec.ContainerID, rec.IfName)
		if rerr != nil {
			return nil, Errorf(ErrIO, "stateDir: record of %s/%s: %w", rec.ContainerID, rec.IfName, rerr)
		}
		if old == nil && try < 3 {
			continue // removed by a DEL meanwhile: claim again
		}
		return nil, retryError(n, rec, old)
	}
}

// retryError refuses an ADD of an attachment that has a record: the CNI spec
// forbids a second ADD without a DEL in between. Code 4: the CNI_CONTAINERID
// and CNI_IFNAME the runtime passed name an attachment that exists, the one
// variable-level mistake the runtime can act on (DEL first); 11 while
// another ADD of it is still running, which ends by itself.
func retryError(n *Network, rec, old *state.Record) error {
	who := fmt.Sprintf("CNI_CONTAINERID %q, CNI_IFNAME %q on network %q", rec.ContainerID, rec.IfName, n.Name)
	switch {
	case old == nil:
		return Errorf(ErrTryAgain, "%s: its record keeps changing (a DEL and an ADD racing); try again", who)
	case !old.Provisional:
		return Errorf(ErrEnv, "%s: this attachment exists already (host veth %s, IPs %s, added %s): ADD may not be repeated without a DEL; the attachment is left as it is",
			who, old.HostIf, strings.Join(old.IPs, ", "), old.Created.Format(time.RFC3339))
	case n.Store().Busy(old) && old.WriterGone():
		return Errorf(ErrTryAgain, "%s: an earlier ADD of this attachment (pid %d) did not finish, and its remains are being torn down (GC or ebpf-agent reconcile); try again", who, old.Pid)
	case n.Store().Busy(old):
		return Errorf(ErrTryAgain, "%s: another ADD of this attachment is in progress (pid %d)", who, old.Pid)
	default:
		return Errorf(ErrEnv, "%s: an earlier ADD of this attachment (pid %d) did not finish and left it half made: DEL it first", who, old.Pid)
	}
}

// CreateVeth creates the veth pair, the pod's end born in its netns under
// its final name, and attaches the host end's programs (cls_bpf for the
// agent to move to tcx when it is alive, see datapath.Attach). podMAC nil
// is a random one. It runs while IPAM does.
func (a *Attachment) CreateVeth(podMAC net.HardwareAddr) error {
	p := &plan{hostIf: a.HostIf, ifname: a.ID.IfName, mtu: a.Net.MTU, podMAC: podMAC}
	var err error
	if p.hostMAC, err = randomMAC(); err == nil && p.podMAC == nil {
		p.podMAC, err = randomMAC()
	}
	if err != nil {
		return internalErr(err)
	}
	a.plan = p
	a.hostLink, err = createVeth(a.nodeNL, p, a.netns)
	if err != nil {
		return internalErr(err)
	}
	// Same order as DEL: the veth first (detaching the programs), then
	// pins, link entry and counters, which in-flight packets could re-create.
	idx := a.hostLink.Attrs().Index
	a.Ifindex = idx
	a.OnUndo(func() error {
		errs := errors.Join(deleteLinkIndex(a.nodeNL, idx), datapath.RemoveLinkPinsOn(a.Net.PinDir, a.HostIf, idx),
			a.DP.Maps.Links().Delete(idx), a.DP.Maps.Stats().Reset(idx))
		if !a.sfTouched {
			return errs // the stack-flow maps were never opened (attack17: a foreign pin there)
		}
		a.waitStackFlowPart() // its table is put before it is dropped
		_, sfErr := a.DP.Maps.StackFlows().DeleteOf(idx)
		return errors.Join(errs, sfErr)
	})
	for _, f := range a.features {
		if s, ok := f.(vethStarter); ok {
			s.startWithVeth(a)
		}
	}
	if a.Net.IPv4Only {
		// Saves the node work only: a /proc/sys that refuses the write
		// (mounted read-only) costs speed, not the pod.
		_ = disableIPv6(a.HostIf)
	}
	a.Trace.Mark("veth")
	// The pod's own stack-flow table (issue 28): a slot of the node's pool
	// (made once per node, issue 30), emptied, waiting for nothing.
	// Without a pool (maps pinned by an older build) or with every slot a
	// live pod's, a table of its own: putting it in the map of maps waits
	// out an RCU grace period (maybe_wait_bpf_programs, 5-15 ms), so with
	// an agent alive the agent makes it after the ADD (background.go) and
	// the pod's records go to the shared table meanwhile; without one,
	// the wait runs beside the rest of the ADD and Publish joins it.
	slot, err := a.DP.Maps.StackFlows().TakeSlot(idx, linkAlive) // a foreign pin panics here, before any change
	a.sfTouched = true
	if err != nil {
		return mapError(err)
	}
	a.sfSlot = slot
	a.Trace.Mark("stack-flow-slot")
	if slot == 0 && !a.agent {
		a.sfPart = make(chan error, 1)
		go func() { a.sfPart <- maps.Guard(func() error { return a.DP.Maps.StackFlows().AddPart(idx) }) }()
	}
	_, err = a.DP.Attach(idx, a.HostIf, a.Net.attachMode, a.deferTCX)
	a.Trace.Mark("attach")
	if err != nil {
		return internalErr(err)
	}
	// Attached while down (a qdisc added to a live device would wait out
	// a grace period); up from here.
	if err := readyHost(a.nodeNL, a.HostIf, a.hostLink, ownerAlias(a.Net.Name, a.ID.ContainerID, a.ID.IfName)); err != nil {
		return netlinkError(err)
	}
	a.Trace.Mark("host-up")
	return nil
}

// Plan takes the IPAM result: the pod's addresses, gateways and routes.
func (a *Attachment) Plan(ipamType string, r types.Result) error {
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return Errorf(ErrDecode, "ipam plugin %q result: %w", ipamType, err)
	}
	if len(res.IPs) == 0 {
		return internal("ipam plugin %q returned no IP addresses", ipamType)
	}
	full, err := newPlan(res, a.plan)
	if err != nil {
		return internalErr(err)
	}
	a.plan, a.res, a.IPs = full, res, res.IPs

	var v4, v6 bool
	for _, ipc := range res.IPs {
		if isV4(ipc.Address.IP) {
			v4 = true
		} else {
			v6 = true
		}
	}
	if v6 && a.Net.MTU != 0 && a.Net.MTU < MinMTU6 {
		// The ranges show the family before ADD (see cni's validateIPAM);
		// other IPAM plugins reveal it only now.
		return ConfError("mtu %d is below %d, the least IPv6 works with, and ipam plugin %q gave an IPv6 address", a.Net.MTU, MinMTU6, ipamType)
	}
	if v6 && a.Net.IPv4Only {
		// The configuration promised IPv4 only (see disableIPv6).
		return internal("ipam plugin %q gave an IPv6 address though its configuration has IPv4 subnets only", ipamType)
	}
	if err := enableForwarding(a.nodeNL, v4, v6); err != nil {
		return internalErr(err)
	}
	return nil
}

// PodIPs are the pod's addresses.
func (a *Attachment) PodIPs() []net.IP {
	out := make([]net.IP, 0, len(a.IPs))
	for _, ipc := range a.IPs {
		out = append(out, ipc.Address.IP)
	}
	return out
}

// Install runs the features' Install, in order.
func (a *Attachment) Install() error {
	for _, f := range a.features {
		if err := f.Install(a); err != nil {
			return err
		}
	}
	return nil
}

// Publish makes the attachment live: the link and endpoint entries (the
// programs are attached already and drop what they do not know), then the
// host side (routes, neighbours) and the pod side (addresses, routes,
// rules), then the pod's netns entry.
func (a *Attachment) Publish() error {
	m, idx, p := a.DP.Maps, a.Ifindex, a.plan
	if err := m.Stats().Reset(idx); err != nil {
		return internalErr(err)
	}
	li := maps.NewLinkInfo(p.podMAC, p.hostMAC)
	// to_container judges the pod's ingress by the policy flag, and looks
	// its ingress bucket up only with the limit's (Install set a.Flags).
	li.Flags = a.Flags&(maps.EndpointFlagPolicy|maps.FlagBandwidthIngress) | maps.LinkFlagBandwidthKnown
	if err := m.Links().Put(idx, li); err != nil {
		return mapError(err)
	}
	// A new address has no stack flow recorded: from_container's fast path
	// skips their lookups until to_container records one.
	info := maps.NewEndpointInfo(idx, p.podMAC, p.hostMAC, a.Flags, maps.EndpointFlagStackFlowsNone,
		maps.EndpointFlagsOfSlot(a.sfSlot))
	// BPF_NOEXIST: an address has one owner. Another live attachment holding
	// it (two networks with overlapping ranges, an IPAM bug) refuses this ADD;
	// a leftover of a vanished veth does not.
	for _, ip := range a.PodIPs() {
		if err := m.Endpoints().Insert(ip, info, linkAlive); err != nil {
			var taken *maps.EndpointTakenError
			if errors.As(err, &taken) {
				return ConfError("pod address %s from ipam plugin %q is already %s's: an address has one owner (overlapping ranges of two networks?); nothing of it was changed",
					ip, a.Net.IPAMType, holderOf(taken.Ifindex))
			}
			return mapError(err)
		}
		a.OnUndo(func() error { return m.Endpoints().Delete(ip, idx) })
	}
	a.Trace.Mark("maps")
	Crashpoint("endpoints")

	// The pod's rules outlive its interface: the undo of the veth does not
	// remove them.
	a.OnUndo(func() error {
		return a.netns.Do(func(ns.NetNS) error {
			if p.table != 0 {
				deleteRules(a.podNL, p.table)
			}
			return nil
		})
	})
	// The pod's side in its netns (a thread of its own) while the node's
	// side is routed here: neither needs the other.
	podErr := make(chan error, 1)
	go func() { podErr <- configurePod(a.podNL, p, a.netns) }()
	hostErr := routeHost(a.nodeNL, p, a.hostLink)
	Crashpoint("host")
	if err := errors.Join(hostErr, <-podErr); err != nil {
		return netlinkError(err)
	}
	if err := a.ensureNetns(m); err != nil {
		return err
	}
	Crashpoint("pod")
	a.Trace.Mark("netlink")
	// The pod's own table of the flows it sends through the stack (to
	// Services of the node's pods): no other pod's flows evict them.
	// Checked after the link entry, sized alike: a full node names
	// cni_links. (CreateVeth's undo drops it.)
	if err := a.waitStackFlowPart(); err != nil {
		return mapError(err)
	}
	a.Trace.Mark("stack-flow-table")
	return nil
}

// ensureNetns registers the pod's netns (by cookie) in cni_netns, so the
// sock_ops hook can pace its TCP towards rate-limited pods (and clamp its
// window, with an ingress limit). Not where the cookie was not learned: no
// pacing program reads it.
//
// Under the pod's netns lock (lockNetns): a teardown of another interface
// of the pod deletes the entry when its look, under the lock, found no
// other interface of ours; this one's veth and link entry exist by now, so
// that look either comes after this and sees them, or came before and its
// deletion is done when this ensures the entry (an ADD of net1 beside a
// DEL of eth0 lost it: TestAddBesideDelNetnsEntry).
func (a *Attachment) ensureNetns(m *maps.Maps) error {
	if a.cookie == 0 {
		return nil
	}
	release := lockNetns(a.Net.PinDir, a.netns)
	created, err := m.Bandwidth().EnsureNetns(a.cookie, a.EgressRateBps, a.RcvWnd)
	if release != nil {
		release()
	}
	if err != nil {
		return mapError(err)
	}
	if created {
		a.OnUndo(func() error { return a.undoNetns(m) })
	}
	return nil
}

// undoNetns deletes the pod's netns entry that this failed ADD created,
// unless another interface of the pod uses it by now: the look of a DEL
// (podSide), under the same lock. An ADD of eth0 beside this one found the
// entry there and created nothing (attack30: this undo took it from the
// live eth0). When the look fails the entry stays: the runtime's DEL of
// this interface, or the agent's sweep, removes it if it is nobody's.
func (a *Attachment) undoNetns(m *maps.Maps) error {
	if release := lockNetns(a.Net.PinDir, a.netns); release != nil {
		defer release()
	}
	links, err := a.podNL.LinkList()
	if err != nil {
		return nil
	}
	isOurs := func(idx int) bool { _, err := m.Links().Lookup(idx); return err == nil }
	nodeNS := openNodeNetns()
	if nodeNS != nil {
		defer nodeNS.Close()
	}
	if otherAttachment(a.podNL, nodeNS, links, a.ID.IfName, a.Ifindex, isOurs) {
		return nil
	}
	return m.Bandwidth().DeleteNetns(a.cookie)
}

// waitStackFlowPart waits for the pod's stack-flow table CreateVeth
// started, if any, and returns its error.
func (a *Attachment) waitStackFlowPart() error {
	if a.sfPart != nil {
		a.sfErr = <-a.sfPart
		a.sfPart = nil
	}
	return a.sfErr
}

// Commit replaces the provisional record with the complete one: the
// attachment exists.
func (a *Attachment) Commit() error {
	r, p := a.Record, a.plan
	r.Provisional, r.Pid = false, 0
	r.HostIfindex, r.HostMAC, r.PodMAC = a.Ifindex, p.hostMAC.String(), p.podMAC.String()
	r.IPs = nil
	for _, ip := range a.PodIPs() {
		r.IPs = append(r.IPs, ip.String())
	}
	r.PodTable = p.table
	if err := a.Net.Store().Write(r); err != nil {
		return &Error{Kind: ErrIO, Err: err}
	}
	Crashpoint("recorded")
	return nil
}

// Result is the CNI result of the ADD: both interfaces, the IPAM addresses
// on the pod's, the routes put in the pod's main table; DNS from IPAM,
// else from the network configuration.
func (a *Attachment) Result(dns types.DNS) *current.Result {
	ctr, p := 1, a.plan
	r := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: p.hostIf, Mac: p.hostMAC.String()},
			{Name: p.ifname, Mac: p.podMAC.String(), Sandbox: a.ID.Netns, Mtu: p.mtu},
		},
		DNS: dns,
	}
	if d := a.res.DNS; d.Nameservers != nil || d.Domain != "" || d.Search != nil || d.Options != nil {
		r.DNS = d
	}
	for _, ipc := range a.res.IPs {
		c := *ipc
		c.Interface = &ctr
		r.IPs = append(r.IPs, &c)
	}
	for _, rt := range p.mainRoutes {
		r.Routes = append(r.Routes, &types.Route{Dst: *rt.dst, GW: rt.gw})
	}
	return r
}

// cniArg returns the value of one key of CNI_ARGS ("K1=V1;K2=V2").
func cniArg(cniArgs, key string) string {
	for _, kv := range strings.Split(cniArgs, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// CheckArgs refuses a CNI_ARGS that is not ";"-separated KEY=VALUE pairs,
// as the CNI library's types.LoadArgs reads it (host-local, static...
// refuse it so, 999, after ADD made the veth): ADD refuses it first
// (names31). Unknown keys are the IPAM plugin's to judge.
func CheckArgs(cniArgs string) error {
	if cniArgs == "" {
		return nil
	}
	for _, kv := range strings.Split(cniArgs, ";") {
		if len(strings.Split(kv, "=")) != 2 {
			return Errorf(ErrEnv, "CNI_ARGS: %q is no KEY=VALUE pair (pairs are separated by ';', each with one '=')", kv)
		}
	}
	return nil
}

// PodIdentity pulls K8S_POD_NAMESPACE and K8S_POD_NAME out of CNI_ARGS.
func PodIdentity(cniArgs string) (namespace, name string) {
	return cniArg(cniArgs, "K8S_POD_NAMESPACE"), cniArg(cniArgs, "K8S_POD_NAME")
}

// RequestedMAC is the MAC the runtime asks the pod interface to have: the
// "mac" capability (runtimeConfig.mac), else CNI_ARGS MAC, as the tuning
// plugin reads them; nil for a random one. It must be a unicast Ethernet
// address: the datapath never learns a group address as a pod's.
func RequestedMAC(runtimeMAC, cniArgs string) (net.HardwareAddr, error) {
	check := func(v string, bad func(format string, a ...any) error) (net.HardwareAddr, error) {
		mac, err := net.ParseMAC(v)
		switch {
		case err != nil || len(mac) != 6:
			return nil, bad("%q is not an Ethernet MAC address", v)
		case mac[0]&1 != 0:
			return nil, bad("%s is a group (multicast) address, not an interface's", mac)
		case mac.String() == "00:00:00:00:00:00":
			return nil, bad("%s is not an interface's address", mac)
		}
		return mac, nil
	}
	if runtimeMAC != "" {
		return check(runtimeMAC, func(format string, a ...any) error {
			return ConfError("runtimeConfig.mac: "+format, a...)
		})
	}
	if v := cniArg(cniArgs, "MAC"); v != "" {
		return check(v, func(format string, a ...any) error {
			return Errorf(ErrEnv, "CNI_ARGS MAC: "+format, a...)
		})
	}
	return nil, nil
}
