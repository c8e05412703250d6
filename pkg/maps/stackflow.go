package maps

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
)

// StackFlows is the stack-flow family of the maps (bpf/lib/stackflow.h):
// the flows the stack delivered to pods whose replies go back through it,
// in the shared table (cni_stack_flows) and the pods' own tables.
type StackFlows struct{ m *Maps }

// StackFlows returns the StackFlows family of m.
func (m *Maps) StackFlows() StackFlows { return StackFlows{m} }

// Go twins of the stack-flow structs in bpf/lib/types.h, generated from BTF.
type (
	StackFlowKey = mapsObjSfKey
	StackFlowVal = mapsObjSfVal
)

// nameStackFlows is cni_stack_flows, as bpf/lib/maps.h declares it: the
// records of the node's flows and of pods attached by older builds.
var nameStackFlows = mapName(&specNames.CniStackFlows)

// nameStackFlowParts is cni_stack_flow_parts: each pod's own table of the
// records of flows it sent (issue 28: so no pod evicts another's), keyed
// by its host veth's ifindex.
var nameStackFlowParts = mapName(&specNames.CniStackFlowParts)

// stackFlowPartSpec is a pod's table: struct sf_part in bpf/lib/maps.h
// (TestStackFlowPartSpec holds them equal), kept here so that a verb
// creates one without parsing the embedded object.
var stackFlowPartSpec = ebpf.MapSpec{Name: "cni_sf_part", Type: ebpf.LRUHash, KeySize: 40, ValueSize: 16, MaxEntries: 256}

// AddPart gives the pod behind the host veth ifindex its own table
// of stack-flow records (replacing one an earlier pod of that ifindex left).
func (s StackFlows) AddPart(ifindex int) error {
	inner, err := ebpf.NewMap(&stackFlowPartSpec)
	if err != nil {
		return fmt.Errorf("create the stack-flow table of ifindex %d: %w", ifindex, err)
	}
	defer inner.Close() // the outer map and the pin hold it from here
	if err := s.m.putInner(nameStackFlowParts, uint32(ifindex), inner, ebpf.UpdateAny); err != nil {
		return writeErr(s.m.get(nameStackFlowParts), nameStackFlowParts, fmt.Sprintf("the table of ifindex %d", ifindex), err)
	}
	return nil
}

// EnsurePart gives the pod behind the host veth ifindex its own
// table of stack-flow records unless it has one (the agent, after an ADD
// that left it to it): an existing table and its records are kept.
func (s StackFlows) EnsurePart(ifindex int) error {
	k := uint32(ifindex)
	outer := s.m.get(nameStackFlowParts)
	var id uint32
	if err := outer.Lookup(&k, &id); err == nil {
		return nil // the common case: no table made to be thrown away
	}
	if slot, err := s.SlotOf(ifindex); err != nil || slot != 0 {
		return err // the pod has the pool's (ADD took it)
	}
	inner, err := ebpf.NewMap(&stackFlowPartSpec)
	if err != nil {
		return fmt.Errorf("create the stack-flow table of ifindex %d: %w", ifindex, err)
	}
	defer inner.Close()
	if err := s.m.putInner(nameStackFlowParts, k, inner, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return writeErr(outer, nameStackFlowParts, fmt.Sprintf("the table of ifindex %d", ifindex), err)
	}
	return nil
}

// Parts lists the ifindexes that have a table of their own: one made for
// them, or a slot of the pool (the agent's reconcile frees a gone veth's).
func (s StackFlows) Parts() ([]int, error) {
	var out []int
	err := scan(s.m.get(nameStackFlowParts), func(k *uint32, _ *uint32) { out = append(out, int(*k)) })
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", nameStackFlowParts, err)
	}
	slots, err := s.Slots()
	if err != nil {
		return nil, err
	}
	for idx := range slots {
		if !slices.Contains(out, idx) {
			out = append(out, idx)
		}
	}
	return out, nil
}

// deleteStackFlowPart drops the table of ifindex, if any; the last one
// gone, the programs stop looking the map up (SyncNoParts).
func (m *Maps) deleteStackFlowPart(ifindex int) error {
	k := uint32(ifindex)
	err := m.get(nameStackFlowParts).Delete(&k)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete the table of ifindex %d from %s: %w", ifindex, nameStackFlowParts, err)
	}
	if uerr := m.unpinInner(nameStackFlowParts, k); uerr != nil || err != nil {
		return uerr // no table was there: the flag stands as it is
	}
	return m.StackFlows().SyncNoParts()
}

