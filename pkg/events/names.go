package events

import (
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// names resolves an event's host veth and addresses to pods from the
// attachment records (as the dumps do), re-read when an event names an
// interface it does not know, at most once a second.
type names struct {
	stateDir string

	mu     sync.Mutex
	read   time.Time
	byIf   map[uint32]*state.Record
	byAddr map[netip.Addr]string
	ifs    map[uint32]string
}

func newNames(stateDir string) *names { return &names{stateDir: stateDir} }

func (n *names) refresh(force bool) {
	if !force && time.Since(n.read) < time.Second {
		return
	}
	n.read = time.Now()
	recs, _ := state.ListAll(n.stateDir)
	n.byIf = map[uint32]*state.Record{}
	n.byAddr = map[netip.Addr]string{}
	n.ifs = map[uint32]string{}
	for _, r := range recs {
		if r.Provisional || r.HostIfindex <= 0 {
			continue
		}
		n.byIf[uint32(r.HostIfindex)] = r
		for _, s := range r.IPs {
			if p, err := netip.ParsePrefix(s); err == nil {
				n.byAddr[p.Addr()] = label(r)
			} else if a, err := netip.ParseAddr(s); err == nil {
				n.byAddr[a] = label(r)
			}
		}
	}
}

// label is a record's pod, or its container ID's start when the runtime
// passed no pod name.
func label(r *state.Record) string {
	if l := r.PodLabel(); l != "" {
		return l
	}
	if len(r.ContainerID) > 12 {
		return r.ContainerID[:12]
	}
	return r.ContainerID
}

// endpoint names the pod, its container and the host veth of ifindex.
func (n *names) endpoint(ifindex uint32) (pod, container, iface string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r := n.byIf[ifindex]
	if r == nil {
		n.refresh(n.byIf == nil)
		r = n.byIf[ifindex]
	}
	if r != nil {
		return r.PodLabel(), r.ContainerID, r.HostIf
	}
	if name, ok := n.ifs[ifindex]; ok {
		return "", "", name
	}
	if l, err := netlink.LinkByIndex(int(ifindex)); err == nil {
		n.ifs[ifindex] = l.Attrs().Name
	} else {
		n.ifs[ifindex] = ""
	}
	return "", "", n.ifs[ifindex]
}

// podOf names the pod of this node with address a, "" when none has it.
func (n *names) podOf(a netip.Addr) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.byAddr == nil {
		n.refresh(true)
	}
	return n.byAddr[a]
}
