// attack19's lab with the agent's controller: pods ADDed through the plugin
// binary with their names in CNI_ARGS, the API objects in a fake
// clientset, pkg/agent/netpol (the code `ebpf-agent run --network-policy`
// runs) programming the real pinned maps.

package integration

import (
	"context"
	"log"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/netpol"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

type a19Lab struct {
	*hpEnv
	cs        *fake.Clientset
	m         *maps.Maps
	statusDir string
	stop      func() // the running controller's (start)
}

// newA19Lab is a networkPolicy node (ipam as given, nil: the default) whose
// controller starts on cs with the first pod.
func newA19Lab(t *testing.T, ipam map[string]any) *a19Lab {
	t.Helper()
	h := newHPEnv(t)
	h.Extra["networkPolicy"] = true
	if ipam != nil {
		ipam["dataDir"] = h.DataDir
		h.IPAM = ipam
	}
	for _, fam := range []int{4, 6} {
		routeVia(t, h.Node, "", remoteIP[fam])
		routeVia(t, h.remote, cluster[fam], uplinkIP[fam])
	}
	cs := fake.NewSimpleClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", Labels: map[string]string{"kubernetes.io/metadata.name": "ns"}}})
	return &a19Lab{hpEnv: h, cs: cs, statusDir: t.TempDir()}
}

// start runs the controller (the maps exist once a pod is ADDed); it stops
// when the test ends.
func (l *a19Lab) start(t *testing.T) {
	t.Helper()
	h := l.hpEnv
	l.m = h.Maps()
	nodeNS, err := netns.GetFromPath(h.Node.Path())
	if err != nil {
		t.Fatal(err)
	}
	nh, err := netlink.NewHandleAt(nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	listed := make(chan struct{})
	close(listed)
	c := netpol.New(netpol.Config{StateDir: h.StateDir, StatusDir: l.statusDir, Writer: l.m.Policy().Writer(),
		Logf: log.New(os.Stderr, "agent: ", log.Lmicroseconds).Printf, Resync: time.Hour,
		ListWatch: fakeListWatch(l.cs, listed),
		LinkName: func(idx int) (string, bool) {
			lk, err := nh.LinkByIndex(idx)
			if err != nil {
				return "", false
			}
			return lk.Attrs().Name, true
		}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	var once sync.Once
	l.stop = func() { once.Do(func() { cancel(); <-done; nh.Close(); nodeNS.Close() }) }
	t.Cleanup(l.stop)
}

// pod ADDs a pod named name (container id = name), publishes it in the API
// with labels and the addresses ADD gave it, and waits until the
// controller has programmed its interface (no longer pending).
func (l *a19Lab) pod(t *testing.T, name string, labels map[string]string) (ns.NetNS, map[int]net.IP) {
	t.Helper()
	netns := l.NewPod()
	v4, v6 := resultIPs(addPod(t, l.hpEnv, netns, name, name))
	if l.m == nil {
		l.start(t)
	}
	_, err := l.cs.CoreV1().Pods("ns").Create(context.Background(), k8sPod(name, labels, v4, v6), metav1.CreateOptions{})
	must(t, err)
	l.waitProgrammed(t, name)
	return netns, map[int]net.IP{4: v4, 6: v6}
}

// waitProgrammed waits until the interface of container id is out of the
// pending state in both directions.
func (l *a19Lab) waitProgrammed(t *testing.T, id string) {
	t.Helper()
	_, idx := l.HostVeth(id)
	waitUntil(t, id+" programmed", func() bool {
		st, ok, _ := l.m.Policy().StateOf(idx)
		return ok && st.Mode[0] != maps.PolicyPending && st.Mode[1] != maps.PolicyPending
	})
}

// settle gives the controller time to act on an API change (it writes
// within milliseconds here; the tests then probe for seconds).
func settle() { time.Sleep(300 * time.Millisecond) }

// dialOK tells whether a TCP connection from netns to ip:port opens.
func dialOK(netns ns.NetNS, ip net.IP, port int) bool {
	return netns.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", hp(ip, port), 300*time.Millisecond)
		if err != nil {
			return err
		}
		return c.Close()
	}) == nil
}
