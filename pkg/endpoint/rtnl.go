package endpoint

import (
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// rtnl is one netns's rtnetlink sockets, opened once and kept for an ADD's
// requests there. Through the library's package functions each request
// opens, binds and closes a socket of its own (16 µs more a request than
// on a kept socket, `go test -bench`, docs/performance.md round 16), and an
// ADD makes about twenty. Its dumps retry as netlinksafe's do; raw carries
// the requests the library has no call for (nexthop objects, routes by
// nexthop id, a link's alias and flags in one message). A request on a
// shared socket holds its lock: goroutines may share an rtnl.
type rtnl struct {
	netlinksafe.Handle
	raw map[int]*nl.SocketHandle
}

// openRTNL opens the sockets in the calling thread's netns; they act there
// whichever thread uses them later.
func openRTNL() (*rtnl, error) {
	h, err := netlinksafe.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		return nil, err
	}
	// The deadlines a socket per request gets (nl.SocketTimeoutTv): a
	// request the kernel never answers fails rather than hangs the verb.
	_ = h.SetSocketTimeout(time.Duration(nl.SocketTimeoutTv.Nano()))
	_ = s.SetSendTimeout(&nl.SocketTimeoutTv)
	_ = s.SetReceiveTimeout(&nl.SocketTimeoutTv)
	return &rtnl{Handle: h, raw: map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}}, nil
}

// openRTNLOrEach is openRTNL for the verbs that go on without it (DEL, GC
// and the agent's sweep are best effort): when the sockets cannot be
// opened, each request opens its own in the calling thread's netns, as the
// library's package functions do.
func openRTNLOrEach() *rtnl {
	if r, err := openRTNL(); err == nil {
		return r
	}
	return (*rtnl)(nil).orEach()
}

// orEach is r, or for nil an rtnl whose every request opens a socket of
// its own in the calling thread's netns (the library's pkgHandle).
func (r *rtnl) orEach() *rtnl {
	if r != nil {
		return r
	}
	return &rtnl{Handle: netlinksafe.Handle{Handle: &netlink.Handle{}}}
}

// kept says that r's sockets are its own, made in one netns, rather than
// one per request in whichever netns the calling thread is in.
func (r *rtnl) kept() bool { return r != nil && r.raw != nil }

// Close closes the sockets; nil is fine.
func (r *rtnl) Close() {
	if r == nil {
		return
	}
	r.Handle.Close()
	for _, s := range r.raw {
		s.Close()
	}
}

// request is nl.NewNetlinkRequest on r's raw socket; r nil: on a socket of
// its own in the calling thread's netns.
func (r *rtnl) request(proto, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(proto, flags)
	if r.kept() {
		req.Sockets = r.raw
	}
	return req
}

// sockets are r's raw sockets for a request built elsewhere (nil: its own).
func (r *rtnl) sockets() map[int]*nl.SocketHandle {
	if !r.kept() {
		return nil
	}
	return r.raw
}
