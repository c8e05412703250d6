package test

import "testing"

// TestPodToPodSmoke is the shortest proof of the core path: two pods on one
// node reach each other over IPv4 and IPv6, and DEL leaves nothing.
func TestPodToPodSmoke(t *testing.T) {
	e := newEnv(t)
	a, b := e.newPod(), e.newPod()
	e.add(a, "pod-a")
	rb := e.add(b, "pod-b")
	b4, b6 := podIPs(t, rb)
	if err := ping(a, b4, 2); err != nil {
		t.Fatal(err)
	}
	if err := ping(a, b6, 2); err != nil {
		t.Fatal(err)
	}
	if err := tcpTransfer(a, b, b4, 4<<20); err != nil {
		t.Fatal(err)
	}
	if err := e.del(a, "pod-a", "eth0"); err != nil {
		t.Fatal(err)
	}
	if err := e.del(b, "pod-b", "eth0"); err != nil {
		t.Fatal(err)
	}
	e.assertClean()
}