// hpConfigSFNoParts is HP_CFG_SF_NO_PARTS in cni_hp_config's flags:
// cni_stack_flow_parts holds no table, so the programs skip its lookup
// for a pod without a pool slot (a pod of a build before issue 28's
// tables: the lookup could only fail; issue 30).
const hpConfigSFNoParts = 32

// SyncNoParts sets HP_CFG_SF_NO_PARTS when cni_stack_flow_parts holds no
// table and clears it otherwise. Under the tables' lock, which putInner
// takes too (and clears the flag under, before a table goes in): a table
// put meanwhile is never left unlooked-up. Run where this build takes
// over a node (Create, an upgrade's swap), by the agent's full passes
// (a table an older build's verb put in meanwhile clears it again), and
// by a DEL that dropped a table.
func (s StackFlows) SyncNoParts() error {
	outer := s.m.get(nameStackFlowParts)
	if outer == nil {
		return nil
	}
	unlock, err := innerLock(s.m.dir, true)
	if err != nil {
		return err
	}
	defer unlock()
	var k uint32
	err = outer.NextKey(nil, &k)
	empty := errors.Is(err, ebpf.ErrKeyNotExist)
	if err != nil && !empty {
		return fmt.Errorf("scan %s: %w", nameStackFlowParts, err)
	}
	return s.m.setConfigFlags(hpConfigSFNoParts, empty)
}

// EndpointFlagStackFlowsNone is EP_F_SF_NONE in ep_info.flags: set by
// ADD, cleared by to_container before it records the first flow the stack
// delivered to the address. While it is set from_container's same-node
// fast path looks up no stack-flow record of the address's flows (issue
// 30). An entry rewritten over a live one (Endpoints().Insert on its own
// ifindex) never gets it: that address may have records already.
const EndpointFlagStackFlowsNone = 1 << 5

// Flags of a stack flow (SF_* in bpf/lib/types.h): who the peer is.
const (
	StackFlowPeerPod  = 1 // a pod of this node: its replies go through the stack
	StackFlowPeerNode = 2 // a node address (UDP): the pod's replies are no hostPort hairpin
	StackFlowInbound  = 4 // written by programs before issue 28 only (a host outside reached a masquerading pod); never read
)

// StackFlow is one entry of cni_stack_flows: a flow the kernel stack
// delivered to a pod, whose replies must go back through the stack.
type StackFlow struct {
	Proto   uint8
	Pod     netip.AddrPort // the pod's address and port (ICMP echo: the id)
	Peer    netip.AddrPort // where the flow came from, as the pod sees it
	Flags   uint32
	Ifindex int           // host veth of the pod
	Idle    time.Duration // since the stack last delivered a packet (second granularity)
}

// Kind names the flags: pod, node, inbound (joined with "+").
func (f StackFlow) Kind() string {
	var s string
	for _, k := range []struct {
		bit  uint32
		name string
	}{{StackFlowPeerPod, "pod"}, {StackFlowPeerNode, "node"}, {StackFlowInbound, "inbound"}} {
		if f.Flags&k.bit != 0 {
			if s != "" {
				s += "+"
			}
			s += k.name
		}
	}
	return s
}

