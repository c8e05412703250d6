package maps

import "time"

// State bits of a translated flow (FLOW_F_* in bpf/lib/types.h), shared by
// cni_ct and cni_snat; bpf/lib/flowlife.h keeps them from the packets seen.
const (
	flowReplied  = 1 << 1 // a packet of the reply direction was seen
	flowAssured  = 1 << 2 // TCP: the handshake completed
	flowStream   = 1 << 3 // UDP: replied, and in use 2 s after it began
	flowFinOrig  = 1 << 4 // TCP FIN from the originator
	flowFinReply = 1 << 5 // TCP FIN from the other side
	flowClosing  = 1 << 6 // TCP RST, or a FIN each way
	// cni_snat only: the peer's FIN came before the pod's, so the peer
	// holds TIME_WAIT for the translated tuple (FLOW_F_PEER_FIRST)
	flowPeerFirst = 1 << 7
)

// Timeouts of flowlife.h: an entry idle longer than its state's is deleted.
const (
	FlowTimeoutTCPOpening = 120 * time.Second
	FlowTimeoutTCP        = time.Hour
	FlowTimeoutUDP        = 30 * time.Second
	FlowTimeoutUDPStream  = 120 * time.Second
	FlowTimeoutICMP       = 30 * time.Second
	FlowTimeoutClosing    = 10 * time.Second
	// a masqueraded flow the peer closed first: Linux's TIME_WAIT
	// (masq.h's MASQ_TIME_WAIT), its node port held from other tuples
	FlowTimeoutTimeWait = 60 * time.Second
)

// FlowState names a flow's state as dumps show it: TCP "syn-sent" (no reply
// yet), "syn-recv" (replied, handshake not completed), "established",
// "fin-wait" (a FIN one way), "closing"; UDP "unreplied", "replied",
// "stream"; ICMP "unreplied", "replied".
func FlowState(proto uint8, flags uint32) string {
	switch {
	case flags&flowClosing != 0:
		return "closing"
	case proto == ProtoTCP && flags&(flowFinOrig|flowFinReply) != 0:
		return "fin-wait"
	case proto == ProtoTCP && flags&flowAssured != 0:
		return "established"
	case proto == ProtoTCP && flags&flowReplied != 0:
		return "syn-recv"
	case proto == ProtoTCP:
		return "syn-sent"
	case flags&flowStream != 0:
		return "stream"
	case flags&flowReplied != 0:
		return "replied"
	}
	return "unreplied"
}

// FlowTimeout is the idle time after which a flow in this state is deleted.
func FlowTimeout(proto uint8, flags uint32) time.Duration {
	switch {
	case flags&flowClosing != 0:
		return FlowTimeoutClosing
	case proto == ProtoTCP && flags&flowAssured != 0:
		return FlowTimeoutTCP
	case proto == ProtoTCP:
		return FlowTimeoutTCPOpening
	case proto == ProtoUDP && flags&flowStream != 0:
		return FlowTimeoutUDPStream
	case proto == ProtoUDP:
		return FlowTimeoutUDP
	}
	return FlowTimeoutICMP
}

// NATFlowTimeout is FlowTimeout for a cni_snat entry: a flow the peer
// closed first lives FlowTimeoutTimeWait.
func NATFlowTimeout(proto uint8, flags uint32) time.Duration {
	if flags&flowClosing != 0 && flags&flowPeerFirst != 0 {
		return FlowTimeoutTimeWait
	}
	return FlowTimeout(proto, flags)
}

// sinceNs is the time from a bpf_ktime_get_ns() stamp to now (0 for none).
func sinceNs(now, t uint64) time.Duration {
	if t == 0 || now < t {
		return 0
	}
	return time.Duration(now - t)
}
