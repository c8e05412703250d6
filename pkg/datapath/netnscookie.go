package datapath

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// The netns cookie is the key the socket hooks (bpf_get_netns_cookie in
// cgroup sock_addr programs, 5.7) compare with the node's, and the pacing
// program (sock_ops, 5.15) looks pods up by. getsockopt(SO_NETNS_COOKIE)
// reads it from 5.14 on. Before (or with so_netns_cookie forced off) a
// cgroup connect4 program learns it: attached for an instant to this
// process's own cgroup, through a bpf_link this process owns (closed with
// it, kill -9 included: nothing is left attached), it answers one UDP
// connect to an address and port drawn at random by this process with the
// socket's netns cookie, written to a private array, and refuses that
// connect. Every other connect passes it untouched.

// NetnsCookie returns the cookie of the calling thread's network namespace.
func NetnsCookie() (uint64, error) {
	if NetnsCookieCheap() {
		return soNetnsCookie()
	}
	c, err := bpfNetnsCookie()
	if err != nil {
		return 0, fmt.Errorf("netns cookie without SO_NETNS_COOKIE (%s): %w", FeatNetnsCookie, err)
	}
	return c, nil
}

var (
	soOnce sync.Once
	soHave bool
)

// NetnsCookieCheap tells whether NetnsCookie is one getsockopt
// (SO_NETNS_COOKIE, not forced off) rather than a BPF program's round.
func NetnsCookieCheap() bool {
	soOnce.Do(func() {
		_, err := soNetnsCookie()
		soHave = !errors.Is(err, unix.ENOPROTOOPT) && !isForced(FeatNetnsCookie)
	})
	return soHave
}

// PodNetnsCookie is the cookie an ADD records for the pod's netns (the
// calling thread's): 0 where nothing reads it (the node at pinRoot runs no
// pacing program, the only reader of cni_netns) and learning it is not one
// getsockopt, so an ADD loads no BPF program for nothing.
// Nor where no cgroup2 mount lets the program learn it: the pacing program
// attaches to cgroup2 as well.
func PodNetnsCookie(pinRoot string) (uint64, error) {
	if NetnsCookieCheap() {
		return soNetnsCookie()
	}
	if NoPacing(pinRoot) {
		return 0, nil
	}
	c, err := NetnsCookie()
	if errors.Is(err, errNoCgroup2) {
		return 0, nil
	}
	return c, err
}

var errNoCgroup2 = errors.New("no cgroup2 mount")

func soNetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket for netns cookie: %w", err)
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("read netns cookie: %w", err)
	}
	return c, nil
}

// cookieProbe is the connect4 program of this process and its answer slot.
var cookieProbe struct {
	once sync.Once
	mu   sync.Mutex // one round at a time: one slot
	prog *ebpf.Program
	slot *ebpf.Map
	addr [4]byte // 127.x.y.z
	port int
	err  error
}

func loadCookieProbe() error {
	p := &cookieProbe
	p.once.Do(func() {
		var r [4]byte
		if _, p.err = rand.Read(r[:]); p.err != nil {
			return
		}
		p.addr = [4]byte{127, r[0], r[1], r[2]}
		p.port = 1024 + int(binary.NativeEndian.Uint16(r[2:]))%(65536-1024)
		// The context holds both in network order, loaded as 32-bit words.
		wantAddr := int32(binary.NativeEndian.Uint32(p.addr[:]))
		wantPort := int32(binary.NativeEndian.Uint16([]byte{byte(p.port >> 8), byte(p.port)}))
		p.slot, p.err = ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
		if p.err != nil {
			p.err = fmt.Errorf("create the netns cookie slot: %w", p.err)
			return
		}
		const userIP4, userPort = 4, 24 // struct bpf_sock_addr
		insns := asm.Instructions{
			asm.Mov.Reg(asm.R6, asm.R1),
			asm.LoadMem(asm.R2, asm.R6, userIP4, asm.Word),
			asm.JNE.Imm32(asm.R2, wantAddr, "pass"),
			asm.LoadMem(asm.R2, asm.R6, userPort, asm.Word),
			asm.JNE.Imm32(asm.R2, wantPort, "pass"),
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.FnGetNetnsCookie.Call(),
			asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
			asm.Mov.Imm(asm.R0, 0),
			asm.StoreMem(asm.RFP, -16, asm.R0, asm.Word),
			asm.LoadMapPtr(asm.R1, p.slot.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -16),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, -8),
			asm.Mov.Imm(asm.R4, 0),
			asm.FnMapUpdateElem.Call(),
			asm.Mov.Imm(asm.R0, 0), // refuse this connect: the socket stays unconnected
			asm.Return(),
			asm.Mov.Imm(asm.R0, 1).WithSymbol("pass"),
			asm.Return(),
		}
		p.prog, p.err = ebpf.NewProgram(&ebpf.ProgramSpec{Name: "cni_netns_cookie", Type: ebpf.CGroupSockAddr,
			AttachType: ebpf.AttachCGroupInet4Connect, License: "GPL", Instructions: insns})
		if p.err != nil {
			p.err = fmt.Errorf("load the netns cookie program (cgroup connect4 with bpf_get_netns_cookie, 5.7): %w", p.err)
		}
	})
	return p.err
}

