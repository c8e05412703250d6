// Masquerade ports under a flood: one pod cannot take a destination's
// ports from the others (issue 14, item 1).

package integration

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestMasqPortFlood: a pod sends UDP from 6000 source ports to one DNS-like
// server (outside:53), over and over, on the range the masquerade had before
// it was configurable (61000-65535, 4536 ports: the flood took all of them
// and a second pod's queries failed 5 of 5). During the flood a second pod's
// 5 queries to the same server all get answers, the flooder never holds
// more than its limit (an eighth of the range: 567 ports) towards the server,
// and its excess flows take back its own ports, not the other pod's.
func TestMasqPortFlood(t *testing.T) {
	t.Parallel()
	const (
		flowsPerRound = 6000
		portRange     = "61000-65535"
		rangeSize     = 65535 - 61000 + 1
		limit         = rangeSize / 8
	)
	lab := newMasqLab(t)
	a := lab.a
	a.Extra["ipMasqPortRange"] = portRange
	flooder, quiet := a.NewPod(), a.NewPod()
	a.CleanupDel(flooder, "flood")
	a.Add(flooder, "flood")
	a.CleanupDel(quiet, "quiet")
	a.Add(quiet, "quiet")
	_, floodIdx := a.HostVeth("flood")
	serve(t, lab.out, 53, "dns")
	server := hp(outsideIP, 53)
	m := a.Maps()
	cfg, err := m.Masq().Config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Size() != rangeSize || cfg.PodLimit != limit {
		t.Fatalf("cni_masq_config %v, want %s with a pod limit of %d", cfg, portRange, limit)
	}

	// The flood: 6000 sockets, each sending to the server, round after round.
	var socks []*net.UDPConn
	err = flooder.Do(func(ns.NetNS) error {
		for i := 0; i < flowsPerRound; i++ {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{})
			if err != nil {
				return fmt.Errorf("socket %d: %w", i, err)
			}
			socks = append(socks, c)
		}
		return nil
	})
	defer func() {
		for _, c := range socks {
			c.Close()
		}
	}()
	if err != nil {
		t.Fatal(err)
	}
	raddr := &net.UDPAddr{IP: outsideIP, Port: 53}
	stop := make(chan struct{})
	var sent atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			for _, c := range socks {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := c.WriteToUDP([]byte("flood"), raddr); err == nil {
					sent.Add(1)
				}
			}
		}
	}()
	// The flooder's share, sampled during the flood.
	var most atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			sh, _ := m.Masq().ListShares()
			for _, s := range sh {
				if s.Ifindex == floodIdx && s.Destination.Port() == 53 && int64(s.Ports) > most.Load() {
					most.Store(int64(s.Ports))
				}
			}
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	// Let the flood fill the flooder's share first, then query.
	for deadline := time.Now().Add(10 * time.Second); sent.Load() < 2*flowsPerRound && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	ok := 0
	for i := 0; i < 5; i++ {
		if _, err := askFrom(quiet, "udp", server, 0); err != nil {
			t.Logf("query %d: %v", i+1, err)
			continue
		}
		ok++
		time.Sleep(200 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	st, err := m.Masq().Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("flood: %d datagrams from %d ports; the flooder's most ports towards the server %d (limit %d of %d); second pod %d/5; counters %v",
		sent.Load(), flowsPerRound, most.Load(), limit, rangeSize, ok, st)
	if ok != 5 {
		t.Errorf("second pod's queries during the flood: %d of 5 answered, want 5", ok)
	}
	if sent.Load() < 2*flowsPerRound {
		t.Errorf("the flood sent %d datagrams, want at least %d (two rounds of every port)", sent.Load(), 2*flowsPerRound)
	}
	if most.Load() == 0 || most.Load() > limit {
		t.Errorf("the flooder held at most %d ports towards the server, want (0, %d]", most.Load(), limit)
	}
	n, err := countPodSNAT(m, floodIdx)
	if err != nil {
		t.Fatal(err)
	}
	if n > limit {
		t.Errorf("the flooder has %d masqueraded flows after the flood, want at most its limit %d", n, limit)
	}
	if st["recycled"] == 0 && st["drop_pod_limit"] == 0 {
		t.Errorf("the flooder's flows past its limit neither took back its own ports nor were dropped: %v", st)
	}
}

// countPodSNAT counts the masqueraded flows of the pod behind ifindex.
func countPodSNAT(m *maps.Maps, ifindex int) (int, error) {
	fl, err := m.Masq().ListSNAT()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, f := range fl {
		if f.Ifindex == ifindex {
			n++
		}
	}
	return n, nil
}
