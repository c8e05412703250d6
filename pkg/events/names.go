package events

import (
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// names resolves an event's host veth and addresses to pods from the
// attachment records (as the dumps do), re-read when a name is missing and
// a network's record directory changed since (a stat per miss, the
// records only when one was written or removed).
type names struct {
	stateDir string

	mu   sync.Mutex
	read time.Time
	dirs map[string]time.Time // mtime of each network's record directory at the last read
	// addrCheck: when an address miss last checked the directories. Peers
	// outside the node miss every time: they check at most every 250 ms.
	addrCheck time.Time
	byIf      map[uint32]*state.Record
	byAddr    map[netip.Addr]string
	ifs       map[uint32]string
}

func newNames(stateDir string) *names { return &names{stateDir: stateDir} }

// changed tells whether a network's record directory changed since the
// last read.
func (n *names) changed() bool {
	nets, _ := state.Networks(n.stateDir)
	if len(nets) != len(n.dirs) {
		return true
	}
	for _, net := range nets {
		fi, err := os.Stat(filepath.Join(n.stateDir, net))
		if err != nil || !fi.ModTime().Equal(n.dirs[net]) {
			return true
		}
	}
	return false
}

func (n *names) refresh(force bool) {
	if !force && !n.changed() {
		return
	}
	n.read = time.Now()
	n.dirs = map[string]time.Time{}
	nets, _ := state.Networks(n.stateDir)
	for _, net := range nets {
		if fi, err := os.Stat(filepath.Join(n.stateDir, net)); err == nil {
			n.dirs[net] = fi.ModTime()
		}
	}
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
	p, ok := n.byAddr[a]
	if !ok && a.IsGlobalUnicast() && (n.byAddr == nil || time.Since(n.addrCheck) > 250*time.Millisecond) {
		n.addrCheck = time.Now()
		n.refresh(n.byAddr == nil)
		p = n.byAddr[a]
	}
	return p
}
