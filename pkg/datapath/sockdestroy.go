package datapath

import (
	"encoding/binary"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// A connected UDP socket of the node that reached a pod through a hostPort
// had its destination rewritten once, at connect: it keeps sending to the
// pod's IP after the pod is gone, and would reach a new pod given that IP.
// DEL aborts such sockets (sock_diag SOCK_DESTROY, as `ss -K` does), found
// by the socket cookies the hook recorded in cni_sock_rnat.

// inet_diag_req_v2 with its inet_diag_sockid, as the kernel lays them out.
type diagReq struct {
	family, proto uint8
	states        uint32
	sport, dport  uint16 // host order here, big endian on the wire
	src, dst      [16]byte
	ifindex       uint32
	cookie        [2]uint32
}

const (
	sizeofDiagReq  = 56
	sizeofDiagMsg  = 72
	tcpEstablished = 1
)

func (r *diagReq) Len() int { return sizeofDiagReq }

func (r *diagReq) Serialize() []byte {
	b := make([]byte, sizeofDiagReq)
	b[0], b[1] = r.family, r.proto
	binary.NativeEndian.PutUint32(b[4:], r.states)
	binary.BigEndian.PutUint16(b[8:], r.sport)
	binary.BigEndian.PutUint16(b[10:], r.dport)
	copy(b[12:28], r.src[:])
	copy(b[28:44], r.dst[:])
	binary.NativeEndian.PutUint32(b[44:], r.ifindex)
	binary.NativeEndian.PutUint32(b[48:], r.cookie[0])
	binary.NativeEndian.PutUint32(b[52:], r.cookie[1])
	return b
}

// parseDiagMsg reads the socket id of an inet_diag_msg into a request.
func parseDiagMsg(family uint8, m []byte) (*diagReq, uint8, bool) {
	if len(m) < sizeofDiagMsg {
		return nil, 0, false
	}
	r := &diagReq{family: family, proto: unix.IPPROTO_UDP}
	state := m[1]
	id := m[4:]
	r.sport = binary.BigEndian.Uint16(id[0:])
	r.dport = binary.BigEndian.Uint16(id[2:])
	copy(r.src[:], id[4:20])
	copy(r.dst[:], id[20:36])
	r.ifindex = binary.NativeEndian.Uint32(id[36:])
	r.cookie[0] = binary.NativeEndian.Uint32(id[40:])
	r.cookie[1] = binary.NativeEndian.Uint32(id[44:])
	return r, state, true
}

// DestroyUDPSockets aborts the connected UDP sockets of the calling thread's
// netns whose cookie is in cookies, and returns how many it aborted.
func DestroyUDPSockets(cookies map[uint64]bool) (int, error) {
	if len(cookies) == 0 {
		return 0, nil
	}
	n := 0
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		req := nl.NewNetlinkRequest(nl.SOCK_DIAG_BY_FAMILY, unix.NLM_F_DUMP)
		req.AddData(&diagReq{family: fam, proto: unix.IPPROTO_UDP, states: 1 << tcpEstablished})
		msgs, err := req.Execute(unix.NETLINK_INET_DIAG, nl.SOCK_DIAG_BY_FAMILY)
		if err != nil {
			return n, fmt.Errorf("list UDP sockets: %w", err)
		}
		for _, m := range msgs {
			r, state, ok := parseDiagMsg(fam, m)
			if !ok || state != tcpEstablished {
				continue
			}
			if !cookies[uint64(r.cookie[0])|uint64(r.cookie[1])<<32] {
				continue
			}
			d := nl.NewNetlinkRequest(nl.SOCK_DESTROY, unix.NLM_F_ACK)
			d.AddData(r)
			if _, err := d.Execute(unix.NETLINK_INET_DIAG, 0); err != nil && err != unix.ENOENT {
				return n, fmt.Errorf("abort UDP socket %d -> %d: %w", r.sport, r.dport, err)
			}
			n++
		}
	}
	return n, nil
}
