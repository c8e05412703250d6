package datapath

import (
	"crypto/sha256"
	"encoding/binary"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/bpfname"
)

// object is one embedded BPF object: one entry-point file of bpf/, as
// bpf2go compiled it (see generate.go).
type object struct {
	name  string
	load  func() (*ebpf.CollectionSpec, error)
	bytes []byte
	// compat is the same object built with EBPF_CNI_COMPAT, for kernels
	// without bpf_timer or bpf_loop (features.go: CompatBuild); nil when
	// the object uses neither.
	compat *object

	hashOnce sync.Once // hash
	hashHex  string
}

var (
	objFromContainer = &object{name: "from_container", load: loadFromContainer, bytes: _FromContainerBytes,
		compat: &object{name: "from_container_compat", load: loadFromContainerCompat, bytes: _FromContainerCompatBytes}}
	objToContainer = &object{name: "to_container", load: loadToContainer, bytes: _ToContainerBytes,
		compat: &object{name: "to_container_compat", load: loadToContainerCompat, bytes: _ToContainerCompatBytes}}
	objSockOps    = &object{name: "sock_ops", load: loadSockOps, bytes: _SockOpsBytes}
	objFromUplink = &object{name: "from_uplink", load: loadFromUplink, bytes: _FromUplinkBytes,
		compat: &object{name: "from_uplink_compat", load: loadFromUplinkCompat, bytes: _FromUplinkCompatBytes}}
	objToUplink = &object{name: "to_uplink", load: loadToUplink, bytes: _ToUplinkBytes,
		compat: &object{name: "to_uplink_compat", load: loadToUplinkCompat, bytes: _ToUplinkCompatBytes}}
	objSock = &object{name: "sock", load: loadSock, bytes: _SockBytes,
		compat: &object{name: "sock_compat", load: loadSockCompat, bytes: _SockCompatBytes}}
	// The tunnel programs use neither bpf_timer nor bpf_loop: one build.
	objTunnel = &object{name: "tunnel", load: loadTunnel, bytes: _TunnelBytes}
)

// in is the build of o the node at pinRoot runs: the compat one where
// CompatBuild says so.
func (o *object) in(pinRoot string) *object {
	if o.compat != nil && CompatBuild(pinRoot) {
		return o.compat
	}
	return o
}

// Scope is where a program is attached.
type Scope int

const (
	// ScopeHostVeth: both directions of every pod's host veth, attached by ADD.
	ScopeHostVeth Scope = iota
	// ScopeUplink: every uplink (the links holding node addresses), once
	// per node by whoever needs the node hooks first (ADD, the agent).
	ScopeUplink
	// ScopeCgroup: the cgroup2 root, once per node; sees every socket of
	// the machine.
	ScopeCgroup
	// ScopeTunnel: the node's tunnel device (tunnel.go), by the agent when
	// a tunnel mode is on.
	ScopeTunnel
)

// Program is one row of the catalogue: every program of the datapath, the
// object it is in, and where it runs.
type Program struct {
	Name   string          // C function name; the program's pin starts with it
	obj    *object         // the embedded object holding it
	Scope  Scope           // host veth, uplink or cgroup
	Attach ebpf.AttachType // the hook
	// Link names its pinned link (see pins.go): host veth: the direction
	// suffix ("ingress": links/<veth>_ingress); uplink: the prefix of
	// node/<prefix><uplink>; cgroup: node/<Link>.
	Link string
}

// Host veth direction names, as Program.Link and the link pins spell them.
const (
	DirIngress = "ingress" // host veth ingress: packets from the pod
	DirEgress  = "egress"  // host veth egress: packets to the pod
)

// progSpecs is never filled: the addresses of its fields name the programs,
// by the C names bpf2go recorded for them (a program renamed in bpf/ is then
// a compile error here, not a program the loader cannot find).
var progSpecs struct {
	fromContainer fromContainerProgramSpecs
	toContainer   toContainerProgramSpecs
	sockOps       sockOpsProgramSpecs
	fromUplink    fromUplinkProgramSpecs
	toUplink      toUplinkProgramSpecs
	sock          sockProgramSpecs
	tunnel        tunnelProgramSpecs
}

// progName is the C name of the program of a field of progSpecs.
func progName(field **ebpf.ProgramSpec) string { return bpfname.Of(&progSpecs, field) }

var (
	progFromContainer = Program{progName(&progSpecs.fromContainer.CniFromContainer), objFromContainer, ScopeHostVeth, ebpf.AttachTCXIngress, DirIngress}
	progToContainer   = Program{progName(&progSpecs.toContainer.CniToContainer), objToContainer, ScopeHostVeth, ebpf.AttachTCXEgress, DirEgress}
	// TCP pacing for rate limits (bpf/lib/bandwidth.h), attached with the
	// first limit.
	progSockOps = Program{progName(&progSpecs.sockOps.CniSockOps), objSockOps, ScopeCgroup, ebpf.AttachCGroupSockOps, "cgroup_sock_ops"}
	// Uplink ingress: every build that set up node hooks attached it.
	progFromUplink = Program{progName(&progSpecs.fromUplink.CniFromUplink), objFromUplink, ScopeUplink, ebpf.AttachTCXIngress, "uplink_"}
)

