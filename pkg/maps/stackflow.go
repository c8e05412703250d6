package maps

import (
	"fmt"
	"net/netip"
	"time"
)

// Go twins of the stack-flow structs in bpf/lib/types.h, generated from BTF.
type (
	StackFlowKey = mapsObjSfKey
	StackFlowVal = mapsObjSfVal
)

// nameStackFlows is cni_stack_flows, as bpf/lib/maps.h declares it.
const nameStackFlows = "cni_stack_flows"

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

// ListStackFlows returns every entry of cni_stack_flows.
func (m *Maps) ListStackFlows() ([]StackFlow, error) {
	now := monotonicNow()
	var out []StackFlow
	err := scan(m.byName[nameStackFlows], func(k *StackFlowKey, v *StackFlowVal) {
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
		return nil, fmt.Errorf("scan %s: %w", nameStackFlows, err)
	}
	return out, nil
}

// DeleteStackFlowsOf removes every cni_stack_flows entry made for the pod
// behind the host veth ifindex and returns how many: a scan, as DeleteCTOf
// (the programs never use an entry whose ifindex is not the pod's anyway).
func (m *Maps) DeleteStackFlowsOf(ifindex int) (int, error) {
	var keys []StackFlowKey
	err := scan(m.byName[nameStackFlows], func(k *StackFlowKey, v *StackFlowVal) {
		if int(v.Ifindex) == ifindex {
			keys = append(keys, *k)
		}
	})
	if err != nil {
		return 0, fmt.Errorf("scan %s: %w", nameStackFlows, err)
	}
	return len(keys), deleteKeys(m.byName[nameStackFlows], keys)
}