// List returns every stack-flow record: cni_stack_flows' and
// those of every pod's table.
func (s StackFlows) List() ([]StackFlow, error) {
	out, err := listStackFlows(s.m.get(nameStackFlows), nameStackFlows)
	if err != nil {
		return nil, err
	}
	err = s.m.eachInner(nameStackFlowParts, func(_ []byte, t *ebpf.Map) error {
		fs, err := listStackFlows(t, nameStackFlowParts)
		out = append(out, fs...)
		return err
	})
	if err != nil {
		return nil, err
	}
	err = s.m.eachTakenTable(func(_ uint32, t *ebpf.Map) error {
		fs, err := listStackFlows(t, nameSFPool)
		out = append(out, fs...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func listStackFlows(mp *ebpf.Map, name string) ([]StackFlow, error) {
	now := monotonicNow()
	var out []StackFlow
	err := scan(mp, func(k *StackFlowKey, v *StackFlowVal) {
		f := StackFlow{
			Proto: k.Proto, Pod: addrPort(k.Addr, k.Family, k.Port), Peer: addrPort(k.PeerAddr, k.Family, k.PeerPort),
			Flags: v.Flags, Ifindex: int(v.Ifindex),
		}
		if v.SeenNs != 0 && now > v.SeenNs {
			f.Idle = time.Duration(now - v.SeenNs)
		}
		out = append(out, f)
	})
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", name, err)
	}
	return out, nil
}

// DeleteOf removes every stack-flow record made for the pod
// behind the host veth ifindex and returns how many: a scan of
// cni_stack_flows and of every pod's table (a flow another pod sent to this
// one is recorded in the sender's), as DeleteCTOf (the programs never use a
// record whose ifindex is not the pod's anyway), and drops the pod's own
// table.
func (s StackFlows) DeleteOf(ifindex int) (int, error) {
	if err := s.m.deleteStackFlowPart(ifindex); err != nil {
		return 0, err
	}
	n, err := deleteStackFlowsIn(s.m.get(nameStackFlows), nameStackFlows, ifindex)
	if err != nil {
		return n, err
	}
	err = s.m.eachInner(nameStackFlowParts, func(_ []byte, t *ebpf.Map) error {
		k, err := deleteStackFlowsIn(t, nameStackFlowParts, ifindex)
		n += k
		return err
	})
	if err != nil {
		return n, err
	}
	// The pod's own pool table is emptied whole and its slot freed; the
	// others' are scanned as above.
	own, err := s.SlotOf(ifindex)
	if err != nil {
		return n, err
	}
	err = s.m.eachTakenTable(func(slot uint32, t *ebpf.Map) error {
		if slot == own {
			return nil
		}
		k, err := deleteStackFlowsIn(t, nameSFPool, ifindex)
		n += k
		return err
	})
	if err != nil {
		return n, err
	}
	return n, s.m.freeSlot(ifindex)
}

// NeverDelivered tells whether no stack flow was ever recorded for the pod
// behind ifindex with addresses ips: every address's entry is still this
// ifindex's and still carries EP_F_SF_NONE, which to_container clears
// before it records the first flow the stack delivered to it. Anything
// else (an entry gone, another's, without the bit: an older build's, a
// rewritten one, an upgrade's ClearNone) is false. DEL looks before it
// removes the entries; a flow the stack delivers after the look, while the
// veth still lives, is recorded as one after DeleteOf's scans would be.
func (s StackFlows) NeverDelivered(ifindex int, ips []net.IP) bool {
	if len(ips) == 0 {
		return false
	}
	for _, ip := range ips {
		e, err := s.m.Endpoints().Lookup(ip)
		if err != nil || int(e.Ifindex) != ifindex || e.Flags&EndpointFlagStackFlowsNone == 0 {
			return false
		}
	}
	return true
}

// DeleteOwn drops what the pod behind ifindex has of its own (its table, or
// its pool slot, emptied and freed) and scans no other table: DeleteOf for
// a pod NeverDelivered (issue 30: DEL scanned every pod's table, a cost
// that grew with the pods of the node).
func (s StackFlows) DeleteOwn(ifindex int) error {
	if err := s.m.deleteStackFlowPart(ifindex); err != nil {
		return err
	}
	return s.m.freeSlot(ifindex)
}

// deleteStackFlowsIn removes the records of table mp made for ifindex.
func deleteStackFlowsIn(mp *ebpf.Map, name string, ifindex int) (int, error) {
	var keys []StackFlowKey
	err := scan(mp, func(k *StackFlowKey, v *StackFlowVal) {
		if int(v.Ifindex) == ifindex {
			keys = append(keys, *k)
		}
	})
	if err != nil {
		return 0, fmt.Errorf("scan %s: %w", name, err)
	}
	return len(keys), deleteKeys(mp, keys)
}

// ClearNone takes EP_F_SF_NONE off every address entry: an
// upgrade from another build does so before any pod runs this build's
// from_container, since the other build's to_container may have recorded
// flows of an address without clearing it (it does not know the bit), and
// the ADDs of this build meanwhile set it. Those pods' flows are then
// looked up, as before the bit. Returns how many entries it changed.
func (s StackFlows) ClearNone() (int, error) {
	eps, err := s.m.Endpoints().List()
	if err != nil {
		return 0, fmt.Errorf("list %s: %w", nameEndpoints, err)
	}
	n := 0
	for _, e := range eps {
		if e.Info.Flags&EndpointFlagStackFlowsNone == 0 {
			continue
		}
		k, err := KeyFor(e.IP)
		if err != nil {
			return n, err
		}
		v := e.Info
		v.Flags &^= EndpointFlagStackFlowsNone
		// Only over the entry still there: a pod deleted meanwhile stays gone.
		if err := s.m.endpoints.Update(&k, &v, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, writeErr(s.m.endpoints, nameEndpoints, "endpoint "+e.IP.String(), err)
		}
		n++
	}
	return n, nil
}