// catalog is every program of the datapath. hostPort and masquerade need
// the uplink programs (replies of masqueraded flows, DNAT of remote
// clients); hostPort the socket hooks (the node's own clients).
var catalog = []Program{
	progFromContainer,
	progToContainer,
	progSockOps,
	progFromUplink,
	{progName(&progSpecs.toUplink.CniToUplink), objToUplink, ScopeUplink, ebpf.AttachTCXEgress, "uplink-egress_"},
	{progName(&progSpecs.sock.CniSockConnect4), objSock, ScopeCgroup, ebpf.AttachCGroupInet4Connect, "cgroup_connect4"},
	{progName(&progSpecs.sock.CniSockSendmsg4), objSock, ScopeCgroup, ebpf.AttachCGroupUDP4Sendmsg, "cgroup_sendmsg4"},
	{progName(&progSpecs.sock.CniSockRecvmsg4), objSock, ScopeCgroup, ebpf.AttachCGroupUDP4Recvmsg, "cgroup_recvmsg4"},
	{progName(&progSpecs.sock.CniSockPeer4), objSock, ScopeCgroup, ebpf.AttachCgroupInet4GetPeername, "cgroup_getpeername4"},
	{progName(&progSpecs.sock.CniSockConnect6), objSock, ScopeCgroup, ebpf.AttachCGroupInet6Connect, "cgroup_connect6"},
	{progName(&progSpecs.sock.CniSockSendmsg6), objSock, ScopeCgroup, ebpf.AttachCGroupUDP6Sendmsg, "cgroup_sendmsg6"},
	{progName(&progSpecs.sock.CniSockRecvmsg6), objSock, ScopeCgroup, ebpf.AttachCGroupUDP6Recvmsg, "cgroup_recvmsg6"},
	{progName(&progSpecs.sock.CniSockPeer6), objSock, ScopeCgroup, ebpf.AttachCgroupInet6GetPeername, "cgroup_getpeername6"},
	{progName(&progSpecs.tunnel.CniFromTunnel), objTunnel, ScopeTunnel, ebpf.AttachTCXIngress, "tunnel_"},
	// The sender's egress policy on pods' packets into the tunnel.
	{progName(&progSpecs.tunnel.CniToTunnel), objTunnel, ScopeTunnel, ebpf.AttachTCXEgress, "tunnel-egress_"},
}

// corePrograms are pinned by the first ADD (Ensure): the host veth programs
// and the pacing hook.
var corePrograms = []Program{progFromContainer, progToContainer, progSockOps}

// coreProgramsOf are the core programs of the node at pinRoot: without the
// pacing program where the kernel cannot run it (NoPacing).
func coreProgramsOf(pinRoot string) []Program {
	if NoPacing(pinRoot) {
		return hostVethPrograms
	}
	return corePrograms
}

// hostVethPrograms are the programs of a pod's host veth, ingress first.
var hostVethPrograms = []Program{progFromContainer, progToContainer}

// uplinkPrograms run on every uplink.
func uplinkPrograms() []Program {
	return filter(func(p Program) bool { return p.Scope == ScopeUplink })
}

// tunnelHookPrograms run on the node's tunnel device.
func tunnelHookPrograms() []Program {
	return filter(func(p Program) bool { return p.Scope == ScopeTunnel })
}

// socketPrograms are hostPort's cgroup sock_addr hooks (bpf/sock.c).
func socketPrograms() []Program { return filter(func(p Program) bool { return p.obj == objSock }) }

// nodeHookPrograms are what EnsureNodeHooks attaches: the uplink and socket
// hooks (sock_ops is EnsurePacing's).
func nodeHookPrograms() []Program { return append(uplinkPrograms(), socketPrograms()...) }

func filter(keep func(Program) bool) []Program {
	var out []Program
	for _, p := range catalog {
		if keep(p) {
			out = append(out, p)
		}
	}
	return out
}

// hooksID identifies this build's node hook programs, so a node whose hooks
// a different build attached takes the slow path and updates them.
func hooksID(pinRoot string) uint32 {
	h := sha256.New()
	seen := map[*object]bool{}
	for _, p := range nodeHookPrograms() {
		if o := p.obj.in(pinRoot); !seen[o] {
			seen[o] = true
			h.Write(o.bytes)
		}
	}
	return binary.LittleEndian.Uint32(h.Sum(nil))
}

// kernelProgName is the name the kernel keeps of a program (BPF_OBJ_NAME_LEN).
func kernelProgName(n string) string {
	if len(n) > 15 {
		return n[:15]
	}
	return n
}
