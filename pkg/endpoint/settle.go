package endpoint

import (
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// localRouteWait bounds how long ADD waits for the pod's kernel to route its
// IPv6 addresses to itself (settleLocalRoutes).
const localRouteWait = 10 * time.Second

// settleLocalRoutes waits, in the pod's netns, until each IPv6 address of
// ips routes to the pod itself. The kernel inserts an IPv6 address's local
// route from its DAD work (a workqueue item that takes RTNL), NODAD or not,
// after the address is added; until then the pod discards what is sent to
// that address (forwarding off: InAddrErrors). On a busy node that took
// seconds, and a pod's first IPv6 datagram through a Service, sent after
// its ADD had returned, was lost (TestFirstIPv6DatagramAfterAdd). IPv4's
// local routes are inserted with the address: nothing to wait for.
func settleLocalRoutes(r *rtnl, ips []net.IP, within time.Duration) error {
	deadline := time.Now().Add(within)
	for _, ip := range ips {
		if isV4(ip) {
			continue
		}
		for delay := 100 * time.Microsecond; ; {
			rs, err := r.RouteGet(ip)
			if err == nil && len(rs) > 0 && rs[0].Type == unix.RTN_LOCAL {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the pod's kernel did not route %s to the pod within %s (its IPv6 DAD work, which takes RTNL, has not run): %v", ip, within, err)
			}
			time.Sleep(delay)
			if delay < 10*time.Millisecond {
				delay *= 2
			}
		}
	}
	return nil
}