// afterCookieAttach runs while the program is attached: a test kills the
// process there (TestNetnsCookieKilled).
var afterCookieAttach = func() {}

// bpfNetnsCookie learns the calling thread's netns cookie with the probe
// program, attached to this process's cgroup, then to the cgroup2 root
// (where net_cls/net_prio turned the sockets' cgroup matching off, every
// socket counts as the root's).
func bpfNetnsCookie() (uint64, error) {
	if err := loadCookieProbe(); err != nil {
		return 0, err
	}
	dirs, err := ownCgroupDirs()
	if err != nil {
		return 0, err
	}
	p := &cookieProbe
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, dir := range dirs {
		c, err := cookieRound(dir)
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return 0, errors.Join(errs...)
}

func cookieRound(dir string) (uint64, error) {
	p := &cookieProbe
	if err := p.slot.Put(uint32(0), uint64(0)); err != nil {
		return 0, fmt.Errorf("clear the netns cookie slot: %w", err)
	}
	f, err := os.Open(dir)
	if err != nil {
		return 0, fmt.Errorf("open cgroup %s: %w", dir, err)
	}
	defer f.Close()
	// A cgroup takes 64 programs per hook: with as many rounds of other
	// processes under way (each a fraction of a millisecond to a few), wait.
	var l link.Link
	for wait := time.Millisecond; ; wait *= 2 {
		l, err = link.AttachRawLink(link.RawLinkOptions{Target: int(f.Fd()), Program: p.prog, Attach: ebpf.AttachCGroupInet4Connect})
		if !errors.Is(err, unix.E2BIG) || wait > time.Second {
			break
		}
		time.Sleep(wait)
	}
	if err != nil {
		return 0, fmt.Errorf("attach the netns cookie program to cgroup %s: %w", dir, err)
	}
	afterCookieAttach()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		// EPERM when the program answered; anything else is checked below.
		_ = unix.Connect(fd, &unix.SockaddrInet4{Addr: p.addr, Port: p.port})
		unix.Close(fd)
	}
	l.Close()
	if err != nil {
		return 0, fmt.Errorf("socket for the netns cookie: %w", err)
	}
	var c uint64
	if err := p.slot.Lookup(uint32(0), &c); err != nil {
		return 0, fmt.Errorf("read the netns cookie slot: %w", err)
	}
	if c == 0 {
		return 0, fmt.Errorf("the netns cookie program attached to cgroup %s did not see this process's connect", dir)
	}
	return c, nil
}

// ownCgroupDirs are this process's cgroup2 directory and the root of its
// cgroup2 mount, from /proc/self/cgroup and /proc/self/mountinfo.
func ownCgroupDirs() ([]string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	var own string
	found := false
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			own, found = p, true
		}
	}
	if !found {
		return nil, errors.New("this process is in no cgroup2 cgroup (/proc/self/cgroup)")
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		// id parent major:minor root mountpoint opts... - fstype source superopts
		fields := strings.Fields(s.Text())
		sep := -1
		for i, x := range fields {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || sep+1 >= len(fields) || fields[sep+1] != "cgroup2" {
			continue
		}
		root, mnt := fields[3], fields[4]
		rel, ok := strings.CutPrefix(own, root)
		if root == "/" {
			rel, ok = own, true
		}
		if !ok {
			continue
		}
		dir := filepath.Join(mnt, rel)
		if dir == mnt {
			return []string{mnt}, nil
		}
		return []string{dir, mnt}, nil
	}
	return nil, fmt.Errorf("%w holds this process's cgroup %s (/proc/self/mountinfo)", errNoCgroup2, own)
}
